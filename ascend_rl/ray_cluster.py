"""Start a Ray node with Ascend NPU resources, wait for a cluster to fill, print a node plan.

    ray_cluster.py start --head [--nodes N --timeout S] [--cpu]   on the head node
    ray_cluster.py start --worker HEAD_IP[:PORT] [--cpu]          on every other node
    ray_cluster.py wait --nodes N [--timeout S]                   until N nodes are alive
    ray_cluster.py plan --nodes N --head-ip IP -- CMD...          the node-by-node commands

The socket interface (`--ifname`, else $SOCKET_IFNAME, else the default route's) is
exported as GLOO_SOCKET_IFNAME, HCCL_SOCKET_IFNAME and TP_SOCKET_IFNAME before `ray
start`, so every Ray worker on the node inherits it. `ray start` is the `ray` command of
the Python running this (beside it, or in its scripts folder), never whichever is first
on PATH. `--cpu` is a node without NPUs (the launcher's CPU profile, the simulated
cluster of ascend_rl.cluster): it also offers the lowercase `cpu` resource verl's CPU
placement bundles ask for, one per rank, with a small object store and no dashboard.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import struct
import sys
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path

DEFAULT_PORT = 6379
# A CPU node's object store: each raylet sees the whole machine's memory, and Ray's default (30 % of it) would
# apply to every simulated node on one machine; a CPU run moves small batches only (objects beyond it spill).
CPU_OBJECT_STORE_BYTES = 512 * 1024**2
IFNAME_VARS = ("GLOO_SOCKET_IFNAME", "HCCL_SOCKET_IFNAME", "TP_SOCKET_IFNAME")


class ClusterError(Exception):
    """A one-line, actionable failure."""


def default_route_ifname(route_table: Path = Path("/proc/net/route")) -> str | None:
    """The interface of the IPv4 default route, if any."""
    try:
        lines = route_table.read_text().splitlines()[1:]
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) > 2 and fields[1] == "00000000":
            return fields[0]
    return None


def ifname_ipv4(ifname: str) -> str:
    """The IPv4 address of a network interface (Linux SIOCGIFADDR)."""
    import fcntl

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            packed = fcntl.ioctl(sock.fileno(), 0x8915, struct.pack("256s", ifname[:15].encode()))
        except OSError as exc:
            raise ClusterError(
                f"interface {ifname!r} has no IPv4 address ({exc.strerror}); set SOCKET_IFNAME or --ifname "
                "to the interface on the cluster network (see `ip -4 addr`)"
            ) from None
    return socket.inet_ntoa(packed[20:24])


def resolve_ifname(given: str | None) -> str:
    """--ifname, else $SOCKET_IFNAME, else the default route's interface."""
    name = given or os.environ.get("SOCKET_IFNAME") or default_route_ifname()
    if not name:
        raise ClusterError("no socket interface found; set SOCKET_IFNAME or --ifname (see `ip -4 addr`)")
    return name


def ray_executable(python: str | None = None) -> str:
    """The `ray` command installed with the Ray of `python` (default: this interpreter): beside it (a venv's
    bin/), else in its scripts folder (a system Python's /usr/local/bin). Not PATH's: that may be another
    Python's Ray, or none (a node whose shell has no venv activated)."""
    python = python or sys.executable
    folders = [Path(python).parent]
    if python == sys.executable:
        folders.append(Path(sysconfig.get_path("scripts")))
    for folder in folders:
        candidate = folder / "ray"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    raise ClusterError(
        f"no `ray` command beside {python} (looked in {', '.join(dict.fromkeys(map(str, folders)))}); install "
        "ray into that environment, or run with the Python ray is installed in (PYTHON=... for ray_start.sh)"
    )


def start_command(
    head: bool,
    address: str | None,
    node_ip: str,
    npus: int,
    port: int = DEFAULT_PORT,
    *,
    ray: str = "ray",
    cpu: bool = False,
    object_store_memory: int | None = None,
) -> list[str]:
    """The `ray start` argv for a head or a worker node with `npus` NPU resources. A CPU node (`cpu`) also
    offers `npus` of the lowercase `cpu` resource (verl's placement bundles ask for one per rank with
    trainer.device=cpu; offering as many as the node's ranks is what spreads the ranks over the nodes), a
    CPU_OBJECT_STORE_BYTES object store unless `object_store_memory` says otherwise, and no dashboard."""
    resources = {"NPU": npus, "cpu": npus} if cpu else {"NPU": npus}
    argv = [ray, "start", f"--node-ip-address={node_ip}", f"--resources={json.dumps(resources)}"]
    if cpu and object_store_memory is None:
        object_store_memory = CPU_OBJECT_STORE_BYTES
    if object_store_memory is not None:
        argv.append(f"--object-store-memory={object_store_memory}")
    if head:
        argv += ["--head", f"--port={port}"]
        argv.append("--include-dashboard=false" if cpu else "--dashboard-host=0.0.0.0")
    else:
        if not address:
            raise ClusterError("--worker needs the head's address, e.g. --worker 10.0.0.1:6379")
        argv.append(f"--address={address if ':' in address else f'{address}:{port}'}")
    return argv


def _say(line: str) -> None:
    print(line, flush=True)  # a progress line, seen as it happens through a pipe too


def wait_for_nodes(
    count_alive: Callable[[], int],
    nodes: int,
    timeout: float,
    interval: float = 2.0,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    say: Callable[[str], None] | None = None,
) -> int:
    """Poll `count_alive` until it reaches `nodes`; raise ClusterError after `timeout` seconds."""
    say = say or _say
    deadline = clock() + timeout
    last = -1
    while True:
        alive = count_alive()
        if alive != last:
            say(f"ray: {alive}/{nodes} nodes alive")
            last = alive
        if alive >= nodes:
            return alive
        if clock() >= deadline:
            raise ClusterError(
                f"only {alive} of {nodes} nodes joined the Ray cluster after {timeout:g}s; run "
                "ray_start.sh --worker <head-ip> on the missing nodes (check SOCKET_IFNAME and the "
                "firewall) or raise --timeout"
            )
        sleep(min(interval, max(0.0, deadline - clock())))


def ray_alive_counter(address: str) -> Callable[[], int]:
    """A counter of alive nodes in the Ray cluster at `address` (connects once)."""
    import ray

    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    return lambda: sum(1 for node in ray.nodes() if node.get("Alive"))


def node_plan(nodes: int, head_ip: str, ray_start: str, job: list[str], timeout: int, port: int) -> list[str]:
    """One line per node: ray start on the head and each worker, then the job on the head."""
    lines = [f"node 0 (head):  bash {ray_start} --head --nodes {nodes} --timeout {timeout}"]
    lines += [f"node {i} (worker): bash {ray_start} --worker {head_ip}:{port}" for i in range(1, nodes)]
    lines.append(f"node 0 (head), after all {nodes} nodes joined:  {shlex.join(job)}")
    return lines
