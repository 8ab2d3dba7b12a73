"""The start-up faults of a multi-node launch (issue 35 item 5), each one line in bounded time: an interface the
node lacks, a worker that never joins, a node without the resource verl's bundles ask for (`ray_cluster wait
--resource`), a placement group no node can hold (`ray_cluster watch`). First the one-line messages without a
cluster, then each fault on the simulated cluster (ascend_rl.harness.cluster_faults, as `python3 -m ascend_rl
cluster_faults` runs them) with the README's `ray_start.sh` from a fresh shell; every cluster test leaves no
namespace, link or process behind. The cluster tests skip without root or `ip netns`."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

from ascend_rl import ray_cluster
from ascend_rl.cli import ray_cluster as cli
from ascend_rl.harness import cluster_faults as faults
from ascend_rl.harness import sim_cluster as lib
from cluster_support import needs_cluster

pytestmark = pytest.mark.ci


PY = sys.executable


# --- the one-line messages, no cluster --------------------------------------------------------------------


def test_an_interface_the_node_lacks_is_named_with_what_the_node_has(capsys):
    with pytest.raises(ray_cluster.ClusterError) as err:
        ray_cluster.ifname_ipv4("ib9")
    text = str(err.value)
    assert text.startswith("interface 'ib9' has no IPv4 address (no such interface here); this node has: ")
    assert "lo 127.0.0.1" in text and "\n" not in text, text
    # through the command: one line on stderr, nothing started, exit 1
    assert cli.main(["start", "--head", "--ifname", "ib9", "--dry-run"]) == 1
    out, err_text = capsys.readouterr()
    assert out == "" and err_text.count("\n") == 1 and "this node has: " in err_text, (out, err_text)


def test_no_interface_at_all_names_what_the_node_has(monkeypatch):
    monkeypatch.delenv("SOCKET_IFNAME", raising=False)
    monkeypatch.setattr(ray_cluster, "default_route_ifname", lambda: None)
    with pytest.raises(ray_cluster.ClusterError) as err:
        ray_cluster.resolve_ifname(None)
    assert "no default route); this node has: " in str(err.value) and "lo 127.0.0.1" in str(err.value)


def test_resource_option_spelling_and_refusals(capsys):
    args = cli.parse_args(
        ["wait", "--nodes", "2", "--timeout", "60", "--resource", "cpu=2", "--resource", "NPU=16"]
    )
    assert args.resource == [("cpu", 2.0), ("NPU", 16.0)] and args.nodes == 2 and args.timeout == 60
    assert cli.parse_args(["wait", "--nodes", "1"]).resource == []
    for bad in ("cpu", "cpu=", "cpu=0", "=2", "cpu=-1", "cpu=two"):
        with pytest.raises(SystemExit) as exc:
            cli.parse_args(["wait", "--nodes", "1", "--resource", bad])
        assert exc.value.code == 2
        assert (
            f"must be NAME=COUNT with a count above 0 (cpu=2, NPU=16), not {bad!r}" in capsys.readouterr().err
        )


def _node(ip: str, alive: bool = True, **resources: float) -> dict:
    base = {f"node:{ip}": 1.0, "memory": 8e9, "object_store_memory": 5.36e8}
    return {"NodeManagerAddress": ip, "Alive": alive, "Resources": {**base, **resources}}


def test_check_resources_names_the_resource_and_what_every_node_offers():
    nodes = [
        _node("10.0.0.1", CPU=2.0, NPU=1.0, cpu=1.0),
        _node("10.0.0.2", CPU=2.0, NPU=1.0),
        _node("10.0.0.3", alive=False),
    ]
    ray_cluster.check_resources(nodes, [("NPU", 1.0)])  # every alive node has it: nothing raised
    with pytest.raises(ray_cluster.ClusterError) as err:
        ray_cluster.check_resources(nodes, [("cpu", 1.0)])
    assert str(err.value) == (
        "1 of 2 nodes offer less than --resource cpu=1 asks of every node (10.0.0.2 has cpu 0); the nodes offer: "
        "10.0.0.1 {CPU: 2, NPU: 1, cpu: 1}; 10.0.0.2 {CPU: 2, NPU: 1}; start each node with the resource its "
        "ranks' placement bundles ask for (ray_start.sh --cpu offers the lowercase cpu; NPUS_PER_NODE sets the count)"
    )
    with pytest.raises(ray_cluster.ClusterError) as err:
        ray_cluster.check_resources(nodes, [("cpu", 2.0), ("NPU", 16.0)])
    assert "2 of 2 nodes offer less than --resource cpu=2, NPU=16 asks" in str(err.value)
    assert "(10.0.0.1 has cpu 1, NPU 1; 10.0.0.2 has cpu 0, NPU 1)" in str(err.value)
    assert "\n" not in str(err.value)


def test_wait_checks_the_resources_only_after_the_nodes_joined(monkeypatch, capsys):
    seen = iter(
        [
            [_node("10.0.0.1", cpu=1.0)],
            [_node("10.0.0.1", cpu=1.0)],
            [_node("10.0.0.1", cpu=1.0), _node("10.0.0.2", NPU=1.0)],
            [_node("10.0.0.1", cpu=1.0), _node("10.0.0.2", NPU=1.0)],
        ]
    )
    monkeypatch.setattr(cli, "ray_alive_nodes", lambda address: lambda: next(seen))
    waits = []

    def wait_for_nodes(count, nodes, timeout):
        waits.append(timeout)
        return ray_cluster.wait_for_nodes(count, nodes, timeout, sleep=lambda s: None)

    monkeypatch.setattr(cli, "wait_for_nodes", wait_for_nodes)
    assert cli.main(["wait", "--nodes", "2", "--timeout", "60", "--resource", "cpu=1"]) == 1
    out, err = capsys.readouterr()
    assert out == "ray: 1/2 nodes alive\nray: 2/2 nodes alive\n", out
    assert err.startswith(
        "ray_cluster: error: 1 of 2 nodes offer less than --resource cpu=1 asks of every node"
    )
    assert err.count("\n") == 1 and "10.0.0.2 {NPU: 1}" in err, err
    assert waits == [60]


def _group(state: str = "PENDING", strategy: str = "STRICT_PACK", n: int = 2, **bundle: float) -> dict:
    return {
        "placement_group_id": "ab" * 14 + "01000000",
        "name": "global_pool_0",
        "bundles": {i: dict(bundle or {"CPU": 1.0, "cpu": 1.0}) for i in range(n)},
        "strategy": strategy,
        "state": state,
    }


def test_why_a_group_is_not_placed():
    npu_only = [_node("10.0.0.1", CPU=2.0, NPU=1.0), _node("10.0.0.2", CPU=2.0, NPU=1.0)]
    assert (
        ray_cluster.why_unplaced(_group(n=1, strategy="PACK"), npu_only)
        == "no alive node offers cpu 1 for a bundle"
    )
    assert (
        ray_cluster.why_unplaced(_group(n=1), npu_only)
        == "no alive node offers cpu 1 on one node (STRICT_PACK)"
    )
    one_cpu = [_node("10.0.0.1", CPU=2.0, cpu=1.0), _node("10.0.0.2", CPU=2.0, cpu=1.0)]
    assert (
        ray_cluster.why_unplaced(_group(n=2), one_cpu)
        == "no alive node offers cpu 2 on one node (STRICT_PACK)"
    )
    assert ray_cluster.why_unplaced(_group(n=2, strategy="PACK"), one_cpu).startswith(
        "the nodes offer it, but"
    )
    assert ray_cluster.why_unplaced(_group(n=3, strategy="STRICT_SPREAD"), one_cpu) == (
        "STRICT_SPREAD needs 3 nodes that fit a bundle, 2 do"
    )
    assert ray_cluster.describe_group(_group(n=2)) == (
        "placement group global_pool_0 (STRICT_PACK, 2 bundles of {CPU: 1, cpu: 1})"
    )


def test_watch_says_one_line_once_a_group_stayed_pending_for_its_timeout():
    now = [0.0]
    states = iter(["CREATED", "PENDING", "PENDING", "CREATED", "PENDING"] + ["PENDING"] * 20)
    nodes = [_node("10.0.0.1", CPU=2.0, NPU=1.0)]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    found = ray_cluster.watch_run(
        lambda: {"g": _group(state=next(states))},
        lambda: nodes,
        30,
        interval=10,
        sleep=sleep,
        clock=lambda: now[0],
    )
    assert found is not None
    kind, group, line = found
    assert kind == "pending"
    # pending from t=40 (the CREATED at t=30 reset the count): said at t=70, not before
    assert now[0] == 70 and group["name"] == "global_pool_0"
    assert line == (
        "placement group global_pool_0 (STRICT_PACK, 2 bundles of {CPU: 1, cpu: 1}) pending for 30s: no alive "
        "node offers cpu 2 on one node (STRICT_PACK); the nodes offer: 10.0.0.1 {CPU: 2, NPU: 1}"
    )
    # a watch whose run ended: no line
    assert ray_cluster.watch_run(lambda: {}, lambda: nodes, 30, keep_going=lambda: False) is None


def test_watch_command_says_one_line_and_logs_it_or_ends_with_the_pid_it_watches(
    monkeypatch, capsys, tmp_path
):
    import ray.util

    nodes = [_node("10.0.0.1", CPU=2.0, NPU=1.0)]
    monkeypatch.setattr(cli, "ray_alive_nodes", lambda address: lambda: nodes)
    monkeypatch.setattr(ray.util, "placement_group_table", lambda: {"g": _group(n=1)})
    log = tmp_path / "run.log"
    log.write_text("step:1\n")
    argv = ["watch", "--pending-timeout", "0.2", "--interval", "0.05", "--log", str(log)]
    assert cli.main(argv) == 1
    out, err = capsys.readouterr()
    line = (
        "ray_cluster: error: placement group global_pool_0 (STRICT_PACK, 1 bundle of {CPU: 1, cpu: 1}) pending for "
        "0.2s: no alive node offers cpu 1 on one node (STRICT_PACK); the nodes offer: 10.0.0.1 {CPU: 2, NPU: 1}; "
        "end the run (its ray.get(pg.ready()) waits forever)"
    )
    assert out == "" and err == line + "\n" and log.read_text() == "step:1\n" + line + "\n"
    # the pid it watches has ended: no line, exit 0
    gone = subprocess.Popen(["true"])
    gone.wait()
    assert cli.main(["watch", "--pending-timeout", "0.2", "--while-pid", str(gone.pid)]) == 0
    assert capsys.readouterr() == ("", "")


def test_a_groups_job_is_the_tail_of_its_id():
    import ray

    job = ray.JobID.from_int(7)
    assert ray_cluster.group_job(ray.PlacementGroupID.of(job).hex()) == job.hex()


def test_end_driver_ends_only_a_driver_on_this_node():
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        jobs = [
            {"JobID": "07000000", "DriverPid": sleeper.pid, "DriverIPAddress": "10.0.0.1", "IsDead": False}
        ]
        assert ray_cluster.end_driver("07000000", jobs, "10.0.0.2") == (
            f"its driver (pid {sleeper.pid} on 10.0.0.1) is not on this node (10.0.0.2): end it there"
        )
        assert sleeper.poll() is None
        assert ray_cluster.end_driver("08000000", jobs, "10.0.0.1") == "job 08000000 has no live driver"
        t0 = time.monotonic()
        said = ray_cluster.end_driver("07000000", jobs, "10.0.0.1", grace=10)
        assert said == f"ended its driver (pid {sleeper.pid}, SIGTERM)" and time.monotonic() - t0 < 5
        assert sleeper.wait(timeout=5) == -15
    finally:
        sleeper.kill()
        sleeper.wait()


def test_rays_npu_detection_noise_is_set_apart_and_nothing_else():
    lines = [
        "2026-12-04 10:55:38,973\tERROR npu.py:81 -- Failed to detect NPU type.",
        "Traceback (most recent call last):",
        '  File ".../ray/_private/accelerators/npu.py", line 77, in get_current_node_accelerator_type',
        "    import acl",
        "ModuleNotFoundError: No module named 'acl'",
        "ray_cluster: error: only 1 of 2 nodes joined the Ray cluster after 5s; ...",
    ]
    assert faults.without_npu_noise(lines) == ([lines[-1]], 1)
    other = ["Traceback (most recent call last):", "ValueError: x", lines[-1]]
    assert faults.without_npu_noise(other) == (other, 0)


def test_cluster_faults_refuses_an_unknown_kind(capsys):
    with pytest.raises(SystemExit) as exc:
        faults.parse_args(["--kinds", "ifname,power-cut"])
    assert (
        exc.value.code == 2
        and "--kinds takes ifname, no-worker, resource, pg-pending" in capsys.readouterr().err
    )


# --- on the simulated cluster -----------------------------------------------------------------------------


def _leftovers(rec: dict) -> list[str]:
    from test_cluster import leftovers  # tests/launch: what a cluster leaves behind

    return leftovers(rec)


def _assert_ok(rows: list[dict]) -> None:
    bad = [row for row in rows if not row["ok"]]
    assert not bad, "\n".join(f"{row['check']}: {row['why']} (said: {row.get('line')})" for row in bad)


@needs_cluster
def test_socket_ifname_a_node_lacks_is_one_line_and_starts_nothing(tmp_path):
    with lib.Cluster(f"cf{os.getpid()}-if", 1, root=tmp_path / "cluster") as cl:
        rec = cl.to_json()
        rows = faults.fault_ifname(cl, PY)
        address = cl.address("node1")
    _assert_ok(rows)
    (row,) = rows
    assert row["rc"] == 1 and row["seconds"] < 60
    assert row["line"].startswith(
        "ray_cluster: error: interface 'ib0' has no IPv4 address (no such interface here)"
    )
    assert f"eth0 {address}" in row["line"] and "lo 127.0.0.1" in row["line"], row["line"]
    assert row["processes_left"] == [] and row["ray_sessions"] == []
    assert _leftovers(rec) == []
    print(f"ifname: {row['seconds']}s: {row['line']}")


@needs_cluster
def test_worker_never_joins_resource_mismatch_and_pending_group_each_end_in_one_line(tmp_path):
    wait_s, pending_s = 5.0, 5.0
    t0 = time.monotonic()
    with lib.Cluster(f"cf{os.getpid()}-ray", 2, root=tmp_path / "cluster") as cl:
        rec = cl.to_json()
        head, worker = cl.address("node1"), cl.address("node2")
        no_worker = faults.start_head(cl, PY, wait_s, no_worker=True)  # node2 never starts Ray
        _assert_ok(no_worker)
        joined = faults.join_npu_worker(cl, PY)  # then node2 joins offering NPU only, no `cpu`
        _assert_ok(joined)
        resource = faults.fault_resource(cl, PY)
        pending = faults.fault_pg_pending(cl, PY, pending_s)
        # Ray was never stopped by a test: the raylets still run in both nodes until the teardown
        for node in ("node1", "node2"):
            assert cl.run(node, ["pgrep", "-f", "raylet"], capture_output=True).returncode == 0, node
    took = time.monotonic() - t0
    assert _leftovers(rec) == []

    # b. the head's own wait and the launcher's `ray_cluster wait`: at the timeout, how many of how many
    for row in no_worker:
        assert row["rc"] == 1 and wait_s - 1 <= row["seconds"] <= wait_s + faults.MARGIN_S, row
        assert row["line"].startswith(
            f"ray_cluster: error: only 1 of 2 nodes joined the Ray cluster after {wait_s:g}s"
        )

    # c. the resource every node must offer: the one short of it named, with what every node offers
    _assert_ok(resource)
    short, good = resource
    assert short["rc"] == 1 and good["rc"] == 0
    assert f"({worker} has cpu 0)" in short["line"] and f"{head} {{CPU: " in short["line"], short["line"]
    assert re.search(rf"{re.escape(worker)} \{{CPU: \d+, NPU: 1\}}", short["line"]), short["line"]

    # c. a group no node can hold: the watch says so in one line and ends the driver (verl's would wait forever)
    _assert_ok(pending)
    (row,) = pending
    assert row["driver_rc"] is not None and row["driver_ended_s"] <= pending_s + 10 + faults.MARGIN_S, row
    assert f"the nodes offer: {head} {{CPU: " in row["line"] and "ended its driver (pid " in row["line"], row
    print(
        f"cluster faults: {took:.1f}s in all; "
        + "; ".join(f"{r['check']}: {r['seconds']}s" for r in no_worker + resource + pending)
    )
    print("\n".join(r["line"] for r in no_worker + resource + pending))


def test_the_watch_writes_why_it_ended_a_run_even_when_the_launchers_sigterm_comes_first(monkeypatch, capsys):
    """ray.init replaces the SIGTERM handler with sys.exit: the watch takes it back once connected, so the
    launcher's SIGTERM (sent as soon as main_ppo ends) lets it write its line first (a node-lost run lost it)."""
    import signal

    def connect(address):  # what ray.init does to the handler
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(signum))
        return lambda: 2

    def lost(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # the launcher's, while the watch still has its line to write
        return "lost", {"NodeManagerAddress": "198.18.0.2"}, "node 198.18.0.2 was lost in step 2"

    monkeypatch.setattr(cli, "ray_alive_nodes", connect)
    monkeypatch.setattr(cli, "watch_run", lost)
    before = signal.getsignal(signal.SIGTERM)
    args = cli.parse_args(["watch", "--pending-timeout", "5", "--lost-node"])
    assert cli._watch(args) == 1
    assert "ray_cluster: error: node 198.18.0.2 was lost in step 2; end the run" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) is before  # the caller's handler is back
