"""The sim_cluster command (ascend_rl.harness.sim_cluster): a SIMULATED cluster of N nodes on this machine, each
in its own namespaces (network, PID, mount, UTS, IPC), for multi-node launches without a second machine.

    python3 -m ascend_rl sim_cluster up|exec|status|down|run|kill|revive ...   (--help for each verb)

`python3 -m ascend_rl cluster`, its old name, still runs it after a one-line notice. A real cluster's nodes are
started with `python3 -m ascend_rl ray_cluster`."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time

from ascend_rl.harness import sim_cluster as _library
from ascend_rl.harness.sim_cluster import (
    MAX_NODES,
    Cluster,
    ClusterError,
    UsageError,
    check_support,
    default_name,
)

PROG = "python3 -m ascend_rl sim_cluster"


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_NODES:
        raise argparse.ArgumentTypeError(f"must be a node count from 1 to {MAX_NODES}, not {text!r}")
    return value


def _cluster_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=_count, required=True, help=f"how many nodes (1 to {MAX_NODES})")
    parser.add_argument("--name", required=True, help="the cluster's name (a-z, 0-9, '-'; up to 32)")
    parser.add_argument(
        "--shared",
        help="the shared folder, at this same path on every node (default: ROOT/shared; kept by `down`)",
    )
    parser.add_argument(
        "--root",
        help=f"the cluster's folders: shared/, local/, nodes/ (default: {_library.DEFAULT_ROOT}/NAME)",
    )
    parser.add_argument(
        "--ray-tmpdir",
        default="/tmp",
        help="RAY_TMPDIR on the nodes; each node's private Ray folder is mounted over RAY_TMPDIR/ray",
    )
    parser.add_argument(
        "--default-route",
        action="store_true",
        help="an on-link default route on each node's eth0 (for tools that look up their address by a UDP "
        "connect to a public address, as vLLM's get_ip does; packets still cannot leave the bridge)",
    )


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one line (UsageError, exit 2), not a usage block."""

    def error(self, message: str):
        verb = self.prog.removeprefix(PROG).strip()
        raise UsageError(f"{verb + ': ' if verb else ''}{message} (--help for the usage)")


def parser() -> argparse.ArgumentParser:
    top = _Parser(
        prog=PROG,
        description=_library.__doc__.split("\n\n")[0].replace("\n", " "),
        epilog="Needs root, iproute2 (ip netns) and util-linux (unshare, nsenter). See docs/cluster.md.",
    )
    sub = top.add_subparsers(dest="verb", required=True, metavar="{up,exec,status,down,run,kill,revive}")

    up = sub.add_parser("up", help="start N nodes and leave them running (`down` removes them)")
    _cluster_options(up)

    run = sub.add_parser(
        "run",
        help="start N nodes, run CMD here with ASCEND_RL_CLUSTER=NAME, remove the nodes when CMD ends",
        description="Start the cluster, run CMD on this machine (ASCEND_RL_CLUSTER=NAME in its environment, "
        "so `cluster exec NODE -- ...` inside it needs no --name), and remove the cluster when CMD ends, "
        "fails, or this process gets Ctrl-C, SIGTERM or SIGHUP (passed on to CMD first). Exit status: CMD's.",
    )
    _cluster_options(run)
    run.add_argument("--grace", type=float, default=10.0, help="seconds CMD has to end after a signal")
    run.add_argument("cmd", nargs="*", metavar="-- CMD", help="the command (after --)")

    exe = sub.add_parser(
        "exec",
        help="run CMD inside a node; exit with its status",
        description="Run CMD inside NODE (all of the node's namespaces; RAY_TMPDIR set to the node's private "
        "Ray folder's parent; the rest of the environment is this one's). Exit status: CMD's.",
    )
    exe.add_argument("--name", help="the cluster (default: $ASCEND_RL_CLUSTER, else the only one up)")
    exe.add_argument("--wd", help="working folder inside the node (default: the current one)")
    exe.add_argument("node", help="node1..nodeN, a node number, or a node's address")
    exe.add_argument("cmd", nargs="*", metavar="-- CMD", help="the command (after --)")

    status = sub.add_parser("status", help="nodes, addresses, pids, alive or what a dead node left")
    status.add_argument("--name", help="one cluster (default: every cluster that is up)")
    status.add_argument("--json", action="store_true", help="the record as JSON")

    down = sub.add_parser("down", help="remove every process, link, namespace and mount of a cluster")
    down.add_argument("--name", help="the cluster (default: $ASCEND_RL_CLUSTER)")
    down.add_argument(
        "--purge", action="store_true", help="also delete the default shared folder (never a --shared one)"
    )

    for verb, what in (
        (
            "kill",
            "lose a node: its link down, then its whole PID namespace killed (network and folders stay)",
        ),
        ("revive", "bring a killed node back: link up, a fresh init, same address and folders"),
    ):
        fault = sub.add_parser(verb, help=what, description=what)
        fault.add_argument("--name", help="the cluster (default: $ASCEND_RL_CLUSTER, else the only one up)")
        fault.add_argument("node", help="node1..nodeN, a node number, or a node's address")
    return top


def parse_args(argv: list[str]) -> argparse.Namespace:
    """argparse, with everything after the first `--` taken as the command, untouched."""
    if "--" in argv:
        cut = argv.index("--")
        head, tail = argv[:cut], argv[cut + 1 :]
    else:
        head, tail = argv, []
    args = parser().parse_args(head)
    if hasattr(args, "cmd"):
        args.cmd = list(args.cmd) + tail
        if not args.cmd:
            raise UsageError(f"{args.verb}: no command (`{args.verb} ... -- CMD...`)")
    elif tail:
        raise UsageError(f"{args.verb} takes no command after --")
    return args


def _make(args: argparse.Namespace) -> Cluster:
    return Cluster(
        args.name,
        args.nodes,
        shared=args.shared,
        root=args.root,
        ray_tmpdir=args.ray_tmpdir,
        default_route=args.default_route,
    )


def _print_up(cl: Cluster) -> None:
    print(
        f"cluster {cl.name} up: {len(cl.nodes)} nodes in {cl.timings.get('up_s', 0):.2f}s, "
        f"subnet {cl.subnet} (bridge {cl.bridge}, no address)"
    )
    for node in cl.nodes:
        print(f"  {node.name:<7} {node.address:<15} init pid {node.init_pid}  netns {node.netns}")
    print(f"  shared folder {cl.shared} (every node); node-local folder {cl.local} (each node its own)")
    print(f"  Ray folder {cl.ray_dir} (each node its own); exec sets RAY_TMPDIR={cl.ray_tmpdir}")


def _up(args: argparse.Namespace) -> int:
    cl = _make(args)
    with _library.terminate_raises():
        cl.up()
    _print_up(cl)
    print(f"  {PROG} exec --name {cl.name} node1 -- CMD   |   {PROG} down --name {cl.name}")
    return 0


def _run(args: argparse.Namespace) -> int:
    cl = _make(args)
    with cl:
        _print_up(cl)
        sys.stdout.flush()
        env = dict(os.environ, ASCEND_RL_CLUSTER=cl.name)
        try:
            child = subprocess.Popen(args.cmd, env=env)
        except OSError as exc:
            raise ClusterError(f"cannot run {args.cmd[0]}: {exc}") from None
        try:
            rc = child.wait()
        except (KeyboardInterrupt, SystemExit) as exc:
            signum = signal.SIGINT if isinstance(exc, KeyboardInterrupt) else (exc.code or 143) - 128
            _end(child, signum, args.grace)
            print(
                f"cluster: {signal.Signals(signum).name}: CMD ended, removing cluster {cl.name}",
                file=sys.stderr,
            )
            rc = 128 + signum
    return 128 - rc if rc < 0 else rc


def _end(child: subprocess.Popen, signum: int, grace: float) -> None:
    """Pass the signal on to CMD, give it `grace` seconds, then SIGKILL it."""
    with _library.signals_blocked():
        if child.poll() is None:
            child.send_signal(signum)
            try:
                child.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


def _exec(args: argparse.Namespace) -> int:
    cl = Cluster.attach(default_name(args.name))
    argv = cl.exec_argv(args.node, args.cmd, args.wd)
    sys.stdout.flush()
    os.execvpe(argv[0], argv, cl.exec_env())  # nsenter: its exit status is CMD's (128 + n for a signal)
    return 1  # not reached


def _status(args: argparse.Namespace) -> int:
    names = [default_name(args.name)] if args.name else _library.list_clusters()
    records = [Cluster.attach(name).status() for name in names]
    if args.json:
        print(json.dumps(records if not args.name else records[0], indent=1))
        return 0
    if not records:
        print("no cluster is up")
    for rec in records:
        holder = ""
        if rec["holder"]:
            holder = f", held by pid {rec['holder']} ({'alive' if rec['holder_alive'] else 'gone'})"
        alive = sum(node["alive"] for node in rec["nodes"])
        print(
            f"cluster {rec['name']}: {rec['phase']}, {alive}/{len(rec['nodes'])} nodes alive, subnet "
            f"{rec['subnet']}, bridge {rec['bridge']}{holder}, "
            f"since {time.strftime('%H:%M:%S', time.localtime(rec['created']))}"
        )
        print(f"  shared {rec['shared']}; node-local {rec['local']}; Ray {rec['ray_tmpdir']}/ray")
        for node in rec["nodes"]:
            state = "alive" if node["alive"] else "DEAD"
            line = f"  {node['name']:<7} {node['address']:<15} init pid {node['init_pid'] or '-':<8} {state}"
            if not node["alive"]:
                why = node["lost"] or "not killed by this tool"
                line += f" ({why}); left: {', '.join(node['left']) or 'nothing'}"
            print(line)
    return 0


def _down(args: argparse.Namespace) -> int:
    name = args.name or os.environ.get("ASCEND_RL_CLUSTER")
    if not name:
        raise UsageError(
            f"down: name the cluster with --name (up: {', '.join(_library.list_clusters()) or 'none'})"
        )
    try:
        cl = Cluster.attach(name)
    except ClusterError:
        # already down: --purge still removes the default shared folder a plain `down` kept
        left = _library.DEFAULT_ROOT / name
        if not (args.purge and _library.NAME_RE.match(name) and (left / "shared").is_dir()):
            raise
        shutil.rmtree(left)
        print(f"cluster {name} is not up; removed the shared folder it left, {left / 'shared'}")
        return 0
    cl.down(purge=args.purge)
    kept = (
        ""
        if args.purge and cl.own_shared
        else f"; shared folder kept: {cl.shared}"
        + (f" (down --purge --name {cl.name} removes it)" if cl.own_shared else "")
    )
    print(f"cluster {cl.name} down in {cl.timings['down_s']:.2f}s{kept}")
    return 0


def _fault(args: argparse.Namespace) -> int:
    cl = Cluster.attach(default_name(args.name))
    node = cl.node(args.node)
    if args.verb == "kill":
        cl.kill(node.name)
        print(
            f"{node.name} ({node.address}) of cluster {cl.name} killed; `revive {node.name}` brings it back"
        )
    else:
        cl.revive(node.name)
        print(f"{node.name} ({node.address}) of cluster {cl.name} running again, init pid {node.init_pid}")
    return 0


def _silence_stdout() -> None:
    """stdout to /dev/null, so the interpreter's last flush into the closed pipe raises nothing either."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
    except (OSError, ValueError):
        pass


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = parse_args(argv)
        check_support()
        verb = args.verb
        verbs = {"up": _up, "run": _run, "exec": _exec, "status": _status, "down": _down}
        code = verbs.get(verb, _fault)(args)
        sys.stdout.flush()  # inside the try: a closed pipe raises here, not at the interpreter's exit
        return code
    except ClusterError as exc:
        print(f"cluster: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("cluster: interrupted (what was made is removed)", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # a reader that went away (`cluster up ... | head -1`): the work is done, the rest of the text unread
        _silence_stdout()
        return 0
    except SystemExit as exc:
        if isinstance(exc.code, int) and exc.code > 128:
            print(
                f"cluster: {signal.Signals(exc.code - 128).name} (what was made is removed)", file=sys.stderr
            )
        raise


if __name__ == "__main__":
    sys.exit(main())
