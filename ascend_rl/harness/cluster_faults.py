"""Start-up faults of a multi-node Ray launch on the simulated cluster: each must end in one line, in bounded time.

    python3 -m ascend_rl cluster_faults [--kinds ifname,no-worker,resource,pg-pending] [--wait S] [--json FILE]
    .venv-e2e/bin/python -m ascend_rl cluster_faults --kinds local-ckpt,node-lost [--out DIR]   (trains: minutes)

Each kind starts the DeepSeek recipe's nodes as its README says (`ray_start.sh` on each node, from a fresh
shell: no venv on PATH) on a simulated cluster (ascend_rl.harness.sim_cluster), makes one fault, and checks what
the user sees:

    ifname      SOCKET_IFNAME names an interface the node lacks (ib0): ray_start.sh exits 1 with one line naming
                it and the node's interfaces, and no process is left in the node, no Ray session folder made
    no-worker   a worker that never joins: `ray_start.sh --head --nodes 2 --timeout S` and `ray_cluster wait
                --nodes 2 --timeout S` each end at their timeout with one line: how many nodes joined of how many
    resource    a worker offering only NPU joins a CPU head (the probe's mismatch: verl's CPU bundles ask for the
                lowercase `cpu`): `ray_cluster wait --nodes 2 --resource cpu=1` exits 1 with one line naming the
                resource and what each node offers; `--resource NPU=1` passes
    pg-pending  a driver asks for a placement group no node can hold and waits on `ray.get(pg.ready())` as
                verl does (forever): `ray_cluster watch --pending-timeout S --end-driver` says why in one line
                and ends the driver

A kind passes when its command exits as it should, its last line on stderr is the expected one line, no
traceback is printed, it ends within its timeout plus a margin, and the cluster's teardown leaves nothing.
These four are start-up faults of a cluster, not kills of a training run: they need root and `ip netns`, no
training, no checkpoint; `python3 -m ascend_rl faults` is the kills of running training runs on one node.

Two more run the DeepSeek launcher's CPU profile across the two nodes (NNODES=2, as the e2e run deepseek-2n; the
e2e environment's Python, not in the default --kinds):

    local-ckpt  trainer.default_local_dir on the node-local folder (each node its own contents): the launcher
                refuses before main_ppo, in one line naming the node that does not see the head's marker file
    node-lost   node2 lost in step 2 (`Cluster.kill`: its link down, its whole PID namespace killed) of a run
                saving every step on the cluster's shared folder: the launcher's watch (its raylet probe) ends
                the run within END_WITHIN_S with one line naming node2's address and step 2, and no process of
                the run is left; node2 revived and joined again (ray_start.sh --worker), a rerun resumes from the
                newest complete checkpoint
Exit status: 0 every kind passed, 1 one did not, 2 usage or no namespaces here.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from ascend_rl.harness import sim_cluster as lib
from ascend_rl.harness.launch import HarnessError
from ascend_rl.paths import REPO
from ascend_rl.ray_cluster import NPU_NOISE_END, NPU_NOISE_START

KINDS = ("ifname", "no-worker", "resource", "pg-pending")
TRAINING_KINDS = ("local-ckpt", "node-lost")  # the launcher trains across the nodes: opt-in, the e2e Python
END_WITHIN_S = 60.0  # how long a run that lost a node may take to end by itself
RAY_START = "llm_rl/deepseek_r1/ray_start.sh"
PORT = 6379
MISSING_IF = "ib0"  # an interface name a node of the simulated cluster does not have (it has lo and eth0)
STEP_S = 180  # a hang, not a measurement: a Ray node starts in 5-30 s here
MARGIN_S = 20.0  # how long past its timeout a wait may take to end (Ray's connect and shutdown)
SMALL_STORE = "100M"  # a worker without --cpu would take Ray's default store (30 % of memory)

# A driver as verl's resource pool makes its groups: STRICT_PACK bundles of {CPU, cpu} and ray.get(pg.ready())
# with no timeout. Two bundles on one node: a node offering cpu 1 cannot hold them, so it waits forever.
DRIVER = r"""
import sys
import ray
from ray.util.placement_group import placement_group

ray.init(address="auto", logging_level="ERROR", log_to_driver=False)
pg = placement_group([{"CPU": 1, "cpu": 1}] * 2, strategy="STRICT_PACK", name="faults_pool_0")
print("PG " + pg.id.hex(), flush=True)
ray.get(pg.ready())
print("PLACED", flush=True)
"""

# The processes of a node, listed from inside it (its own /proc), the lister and the node's init left out.
LIST_PROCESSES = r"""
import os
me = os.getpid()
for pid in sorted(int(p) for p in os.listdir("/proc") if p.isdigit()):
    if pid in (1, me):
        continue
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            print(pid, fh.read().replace(b"\0", b" ").decode(errors="replace")[:160])
    except OSError:
        pass
"""


# The verl base the start-up kinds' nodes resolve (ray_start.sh reads VERL_BASE): the Python they run (--python, the
# 0.13 stack's .venv-e2e in the tests) is 0.6.0's, not the recipe's default base's (0.9.1, a stack of its own).
STARTUP_BASE = "0.6.0"


def node_env(python: str, **extra: str) -> dict[str, str]:
    """A user's fresh shell on a node: no venv on PATH; the Python with Ray named (PYTHON), the cluster's
    interface named as the README says, the base named (STARTUP_BASE unless `extra` says another)."""
    env = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": os.environ.get("HOME", "/root"),
        "LANG": "C.UTF-8",
        "PYTHON": python,
        "VERL_BASE": STARTUP_BASE,
        "PYTHONPATH": str(REPO),
        "SOCKET_IFNAME": "eth0",
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    env.update(extra)
    return env


class Run:
    """A command inside a node, its stdout and stderr read by threads, each line with the time it came."""

    def __init__(self, cl: lib.Cluster, node: str, cmd: list[str], env: dict[str, str]):
        self.t0 = time.monotonic()
        self.proc = cl.popen(
            node, cmd, wd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.out: list[tuple[float, str]] = []
        self.err: list[tuple[float, str]] = []
        self._threads = [
            threading.Thread(target=self._read, args=(self.proc.stdout, self.out), daemon=True),
            threading.Thread(target=self._read, args=(self.proc.stderr, self.err), daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def _read(self, stream, lines) -> None:
        for line in stream:
            lines.append((time.monotonic() - self.t0, line.rstrip("\n")))

    def wait(self, timeout: float) -> int | None:
        """The exit status, or None when it did not end within `timeout` (then it is killed)."""
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            rc = None
        for thread in self._threads:
            thread.join(timeout=10)
        self.seconds = time.monotonic() - self.t0
        return rc

    def when(self, needle: str) -> float | None:
        """When the first stdout line containing `needle` came (seconds from the start)."""
        return next((t for t, line in self.out if needle in line), None)

    def stderr_lines(self) -> list[str]:
        return [line for _, line in self.err if line.strip()]

    def text(self) -> str:
        return "\n".join(line for _, line in sorted(self.out + self.err))


# Ray's own noise when `ray start` runs on a node offering `NPU` without Ascend's `acl` module (a CPU node):
# npu.py logs "Failed to detect NPU type." with the ImportError's traceback, then starts normally. Not a fault's
# line; counted apart (ray_npu_noise) so that any other traceback still fails a check.
# ray_start.sh's `ray_cluster start` drops it itself now (ascend_rl.ray_cluster.RayStartOutput); a `ray start` run
# another way still prints it.


def without_npu_noise(lines: list[str]) -> tuple[list[str], int]:
    """`lines` without Ray's NPU-detection tracebacks, and how many there were."""
    kept, dropped, inside = [], 0, False
    for line in lines:
        if not inside and line.rstrip().endswith(NPU_NOISE_START):
            inside, dropped = True, dropped + 1
        elif inside and line.startswith(NPU_NOISE_END):
            inside = False
        elif not inside:
            kept.append(line)
    return kept, dropped


def run(cl: lib.Cluster, node: str, cmd: list[str], env: dict[str, str], timeout: float = STEP_S) -> dict:
    """Run `cmd` in a node to its end: {rc, seconds, stdout, stderr (without Ray's NPU-detection noise), line
    (the last stderr line), traceback (any other), ray_npu_noise (how many of those)}."""
    proc = Run(cl, node, cmd, env)
    rc = proc.wait(timeout)
    err, noise = without_npu_noise(proc.stderr_lines())
    out = [line for _, line in proc.out]
    return {
        "rc": rc,
        "seconds": round(proc.seconds, 1),
        "stdout": out,
        "stderr": err,
        "line": err[-1] if err else "",
        "traceback": any("Traceback (most recent call last)" in line for line in out + err),
        "ray_npu_noise": noise,
        "run": proc,
    }


def node_processes(cl: lib.Cluster, node: str, python: str) -> list[str]:
    """The processes running in a node besides its init."""
    done = cl.run(node, [python, "-c", LIST_PROCESSES], capture_output=True, text=True, timeout=30)
    return [line for line in done.stdout.splitlines() if line.strip()]


def _check(what: str, result: dict, rc: int, pattern: str, within: float | None, ok_extra=True) -> dict:
    """A check's row: `what`, its exit status against `rc`, its last stderr line against `pattern`, one line
    only when rc != 0, no traceback, and its time against `within` seconds."""
    problems = []
    if result["rc"] != rc:
        problems.append(f"exit {result['rc']}, not {rc}")
    if not re.fullmatch(pattern, result["line"]):
        problems.append(f"its last stderr line does not match {pattern!r}")
    if rc != 0 and len([line for line in result["stderr"] if "error" in line.lower()]) != 1:
        problems.append(f"{len(result['stderr'])} lines on stderr, not one error line")
    if result["traceback"]:
        problems.append("a traceback")
    if within is not None and result["seconds"] > within:
        problems.append(f"took {result['seconds']}s, more than {within:g}s")
    if ok_extra is not True:
        problems.append(str(ok_extra))
    return {
        "check": what,
        "ray_npu_noise": result.get("ray_npu_noise", 0),
        "rc": result["rc"],
        "seconds": result["seconds"],
        "line": result["line"],
        "ok": not problems,
        "why": "; ".join(problems),
    }


def _ray_start(args: list[str]) -> list[str]:
    return ["bash", RAY_START, *args]


def _tool(python: str, *args: str) -> list[str]:
    return [python, "-m", "ascend_rl", "ray_cluster", *args]


def fault_ifname(cl: lib.Cluster, python: str) -> list[dict]:
    """ray_start.sh with SOCKET_IFNAME naming an interface node1 lacks."""
    node = cl.node("node1")
    res = run(cl, "node1", _ray_start(["--cpu", "--head"]), node_env(python, SOCKET_IFNAME=MISSING_IF), 60)
    left = node_processes(cl, "node1", python)
    sessions = sorted(p.name for p in (Path(node.dir) / "ray").glob("session*"))
    extra = True
    if left or sessions or res["stdout"]:
        extra = f"left processes {left}, Ray folders {sessions}, stdout {res['stdout'][-3:]}"
    pattern = (
        rf"ray_cluster: error: interface '{MISSING_IF}' has no IPv4 address \(no such interface here\); "
        rf"this node has: .*eth0 {re.escape(node.address)}.*; set SOCKET_IFNAME or --ifname .*"
    )
    row = _check(f"ray_start.sh with SOCKET_IFNAME={MISSING_IF}", res, 1, pattern, 60, extra)
    row.update(processes_left=left, ray_sessions=sessions)
    return [row]


def _no_worker_pattern(nodes: int, timeout: float) -> str:
    return (
        rf"ray_cluster: error: only 1 of {nodes} nodes joined the Ray cluster after {timeout:g}s; "
        r"run ray_start.sh --worker .*"
    )


def start_head(cl: lib.Cluster, python: str, wait_s: float, no_worker: bool) -> list[dict]:
    """The head's Ray on node1 (`ray_start.sh --cpu --head`): with `no_worker`, waiting for a second node that
    never comes (the fault), else for itself only. Its Ray stays up either way."""
    if not no_worker:
        res = run(cl, "node1", _ray_start(["--cpu", "--head"]), node_env(python))
        row = _check("ray_start.sh --cpu --head", res, 0, r".*", None)
        if not row["ok"]:
            row["why"] += f"; output: {res['run'].text()[-1500:]}"
        return [row]
    args = ["--cpu", "--head", "--nodes", "2", "--timeout", f"{wait_s:g}"]
    res = run(cl, "node1", _ray_start(args), node_env(python))
    waited = res["run"].when("ray: 1/2 nodes alive")
    extra = True if waited is not None else "the head never began its wait (no 'ray: 1/2 nodes alive')"
    wait_part = round(res["seconds"] - waited, 1) if waited is not None else None
    row = _check(
        f"ray_start.sh --head --nodes 2 --timeout {wait_s:g}",
        {**res, "seconds": wait_part if wait_part is not None else res["seconds"]},
        1,
        _no_worker_pattern(2, wait_s),
        wait_s + MARGIN_S,
        extra,
    )
    row["started_s"] = round(waited, 1) if waited is not None else None
    rows = [row]
    res = run(
        cl, "node1", _tool(python, "wait", "--nodes", "2", "--timeout", f"{wait_s:g}"), node_env(python)
    )
    rows.append(
        _check(
            f"ray_cluster wait --nodes 2 --timeout {wait_s:g}",
            res,
            1,
            _no_worker_pattern(2, wait_s),
            wait_s + MARGIN_S,
        )
    )
    return rows


def join_npu_worker(cl: lib.Cluster, python: str) -> list[dict]:
    """node2 joins as an NPU node (no --cpu: it offers NPU only, as the probe's nodes did), then both are up."""
    head = cl.address("node1")
    args = ["--worker", f"{head}:{PORT}", "--object-store-memory", SMALL_STORE]
    res = run(cl, "node2", _ray_start(args), node_env(python, NPUS_PER_NODE="1"))
    rows = [_check("ray_start.sh --worker (NPU only)", res, 0, r".*", None)]
    res = run(cl, "node1", _tool(python, "wait", "--nodes", "2", "--timeout", "60"), node_env(python))
    rows.append(_check("ray_cluster wait --nodes 2 (both joined)", res, 0, r".*", None))
    for row in rows:
        if not row["ok"]:
            row["why"] += f"; stderr: {' | '.join(res['stderr'][-5:])}"
    return rows


def fault_resource(cl: lib.Cluster, python: str) -> list[dict]:
    """`ray_cluster wait --resource`: cpu=1 fails (node2 offers none), NPU=1 passes."""
    head, worker = cl.address("node1"), cl.address("node2")
    pattern = (
        r"ray_cluster: error: 1 of 2 nodes offer less than --resource cpu=1 asks of every node "
        rf"\({re.escape(worker)} has cpu 0\); the nodes offer: {re.escape(head)} \{{CPU: \d+, NPU: 1, cpu: 1\}}; "
        rf"{re.escape(worker)} \{{CPU: \d+, NPU: 1\}}; start each node with .*"
    )
    short = run(
        cl,
        "node1",
        _tool(python, "wait", "--nodes", "2", "--timeout", "30", "--resource", "cpu=1"),
        node_env(python),
    )
    good = run(
        cl,
        "node1",
        _tool(python, "wait", "--nodes", "2", "--timeout", "30", "--resource", "NPU=1"),
        node_env(python),
    )
    return [
        _check("ray_cluster wait --nodes 2 --resource cpu=1", short, 1, pattern, 30 + MARGIN_S),
        _check("ray_cluster wait --nodes 2 --resource NPU=1", good, 0, r".*", 30 + MARGIN_S),
    ]


def fault_pg_pending(cl: lib.Cluster, python: str, pending_s: float) -> list[dict]:
    """A driver waits on a placement group no node can hold; the watch ends it with one line."""
    driver = Run(cl, "node1", [python, "-c", DRIVER], node_env(python))
    deadline = time.monotonic() + STEP_S
    while driver.when("PG ") is None and driver.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    asked = driver.when("PG ")
    grace = 10.0
    args = [
        "watch",
        "--pending-timeout",
        f"{pending_s:g}",
        "--interval",
        "1",
        "--end-driver",
        "--grace",
        f"{grace:g}",
    ]
    watch = run(cl, "node1", _tool(python, *args), node_env(python), timeout=pending_s + grace + STEP_S)
    driver_rc = driver.wait(30)
    ended = round(driver.seconds - asked, 1) if asked is not None else None
    extra = True
    if asked is None:
        extra = f"the driver never made its group: {driver.text()[-1500:]}"
    elif driver_rc is None:
        extra = "the driver was still waiting 30 s after the watch ended"
    elif driver.when("PLACED") is not None:
        extra = "the group was placed"
    pattern = (
        r"ray_cluster: error: placement group faults_pool_0 \(STRICT_PACK, 2 bundles of \{CPU: 1, cpu: 1\}\) "
        rf"pending for {pending_s:g}s: no alive node offers cpu 2 on one node \(STRICT_PACK\); the nodes offer: "
        rf".*; ended its driver \(pid \d+, SIGTERM\)"
    )
    row = _check(
        f"ray_cluster watch --pending-timeout {pending_s:g} --end-driver",
        watch,
        1,
        pattern,
        pending_s + grace + MARGIN_S,
        extra,
    )
    row.update(driver_rc=driver_rc, driver_ended_s=ended)
    return [row]


def leftovers(rec: dict) -> list[str]:
    """What a cluster left after its teardown: its state file, network namespaces, links, processes."""
    left = ["state file"] if lib.state_file(rec["name"]).exists() else []
    netns = set(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else set()
    left += [f"netns {n['netns']}" for n in rec["nodes"] if n["netns"] in netns]
    left += [
        f"link {link}"
        for link in [rec["bridge"], *(n["link"] for n in rec["nodes"])]
        if Path("/sys/class/net", link).exists()
    ]
    for node in rec["nodes"]:
        for pid, start in (
            (node["init_pid"], node["init_start"]),
            (node["unshare_pid"], node["unshare_start"]),
        ):
            if pid and lib.start_time(pid) == start:
                left.append(f"{node['name']} pid {pid}")
    return left


def run_kinds(kinds: list[str], python: str, wait_s: float, pending_s: float, root: Path) -> list[dict]:
    """Each kind on a fresh cluster (ifname: one node, no Ray; the others share one two-node cluster, in
    order: the head's wait, the NPU-only worker, the resource check, the pending group). Rows: one per check."""
    rows: list[dict] = []
    tag = f"cf{os.getpid()}"

    def with_cluster(name: str, nodes: int, body) -> None:
        rec = None
        try:
            with lib.Cluster(name, nodes, root=root / name) as cl:
                rec = cl.to_json()
                body(cl)
        except lib.ClusterError as exc:
            rows.append({"kind": name, "check": "the cluster", "ok": False, "why": str(exc)})
        if rec is not None:
            left = leftovers(rec)
            rows.append(
                {
                    "kind": name,
                    "check": "teardown",
                    "ok": not left,
                    "why": f"left {left}" if left else "",
                    "line": "",
                }
            )

    def add(kind: str, found: list[dict]) -> None:
        rows.extend({"kind": kind, **row} for row in found)

    from ascend_rl.harness.multinode import cache_for_nodes

    # ray_start.sh makes the base's verl tree in a node, which reaches no index
    cache_for_nodes(STARTUP_BASE, megatron=False)
    if "ifname" in kinds:
        with_cluster(f"{tag}-if", 1, lambda cl: add("ifname", fault_ifname(cl, python)))
    rest = [k for k in KINDS[1:] if k in kinds]
    if rest:

        def body(cl: lib.Cluster) -> None:
            add(
                "no-worker" if "no-worker" in rest else "setup",
                start_head(cl, python, wait_s, "no-worker" in rest),
            )
            if "resource" in rest or "pg-pending" in rest:
                add("setup", join_npu_worker(cl, python))
                if not all(r["ok"] for r in rows if r["kind"] == "setup"):
                    return
                if "resource" in rest:
                    add("resource", fault_resource(cl, python))
                if "pg-pending" in rest:
                    add("pg-pending", fault_pg_pending(cl, python, pending_s))

        with_cluster(f"{tag}-ray", 2, body)
    return rows


# --- the launcher across the nodes: a node-local checkpoint folder, a node lost in step 2 --------------------

# in the environment of every process of a run (the launcher's, and Ray's workers through the job's runtime_env)
RUN_TAG_ENV = "RECIPES_CLUSTER_FAULT_RUN"
STEPS = 3


def _training_overrides(run_dir: Path, tag: str) -> list[str]:
    """The e2e deepseek run's settings (3 steps, the lr that moves the policy), a checkpoint every step (step 1's
    exists before step 2), resume_mode=auto; the Ray workers (the raylets' children on each node, which inherit
    only the job's runtime_env) get the metrics file and the run's tag."""
    import argparse as _argparse

    from ascend_rl.harness import e2e

    ns = _argparse.Namespace(steps=STEPS, lr=2e-3, prompts=4, out=run_dir.parent, disable_weight_sync=False)
    kept = [o for o in e2e.run_overrides("deepseek", ns) if "RECIPE_RESHARD_REPORT" not in o]
    env = "+ray_kwargs.ray_init.runtime_env.env_vars"
    return kept + [
        "trainer.save_freq=1",
        "trainer.resume_mode=auto",
        f"{env}.VERL_FILE_LOGGER_PATH={run_dir / 'metrics.jsonl'}",
        f"{env}.{RUN_TAG_ENV}={tag}",
    ]


def _launch(
    cl: lib.Cluster, name: str, out: Path, inputs, base: str, ckpt: Path, run_name: str, timeout: float
):
    """The DeepSeek launcher's CPU profile with NNODES=2 on node1: (RunResult or None, HarnessError or None, the
    monotonic time it started). Checkpoints in ckpt/run_name (a rerun of the same run_name resumes there)."""
    from ascend_rl.harness.launch import DS_LAUNCHER, HarnessError, launch

    model_dir, data_dir = inputs
    tag = f"{out}/{name}"
    prefix = cl.exec_argv("node1", ["env", f"RAY_TMPDIR={cl.ray_tmpdir}", f"NNODES={len(cl.nodes)}"], wd=REPO)
    t0 = time.monotonic()
    try:
        result = launch(
            name,
            DS_LAUNCHER,
            _training_overrides(out / name, tag),
            out,
            model_dir,
            data_dir,
            timeout_s=timeout,
            prefix="cluster_faults",
            base=base,
            cmd_prefix=prefix,
            extra_env={"CKPT_DIR": str(ckpt), "RUN_NAME": run_name, RUN_TAG_ENV: tag},
        )
        return result, None, t0
    except HarnessError as err:
        return None, err, t0


def _said(log: Path, prefix: str) -> list[str]:
    """The lines of a launcher's log that start with `prefix` (its one-line reasons)."""
    try:
        text = log.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    return [line.strip() for line in text.splitlines() if line.startswith(prefix)]


def fault_local_ckpt(cl: lib.Cluster, out: Path, inputs, base: str, timeout: float) -> list[dict]:
    """trainer.default_local_dir on the node-local folder: the launcher refuses before main_ppo, in one line."""
    name = "local-ckpt"
    result, err, t0 = _launch(cl, name, out, inputs, base, cl.local / "ckpt", "cf_local_ckpt", timeout)
    took = round(time.monotonic() - t0, 1)
    log = out / name / "launcher.log"
    text = log.read_text(encoding="utf-8", errors="replace") if log.is_file() else ""
    said = _said(log, "ray_cluster: error: ")
    worker = cl.address("node2")
    pattern = (
        rf"ray_cluster: error: trainer\.default_local_dir {re.escape(str(cl.local))}/ckpt/cf_local_ckpt is not one "
        rf"folder every node sees: 1 of 2 nodes do not see the marker file the head wrote there \({re.escape(worker)} "
        r"\(node2\): no marker \(No such file or directory\)\); put it on a folder every node mounts .*"
    )
    problems = []
    if result is not None:
        problems.append("the launcher trained: it did not refuse")
    elif "exit status 1" not in str(err):
        problems.append(f"the launcher did not exit 1: {err}")
    if len(said) != 1 or not re.fullmatch(pattern, said[0]):
        problems.append(f"its one line does not match {pattern!r}: {said}")
    if "logging to " in text or "main_ppo" in text:
        problems.append("main_ppo started")
    if "Traceback (most recent call last)" in text:
        problems.append("a traceback")
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines or lines[-1].strip() != (said[-1] if said else None):
        problems.append(f"the launcher's last line is not the one line: {lines[-1:]}")
    return [
        {
            "check": "trainer.default_local_dir on the node-local folder",
            "rc": 1 if err is not None else 0,
            "seconds": took,
            "line": said[-1] if said else "",
            "ok": not problems,
            "why": "; ".join(problems),
            "ray_npu_noise": 0,
        }
    ]


def fault_node_lost(cl: lib.Cluster, out: Path, inputs, base: str, timeout: float) -> list[dict]:
    """node2 lost in step 2 of a run across both nodes; then node2 back, and a rerun that resumes."""
    from ascend_rl.harness import multinode
    from ascend_rl.harness.faults import leftovers as run_leftovers
    from ascend_rl.harness.faults import newest_complete

    name, run_name = "node-lost", "cf_node_lost"
    ckpt = cl.shared / "ckpt"
    # a metrics file left by an earlier command would read as step 1 logged
    shutil.rmtree(out / name, ignore_errors=True)
    metrics = out / name / "metrics.jsonl"
    state: dict = {}

    def kill_in_step_2() -> None:
        while not state.get("done"):
            try:
                logged = metrics.is_file() and bool(metrics.read_text(encoding="utf-8").strip())
            except OSError:
                logged = False
            if logged:  # step 1 logged: its checkpoint was saved before; the run is in step 2 now
                state["killed_at"] = time.monotonic()
                cl.kill("node2", why="lost in step 2 by cluster_faults")
                return
            time.sleep(0.2)

    killer = threading.Thread(target=kill_in_step_2, daemon=True)
    killer.start()
    result, err, t0 = _launch(cl, name, out, inputs, base, ckpt, run_name, timeout)
    state["done"] = True
    killer.join(timeout=10)
    tag = f"{out}/{name}"
    row: dict = {"check": "node2 lost in step 2", "ray_npu_noise": 0, "rc": None}
    if "killed_at" not in state:
        why = (
            "the run finished before step 1 was logged" if result else f"the run failed before step 2: {err}"
        )
        return [{**row, "ok": False, "why": why, "seconds": None, "line": ""}]
    ended = t0 + (err.measured.wall_s if err is not None and err.measured else time.monotonic() - t0)
    row["seconds"] = round(ended - state["killed_at"], 1)
    said = _said(out / name / "launcher.log", "run: ")
    row["line"] = said[-1] if said else ""
    row["left"], row["left_names"] = run_leftovers(tag)
    row["newest_complete"] = newest_complete(ckpt / run_name)
    worker = cl.address("node2")
    problems = []
    if result is not None:
        problems.append("the run finished: losing node2 did not end it")
    if row["seconds"] > END_WITHIN_S:
        problems.append(f"it ended {row['seconds']}s after the kill, more than {END_WITHIN_S:g}s")
    if not re.fullmatch(rf"run: node {re.escape(worker)} was lost in step 2\b.*", row["line"]):
        problems.append(f"its one line does not name node {worker} and step 2: {said[-1:]}")
    if row["left"]:
        problems.append(f"{row['left']} processes of the run left: {row['left_names']}")
    if row["newest_complete"] is None:
        problems.append(f"no complete checkpoint in {ckpt / run_name}")
    rows = [{**row, "ok": not problems, "why": "; ".join(problems)}]

    # node2 back, its Ray joined to the head's again as the README says, then the same launch again
    t1 = time.monotonic()
    revived: dict = {"check": "node2 back (revive, ray_start.sh --worker)", "ray_npu_noise": 0, "line": ""}
    try:
        cl.revive("node2")
        cmd = ["bash", str(multinode.RAY_START), "--cpu", "--worker", f"{cl.address('node1')}:{PORT}"]
        with open(out / "ray_start_revived.log", "w", encoding="utf-8") as log:
            done = cl.run(
                "node2",
                cmd,
                wd=REPO,
                env=multinode.node_env(base),
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=STEP_S,
            )
        revived.update(
            rc=done.returncode, ok=done.returncode == 0, why="" if done.returncode == 0 else "exit"
        )
    except (lib.ClusterError, subprocess.TimeoutExpired) as exc:
        revived.update(rc=None, ok=False, why=str(exc))
    revived["seconds"] = round(time.monotonic() - t1, 1)
    rows.append(revived)
    if not revived["ok"]:
        return rows
    rerun, rerun_err, _ = _launch(cl, f"{name}-rerun", out, inputs, base, ckpt, run_name, timeout)
    want = row["newest_complete"]
    steps = [r["step"] for r in rerun.rows] if rerun else []
    resumed = rerun.resumed_from if rerun else None
    ok = (
        rerun is not None
        and want is not None
        and resumed == want
        and steps == list(range(want + 1, STEPS + 1))
    )
    rows.append(
        {
            "check": "the rerun resumes from the newest complete checkpoint",
            "ray_npu_noise": 0,
            "rc": 0 if rerun else 1,
            "seconds": round(rerun.wall_s, 1) if rerun else None,
            "line": f"resumed from step {resumed}, did steps {steps}" if rerun else str(rerun_err),
            "resumed_from": resumed,
            "rerun_steps": steps,
            "ok": ok,
            "why": ""
            if ok
            else f"resumed from {resumed}, not {want}, or did not finish: {rerun_err or steps}",
        }
    )
    return rows


def run_training_kinds(kinds: list[str], out: Path, root: Path, base: str, timeout: float) -> list[dict]:
    """The launcher across a fresh two-node cluster whose Ray ray_start.sh started (as the e2e run deepseek-2n
    does): the node-local checkpoint folder first (the launcher refuses before training), then the lost node."""
    from ascend_rl.harness import e2e, multinode
    from ascend_rl.harness.launch import check_interpreter, out_lock

    check_interpreter()
    rows: list[dict] = []
    name = f"cf{os.getpid()}-train"
    with out_lock(out, "cluster_faults"):
        inputs = e2e.prepare_deepseek_inputs(out, base=base)
        rec = None
        try:
            with lib.Cluster(name, 2, root=root / name) as cl:
                rec = cl.to_json()
                t0 = time.monotonic()
                multinode.start_ray(cl, base, out / "ray_start.log", REPO)
                rows.append(
                    {
                        "kind": "setup",
                        "check": "ray_start.sh on both nodes",
                        "seconds": round(time.monotonic() - t0, 1),
                        "ok": True,
                        "line": "",
                    }
                )
                if "local-ckpt" in kinds:
                    rows += [
                        {"kind": "local-ckpt", **r} for r in fault_local_ckpt(cl, out, inputs, base, timeout)
                    ]
                if "node-lost" in kinds:
                    rows += [
                        {"kind": "node-lost", **r} for r in fault_node_lost(cl, out, inputs, base, timeout)
                    ]
        except lib.ClusterError as exc:
            rows.append({"kind": "setup", "check": "the cluster", "ok": False, "why": str(exc)})
        except HarnessError as exc:  # Ray's start-up on the nodes, one line
            rows.append(
                {"kind": "setup", "check": "ray_start.sh on both nodes", "ok": False, "why": str(exc)}
            )
        if rec is not None:
            left = leftovers(rec)
            rows.append(
                {
                    "kind": "teardown",
                    "check": "teardown",
                    "ok": not left,
                    "why": f"left {left}" if left else "",
                    "line": "",
                }
            )
    return rows


def table(rows: list[dict]) -> str:
    lines = []
    for r in rows:
        took = f"{r['seconds']}s" if r.get("seconds") is not None else "-"
        lines.append(
            f"{r['kind']:<10} {r['check']:<52} {took:>7}  {'pass' if r['ok'] else 'FAIL: ' + r.get('why', '')}"
        )
        if r.get("line"):
            lines.append(f"{'':<11}said: {r['line']}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python3 -m ascend_rl cluster_faults",
        description=__doc__.splitlines()[0],
        epilog="Needs root and `ip netns` (the simulated cluster, docs/cluster.md); about a minute on 2 cores.",
    )
    parser.add_argument(
        "--kinds", default=",".join(KINDS), help="comma-separated kinds (default: %(default)s)"
    )
    parser.add_argument(
        "--wait", type=float, default=5.0, help="the node wait's --timeout (default: %(default)s)"
    )
    parser.add_argument(
        "--pending-timeout",
        type=float,
        default=5.0,
        help="the watch's --pending-timeout (default: %(default)s)",
    )
    parser.add_argument(
        "--python", default=sys.executable, help="the Python with Ray the nodes run (default: this one)"
    )
    parser.add_argument("--json", type=Path, help="also write the rows to this file")
    parser.add_argument(
        "--out",
        type=Path,
        default=REPO / "e2e_out" / "cluster_faults",
        help="the training kinds' run folders (default: %(default)s)",
    )
    parser.add_argument(
        "--base", default="0.6.0", help="the training kinds' verl base (default: %(default)s)"
    )
    parser.add_argument(
        "--timeout", type=float, default=900, help="seconds one training run may take (default: %(default)s)"
    )
    args = parser.parse_args(argv)
    args.kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    if not args.kinds or set(args.kinds) - set(KINDS + TRAINING_KINDS):
        parser.error(f"--kinds takes {', '.join(KINDS + TRAINING_KINDS)}; got {args.kinds}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        lib.check_support()
    except lib.Unsupported as exc:
        print(f"cluster_faults: error: {exc}", file=sys.stderr)
        return 2
    root = Path(tempfile.mkdtemp(prefix="ascend_rl-cluster-faults-"))
    rows = []
    try:
        with lib.terminate_raises():
            startup = [k for k in args.kinds if k in KINDS]
            if startup:
                rows += run_kinds(startup, args.python, args.wait, args.pending_timeout, root)
            training = [k for k in args.kinds if k in TRAINING_KINDS]
            if training:
                rows += run_training_kinds(training, args.out.absolute(), root, args.base, args.timeout)
    except HarnessError as exc:
        print(f"cluster_faults: error: {exc}", file=sys.stderr)
        return 2
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps({"rows": rows}, indent=1) + "\n")
    print(table(rows))
    return 0 if rows and all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
