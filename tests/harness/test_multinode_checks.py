"""The quick half of the DeepSeek launcher's multi-node runs (the runs themselves: test_e2e_multinode.py, full tier).

- The launcher's CPU dry run with NNODES=2 keeps the node count (trainer.nnodes=2, one rank per node) and leaves
  out the ray_init resources a private Ray needs, which Ray refuses when main_ppo attaches to the cluster that
  ray_start.sh --cpu made; without NNODES it is still the one-machine profile.
- The rank evidence check (ascend_rl/harness/multinode.py) passes ranks that ran on their own nodes through eth0,
  and fails ranks that shared a node, sockets on lo, a loopback master, a missing vLLM engine. Its input is what
  the rank_evidence hook writes: one test runs the hook for real in two torch.distributed gloo ranks, across two
  simulated nodes and then both on one node over lo (root and `ip netns`; skipped otherwise).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from ascend_rl.harness import multinode
from ascend_rl.harness import sim_cluster as lib
from ascend_rl.paths import HOOK_PATH
from cluster_support import needs_cluster
from launcher_env import dry_run_plan, launcher_env, run_launcher

REPO = Path(__file__).resolve().parents[2]
DS_LAUNCHER = REPO / "llm_rl" / "deepseek_r1" / "run_deepseek_r1_a3.sh"
RAY_INIT = (
    "+ray_kwargs.ray_init.num_cpus",
    "+ray_kwargs.ray_init.num_gpus",
    "+ray_kwargs.ray_init.resources",
)


def _dry_run(tmp_path: Path, verl_tree: Path, **extra: str) -> tuple[list[str], str]:
    env = launcher_env(tmp_path, verl_tree)
    for name in ("NNODES", "NPUS_PER_NODE"):  # the profile's defaults unless the test sets them
        env.pop(name, None)
    env.update(extra)
    proc = run_launcher(DS_LAUNCHER, ["--cpu", "--dry-run", "--json"], env)
    return dry_run_plan(proc)["argv"], proc.stderr


def test_cpu_dry_run_with_nnodes_2_attaches_to_the_cluster(tmp_path, verl_tree):
    argv, report = _dry_run(tmp_path, verl_tree, NNODES="2")
    assert "trainer.nnodes=2" in argv and "trainer.n_gpus_per_node=1" in argv
    assert "trainer.nnodes=1" not in argv  # the profile no longer forces one node
    assert not [a for a in argv if a.startswith(RAY_INIT)], "Ray refuses these when attaching to a cluster"
    assert (
        "+ray_kwargs.ray_init.runtime_env.env_vars.RAY_USE_UVLOOP='0'" in argv
    )  # the workers' settings stay
    assert "nodes      ok       2 (NNODES = trainer.nnodes)" in report
    nodes = [line for line in report.splitlines() if line.startswith("node ")]
    assert "ray_start.sh --cpu --head --nodes 2" in nodes[0] and "ray_start.sh --cpu --worker" in nodes[1]
    assert "NNODES=2" in nodes[2] and "run_deepseek_r1_a3.sh --cpu" in nodes[2]


def test_cpu_dry_run_without_nnodes_is_one_machine_with_its_own_ray(tmp_path, verl_tree):
    argv, _ = _dry_run(tmp_path, verl_tree)
    assert "trainer.nnodes=1" in argv and "trainer.n_gpus_per_node=2" in argv
    assert "+ray_kwargs.ray_init.num_cpus=8" in argv and "+ray_kwargs.ray_init.num_gpus=2" in argv
    assert "+ray_kwargs.ray_init.resources={cpu:2}" in argv


# --- the evidence check --------------------------------------------------------------------------------

HEAD, WORKER = "198.18.0.1", "198.18.0.2"
ETH0 = dict.fromkeys(("GLOO_SOCKET_IFNAME", "HCCL_SOCKET_IFNAME", "TP_SOCKET_IFNAME"), "eth0")


def _rank(rank: int, node: str, host: str, other: str, **change) -> dict:
    """One trainer rank's line as the hook writes it."""
    rec = {
        "kind": "torch.distributed",
        "caller": "verl.workers.megatron_workers",
        "rank": rank,
        "world_size": 2,
        "backend": "gloo",
        "master_addr": HEAD,
        "master_port": "40000",
        "init_method": None,
        # the gloo pair with the other rank (whose group listens on port 41000 + its rank), and the master's store
        "tcp": [[node, 41000 + rank, other, 41001 - rank], [node, 50000 + rank, HEAD, 40000]],
        "listen": [[node, 41000 + rank]],
        "pid": 100 + rank,
        "hostname": host,
        "ifname": dict(ETH0),
        "ifname_addr": node,
        "ray_node_ip": node,
    }
    rec.update(change)
    return rec


def _engine(node: str, host: str, dp: int = 1, master: str = "127.0.0.1") -> dict:
    return {
        "kind": "vllm.engine",
        "parallel": {
            "data_parallel_size": dp,
            "data_parallel_master_ip": master,
            "data_parallel_master_port": 0,
        },
        "env": {},
        "pid": 200,
        "hostname": host,
        "ifname": dict(ETH0),
        "ifname_addr": node,
        "ray_node_ip": None,
    }


def _good() -> list[dict]:
    return [
        _rank(0, HEAD, "node1", WORKER),
        _rank(1, WORKER, "node2", HEAD),
        _engine(HEAD, "node1"),
        _engine(WORKER, "node2"),
    ]


def _problems(records: list[dict]) -> list[str]:
    return multinode.check_evidence(multinode.summarise_evidence(records), 2, [HEAD, WORKER])


def test_evidence_of_one_rank_per_node_through_eth0_passes():
    assert _problems(_good()) == []
    # a socket another thread of the process opened meanwhile (not the group's ports) is not the group's
    other = _good()
    other[0]["tcp"].append(["127.0.0.1", 6000, "127.0.0.1", 6001])
    assert _problems(other) == []
    ev = multinode.summarise_evidence(_good())
    assert [(r["rank"], r["node"], r["hostname"]) for r in ev["ranks"]] == [
        (0, HEAD, "node1"),
        (1, WORKER, "node2"),
    ]
    assert all(e["dp_master"].startswith("DP=1 per engine") for e in ev["engines"])


def test_evidence_of_ranks_sharing_a_node_fails():
    records = [
        _rank(0, HEAD, "node1", HEAD),
        _rank(1, HEAD, "node1", HEAD, pid=102),
        _engine(HEAD, "node1"),
        _engine(HEAD, "node1"),
    ]
    problems = "\n".join(_problems(records))
    assert "ran on 1 node(s)" in problems and "host names" in problems
    assert "no torch.distributed connection to another node" in problems


def test_evidence_of_sockets_on_loopback_fails():
    records = _good()
    records[1] = _rank(
        1,
        WORKER,
        "node2",
        HEAD,
        ifname=dict.fromkeys(ETH0, "lo"),
        ifname_addr="127.0.0.1",
        tcp=[["127.0.0.1", 50001, HEAD, 40000], ["127.0.0.1", 41001, "127.0.0.1", 41000]],
    )
    problems = "\n".join(_problems(records))
    assert "socket interface" in problems and "'lo'" in problems
    assert "eth0 has 127.0.0.1, not the node's address" in problems
    assert "connection on loopback" in problems


def test_evidence_of_a_loopback_master_or_a_missing_engine_fails():
    records = [_rank(0, HEAD, "node1", WORKER, master_addr="127.0.0.1"), _rank(1, WORKER, "node2", HEAD)]
    records += [_engine(HEAD, "node1")]
    problems = "\n".join(_problems(records))
    assert "disagree on the torch.distributed master" in problems
    assert "master 127.0.0.1, not rank 0's node address" in problems
    assert "1 vLLM engine(s) for 2 ranks" in problems
    dp = _good()
    dp[2] = _engine(HEAD, "node1", dp=2, master="127.0.0.1")
    assert any("DP master 127.0.0.1:0 on loopback" in p for p in _problems(dp))


def test_no_evidence_fails():
    assert _problems([]) == ["no trainer rank recorded where it ran (the rank_evidence hook did not run)"]


# --- the hook itself, in two real gloo ranks ------------------------------------------------------------

# A trainer rank as verl starts one: torch.distributed on gloo, called from a verl module (the hook records the
# caller; the evidence check counts only verl's calls as trainer ranks).
RANK = r"""
import datetime, sys
import torch.distributed as dist
code = "dist.init_process_group('gloo', rank=int(sys.argv[1]), world_size=2, timeout=datetime.timedelta(seconds=60))"
exec(code, {"__name__": "verl.workers.megatron_workers", "dist": dist, "sys": sys, "datetime": datetime})
dist.barrier()
dist.destroy_process_group()
"""


def _ranks(popen, env: dict[str, str]) -> None:
    procs = [popen(r, [sys.executable, "-c", RANK, str(r)], env) for r in (0, 1)]
    for proc in procs:
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, out[-2000:]


@needs_cluster
def test_the_hook_in_real_gloo_ranks_across_two_nodes_and_on_one(tmp_path):
    base = dict(
        os.environ, PYTHONPATH=os.pathsep.join([*map(str, HOOK_PATH), str(REPO)]), MASTER_PORT="29511"
    )
    pipe = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True}

    across = tmp_path / "across.jsonl"
    with lib.Cluster(f"ev{os.getpid()}", 2, root=tmp_path / "cluster") as cl:
        head, worker = cl.address("node1"), cl.address("node2")
        env = dict(base, MASTER_ADDR=head, RECIPES_RANK_EVIDENCE=str(across), **ETH0)
        _ranks(lambda r, cmd, e: cl.popen(f"node{r + 1}", cmd, wd=REPO, env=e, **pipe), env)
    records = [json.loads(line) for line in across.read_text().splitlines()]
    ev = multinode.summarise_evidence(records)
    assert [(r["rank"], r["node"], r["hostname"]) for r in ev["ranks"]] == [
        (0, head, "node1"),
        (1, worker, "node2"),
    ]
    problems = multinode.check_evidence(ev, 2, [head, worker])
    # no vLLM engine runs here, so the check misses them; everything about the ranks holds
    assert problems and all("vLLM engine" in p for p in problems), problems

    one = tmp_path / "one.jsonl"
    lo = dict.fromkeys(ETH0, "lo")
    env = dict(base, MASTER_ADDR="127.0.0.1", MASTER_PORT="29512", RECIPES_RANK_EVIDENCE=str(one), **lo)
    _ranks(lambda r, cmd, e: subprocess.Popen(cmd, cwd=REPO, env=e, **pipe), env)
    ev = multinode.summarise_evidence([json.loads(line) for line in one.read_text().splitlines()])
    problems = "\n".join(multinode.check_evidence(ev, 2, [head, worker]))
    assert "ran on 1 node(s) ['127.0.0.1'], not 2" in problems
    assert "ran on loopback" in problems and "socket interface" in problems
    assert "master 127.0.0.1, not rank 0's node address" in problems


# --- the cluster sampler: memory of every node's processes, eth0 bytes per logged step -------------------------

SINK = r"""
import socket, sys
srv = socket.create_server((sys.argv[1], 29600))
print("ready", flush=True)
conn, _ = srv.accept()
got = 0
while chunk := conn.recv(1 << 16):
    got += len(chunk)
print(got, flush=True)
"""
SEND = r"""
import socket, sys
with socket.create_connection((sys.argv[1], 29600)) as s:
    s.sendall(b"x" * int(sys.argv[2]))
"""


@needs_cluster
def test_the_sampler_counts_each_nodes_processes_and_eth0_bytes_per_step(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    sent = 3 * 2**20
    with lib.Cluster(f"sa{os.getpid()}", 2, root=tmp_path / "cluster") as cl:
        sampler = multinode.ClusterSampler(cl, metrics, every_s=0.1)
        sampler.start()
        try:
            worker = cl.address("node2")
            sink = cl.popen("node2", [sys.executable, "-c", SINK, worker], stdout=subprocess.PIPE, text=True)
            assert sink.stdout.readline().strip() == "ready"
            metrics.write_text('{"step": 1}\n')  # a step with no traffic
            time.sleep(0.5)
            cl.run("node1", [sys.executable, "-c", SEND, worker, str(sent)], check=True, timeout=60)
            assert int(sink.stdout.readline()) == sent
            sink.wait(timeout=30)
            metrics.write_text('{"step": 1}\n{"step": 2}\n')  # step 2: node1 sent 3 MiB to node2
            time.sleep(0.5)
        finally:
            sampler.stop()
    steps = sampler.bytes_per_step()
    assert [s["step"] for s in steps] == [1, 2], steps
    assert steps[0]["node1"]["tx"] < 2**16 and steps[0]["node2"]["rx"] < 2**16, steps
    assert sent <= steps[1]["node1"]["tx"] < sent * 1.2 and sent <= steps[1]["node2"]["rx"] < sent * 1.2, (
        steps
    )
    assert steps[1]["node1"]["rx"] < sent / 10, steps  # the other direction: acknowledgements only
    assert sampler.peak_pss > 0 and set(sampler.at_peak) == {"node1", "node2"}
    assert sampler.at_peak["node2"] > 0  # the sink's python ran in node2's namespaces and was counted there


def test_bench_nodes_prints_each_steps_bytes_beside_the_reshard_plan(tmp_path):
    from llm_rl.deepseek_r1 import bench_nodes

    run = tmp_path / "deepseek-2n"
    run.mkdir()
    steps = [
        {"step": 1, "node1": {"rx": 3 * 2**20, "tx": 4 * 2**20}, "node2": {"rx": 4 * 2**20, "tx": 3 * 2**20}}
    ]
    (run / "cluster.json").write_text(json.dumps({"addresses": {}, "eth0_bytes_per_step": steps}))
    rows = [{"rank": r, "sync": 1, "recv_bytes": 196608, "plan_recv_bytes": 196608} for r in (0, 1)]
    (run / "reshard.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    lines: list[str] = []
    assert bench_nodes.main(["--out", str(tmp_path), "--runs", "deepseek-2n"], out=lines.append) == 0
    assert any(line.split() == ["1", "node1", "3.00", "4.00"] for line in lines), lines
    assert any("received per rank and sync [196608] B, the plan's [196608] B" in line for line in lines), (
        lines
    )
    assert bench_nodes.main(["--out", str(tmp_path / "none")], out=lines.append) == 1  # nothing to read
