"""The head refuses a run whose nodes' Ray runs another Python environment than the driver (issue 48, item 1): a
node whose ray_start.sh found `.venv`'s Python while the launcher runs `.venv-e2e`'s passed the node wait and the run
failed 53 s later in step 1 (No module named 'zmq'). `ray_cluster wait --same-env VERL_DIR` (the launcher passes
it across nodes, NPU or CPU) asks a Ray task pinned to each node for its interpreter, verl, vLLM and torch, and
ends in one line naming the node and the difference."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ascend_rl import ray_cluster
from ascend_rl.harness import sim_cluster as lib
from ascend_rl.paths import REPO
from cluster_support import needs_cluster

RAY_START = "llm_rl/deepseek_r1/ray_start.sh"
STEP_S = 120  # a hang, not a measurement
NODE_ENV = {
    "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": os.environ.get("HOME", "/root"),
    "LANG": "C.UTF-8",
    "SOCKET_IFNAME": "eth0",
    "RAY_USAGE_STATS_ENABLED": "0",
    "VERL_BASE": "0.6.0",  # the e2e environment's stack (e2e_python), not the recipe's default base (0.9.1)
}

DRIVER = {
    "host": "node1",
    "executable": "/r/.venv-e2e/bin/python3",
    "python": "/r/.venv-e2e (Python 3.11.9)",
    "verl": "0.7.1",
    "vllm": "0.13.0",
    "torch": "2.9.1",
}


def test_the_line_names_the_node_and_each_difference():
    # bin/python on a node, bin/python3 in the driver: one environment, no difference
    same = {**DRIVER, "executable": "/r/.venv-e2e/bin/python"}
    other = {
        **DRIVER,
        "host": "node2",
        "python": "/r/.venv (Python 3.11.9)",
        "vllm": None,
        "torch": "2.13.0+cpu",
    }
    assert ray_cluster.environment_line(DRIVER, {"10.0.0.1 (node1)": same, "10.0.0.2 (node2)": same}) is None
    line = ray_cluster.environment_line(DRIVER, {"10.0.0.1 (node1)": same, "10.0.0.2 (node2)": other})
    assert "\n" not in line
    assert line.startswith("node 10.0.0.2 (node2) runs another Python environment than this run's driver")
    assert (
        "python /r/.venv (Python 3.11.9), not /r/.venv-e2e (Python 3.11.9); vllm absent, not 0.13.0; " in line
    )
    assert "torch 2.13.0+cpu, not 2.9.1" in line and "verl" not in line.split("driver")[1].split("start")[0]
    assert "PYTHON=/r/.venv-e2e/bin/python3 bash llm_rl/deepseek_r1/ray_start.sh" in line
    # another base on a node is a difference too; the first node by address is named, the others counted
    older = {**DRIVER, "verl": "0.6.0"}
    line = ray_cluster.environment_line(DRIVER, {"10.0.0.10 (n10)": other, "10.0.0.9 (n9)": older})
    assert line.startswith("node 10.0.0.9 (n9) ") and "verl 0.6.0, not 0.7.1 (1 more node differ)" in line


def test_a_verl_tree_is_read_by_its_version_file(tmp_path, pristine_verl):
    facts = ray_cluster.environment_facts(str(pristine_verl))
    assert facts["verl"] == "0.6.0" and facts["executable"] == sys.executable
    assert facts["python"].startswith(os.path.realpath(sys.prefix) + " (Python 3.")
    assert ray_cluster.environment_facts(str(tmp_path))["verl"] is None


def _start(cl: lib.Cluster, node: str, python: str, verl: str, *args: str) -> subprocess.CompletedProcess:
    env = {**NODE_ENV, "PYTHON": python, "VERL_DIR": verl}
    return cl.run(
        node,
        ["bash", RAY_START, "--cpu", *args],
        wd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=STEP_S,
    )


def _wait(cl: lib.Cluster, python: str, nodes: int, verl: str) -> subprocess.CompletedProcess:
    argv = [python, "-m", "ascend_rl", "ray_cluster", "wait", "--nodes", str(nodes), "--timeout", "60"]
    return cl.run(
        "node1",
        [*argv, "--same-env", verl],
        wd=REPO,
        env=NODE_ENV,
        capture_output=True,
        text=True,
        timeout=STEP_S,
    )


@needs_cluster
@pytest.mark.ci
def test_the_head_refuses_a_node_whose_ray_runs_another_python(tmp_path, e2e_python, base_tree):
    # a tree of the test's own: ray_start.sh makes VERL_DIR ready on its node (the series applied), as the launcher does
    e2e, dev, verl = str(e2e_python), sys.executable, str(base_tree("0.6.0"))
    # every node on the job's Python: the wait passes and says what they run
    with lib.Cluster(f"e{os.getpid()}", 1, root=tmp_path / "one") as cl:
        head = _start(cl, "node1", e2e, verl, "--head", "--nodes", "1")
        assert head.returncode == 0, head.stdout[-2000:] + head.stderr[-2000:]
        ok = _wait(cl, e2e, 1, verl)
        assert ok.returncode == 0, ok.stdout[-2000:] + ok.stderr[-2000:]
        where = os.path.realpath(Path(e2e).parent.parent)
        assert f"ray_cluster: every node of 1 runs this driver's environment ({where} (Python 3." in ok.stdout
        assert ", verl 0.6.0, vllm 0.13.0" in ok.stdout, ok.stdout
    # the case: node2 started from a shell with .venv activated, the run on .venv-e2e
    with lib.Cluster(f"f{os.getpid()}", 2, root=tmp_path / "two") as cl:
        head = _start(cl, "node1", e2e, verl, "--head", "--nodes", "1")
        assert head.returncode == 0, head.stdout[-2000:] + head.stderr[-2000:]
        worker = _start(cl, "node2", dev, verl, "--worker", f"{cl.address('node1')}:6379")
        assert worker.returncode == 0, worker.stdout[-2000:] + worker.stderr[-2000:]
        bad = _wait(cl, e2e, 2, verl)
        assert bad.returncode == 1, bad.stdout[-2000:] + bad.stderr[-2000:]
        errors = [line for line in bad.stderr.splitlines() if line.startswith("ray_cluster: error:")]
        assert len(errors) == 1 and "Traceback" not in bad.stderr, bad.stderr[-3000:]
        assert f"node {cl.address('node2')} (node2) runs another Python environment" in errors[0], errors[0]
        prefix = {py: os.path.realpath(Path(py).parent.parent) for py in (dev, e2e)}
        assert (
            f"python {prefix[dev]} (Python 3." in errors[0] and f"not {prefix[e2e]} (Python 3." in errors[0]
        ), errors
        assert "vllm absent, not 0.13.0" in errors[0], errors[0]
