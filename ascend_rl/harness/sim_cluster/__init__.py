"""The SIMULATED cluster (proof rig, not a real one): N nodes on this machine, each in its own Linux namespaces,
for multi-node launches without a second machine (as root; `ip netns`, `unshare`, `nsenter`). A real cluster's
nodes are started with `python3 -m ascend_rl ray_cluster` (ascend_rl/ray_cluster.py) instead.

    python3 -m ascend_rl sim_cluster up --nodes N --name NAME [--shared DIR]   start N nodes, leave them running
    python3 -m ascend_rl sim_cluster exec [--name NAME] NODE -- CMD...          run CMD inside a node
    python3 -m ascend_rl sim_cluster status [--name NAME] [--json]              nodes, addresses, pids, alive
    python3 -m ascend_rl sim_cluster down --name NAME                           remove everything of the cluster
    python3 -m ascend_rl sim_cluster run --nodes N --name NAME -- CMD...        up, CMD here, down when CMD ends
    python3 -m ascend_rl sim_cluster kill|revive [--name NAME] NODE             lose a node; bring it back

Each node (`node1` … `nodeN`) has its own network namespace (`lo` and one interface `eth0` with
198.18.S.<i>/24, S the cluster's slot, joined by a bridge in the root namespace that has no address and no
route: no packet leaves the bridge), its own PID, mount, UTS and IPC namespaces (hostname `node<i>`, a
bind-mounted /etc/hosts listing every node, a private Ray folder over $RAY_TMPDIR/ray, a private /dev/shm, a
node-local folder at the same path on every node with different contents), and one shared folder at the same
path on every node. The rest of the filesystem (repository, venvs, models) is the machine's, seen by all.

A node is held by its init: `ip netns exec NS unshare --pid --fork --kill-child --mount-proc ...`, whose child
(PID 1 of the node) reaps orphans. SIGKILL of that init ends every process of the node (`unshare` ignores
SIGTERM). The state (slot, pids, folders) is a JSON file in /run/ascend_rl-cluster/, so `exec`, `status` and
`down` from another process find the cluster; `down` kills the nodes' processes by pid and start time (never
by name, never a machine-wide `ray stop`), waits until they are gone, then deletes the links, the network
namespaces and the bridge last.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from ascend_rl import locks
from ascend_rl.errors import EXIT_REFUSED, EXIT_USAGE

PREFIX = "arcl"  # netns arcl-NAME-I, bridge arclSbr, host end of node I's veth arclShI
RUNTIME = Path("/run/ascend_rl-cluster")  # one state file per cluster: NAME.json
DEFAULT_ROOT = Path(
    "/var/tmp/ascend_rl-cluster"
)  # NAME/{shared,local,nodes/nodeI/{local,ray,hosts,init.log}}
MAX_NODES = 64
SLOTS = 512  # 198.18.0.0/15 as /24s: slot S -> 198.(18 + S // 256).(S % 256).0/24
NAME_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,31}\Z")
READY_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 15.0
NAMESPACES = ("net", "mnt", "pid", "uts", "ipc")

# PID 1 of a node: reaps every orphan of the node (a daemonising `ray start` leaves many), ignores the
# signals sent from inside the node (the kernel drops those without a handler), dies only by SIGKILL.
REAPER = """\
import os, signal
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
while True:
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass
    signal.sigwaitinfo({signal.SIGCHLD})
"""

# Runs as PID 1 of the new PID/mount/UTS/IPC namespaces, inside the node's network namespace; idempotent, so
# `revive` runs it again in the same network namespace. Positional: 1 hostname, 2 address/prefix, 3 hosts
# file, 4 local source, 5 local mount point, 6 Ray source, 7 Ray mount point, 8 shared folder, 9 the folder
# of every node's own folders (hidden), 10 python, 11 reaper code, 12 "1" for an on-link default route.
# The copies of /run/netns/* mounts go: a node must not pin another node's (or cluster's) network namespace.
INIT_SCRIPT = """\
set -eu
echo "$1" > /proc/sys/kernel/hostname
{ echo 1 > /proc/sys/net/ipv6/conf/eth0/disable_ipv6; } 2>/dev/null || true
printf 'link set lo up\\naddr replace %s dev eth0\\nlink set eth0 up\\n' "$2" | ip -batch -
if [ "${12}" = 1 ]; then ip route replace default dev eth0; fi
mount --bind "$3" /etc/hosts
mount --bind "$4" "$5"
mount --bind "$6" "$7"
mount --bind "$8" "$8"
mount -t tmpfs -o nosuid,nodev,mode=1777 arcl-shm /dev/shm
mount -t tmpfs -o ro,nosuid,nodev,mode=755,size=4k arcl-hidden "$9"
netns_mounts=$(while read -r _ at _; do case $at in /run/netns/?*) echo "$at";; esac; done </proc/self/mounts)
for at in $netns_mounts; do umount -l "$at"; done
echo ready
exec "${10}" -I -S -c "${11}" </dev/null >/dev/null 2>&1
"""


class ClusterError(Exception):
    """A one-line failure or refusal (exit 1)."""

    exit_code = EXIT_REFUSED


class UsageError(ClusterError):
    """The command line is wrong: a node count, a name, a node that does not exist (exit 2)."""

    exit_code = EXIT_USAGE


class Unsupported(ClusterError):
    """This machine (or user) cannot make namespaces: not root, no `ip netns` (exit 2)."""

    exit_code = EXIT_USAGE


def check_support() -> None:
    """Raise Unsupported, with the one-line reason, unless this process can make the cluster."""
    if os.geteuid() != 0:
        raise Unsupported("the simulated cluster needs root (network namespaces, mounts); run it as root")
    missing = [tool for tool in ("ip", "unshare", "nsenter", "mount") if shutil.which(tool) is None]
    if missing:
        raise Unsupported(f"the simulated cluster needs {', '.join(missing)} (iproute2, util-linux) on PATH")
    if not Path("/proc/self/ns/net").exists():
        raise Unsupported("this kernel has no network namespaces (/proc/self/ns/net)")
    proc = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    if proc.returncode != 0:
        reason = (proc.stderr.strip().splitlines() or ["no reason given"])[-1]
        raise Unsupported(f"`ip netns` does not work here: {reason}")


def check_name(name: str) -> str:
    if not NAME_RE.match(name or ""):
        raise UsageError(f"a cluster name is 1-32 of a-z, 0-9 and '-' (not starting with '-'), not {name!r}")
    return name


def check_nodes(nodes: int) -> int:
    if not isinstance(nodes, int) or not 1 <= nodes <= MAX_NODES:
        raise UsageError(f"--nodes must be 1 to {MAX_NODES}, not {nodes!r}")
    return nodes


def subnet(slot: int) -> str:
    """The /24 of a cluster slot, without the last octet: '198.18.0'."""
    return f"198.{18 + slot // 256}.{slot % 256}"


def state_file(name: str) -> Path:
    return RUNTIME / f"{name}.json"


def list_clusters() -> list[str]:
    """The names of the clusters with a state file, sorted."""
    return sorted(path.stem for path in RUNTIME.glob("*.json")) if RUNTIME.is_dir() else []


def default_name(name: str | None = None) -> str:
    """`name`, else $ASCEND_RL_CLUSTER, else the only cluster there is."""
    if name:
        return check_name(name)
    if os.environ.get("ASCEND_RL_CLUSTER"):
        return check_name(os.environ["ASCEND_RL_CLUSTER"])
    names = list_clusters()
    if len(names) == 1:
        return names[0]
    if not names:
        raise ClusterError("no cluster is up (start one with `cluster up --nodes N --name NAME`)")
    raise UsageError(f"{len(names)} clusters are up ({', '.join(names)}): name one with --name")


# --- processes --------------------------------------------------------------------------------------


def start_time(pid: int) -> int | None:
    """The start time (clock ticks since boot) of a live process; None when it is gone or a zombie."""
    if not pid:
        return None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = stat[stat.rindex(")") + 2 :].split()
    if rest[0] in ("Z", "X"):
        return None
    return int(rest[19])


def _same(pid: int, start: int) -> bool:
    return bool(pid) and start_time(pid) == start


def _ns_id(path: str | Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def _members(ns_ids: set[tuple[str, tuple[int, int]]]) -> list[int]:
    """The live processes in any of these namespaces ((kind, (dev, inode)) pairs), this process excluded."""
    if not ns_ids:
        return []
    kinds = {kind for kind, _ in ns_ids}
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        for kind in kinds:
            ident = _ns_id(f"/proc/{entry.name}/ns/{kind}")
            if ident and (kind, ident) in ns_ids and start_time(int(entry.name)) is not None:
                found.append(int(entry.name))
                break
    return found


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        pass
    kids = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(f"/proc/{entry.name}/stat").read_text()
            except OSError:
                continue
            if int(stat[stat.rindex(")") + 2 :].split()[1]) == pid:
                kids.append(int(entry.name))
    return kids


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _ip_batch(commands: list[str], force: bool = False) -> subprocess.CompletedProcess:
    """`ip -batch -`: many link/netns commands in one process."""
    argv = ["ip", *(["-force"] if force else []), "-batch", "-"]
    return subprocess.run(argv, input="\n".join(commands) + "\n", capture_output=True, text=True)


def _link_exists(link: str) -> bool:
    return Path("/sys/class/net", link).exists()


def _netns_exists(netns: str) -> bool:
    return Path("/run/netns", netns).exists()


def _disable_ipv6(link: str) -> None:
    """No IPv6 link-local address on a link of the root namespace (before it is up): no address at all."""
    with contextlib.suppress(OSError):
        Path(f"/proc/sys/net/ipv6/conf/{link}/disable_ipv6").write_text("1\n")


@contextlib.contextmanager
def _lock():
    RUNTIME.mkdir(parents=True, exist_ok=True)
    with locks.exclusive(RUNTIME / ".lock"):
        yield


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def signals_blocked():
    """SIGINT, SIGTERM and SIGHUP held back (in this thread) while a teardown runs; delivered after."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _raise_exit(signum, frame):
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def terminate_raises():
    """Inside: SIGTERM and SIGHUP raise SystemExit(128 + signal) in the main thread (where their handler is
    the default), so `finally` clauses and `with` exits run; outside, the handlers are as they were."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {}
    for signum in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(signum) is signal.SIG_DFL:
            saved[signum] = signal.signal(signum, _raise_exit)
    try:
        yield
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)


# --- the cluster ------------------------------------------------------------------------------------


@dataclass
class Node:
    """One node: its name (`node<i>`, also its hostname), address, network namespace, the host end of its
    veth link, its folder on the host, and the pids (with start times) of its init."""

    index: int
    name: str
    address: str
    netns: str
    link: str
    dir: str
    unshare_pid: int = 0
    unshare_start: int = 0
    init_pid: int = 0
    init_start: int = 0
    lost: str = ""  # why it is not running, when `kill` took it down

    def alive(self) -> bool:
        return _same(self.init_pid, self.init_start)

    @property
    def local(self) -> Path:
        """This node's node-local folder, as the host sees it."""
        return Path(self.dir) / "local"


class Cluster:
    """A simulated cluster. `with Cluster("t", 2) as c: c.run("node1", ["hostname"])`: up on entry, down on
    every exit (normal, an exception, Ctrl-C, SIGTERM or SIGHUP to this process). `Cluster.attach(name)` is a
    cluster another process made (from its state file)."""

    def __init__(
        self,
        name: str,
        nodes: int = 2,
        *,
        shared: str | Path | None = None,
        root: str | Path | None = None,
        ray_tmpdir: str | Path = "/tmp",
        default_route: bool = False,
    ):
        self.name = check_name(name)
        self.size = check_nodes(nodes)
        self.root = Path(root).absolute() if root else DEFAULT_ROOT / self.name
        self.shared = Path(shared).absolute() if shared else self.root / "shared"
        self.own_shared = shared is None
        self.ray_tmpdir = Path(ray_tmpdir).absolute()
        self.default_route = default_route
        self.slot = -1
        self.nodes: list[Node] = []
        self.holder = 0  # the pid of the process that holds the cluster for its life (0: none, `up`)
        self.holder_start = 0
        self.phase = "new"
        self.created = 0.0
        self._procs: dict[int, subprocess.Popen] = {}
        self.timings: dict[str, float] = {}

    # -- paths and names
    @property
    def state_file(self) -> Path:
        return state_file(self.name)

    @property
    def bridge(self) -> str:
        return f"{PREFIX}{self.slot}br"

    @property
    def subnet(self) -> str:
        return f"{subnet(self.slot)}.0/24"

    @property
    def local(self) -> Path:
        """The node-local folder's path inside every node (each node sees its own contents there)."""
        return self.root / "local"

    @property
    def ray_dir(self) -> Path:
        """Ray's folder inside every node ($RAY_TMPDIR/ray; private per node)."""
        return self.ray_tmpdir / "ray"

    def node(self, which: str | int) -> Node:
        """A node by name (`node2`), number (2) or address."""
        text = str(which)
        for node in self.nodes:
            if text in (node.name, str(node.index), node.address):
                return node
        raise UsageError(
            f"cluster {self.name} has no node {text!r} (node1..node{len(self.nodes) or self.size})"
        )

    def address(self, which: str | int) -> str:
        return self.node(which).address

    # -- state file
    def to_json(self) -> dict:
        return {
            "name": self.name,
            "phase": self.phase,
            "slot": self.slot,
            "subnet": self.subnet,
            "bridge": self.bridge,
            "root": str(self.root),
            "shared": str(self.shared),
            "own_shared": self.own_shared,
            "local": str(self.local),
            "ray_tmpdir": str(self.ray_tmpdir),
            "default_route": self.default_route,
            "holder": self.holder,
            "holder_start": self.holder_start,
            "created": self.created,
            "nodes": [asdict(node) for node in self.nodes],
        }

    def _save(self) -> None:
        RUNTIME.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(self.to_json(), indent=1) + "\n")
        tmp.replace(self.state_file)

    @classmethod
    def attach(cls, name: str) -> Cluster:
        """The cluster `name` as its state file records it."""
        path = state_file(check_name(name))
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise ClusterError(f"no cluster named {name} (no {path})") from None
        except (OSError, ValueError) as exc:
            raise ClusterError(f"cannot read {path}: {exc}") from None
        self = cls(
            name,
            max(1, len(data["nodes"])),
            shared=data["shared"],
            root=data["root"],
            ray_tmpdir=data["ray_tmpdir"],
            default_route=data["default_route"],
        )
        self.own_shared = data["own_shared"]
        self.slot, self.phase, self.created = data["slot"], data["phase"], data["created"]
        self.holder, self.holder_start = data["holder"], data["holder_start"]
        known = {f.name for f in fields(Node)}
        self.nodes = [Node(**{k: v for k, v in node.items() if k in known}) for node in data["nodes"]]
        return self

    # -- up
    def up(self) -> Cluster:
        """Make the nodes; on any failure or interruption, remove what was made and raise."""
        check_support()
        t0 = time.monotonic()
        with _lock():
            if self.state_file.exists():
                raise ClusterError(
                    f"a cluster named {self.name} exists ({self.state_file}); "
                    f"`python3 -m ascend_rl sim_cluster down --name {self.name}` first"
                )
            taken = [ns for ns in _netns_list() if ns.startswith(f"{PREFIX}-{self.name}-")]
            if taken:
                raise ClusterError(
                    f"network namespaces of a cluster {self.name} exist without its state file "
                    f"({', '.join(taken)})"
                )
            nodes_dir = self.root / "nodes"
            if nodes_dir.is_dir() and any(nodes_dir.iterdir()):
                raise ClusterError(f"{nodes_dir} is left from an earlier cluster: remove it first")
            self.slot = _free_slot()
            self.created = time.time()
            self.phase = "creating"
            base = subnet(self.slot)
            self.nodes = [
                Node(
                    index=i,
                    name=f"node{i}",
                    address=f"{base}.{i}",
                    netns=f"{PREFIX}-{self.name}-{i}",
                    link=f"{PREFIX}{self.slot}h{i}",
                    dir=str(nodes_dir / f"node{i}"),
                )
                for i in range(1, self.size + 1)
            ]
            self._save()  # from here on, `down` (from anywhere) can remove what exists
        try:
            self._make()
        except BaseException:
            with signals_blocked():
                self._teardown(purge=False)
            raise
        self.phase = "up"
        self._save()
        self.timings["up_s"] = time.monotonic() - t0
        return self

    def _make(self) -> None:
        if not self.ray_tmpdir.is_dir():
            raise UsageError(f"--ray-tmpdir {self.ray_tmpdir} is not a folder")
        for folder in (self.local, self.shared, self.ray_dir):
            folder.mkdir(parents=True, exist_ok=True)
        hosts = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
        hosts += "".join(f"{node.address}\t{node.name}\n" for node in self.nodes)
        for node in self.nodes:
            for sub in ("local", "ray"):
                (Path(node.dir) / sub).mkdir(parents=True, exist_ok=True)
            (Path(node.dir) / "hosts").write_text(hosts)
        made = _ip_batch(
            [f"link add {self.bridge} type bridge"]
            + [f"netns add {node.netns}" for node in self.nodes]
            + [f"link add {node.link} type veth peer name eth0 netns {node.netns}" for node in self.nodes]
        )
        if made.returncode != 0:
            raise ClusterError(f"cannot make the links: {_last_line(made.stderr)}")
        for link in [self.bridge, *(node.link for node in self.nodes)]:
            _disable_ipv6(link)
        wired = _ip_batch(
            [f"link set {node.link} master {self.bridge} up" for node in self.nodes]
            + [f"link set {self.bridge} up"]
        )
        if wired.returncode != 0:
            raise ClusterError(f"cannot join the links to the bridge: {_last_line(wired.stderr)}")
        self._start(self.nodes)

    def _start(self, nodes: list[Node]) -> None:
        """Start the inits of these nodes (their network namespaces exist) and wait until each is ready."""
        pending = {}
        for node in nodes:
            node.lost = ""
            argv = [
                "ip", "netns", "exec", node.netns,
                "unshare", "--pid", "--fork", "--kill-child", "--mount-proc",
                "--uts", "--ipc", "--mount", "--propagation", "private",
                "sh", "-c", INIT_SCRIPT, f"{PREFIX}-init",
                node.name, f"{node.address}/24", str(Path(node.dir) / "hosts"),
                str(node.local), str(self.local), str(Path(node.dir) / "ray"), str(self.ray_dir),
                str(self.shared), str(self.root / "nodes"), _python(), REAPER,
                "1" if self.default_route else "0",
            ]  # fmt: skip
            with open(Path(node.dir) / "init.log", "w") as log:
                proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    start_new_session=True,  # a Ctrl-C to the caller's terminal is the caller's to handle
                    env={"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), "LC_ALL": "C"},
                )
            self._procs[node.index] = proc
            node.unshare_pid, node.unshare_start = proc.pid, start_time(proc.pid) or 0
            pending[proc.stdout.fileno()] = (node, proc)
        self._save()
        deadline = time.monotonic() + READY_TIMEOUT_S
        try:
            while pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    names = ", ".join(node.name for node, _ in pending.values())
                    raise ClusterError(f"{names} not ready after {READY_TIMEOUT_S:g}s")
                ready, _, _ = select.select(list(pending), [], [], left)
                for fd in ready:
                    node, proc = pending.pop(fd)
                    line = proc.stdout.readline().strip()
                    if line != b"ready":
                        proc.wait(timeout=5)
                        log = _last_line((Path(node.dir) / "init.log").read_text(errors="replace"))
                        raise ClusterError(f"{node.name} did not start (exit {proc.returncode}): {log}")
                    kids = _children(proc.pid)
                    if len(kids) != 1:
                        raise ClusterError(f"{node.name}: its init has {len(kids)} children, not 1")
                    node.init_pid, node.init_start = kids[0], start_time(kids[0]) or 0
        finally:
            for _, proc in pending.values():
                proc.stdout.close()
            for node in nodes:
                proc = self._procs[node.index]
                if proc.stdout and not proc.stdout.closed:
                    proc.stdout.close()

    # -- commands inside a node
    def exec_argv(self, which: str | int, cmd: list[str], wd: str | Path | None = None) -> list[str]:
        """The nsenter command line that runs `cmd` inside the node, in `wd` (default: the current folder)."""
        node = self.node(which)
        if not node.alive():
            raise ClusterError(f"{node.name} of cluster {self.name} is not running{_why(node)}")
        if not cmd:
            raise UsageError("no command to run (exec NODE -- CMD...)")
        where = str(wd) if wd is not None else os.getcwd()
        spaces = ["-n", "-m", "-p", "-u", "-i"]
        return ["nsenter", "-t", str(node.init_pid), *spaces, f"--wd={where}", "--", *map(str, cmd)]

    def exec_env(self, env: dict[str, str] | None = None) -> dict[str, str]:
        """`env` (default: this process's) with RAY_TMPDIR naming the parent of the node's private Ray folder,
        so Ray on the node uses it whatever TMPDIR says."""
        env = dict(os.environ if env is None else env)
        env["RAY_TMPDIR"] = str(self.ray_tmpdir)
        return env

    def run(
        self, which: str | int, cmd: list[str], *, wd=None, env=None, **kwargs
    ) -> subprocess.CompletedProcess:
        """subprocess.run of `cmd` inside the node (its exit status is the returncode)."""
        return subprocess.run(self.exec_argv(which, cmd, wd), env=self.exec_env(env), **kwargs)

    def popen(self, which: str | int, cmd: list[str], *, wd=None, env=None, **kwargs) -> subprocess.Popen:
        """subprocess.Popen of `cmd` inside the node; it dies with the node."""
        return subprocess.Popen(self.exec_argv(which, cmd, wd), env=self.exec_env(env), **kwargs)

    # -- faults
    def kill(self, which: str | int, why: str = "killed by `cluster kill`") -> None:
        """Lose a node as a power-off does: its link goes down first (its peers get no FIN or RST, only
        silence), then its whole PID namespace is killed. Its network namespace and folders stay (revive)."""
        node = self.node(which)
        _ip_batch([f"link set {node.link} down"], force=True)
        self._stop([node])
        node.lost = f"{why} at {time.strftime('%H:%M:%S')}"
        self._save()

    def revive(self, which: str | int) -> None:
        """Bring a node that is not running back: link up, a fresh init (same address, folders kept)."""
        node = self.node(which)
        if node.alive():
            raise ClusterError(f"{node.name} of cluster {self.name} is running")
        if not _netns_exists(node.netns) or not _link_exists(node.link):
            raise ClusterError(
                f"{node.name}'s network is gone (netns {node.netns}, link {node.link}): `down` it"
            )
        self._stop([node])  # whatever is left in its network namespace
        up = _ip_batch([f"link set {node.link} up"])
        if up.returncode != 0:
            raise ClusterError(f"cannot bring {node.link} up: {_last_line(up.stderr)}")
        try:
            self._start([node])
        except BaseException:
            with signals_blocked():
                self._stop([node])
            raise
        finally:
            self._save()

    # -- status
    def status(self) -> dict:
        """The state file's record plus, per node, whether it is alive and, when not, what it left."""
        data = self.to_json()
        data["holder_alive"] = bool(self.holder) and start_time(self.holder) == self.holder_start
        for record, node in zip(data["nodes"], self.nodes, strict=True):
            record["alive"] = node.alive()
            record["left"] = [] if record["alive"] else _left_by(node)
        return data

    # -- down
    def _stop(self, nodes: list[Node]) -> list[int]:
        """SIGKILL every process of these nodes: each init (its PID namespace dies with it), then anything
        else in one of their namespaces; wait until they are gone. Returns the pids left at the timeout."""
        ns_ids: set[tuple[str, tuple[int, int]]] = set()
        for node in nodes:
            ident = _ns_id(Path("/run/netns", node.netns))
            if ident:
                ns_ids.add(("net", ident))
            if node.alive():  # its namespaces' inodes are current only while it lives
                for kind in NAMESPACES:
                    ident = _ns_id(f"/proc/{node.init_pid}/ns/{kind}")
                    if ident:
                        ns_ids.add((kind, ident))
        for node in nodes:
            if _same(node.init_pid, node.init_start):
                _kill(node.init_pid)
            if _same(node.unshare_pid, node.unshare_start):
                _kill(node.unshare_pid)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while True:
            for node in nodes:
                if node.index in self._procs:
                    self._procs[node.index].poll()  # reap our own children
            left = [
                pid
                for node in nodes
                for pid, start in ((node.init_pid, node.init_start), (node.unshare_pid, node.unshare_start))
                if _same(pid, start)
            ]
            members = _members(ns_ids)
            for pid in members:
                _kill(pid)
            if not left and not members:
                return []
            if time.monotonic() > deadline:
                return sorted(set(left + members))
            time.sleep(0.02)

    def _teardown(self, purge: bool) -> list[str]:
        """Processes, then the veth links, the network namespaces, the bridge last; then the folders and the
        state file. Returns what is still there (nothing when all went)."""
        left = [f"pid {pid}" for pid in self._stop(self.nodes)]
        if self.slot >= 0:
            commands = [f"link del {node.link}" for node in self.nodes if _link_exists(node.link)]
            commands += [f"netns del {node.netns}" for node in self.nodes if _netns_exists(node.netns)]
            if _link_exists(self.bridge):
                commands.append(f"link del {self.bridge}")
            if commands and not left:
                _ip_batch(commands, force=True)
            left += [f"link {node.link}" for node in self.nodes if _link_exists(node.link)]
            left += [f"netns {node.netns}" for node in self.nodes if _netns_exists(node.netns)]
            if _link_exists(self.bridge):
                left.append(f"bridge {self.bridge}")
        for proc in self._procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=1)
        if left:
            return left
        shutil.rmtree(self.root / "nodes", ignore_errors=True)
        with contextlib.suppress(OSError):
            self.local.rmdir()
        if purge and self.own_shared:
            shutil.rmtree(self.shared, ignore_errors=True)
        with contextlib.suppress(OSError):
            self.root.rmdir()  # only when nothing is left in it
        self.state_file.unlink(missing_ok=True)
        self.phase = "down"
        return []

    def down(self, purge: bool = False) -> None:
        """Remove every process, link, namespace, mount and node folder of the cluster, and its state file.
        The shared folder stays (a rerun finds its checkpoints) unless purge=True and it is the default."""
        t0 = time.monotonic()
        with signals_blocked():
            left = self._teardown(purge)
        self.timings["down_s"] = time.monotonic() - t0
        if left:
            raise ClusterError(f"cluster {self.name}: still there after teardown: {', '.join(left)}")

    # -- context manager
    def __enter__(self) -> Cluster:
        self._signals = terminate_raises()
        self._signals.__enter__()
        try:
            self.holder, self.holder_start = os.getpid(), start_time(os.getpid()) or 0
            self.up()
        except BaseException:
            self._signals.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        try:
            if self.phase != "down":
                with signals_blocked():
                    left = self._teardown(purge=False)
                if left:
                    raise ClusterError(f"cluster {self.name}: still there after teardown: {', '.join(left)}")
        finally:
            self._signals.__exit__(None, None, None)


def _python() -> str:
    """An interpreter for the nodes' reaper (it needs only os and signal)."""
    return sys.executable or shutil.which("python3") or "python3"


def _netns_list() -> list[str]:
    try:
        return sorted(os.listdir("/run/netns"))
    except OSError:
        return []


def _free_slot() -> int:
    taken = set()
    for name in list_clusters():
        with contextlib.suppress(OSError, ValueError, KeyError):
            taken.add(json.loads(state_file(name).read_text())["slot"])
    for slot in range(SLOTS):
        if slot not in taken and not _link_exists(f"{PREFIX}{slot}br"):
            return slot
    raise ClusterError(f"all {SLOTS} cluster slots of 198.18.0.0/15 are taken")


def _last_line(text: str) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1] if lines else "no message"


def _left_by(node: Node) -> list[str]:
    """What a node that is not running left behind."""
    left = []
    if _netns_exists(node.netns):
        members = _members({("net", _ns_id(Path("/run/netns", node.netns)))})
        left.append(f"netns {node.netns} ({len(members)} processes)")
    if _link_exists(node.link):
        state = "?"
        with contextlib.suppress(OSError):
            state = Path("/sys/class/net", node.link, "operstate").read_text().strip()
        left.append(f"link {node.link} ({state})")
    if Path(node.dir).is_dir():
        left.append(f"folder {node.dir}")
    return left


def _why(node: Node) -> str:
    if node.lost:
        return f" ({node.lost})"
    if node.init_pid:
        return f" (its init, pid {node.init_pid}, is gone)"
    return " (it never started)"
