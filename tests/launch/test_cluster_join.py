"""The DeepSeek recipe's multi-node start on the simulated cluster (issue 35 item 7, the short join test): two
nodes up, `ray_start.sh --cpu --head --nodes 2` on node1 and `ray_start.sh --cpu --worker HEAD_IP:6379` on node2
exactly as the recipe README says (SOCKET_IFNAME=eth0 as a user sets it, no venv on PATH: the script finds its
Python), the head's wait sees both nodes, then a gloo all-reduce between a Ray task on each node through the
socket settings ray_start.sh exported to the raylets, then teardown that leaves nothing. Ray is stopped only by
the cluster's teardown (the nodes' PID namespaces), never by `ray stop`. Skips without root or `ip netns`."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from ascend_rl.harness import sim_cluster as lib
from ascend_rl.paths import REPO
from cluster_support import NO_CLUSTER

if NO_CLUSTER:
    pytest.skip(NO_CLUSTER, allow_module_level=True)

from test_cluster import leftovers  # noqa: E402  (tests/launch: what a cluster leaves behind)

pytestmark = pytest.mark.ci

RAY_START = "llm_rl/deepseek_r1/ray_start.sh"
MASTER_PORT = 29500  # inside node1's own network namespace: nothing else of the machine is there
STEP_S = 120  # a hang, not a measurement

# A user's fresh shell on a node: no venv on PATH, no PYTHON; the cluster interface named as the README says.
# verl 0.6.0, named: the e2e environment's stack (e2e_python), whose Ray the script finds; the recipe's default base,
# 0.9.1, would take .venv-e2e-091's and offer Ray's GPU resource too (test_ray_start.py).
NODE_ENV = {
    "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": os.environ.get("HOME", "/root"),
    "LANG": "C.UTF-8",
    "SOCKET_IFNAME": "eth0",
    "RAY_USAGE_STATS_ENABLED": "0",
    "VERL_BASE": "0.6.0",
}

# The driver, on the head node: attaches to the cluster ray_start.sh made (through the node's own Ray folder),
# runs one rank per node (pinned, and asking for the lowercase `cpu` resource a CPU node offers, as verl's CPU
# bundles do), each initialising torch.distributed on gloo with MASTER_ADDR = the head's address.
DRIVER = r"""
import json, sys
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

head, worker, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
ray.init(address="auto", logging_level="ERROR", log_to_driver=False)
nodes = {n["NodeManagerAddress"]: n for n in ray.nodes() if n["Alive"]}
print("NODES " + json.dumps({ip: n["Resources"] for ip, n in nodes.items()}), flush=True)
if sorted(nodes) != sorted([head, worker]) or any(n["Resources"].get("cpu") != 1 for n in nodes.values()):
    sys.exit("the nodes are not the two ray_start.sh started, each offering cpu: 1")


@ray.remote(num_cpus=1, resources={"cpu": 1})
def rank(r, master, port):
    import datetime, os, socket
    import psutil, torch
    import torch.distributed as dist

    me = psutil.Process()

    def conns():
        return {
            (c.laddr.ip, c.laddr.port, c.raddr.ip if c.raddr else "", c.raddr.port if c.raddr else 0, c.status)
            for c in me.net_connections("tcp")
        }

    before = conns()
    os.environ.update(MASTER_ADDR=master, MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=r, world_size=2, timeout=datetime.timedelta(seconds=60))
    t = torch.full((1024,), float(r + 1))
    dist.all_reduce(t)
    new = sorted(conns() - before)
    dist.destroy_process_group()
    names = ("GLOO_SOCKET_IFNAME", "HCCL_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "MASTER_ADDR")
    return {
        "rank": r,
        "sum": sorted(set(t.tolist())),
        "hostname": socket.gethostname(),
        "node_ip": ray.util.get_node_ip_address(),
        "env": {k: os.environ.get(k) for k in names},
        "conns": new,
    }


pinned = [NodeAffinitySchedulingStrategy(nodes[ip]["NodeID"], soft=False) for ip in (head, worker)]
refs = [rank.options(scheduling_strategy=s).remote(r, head, port) for r, s in enumerate(pinned)]
print("RESULT " + json.dumps(ray.get(refs, timeout=90)), flush=True)
"""


class _Lines:
    """A process's merged output, read by a thread, so a test can wait for a line without blocking."""

    def __init__(self, proc: subprocess.Popen):
        self.proc, self.lines = proc, []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def text(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, needle: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not any(needle in line for line in self.lines):
            assert self.proc.poll() is None or self.thread.is_alive(), (
                f"ended before {needle!r}:\n{self.text()}"
            )
            assert time.monotonic() < deadline, f"no {needle!r} after {timeout}s:\n{self.text()}"
            time.sleep(0.1)


def _plain(ip: str) -> str:
    return ip.removeprefix("::ffff:")


def _namespaces(cl: lib.Cluster) -> set[tuple[str, int, int]]:
    """Every node's net, pid and mnt namespaces, as (kind, dev, inode), read while the nodes are up."""
    found = set()
    for node in cl.nodes:
        for kind in ("net", "pid", "mnt"):
            st = os.stat(f"/proc/{node.init_pid}/ns/{kind}")
            found.add((kind, st.st_dev, st.st_ino))
    return found


def _in_namespaces(spaces: set[tuple[str, int, int]]) -> list[str]:
    """The processes of the machine inside any of these namespaces."""
    left = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        for kind in ("net", "pid", "mnt"):
            try:
                st = os.stat(f"/proc/{entry.name}/ns/{kind}")
            except OSError:
                break
            if (kind, st.st_dev, st.st_ino) in spaces:
                left.append(f"pid {entry.name} in a node's {kind} namespace")
                break
    return left


def test_ray_start_on_two_nodes_then_gloo_across_them(tmp_path, e2e_python):
    t: dict[str, float] = {}
    t0 = time.monotonic()
    with lib.Cluster(f"j{os.getpid()}", 2, root=tmp_path / "cluster") as cl:
        rec, spaces = cl.to_json(), _namespaces(cl)
        head_ip, worker_ip = cl.address("node1"), cl.address("node2")
        t["up"] = time.monotonic() - t0

        head = cl.popen(
            "node1",
            ["bash", RAY_START, "--cpu", "--head", "--nodes", "2", "--timeout", "60"],
            wd=REPO,
            env=NODE_ENV,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            out = _Lines(head)
            out.wait_for("ray: 1/2 nodes alive", STEP_S)  # the head's Ray is up; its wait has begun
            t["head"] = time.monotonic() - t0
            worker = cl.run(
                "node2",
                ["bash", RAY_START, "--cpu", "--worker", f"{head_ip}:6379"],
                wd=REPO,
                env=NODE_ENV,
                capture_output=True,
                text=True,
                timeout=STEP_S,
            )
            t["worker"] = time.monotonic() - t0
            assert worker.returncode == 0, worker.stdout[-3000:] + worker.stderr[-3000:]
            assert head.wait(timeout=STEP_S) == 0, out.text()[-3000:]
            out.thread.join(timeout=10)
            t["joined"] = time.monotonic() - t0
        finally:
            head.kill()
            head.wait()
        head_out = out.text()
        assert "ray: 2/2 nodes alive" in head_out, head_out[-3000:]

        # each node: the recipe's socket settings name its own interface; the `ray` of the Python the script
        # found (the e2e environment's, by the launchers' own search: no venv is on PATH); a CPU node's resources
        ray_dir = Path(e2e_python).parent.resolve()
        for text, ip in ((head_out, head_ip), (worker.stdout, worker_ip)):
            command = next(line for line in text.splitlines() if " start --node-ip-address=" in line)
            assert "GLOO_SOCKET_IFNAME=eth0 HCCL_SOCKET_IFNAME=eth0 TP_SOCKET_IFNAME=eth0" in text
            ray = Path(command.split()[0])
            assert ray.name == "ray" and ray.parent.resolve() == ray_dir, command
            assert f"--node-ip-address={ip} " in command and '"cpu": 1' in command, command
            assert "--object-store-memory=536870912" in command, command

        driver = cl.run(
            "node1",
            [str(e2e_python), "-c", DRIVER, head_ip, worker_ip, str(MASTER_PORT)],
            wd=REPO,
            env=NODE_ENV,
            capture_output=True,
            text=True,
            timeout=STEP_S,
        )
        t["allreduce"] = time.monotonic() - t0
        assert driver.returncode == 0, driver.stdout[-3000:] + driver.stderr[-3000:]
        said = dict(
            line.split(" ", 1) for line in driver.stdout.splitlines() if line[:6] in ("NODES ", "RESULT")
        )
        resources = json.loads(said["NODES"])
        for ip in (head_ip, worker_ip):
            assert resources[ip]["cpu"] == 1 and resources[ip]["NPU"] == 1, resources
            assert resources[ip]["object_store_memory"] == 512 * 1024**2, resources
        ranks = json.loads(said["RESULT"])

        # Ray was stopped by nothing but the teardown to come: both raylets still run in their nodes
        for node in ("node1", "node2"):
            assert cl.run(node, ["pgrep", "-f", "raylet"], capture_output=True).returncode == 0, node

    t["down"] = time.monotonic() - t0

    # the all-reduce: 1 + 2 on both ranks, each rank on its own node with the recipe's interface
    own = {0: head_ip, 1: worker_ip}
    gloo_ports = {MASTER_PORT}
    for r in ranks:
        listens = {(_plain(ip), port) for ip, port, _, _, status in r["conns"] if status == "LISTEN"}
        gloo = {(ip, port) for ip, port in listens if port != MASTER_PORT}
        assert gloo and all(ip == own[r["rank"]] for ip, _ in gloo), r  # gloo listens on the node's eth0 only
        gloo_ports |= {port for _, port in gloo}
    for r in ranks:
        me, other = own[r["rank"]], own[1 - r["rank"]]
        assert r["sum"] == [3.0], r
        assert r["node_ip"] == me and r["hostname"] == f"node{r['rank'] + 1}", r
        assert r["env"] == {
            "GLOO_SOCKET_IFNAME": "eth0",
            "HCCL_SOCKET_IFNAME": "eth0",
            "TP_SOCKET_IFNAME": "eth0",
            "MASTER_ADDR": head_ip,
        }, r
        links = [
            (_plain(lip), _plain(rip))
            for lip, lport, rip, rport, status in r["conns"]
            if status == "ESTABLISHED" and {lport, rport} & gloo_ports
        ]
        assert links and all(lip == me and rip in (me, other) for lip, rip in links), r
        assert (me, other) in links, r  # a connection across the two nodes
        # none of the group's sockets on loopback (Ray's own worker may open a loopback socket in the same window:
        # a fresh CI run saw one, 127.0.0.1:43880 <-> 127.0.0.1:59360, on neither gloo port)
        group = [c for c in r["conns"] if {c[1], c[3]} & gloo_ports]
        assert group and "127.0.0.1" not in json.dumps(group), r

    # teardown: no namespace, link, mount or process of the cluster is left
    assert leftovers(rec) == []
    assert _in_namespaces(spaces) == []
    steps = ", ".join(f"{name} {seconds:.1f}s" for name, seconds in t.items())
    print(f"join test: {steps}")
