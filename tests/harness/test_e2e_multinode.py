"""The DeepSeek recipe's own multi-node path on two simulated nodes (`make test-full`): `python -m ascend_rl e2e
--runs deepseek-2n,deepseek-v071-2n,deepseek-v091-2n`.

Each run makes a simulated cluster (ascend_rl.harness.sim_cluster), runs ray_start.sh --cpu on each node as the
recipe README says (--head --nodes 2 on node1, --worker on node2, SOCKET_IFNAME=eth0), then the DeepSeek
launcher's CPU profile with NNODES=2 on node1: the Megatron actor with one rank per node (EP=2 across the nodes),
a vLLM engine on each node, 3 GRPO steps, on verl 0.6.0, 0.7.1 and 0.9.1 (its Megatron engine, in the 0.9.1 e2e
environment, which every node's Ray runs: multinode.node_env). The checks are the single-node deepseek runs'
(weight sync, one actor forward per step, the AlltoAllV bytes per rank against the plan) and where each rank ran:
its own node, the node's eth0 for every socket setting, one torch.distributed master off loopback
(ascend_rl/harness/multinode.py). Needs root and `ip netns` (skipped otherwise, with the reason) and the e2e
environment (the e2e_python fixture; e2e_python_091 for the 0.9.1 run).
The quick checks of the same code (dry run, the evidence check on good and bad input): test_multinode_checks.py.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

import tier_report
from cluster_support import NO_CLUSTER

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.full
RUNS = ("deepseek-2n", "deepseek-v071-2n", "deepseek-v091-2n")
PEAK_PSS_GIB = 14  # per run: every process of both nodes, summed PSS


@pytest.fixture(scope="module")
def multinode(e2e_python, e2e_python_091, tmp_path_factory):
    if NO_CLUSTER:
        pytest.skip(f"the simulated cluster: {NO_CLUSTER}")
    out = tmp_path_factory.mktemp("e2e-multinode") / "e2e_out"
    proc = subprocess.run(
        [str(e2e_python), "-m", "ascend_rl", "e2e", "--out", str(out), "--runs", ",".join(RUNS)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    path = out / "summary.json"
    summary = json.loads(path.read_text()) if path.is_file() else {}
    tier_report.record_e2e("e2e_multinode", summary, list(RUNS))
    return proc, summary, out


def _tail(proc: subprocess.CompletedProcess) -> str:
    return f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"


@pytest.mark.parametrize(
    "run, base, syncs",
    [("deepseek-2n", "0.6.0", 3), ("deepseek-v071-2n", "0.7.1", 4), ("deepseek-v091-2n", "0.9.1", 4)],
)
def test_the_deepseek_launcher_trains_across_two_nodes(multinode, run, base, syncs):
    """3 GRPO steps with one rank per node; the single-node runs' checks all hold (weight sync, one forward, the
    planned AlltoAllV bytes on both ranks at every sync)."""
    proc, summary, _ = multinode
    assert summary, _tail(proc)
    r = summary["runs"][run]
    assert r["nodes"] == 2 and r["base"] == base and r["steps_done"] == [1, 2, 3]
    checks = {c["check"]: c for c in summary["checks"] if c["run"] == run}
    assert {"weight sync", "one forward", "reshard bytes", "nodes"} <= set(checks), checks
    assert all(c["ok"] for c in checks.values()), checks
    assert sorted({row["sync"] for row in r["reshard"]}) == list(range(1, syncs + 1))
    assert {row["rank"] for row in r["reshard"]} == {0, 1}


@pytest.mark.parametrize("run", RUNS)
def test_each_rank_ran_on_its_own_node_through_eth0(multinode, run):
    """Per rank, what the process itself saw: its node's address and host name (two different nodes), the socket
    interface variables (eth0, the node's own), the torch.distributed master (rank 0's node); a vLLM engine on
    each node whose DP size is 1 (no DP group to cross the nodes)."""
    proc, summary, _ = multinode
    assert summary, _tail(proc)
    r = summary["runs"][run]
    addresses = r["cluster"]["addresses"]
    ev = r["evidence"]
    ranks = ev["ranks"]
    assert [x["rank"] for x in ranks] == [0, 1]
    assert [x["node"] for x in ranks] == [
        addresses["node1"],
        addresses["node2"],
    ]  # verl put rank 0 on the head
    assert [x["hostname"] for x in ranks] == ["node1", "node2"]
    for x in ranks:
        assert set(x["ifname"].values()) == {"eth0"} and x["ifname_addr"] == x["node"], x
        assert x["master_addr"] == addresses["node1"], x
    assert sorted(e["node"] for e in ev["engines"]) == sorted(addresses.values())
    assert all(e["data_parallel_size"] == 1 for e in ev["engines"]), ev["engines"]
    if run in (
        "deepseek-v071-2n",
        "deepseek-v091-2n",
    ):  # the vLLM servers, one per node, each on its node's address
        assert sorted(s["server_address"] for s in ev["servers"]) == sorted(addresses.values())


@pytest.mark.parametrize("run", RUNS)
def test_the_two_nodes_stay_within_the_memory_budget(multinode, run):
    proc, summary, _ = multinode
    assert summary, _tail(proc)
    r = summary["runs"][run]
    assert 0 < r["peak_pss_gib"] <= PEAK_PSS_GIB, r["cluster"]
    assert set(r["cluster"]["pss_gib_at_peak"]) == {"node1", "node2"}
