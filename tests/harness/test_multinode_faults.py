"""The faults of a run across nodes (issue 35 item 5): a node lost while the run goes, a checkpoint folder not every
node sees, and the launcher's watch beside main_ppo.

First the one-line messages and the launcher's wiring without a cluster (`make test`): run_failure on Ray's report
of an actor that died with its node and on the watch's line; the watch noticing a node it saw alive go dead; the
launcher's multi-node path with a stand-in Python that records what it is asked (the `shared` check of the resolved
trainer.default_local_dir, the watch beside main_ppo and its line reaching the run's last line; neither on one node).
Then on the simulated cluster: `ray_cluster shared` refusing the node-local folder and passing the shared one (Ray
on two nodes, `make test`), and the DeepSeek launcher across two nodes (`make test-full`, the e2e Python:
`python -m ascend_rl cluster_faults --kinds local-ckpt,node-lost`): the launcher refuses a node-local checkpoint
folder before training; node2 killed in step 2 ends the run by itself within 60 s in one line naming its address
and the step, nothing of the run left; node2 back, the rerun resumes from the newest complete checkpoint. The
cluster tests skip without root or `ip netns`, and leave no namespace, link or process behind.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ascend_rl import ray_cluster, run_failure
from ascend_rl.cli import ray_cluster as cli
from ascend_rl.harness import cluster_faults as faults
from ascend_rl.harness import sim_cluster as lib
from cluster_support import NO_CLUSTER, needs_cluster

REPO = Path(__file__).resolve().parents[2]
LAUNCHER = REPO / "llm_rl" / "deepseek_r1" / "run_deepseek_r1_a3.sh"
PY = sys.executable

ci = pytest.mark.ci  # a second each, no training (the shared-folder check on the cluster: Ray on two nodes)


# --- the one-line messages, no cluster --------------------------------------------------------------------

NODE_DIED = """\
(TaskRunner pid=812) step:1 - actor/pg_loss:0.0 - timing_s/step:27.1
Traceback (most recent call last):
  File "/w/verl-0.6.0-cpu/verl/trainer/ppo/ray_trainer.py", line 1121, in fit
    gen_batch_output = self.actor_rollout_wg.generate_sequences(gen_batch)
  File "/w/verl-0.6.0-cpu/verl/single_controller/ray/base.py", line 48, in generate_sequences
    output = ray.get(output)
ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.
\tclass_name: create_colocated_worker_cls.<locals>.WorkerDict
\tactor_id: 5e1b
\tpid: 2211
\tname: Ab1cWorkerDict_0:1
\tnamespace: 7c9d
\tip: 198.18.0.2
The actor died because its node has died. Node Id: 0a1b2c
\tthe actor's node was terminated unexpectedly: health check failed due to missing too many heartbeats
"""


@ci
def test_an_actor_that_died_with_its_node_names_the_node_and_the_step():
    assert run_failure.summarise(NODE_DIED) == (
        "run: node 198.18.0.2 was lost in step 2 (generation): trainer rank 1 (the actor, rollout and reference "
        "worker, pid 2211) died with it (the actor's node was terminated unexpectedly: health check failed due to "
        "missing too many heartbeats)"
    )
    # the same actor dying on a live node is still a rank that died
    alive = (
        NODE_DIED.split("The actor died because")[0] + "\tWorker unexpectedly exits with a connection error\n"
    )
    assert run_failure.summarise(alive).startswith(
        "run: trainer rank 1 (the actor, rollout and reference worker"
    )


WATCH_LOST = (
    "ray_cluster: error: node 198.18.0.2 (node2) left the Ray cluster while the run was going: Ray marked it dead "
    "(health check failed due to missing too many heartbeats); the nodes alive: 198.18.0.1 {CPU: 4, NPU: 1, cpu: 1}; "
    "bring it back (ray_start.sh --worker) and rerun: the run resumes from its last complete checkpoint; ended its "
    "driver (pid 77, SIGTERM)"
)


@ci
def test_the_watchs_line_is_the_runs_reason(tmp_path):
    log = (
        "(TaskRunner pid=812) step:1 - x:1\n(TaskRunner pid=812) step:2 - x:1\nKeyboardInterrupt\n"
        + WATCH_LOST
    )
    assert run_failure.summarise(log) == (
        f"run: node 198.18.0.2 was lost in step 3; ray_cluster watch: {WATCH_LOST[len('ray_cluster: error: ') :]}"
    )
    pending = (
        "ray_cluster: error: placement group global_pool_0 (STRICT_PACK, 2 bundles of {CPU: 1, cpu: 1}) pending for "
        "600s: no alive node offers cpu 2 on one node (STRICT_PACK); the nodes offer: 10.0.0.1 {CPU: 4}; ended its "
        "driver (pid 9, SIGTERM)"
    )
    assert run_failure.summarise("Terminated\n" + pending) == (
        f"run: stopped in step 1 by ray_cluster watch: {pending[len('ray_cluster: error: ') :]}"
    )
    # through the command: one line
    path = tmp_path / "run.log"
    path.write_text(log + "\n")
    done = subprocess.run(
        [PY, "-m", "ascend_rl", "run_failure", str(path)], cwd=REPO, capture_output=True, text=True
    )
    assert done.returncode == 0 and done.stdout.count("\n") == 1, done
    assert done.stdout.startswith("run: node 198.18.0.2 was lost in step 3; ") and str(path) in done.stdout


def _node(ip: str, node_id: str, alive: bool = True, why: str = "", **resources: float) -> dict:
    host = {"198.18.0.1": "node1", "198.18.0.2": "node2"}.get(ip, ip)
    return {
        "NodeID": node_id,
        "NodeManagerAddress": ip,
        "NodeManagerHostname": host,
        "Alive": alive,
        "DeathReasonMessage": why,
        "Resources": {f"node:{ip}": 1.0, **resources},
    }


def _watch_lost_nodes(read_nodes, **kwargs) -> tuple[tuple | None, float]:
    """ray_cluster.watch_run watching nodes every 2 s on a clock its sleeps advance: (what it found, when)."""
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    found = ray_cluster.watch_run(
        lambda: {}, read_nodes, 600, interval=2, sleep=sleep, clock=lambda: now[0], lost_nodes=True, **kwargs
    )
    return found, now[0]


@ci
def test_the_watch_notices_a_node_it_saw_alive_go_dead_and_nothing_else():
    why = "health check failed due to missing too many heartbeats"
    head = _node("198.18.0.1", "h", CPU=4.0, cpu=1.0)
    old = _node("198.18.0.2", "w-old", alive=False, why="an earlier life")  # dead before the watch began
    worker = _node("198.18.0.2", "w", CPU=4.0, cpu=1.0)
    looks = iter(
        [
            [head, old, worker],
            [head, old, worker],
            [head, old, {**worker, "Alive": False, "DeathReasonMessage": why}],
        ]
    )
    found, now = _watch_lost_nodes(lambda: next(looks))
    assert found is not None and now == 4
    kind, node, line = found
    assert kind == "lost" and node["NodeID"] == "w"
    assert line == (
        f"node 198.18.0.2 (node2) left the Ray cluster while the run was going: Ray marked it dead ({why}); the "
        "nodes alive: 198.18.0.1 {CPU: 4, cpu: 1}; bring it back (ray_start.sh --worker) and rerun: the run "
        "resumes from its last complete checkpoint"
    )
    # a node that joins (a revived node2 under a new id) is not a loss; without --lost-node no node is watched
    joins = iter([[head], [head, worker], [head, worker]])
    stop = iter([True, True, True, False])
    assert (
        ray_cluster.watch_run(
            lambda: {},
            lambda: next(joins),
            600,
            sleep=lambda s: None,
            keep_going=lambda: next(stop),
            lost_nodes=True,
        )
        is None
    )
    gone = iter([[head, worker], [head]])
    stop = iter([True, True, False])
    assert (
        ray_cluster.watch_run(
            lambda: {}, lambda: next(gone), 600, sleep=lambda s: None, keep_going=lambda: next(stop)
        )
        is None
    )


@ci
def test_a_node_whose_raylet_stops_answering_is_lost_before_ray_marks_it_dead():
    head = {**_node("198.18.0.1", "h", CPU=4.0), "NodeManagerPort": 40001}
    worker = {**_node("198.18.0.2", "w", CPU=4.0), "NodeManagerPort": 40002}
    answers = iter([True, True, False, False, False, True, False, False, False, False, False, False])
    found, now = _watch_lost_nodes(
        lambda: [head, worker],  # Ray still counts both alive
        reachable=lambda node: node["NodeID"] == "h" or next(answers),
        unreachable_timeout=8,
    )
    # silent from t=12 (an answer at t=10 reset it): lost at t=20, not at t=12
    assert found is not None and now == 20, now
    kind, node, line = found
    assert kind == "lost" and node["NodeID"] == "w"
    assert line == (
        "node 198.18.0.2 (node2) stopped answering while the run was going: its raylet (198.18.0.2:40002) took no "
        "connection for 8s (Ray has not marked it dead yet); the nodes answering: 198.18.0.1 {CPU: 4}; bring it "
        "back (ray_start.sh --worker) and rerun: the run resumes from its last complete checkpoint"
    )
    assert run_failure.summarise(
        f"step:1 - a:1\nray_cluster: error: {line}; ended its driver (pid 5, SIGTERM)"
    ) == (
        f"run: node 198.18.0.2 was lost in step 2; ray_cluster watch: {line}; ended its driver (pid 5, SIGTERM)"
    )
    # a port that takes connections answers; one nothing listens on does not
    import socket

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert ray_cluster.raylet_answers({"NodeManagerAddress": "127.0.0.1", "NodeManagerPort": port})
    assert not ray_cluster.raylet_answers({"NodeManagerAddress": "127.0.0.1", "NodeManagerPort": port})


@ci
def test_a_node_back_before_ray_marked_its_old_raylet_dead_is_waited_for_and_is_no_loss():
    """node2 revived within seconds of its loss: Ray lists the gone raylet alive beside the new one until its
    health check fails (a full-tier rerun saw `ray: 3/2 nodes alive`, started, and its watch took the stale
    entry's death for a lost node). The wait counts that address only once the stale entry is dead; the watch
    lets the stale entry die, and go silent, without a line; the node that came back is still watched."""
    head = {**_node("198.18.0.1", "h", CPU=4.0), "NodeManagerPort": 40001}
    stale = {**_node("198.18.0.2", "w-old", CPU=4.0), "NodeManagerPort": 40002}
    back = {**_node("198.18.0.2", "w", CPU=4.0), "NodeManagerPort": 40003}
    assert [n["NodeID"] for n in ray_cluster.settled([head, stale, back])] == ["h"]
    assert [n["NodeID"] for n in ray_cluster.settled([head, {**stale, "Alive": False}, back])] == ["h", "w"]
    dead_stale = {**stale, "Alive": False, "DeathReasonMessage": "health check failed"}
    looks = iter(
        [[head, stale, back]] * 6
        + [[head, dead_stale, back]] * 3
        + [[head, dead_stale, {**back, "Alive": False}]]
    )
    found, now = _watch_lost_nodes(
        lambda: next(looks),
        reachable=lambda node: node["NodeID"] != "w-old",  # the stale raylet's port takes no connection
        unreachable_timeout=4,
    )
    assert found is not None
    kind, node, line = found
    assert kind == "lost" and node["NodeID"] == "w" and now == 18, (node["NodeID"], now)
    assert line.startswith("node 198.18.0.2 (node2) left the Ray cluster while the run was going")


@ci
def test_the_watch_command_ends_the_launchers_driver_when_a_node_is_lost(monkeypatch, capsys, tmp_path):
    import signal

    import ray
    import ray.util
    from ray._private import state

    head = _node("10.0.0.1", "h", CPU=4.0)
    worker = _node("10.0.0.2", "w", CPU=4.0)
    looks = iter([[head, worker], [head, {**worker, "Alive": False}]])
    # the launcher (--while-pid) and its main_ppo (the run's driver); another run's driver on the node, not under it
    launcher = subprocess.Popen(["bash", "-c", "sleep 60 & echo $!; wait"], stdout=subprocess.PIPE, text=True)
    driver = int(launcher.stdout.readline())
    other = subprocess.Popen(["sleep", "60"])
    handler = signal.getsignal(signal.SIGTERM)
    try:
        jobs = [
            {"JobID": "01000000", "DriverPid": os.getpid(), "DriverIPAddress": "10.0.0.1", "IsDead": False},
            {"JobID": "02000000", "DriverPid": driver, "DriverIPAddress": "10.0.0.1", "IsDead": False},
            {"JobID": "03000000", "DriverPid": other.pid, "DriverIPAddress": "10.0.0.1", "IsDead": False},
        ]
        monkeypatch.setattr(cli, "ray_alive_nodes", lambda address: lambda: [head])
        monkeypatch.setattr(ray, "nodes", lambda: next(looks))
        monkeypatch.setattr(ray.util, "placement_group_table", lambda: {})
        monkeypatch.setattr(ray.util, "get_node_ip_address", lambda: "10.0.0.1")
        monkeypatch.setattr(state, "jobs", lambda: jobs)

        class Context:
            def get_job_id(self) -> str:
                return "01000000"  # the watch's own connection

        monkeypatch.setattr(ray, "get_runtime_context", lambda: Context())
        log = tmp_path / "watch.log"
        argv = ["watch", "--pending-timeout", "600", "--interval", "0.05", "--lost-node", "--end-driver"]
        argv += ["--while-pid", str(launcher.pid), "--log", str(log)]
        assert cli.main(argv) == 1
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1, (out, err)
        assert err.startswith(
            "ray_cluster: error: node 10.0.0.2 left the Ray cluster while the run was going"
        )
        assert err.endswith(f"; ended its driver (pid {driver}, SIGTERM)\n"), err
        assert log.read_text() == err
        assert launcher.wait(timeout=5) == 0 and other.poll() is None  # its `wait` saw the driver end
        assert signal.getsignal(signal.SIGTERM) == handler  # the watch's own SIGTERM handling is undone
    finally:
        for proc in (launcher, other):
            proc.kill()
            proc.wait()
        subprocess.run(["kill", "-KILL", str(driver)], capture_output=True)


@ci
def test_run_drivers_are_the_live_ones_here_under_the_launcher():
    child = subprocess.Popen(["sleep", "60"])
    try:
        jobs = [
            {"JobID": "01000000", "DriverPid": 1, "DriverIPAddress": "10.0.0.1", "IsDead": False},
            {"JobID": "02000000", "DriverPid": child.pid, "DriverIPAddress": "10.0.0.1", "IsDead": False},
            {"JobID": "03000000", "DriverPid": child.pid, "DriverIPAddress": "10.0.0.2", "IsDead": False},
            {"JobID": "04000000", "DriverPid": child.pid, "DriverIPAddress": "10.0.0.1", "IsDead": True},
            {"JobID": "05000000", "DriverPid": os.getpid(), "DriverIPAddress": "10.0.0.1", "IsDead": False},
        ]
        assert ray_cluster.run_drivers(jobs, "10.0.0.1", "05000000", os.getpid()) == ["02000000"]
        assert ray_cluster.run_drivers(jobs, "10.0.0.1", "05000000", None) == ["01000000", "02000000"]
        assert ray_cluster.descends_from(child.pid, os.getpid()) and not ray_cluster.descends_from(
            os.getpid(), child.pid
        )
    finally:
        child.kill()
        child.wait()


@ci
def test_a_folder_not_every_node_sees_is_one_line_naming_the_nodes():
    assert ray_cluster.shared_folder_line("trainer.default_local_dir", "/c", {"10.0.0.1 (node1)": ""}) is None
    line = ray_cluster.shared_folder_line(
        "trainer.default_local_dir",
        "/local/ckpt",
        {
            "10.0.0.1 (node1)": "",
            "10.0.0.2 (node2)": "no marker (No such file or directory)",
            "10.0.0.3 (node3)": "no answer in 120s",
        },
    )
    assert line == (
        "trainer.default_local_dir /local/ckpt is not one folder every node sees: 2 of 3 nodes do not see the marker "
        "file the head wrote there (10.0.0.2 (node2): no marker (No such file or directory); 10.0.0.3 (node3): no "
        "answer in 120s); put it on a folder every node mounts at the same path (a shared filesystem): on a "
        "node-local disk each rank saves its shards where the others cannot read them, and a rerun cannot resume"
    )
    path = Path(__file__)
    assert ray_cluster.look_for_marker(str(path), path.read_text())[1] == ""
    assert ray_cluster.look_for_marker(str(path), "x")[1] == "another file at the marker's path"
    assert ray_cluster.look_for_marker("/nonexistent/m", "x")[1] == "no marker (No such file or directory)"


@ci
def test_cluster_faults_takes_the_training_kinds_only_when_asked():
    assert faults.parse_args([]).kinds == list(faults.KINDS)
    assert faults.parse_args(["--kinds", "local-ckpt,node-lost"]).kinds == ["local-ckpt", "node-lost"]


# --- the launcher's multi-node path, with a stand-in Python ------------------------------------------------

# What the launcher runs through $PYTHON, recorded; `ray_cluster watch` does what the real one does on a lost node
# (one line, the driver ended) once main_ppo started; run_failure is the real one.
STUB = r"""#!/usr/bin/env bash
echo "$*" >> "$STUB_DIR/calls"
case "$1" in
  -c) case "$2" in *megatron_packages*) echo "$STUB_DIR" ;; esac; exit 0 ;;
esac
case "$2 $3 " in
  "ascend_rl preflight ") exit 0 ;;
  "ascend_rl run_failure "|"ascend_rl resolve ") exec "$REAL_PYTHON" "$@" ;;
  "ascend_rl ray_cluster ")
    case "$4" in
      shared) [ -z "${STUB_SHARED_REFUSES:-}" ] || { echo "ray_cluster: error: $STUB_SHARED_REFUSES" >&2; exit 1; } ;;
      watch)
        echo "watch ppid $PPID" >> "$STUB_DIR/calls"
        [ -n "${STUB_LOSE_NODE:-}" ] || { while kill -0 "${@: -1}" 2>/dev/null; do sleep 0.1; done; exit 0; }
        for _ in $(seq 100); do [ -s "$STUB_DIR/main_ppo.pid" ] && break; sleep 0.1; done
        sleep 0.5
        pid=$(cat "$STUB_DIR/main_ppo.pid")
        echo "ray_cluster: error: $STUB_LOSE_NODE; ended its driver (pid $pid, SIGTERM)" >&2
        kill -TERM "$pid"
        exit 1 ;;
    esac
    exit 0 ;;
  "verl.trainer.main_ppo "*)
    echo $$ > "$STUB_DIR/main_ppo.pid"
    echo "(TaskRunner pid=5) step:1 - x:1"
    exec sleep "${STUB_MAIN_S:-0.2}" ;;
esac
echo "stub: unexpected $*" >&2
exit 3
"""


def _launch(
    tmp_path: Path, nnodes: int, *args: str, **env: str
) -> tuple[subprocess.CompletedProcess, list[str]]:
    stub = tmp_path / "python"
    stub.write_text(STUB)
    stub.chmod(0o755)
    (tmp_path / "calls").unlink(missing_ok=True)
    (tmp_path / "main_ppo.pid").unlink(missing_ok=True)
    run_env = {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", "/root"),
        "PYTHON": str(stub),
        "REAL_PYTHON": PY,
        "STUB_DIR": str(tmp_path),
        "NNODES": str(nnodes),
        "LOG_DIR": str(tmp_path / "log"),
        "CKPT_DIR": str(tmp_path / "ckpt"),
        "RUN_NAME": "r",
        "VERL_BASE": "0.6.0",
        **env,
    }
    done = subprocess.run(
        ["bash", str(LAUNCHER), "--cpu", *args], capture_output=True, text=True, env=run_env, timeout=120
    )
    calls = (tmp_path / "calls").read_text().splitlines() if (tmp_path / "calls").is_file() else []
    return done, calls


def _tail(done: subprocess.CompletedProcess) -> str:
    return f"exit {done.returncode}\nstdout:\n{done.stdout[-2000:]}\nstderr:\n{done.stderr[-2000:]}"


@ci
def test_the_launcher_across_nodes_checks_the_checkpoint_folder_and_watches_beside_main_ppo(tmp_path):
    done, calls = _launch(tmp_path, 2)
    assert done.returncode == 0, _tail(done)
    shared = [c for c in calls if c.startswith("-m ascend_rl ray_cluster shared")]
    assert shared == [
        f"-m ascend_rl ray_cluster shared {tmp_path}/ckpt/r --what trainer.default_local_dir"
    ], calls
    names = [
        c.split()[3] if c.startswith("-m ascend_rl ray_cluster") else c.split()[1]
        for c in calls
        if c[:2] == "-m"
    ]
    # the check after the node wait, before main_ppo; the watch started beside main_ppo
    assert names.index("wait") < names.index("shared") < names.index("verl.trainer.main_ppo"), names
    (watch,) = [c for c in calls if c.startswith("-m ascend_rl ray_cluster watch")]
    assert re.fullmatch(
        r"-m ascend_rl ray_cluster watch --pending-timeout 600 --lost-node --end-driver --while-pid \d+",
        watch,
    ), watch
    # a relative folder is main_ppo's working folder's (the recipe's), and the last setting wins
    done, calls = _launch(tmp_path, 2, "trainer.default_local_dir=a", "trainer.default_local_dir='rel/ck'")
    assert done.returncode == 0, _tail(done)
    assert f"ray_cluster shared {LAUNCHER.parent}/rel/ck --what" in "\n".join(calls), calls
    # one node: neither (main_ppo starts its own Ray)
    done, calls = _launch(tmp_path, 1)
    assert done.returncode == 0, _tail(done)
    assert not [c for c in calls if "ray_cluster" in c] and any("main_ppo" in c for c in calls), calls


@ci
def test_the_launcher_refuses_a_folder_not_every_node_sees_before_main_ppo(tmp_path):
    line = "trainer.default_local_dir /x is not one folder every node sees: ..."
    done, calls = _launch(tmp_path, 2, STUB_SHARED_REFUSES=line)
    assert done.returncode == 1, _tail(done)
    assert done.stderr.strip().splitlines()[-1] == f"ray_cluster: error: {line}", _tail(done)
    assert not any("main_ppo" in c for c in calls) and "logging to" not in done.stdout, calls


@ci
def test_the_watchs_line_reaches_the_runs_last_line(tmp_path):
    lost = WATCH_LOST[len("ray_cluster: error: ") :].rsplit("; ended its driver", 1)[0]
    t0 = time.monotonic()
    done, calls = _launch(tmp_path, 2, STUB_LOSE_NODE=lost, STUB_MAIN_S="60")
    assert time.monotonic() - t0 < 30, _tail(done)
    assert done.returncode == 143, _tail(done)  # main_ppo's status: SIGTERM
    last = done.stdout.strip().splitlines()[-1]
    pid = (tmp_path / "main_ppo.pid").read_text().strip()
    log = next((tmp_path / "log").glob("r_*.log"))
    assert last == (
        f"run: node 198.18.0.2 was lost in step 2; ray_cluster watch: {lost}; ended its driver (pid {pid}, SIGTERM); "
        f"the log: {log}"
    ), _tail(done)
    assert "ray_cluster: error: " not in done.stderr, _tail(
        done
    )  # one line: the watch's is inside run_failure's
    assert log.read_text().splitlines()[-1].startswith("ray_cluster: error: node 198.18.0.2 (node2) left")
    assert not list((tmp_path / "log").glob("*.watch")), "the watch's file was left"
    # the watch ran beside main_ppo, a child of the launcher's shell, which is its --while-pid
    watch = next(c for c in calls if c.startswith("-m ascend_rl ray_cluster watch"))
    parent = next(c for c in calls if c.startswith("watch ppid")).split()[-1]
    assert watch.endswith(f"--while-pid {parent}"), (watch, parent)


# --- on the simulated cluster -----------------------------------------------------------------------------


@needs_cluster
@ci
def test_shared_refuses_the_node_local_folder_and_passes_the_shared_one(tmp_path):
    t0 = time.monotonic()
    with lib.Cluster(f"mf{os.getpid()}", 2, root=tmp_path / "cluster") as cl:
        rec = cl.to_json()
        rows = faults.start_head(cl, PY, 5.0, no_worker=False) + faults.join_npu_worker(cl, PY)
        assert all(r["ok"] for r in rows), rows
        worker = cl.address("node2")
        local = faults.run(
            cl,
            "node1",
            faults._tool(PY, "shared", str(cl.local / "ckpt" / "run"), "--what", "trainer.default_local_dir"),
            faults.node_env(PY),
        )
        shared = faults.run(
            cl, "node1", faults._tool(PY, "shared", str(cl.shared / "ckpt")), faults.node_env(PY)
        )
        marker_left = list((cl.node("node1").local / "ckpt" / "run").iterdir())
    took = time.monotonic() - t0
    assert faults.leftovers(rec) == []
    assert local["rc"] == 1 and not local["traceback"], local
    assert local["line"] == (
        f"ray_cluster: error: trainer.default_local_dir {cl.local}/ckpt/run is not one folder every node sees: 1 of 2 "
        f"nodes do not see the marker file the head wrote there ({worker} (node2): no marker (No such file or "
        "directory)); put it on a folder every node mounts at the same path (a shared filesystem): on a node-local "
        "disk each rank saves its shards where the others cannot read them, and a rerun cannot resume"
    ), local
    assert marker_left == [], marker_left
    assert shared["rc"] == 0 and shared["stdout"][-1] == (
        f"ray_cluster: the folder {cl.shared}/ckpt: every node of 2 sees it"
    ), shared
    print(
        f"shared: {took:.1f}s in all; local {local['seconds']}s: {local['line']}; shared {shared['seconds']}s"
    )


def _cluster_faults(e2e_python, out: Path, kinds: str, *extra: str):
    if NO_CLUSTER:
        pytest.skip(f"the simulated cluster: {NO_CLUSTER}")
    report = out.parent / "rows.json"
    proc = subprocess.run(
        [str(e2e_python), "-m", "ascend_rl", "cluster_faults", "--kinds", kinds, *extra]
        + ["--out", str(out), "--json", str(report), "--timeout", "600"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=2400,
    )
    rows = json.loads(report.read_text())["rows"] if report.is_file() else []
    return proc, rows


@pytest.fixture(scope="module")
def training_faults(e2e_python, tmp_path_factory):
    return _cluster_faults(
        e2e_python, tmp_path_factory.mktemp("cluster-faults") / "out", "local-ckpt,node-lost"
    )


@pytest.fixture(scope="module")
def training_faults_091(e2e_python, e2e_python_091, tmp_path_factory):
    """The node loss on verl 0.9.1: its Megatron engine, every node's Ray in the 0.9.1 e2e environment."""
    out = tmp_path_factory.mktemp("cluster-faults-091") / "out"
    return _cluster_faults(e2e_python, out, "node-lost", "--base", "0.9.1")


def _rows(proc, rows, kind):
    found = [r for r in rows if r["kind"] == kind]
    assert found, f"no {kind} rows\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    return found


@pytest.mark.full
def test_a_node_local_checkpoint_folder_is_refused_before_training(training_faults):
    proc, rows = training_faults
    (row,) = _rows(proc, rows, "local-ckpt")
    assert row["ok"], row
    assert (
        "is not one folder every node sees: 1 of 2 nodes" in row["line"]
        and "(node2): no marker" in row["line"]
    )


@pytest.mark.full
@pytest.mark.parametrize("which", ["training_faults", "training_faults_091"])
def test_a_node_lost_in_step_2_ends_the_run_in_one_line_and_the_rerun_resumes(request, which):
    """verl 0.6.0 (cluster_faults' default base) and 0.9.1."""
    proc, rows = request.getfixturevalue(which)
    lost, back, rerun = _rows(proc, rows, "node-lost")
    assert lost["ok"], lost
    assert lost["seconds"] <= faults.END_WITHIN_S and lost["left"] == 0, lost
    assert re.match(r"run: node 198\.18\.\d+\.2 was lost in step 2\b", lost["line"]), lost
    assert back["ok"], back
    assert rerun["ok"], rerun
    assert rerun["resumed_from"] == lost["newest_complete"] >= 1
    assert rerun["rerun_steps"] == list(range(lost["newest_complete"] + 1, faults.STEPS + 1))
    teardown = _rows(proc, rows, "teardown")
    assert all(r["ok"] for r in teardown), teardown
    assert proc.returncode == 0, proc.stdout[-3000:]
    print("\n".join(f"{r['check']}: {r.get('seconds')}s: {r.get('line')}" for r in rows))
