"""Start a Ray node with Ascend NPU resources, wait for a cluster to fill, print a node plan.

    ray_cluster.py start --head [--nodes N --timeout S]   on the head node
    ray_cluster.py start --worker HEAD_IP[:PORT]          on every other node
    ray_cluster.py wait --nodes N [--timeout S]           until N nodes are alive
    ray_cluster.py plan --nodes N --head-ip IP -- CMD...  the node-by-node commands

The socket interface (`--ifname`, else $SOCKET_IFNAME, else the default route's) is
exported as GLOO_SOCKET_IFNAME, HCCL_SOCKET_IFNAME and TP_SOCKET_IFNAME before `ray
start`, so every Ray worker on the node inherits it.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import struct
import time
from collections.abc import Callable
from pathlib import Path

DEFAULT_PORT = 6379
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


def start_command(
    head: bool, address: str | None, node_ip: str, npus: int, port: int = DEFAULT_PORT
) -> list[str]:
    """The `ray start` argv for a head or a worker node with `npus` NPU resources."""
    argv = ["ray", "start", f"--node-ip-address={node_ip}", f"--resources={json.dumps({'NPU': npus})}"]
    if head:
        argv += ["--head", f"--port={port}", "--dashboard-host=0.0.0.0"]
    else:
        if not address:
            raise ClusterError("--worker needs the head's address, e.g. --worker 10.0.0.1:6379")
        argv.append(f"--address={address if ':' in address else f'{address}:{port}'}")
    return argv


def wait_for_nodes(
    count_alive: Callable[[], int],
    nodes: int,
    timeout: float,
    interval: float = 5.0,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    say: Callable[[str], None] = print,
) -> int:
    """Poll `count_alive` until it reaches `nodes`; raise ClusterError after `timeout` seconds."""
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
