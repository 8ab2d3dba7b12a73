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

import argparse
import json
import os
import shlex
import socket
import struct
import subprocess
import sys
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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line interface."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="verb", required=True)

    start = sub.add_parser("start", help="start this node's Ray process with NPU resources")
    role = start.add_mutually_exclusive_group(required=True)
    role.add_argument("--head", action="store_true", help="start the head node")
    role.add_argument("--worker", metavar="HEAD_IP[:PORT]", help="join the head at this address")
    start.add_argument("--nodes", type=int, default=1, help="on the head: wait until this many nodes joined")
    start.add_argument("--timeout", type=float, default=1800, help="seconds to wait for the nodes (head)")
    start.add_argument("--npus", type=int, default=16, help="NPU resources of this node (A3: 16 dies)")
    start.add_argument("--port", type=int, default=DEFAULT_PORT, help="Ray GCS port on the head")
    start.add_argument("--ifname", help="socket interface (default $SOCKET_IFNAME, else the default route's)")
    start.add_argument(
        "--dry-run", action="store_true", help="print the environment and command, start nothing"
    )

    wait = sub.add_parser("wait", help="wait until the Ray cluster has N alive nodes")
    wait.add_argument("--nodes", type=int, required=True)
    wait.add_argument("--timeout", type=float, default=1800, help="seconds before giving up")
    wait.add_argument("--address", default="auto", help="Ray address (default: the local cluster)")

    plan = sub.add_parser("plan", help="print the node-by-node launch commands")
    plan.add_argument("--nodes", type=int, required=True)
    plan.add_argument("--head-ip", default="<head-ip>")
    plan.add_argument("--port", type=int, default=DEFAULT_PORT)
    plan.add_argument("--timeout", type=int, default=1800)
    plan.add_argument("--ray-start", default="llm_rl/deepseek_r1/ray_start.sh")
    plan.add_argument("job", nargs="+", help="the job command run on the head (after --)")
    return parser.parse_args(argv)


def _start(args: argparse.Namespace) -> int:
    ifname = resolve_ifname(args.ifname)
    node_ip = ifname_ipv4(ifname)
    for var in IFNAME_VARS:
        os.environ[var] = ifname
    argv = start_command(args.head, args.worker, node_ip, args.npus, args.port)
    print(" ".join(f"{var}={ifname}" for var in IFNAME_VARS))
    print(shlex.join(argv))
    if args.dry_run:
        if args.head and args.nodes > 1:
            print(f"then wait up to {args.timeout:g}s for {args.nodes} nodes")
        return 0
    proc = subprocess.run(argv)
    if proc.returncode != 0:
        raise ClusterError(
            f"ray start exited {proc.returncode}; read the lines above (`ray stop` clears a stale node)"
        )
    if args.head and args.nodes > 1:
        wait_for_nodes(ray_alive_counter(f"{node_ip}:{args.port}"), args.nodes, args.timeout)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    args = parse_args(argv)
    try:
        if args.verb == "start":
            return _start(args)
        if args.verb == "wait":
            wait_for_nodes(ray_alive_counter(args.address), args.nodes, args.timeout)
            return 0
        for line in node_plan(args.nodes, args.head_ip, args.ray_start, args.job, args.timeout, args.port):
            print(line)
        return 0
    except ClusterError as exc:
        print(f"ray_cluster: error: {exc}", file=sys.stderr)
        return 1
    except ConnectionError as exc:
        print(
            f"ray_cluster: error: cannot reach the Ray cluster ({exc}); start it with ray_start.sh --head",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
