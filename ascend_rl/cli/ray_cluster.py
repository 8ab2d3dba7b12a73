"""The ray_cluster command (ascend_rl.ray_cluster), for a REAL cluster: start a Ray node with Ascend NPU resources
(or, with --cpu, a node without NPUs), wait for a cluster to fill (and check what its nodes offer), watch for a
placement group that never places or a node lost while a run goes, check that every node sees a folder, print a
node plan. (`python3 -m ascend_rl sim_cluster` simulates a cluster's nodes on one machine.)"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
import uuid
from pathlib import Path

from ascend_rl import ray_cluster as _library
from ascend_rl.ray_cluster import (
    CPU_OBJECT_STORE_BYTES,
    DEFAULT_PORT,
    ENV_FACTS,
    IFNAME_VARS,
    ClusterError,
    check_resources,
    end_driver,
    environment_facts,
    environment_line,
    group_job,
    ifname_ipv4,
    look_for_marker,
    node_name,
    node_plan,
    parse_resource,
    process_running,
    ray_alive_counter,
    ray_alive_nodes,
    ray_executable,
    raylet_answers,
    resolve_ifname,
    run_drivers,
    run_ray_start,
    settled,
    shared_folder_line,
    start_command,
    wait_for_nodes,
    watch_run,
)


def _nodes(text: str) -> int:
    """A node count: a whole number, at least 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a node count (1 or more), not {text!r}")
    return value


def _resource(text: str) -> tuple[str, float]:
    """NAME=COUNT: a resource every node must offer at least COUNT of."""
    try:
        return parse_resource(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be seconds above 0, not {text!r}")
    return value


_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}
_OBJECT_STORE_MIN = 75 * 1024**2  # Ray's minimum (ray_constants.OBJECT_STORE_MINIMUM_MEMORY_BYTES)


def _bytes(text: str) -> int:
    """A size in bytes, or with a K, M or G suffix (binary): 536870912, 512M, 1G; at least Ray's 75 MiB."""
    number, unit = text.strip(), ""
    if number[-1:].upper() in ("K", "M", "G"):
        number, unit = number[:-1], number[-1].upper()
    try:
        value = int(float(number) * _UNITS[unit])
    except ValueError:
        value = -1
    if value < _OBJECT_STORE_MIN:
        raise argparse.ArgumentTypeError(f"must be a size of at least 75M (Ray's minimum), not {text!r}")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line interface."""
    parser = argparse.ArgumentParser(description=_library.__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="verb", required=True)

    start = sub.add_parser("start", help="start this node's Ray process with NPU resources")
    role = start.add_mutually_exclusive_group(required=True)
    role.add_argument("--head", action="store_true", help="start the head node")
    role.add_argument("--worker", metavar="HEAD_IP[:PORT]", help="join the head at this address")
    start.add_argument(
        "--nodes", type=_nodes, default=1, help="on the head: wait until this many nodes joined"
    )
    start.add_argument("--timeout", type=float, default=1800, help="seconds to wait for the nodes (head)")
    start.add_argument("--npus", type=int, default=16, help="NPU resources of this node (A3: 16 dies)")
    start.add_argument("--port", type=int, default=DEFAULT_PORT, help="Ray GCS port on the head")
    start.add_argument("--ifname", help="socket interface (default $SOCKET_IFNAME, else the default route's)")
    start.add_argument(
        "--cpu",
        action="store_true",
        help="a node without NPUs: also offer --npus of the lowercase `cpu` resource verl's CPU bundles ask "
        f"for (one per rank), a {CPU_OBJECT_STORE_BYTES // 1024**2} MiB object store, no dashboard",
    )
    start.add_argument(
        "--gpus",
        action="store_true",
        help="also offer --npus of Ray's GPU resource (a CPU node on verl 0.9.1: its CPU platform's bundles ask GPU)",
    )
    start.add_argument(
        "--object-store-memory",
        type=_bytes,
        metavar="SIZE",
        help="Ray's object store on this node (bytes, or 512M, 2G); default: Ray's 30%% of memory, "
        f"{CPU_OBJECT_STORE_BYTES // 1024**2}M with --cpu",
    )
    start.add_argument(
        "--dry-run", action="store_true", help="print the environment and command, start nothing"
    )

    wait = sub.add_parser("wait", help="wait until the Ray cluster has N alive nodes")
    wait.add_argument("--nodes", type=_nodes, required=True)
    wait.add_argument(
        "--same-env",
        metavar="VERL_DIR",
        help="once the nodes joined, every alive node's Ray workers must run this Python (interpreter, vLLM, "
        "torch) and a verl of VERL_DIR's version, the tree the job's driver runs; else one line naming the node "
        "and the difference, exit 1",
    )
    wait.add_argument("--timeout", type=float, default=1800, help="seconds before giving up")
    wait.add_argument("--address", default="auto", help="Ray address (default: the local cluster)")
    wait.add_argument(
        "--resource",
        type=_resource,
        action="append",
        default=[],
        metavar="NAME=COUNT",
        help="once the nodes joined, every alive node must offer at least COUNT of NAME (repeatable; "
        "cpu=2 for verl's CPU bundles, NPU=16 on A3), else one line naming it and what each node offers, exit 1",
    )

    watch = sub.add_parser(
        "watch",
        help="end with one line when a placement group stays pending (verl's pg.ready() waits forever)",
        description="Poll the cluster's placement groups (from Ray's GCS; no dashboard needed). When one has been "
        "pending for --pending-timeout seconds: one line (its bundles, why no node holds them, what each node "
        "offers) on stderr (and appended to --log), with --end-driver its job's driver ended when it runs on "
        "this node (SIGTERM, SIGKILL after --grace), exit 1. With --lost-node, the same when a node it saw alive "
        "is marked dead (its address, Ray's reason; --end-driver then ends every driver on this node under "
        "--while-pid). Exit 0 once --while-pid has ended, or on SIGTERM (a driver being ended is ended first).",
    )
    watch.add_argument(
        "--pending-timeout",
        type=_seconds,
        required=True,
        metavar="S",
        help="seconds a placement group may stay pending (from when this watch first sees it so)",
    )
    watch.add_argument("--interval", type=_seconds, default=2.0, help="seconds between looks (default 2)")
    watch.add_argument("--address", default="auto", help="Ray address (default: the local cluster)")
    watch.add_argument(
        "--end-driver", action="store_true", help="end the driver of the job that made the pending group"
    )
    watch.add_argument("--grace", type=_seconds, default=10.0, help="seconds from SIGTERM to SIGKILL")
    watch.add_argument("--while-pid", type=int, metavar="PID", help="stop watching (exit 0) once PID ended")
    watch.add_argument(
        "--lost-node",
        action="store_true",
        help="also end with one line when a node seen alive leaves the cluster (the ranks left may wait forever)",
    )
    watch.add_argument(
        "--unreachable-timeout",
        type=_seconds,
        default=20.0,
        metavar="S",
        help="with --lost-node: a node whose raylet port takes no connection for S seconds is lost too, before "
        "Ray marks it dead (about a minute for a node that went silent) (default 20)",
    )
    watch.add_argument(
        "--log",
        help="also append the line to this file (one nothing else writes to then: not a file `tee` holds)",
    )

    shared = sub.add_parser(
        "shared",
        help="refuse in one line unless every alive node sees FOLDER as the head does",
        description="Write a marker file into FOLDER (made if missing) here, read it back with a Ray task on "
        "every alive node, remove it; one line naming the nodes that do not see it, exit 1. For a checkpoint "
        "folder (trainer.default_local_dir) of a run across nodes: each rank saves its shards there.",
    )
    shared.add_argument("folder", type=Path, metavar="FOLDER")
    shared.add_argument("--what", default="the folder", help="what FOLDER is, for the message")
    shared.add_argument("--address", default="auto", help="Ray address (default: the local cluster)")
    shared.add_argument("--timeout", type=_seconds, default=120.0, help="seconds for every node to answer")

    plan = sub.add_parser("plan", help="print the node-by-node launch commands")
    where = plan.add_mutually_exclusive_group(required=True)
    where.add_argument("--nodes", type=_nodes, help="the cluster's node count")
    where.add_argument(
        "--local", action="store_true", help="one machine, no ray_start.sh (the job starts its own Ray)"
    )
    plan.add_argument("--head-ip", default="<head-ip>")
    plan.add_argument("--port", type=int, default=DEFAULT_PORT)
    plan.add_argument("--timeout", type=int, default=1800)
    plan.add_argument("--ray-start", default="llm_rl/deepseek_r1/ray_start.sh")
    plan.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a setting every node's command carries (repeatable): the base, PYTHON, SOCKET_IFNAME, ...",
    )
    plan.add_argument("job", nargs="+", help="the job command run on the head (after --)")
    return parser.parse_args(argv)


def _start(args: argparse.Namespace) -> int:
    ifname = resolve_ifname(args.ifname)
    node_ip = ifname_ipv4(ifname)
    for var in IFNAME_VARS:
        os.environ[var] = ifname
    argv = start_command(
        args.head,
        args.worker,
        node_ip,
        args.npus,
        args.port,
        ray=ray_executable(),
        cpu=args.cpu,
        object_store_memory=args.object_store_memory,
        gpus=args.gpus,
    )
    # flushed: `ray start` writes to the same stdout, often a pipe (tee, a cluster's exec)
    print(" ".join(f"{var}={ifname}" for var in IFNAME_VARS), flush=True)
    print(shlex.join(argv), flush=True)
    if args.dry_run:
        if args.head and args.nodes > 1:
            print(f"then wait up to {args.timeout:g}s for {args.nodes} nodes")
        return 0
    returncode = run_ray_start(argv)
    if returncode != 0:
        raise ClusterError(
            f"ray start exited {returncode}; read the lines above (a Ray node already running here from an "
            "earlier start: end its processes by pid, not with `ray stop`, which ends every Ray on the machine)"
        )
    if args.head and args.nodes > 1:
        wait_for_nodes(ray_alive_counter(f"{node_ip}:{args.port}"), args.nodes, args.timeout)
    return 0


def _watch(args: argparse.Namespace) -> int:
    # SIGTERM (the launcher, once main_ppo has ended): stop at the next look, not in the middle of ending a
    # driver and saying why, so the line always reaches the log
    stopping = []

    def hold_sigterm() -> None:
        signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))

    before = signal.getsignal(signal.SIGTERM)
    hold_sigterm()
    try:
        return _watch_until(
            args,
            lambda: not stopping and (args.while_pid is None or process_running(args.while_pid)),
            hold_sigterm,
        )
    finally:
        signal.signal(signal.SIGTERM, before)


def _watch_until(args: argparse.Namespace, keep_going, hold_sigterm) -> int:
    import ray

    alive = ray_alive_nodes(args.address)  # connects
    # ray.init sets its own SIGTERM handler (sys.exit): the launcher's SIGTERM, sent once main_ppo has ended, would
    # then end the watch between ending the driver and writing why (seen: the node-lost run's log without its line)
    hold_sigterm()
    found = watch_run(
        ray.util.placement_group_table,
        ray.nodes if args.lost_node else alive,  # every node, dead ones with Ray's reason, for --lost-node
        args.pending_timeout,
        args.interval,
        keep_going=keep_going,
        lost_nodes=args.lost_node,
        reachable=raylet_answers if args.lost_node else None,
        unreachable_timeout=args.unreachable_timeout,
    )
    if found is None:
        return 0
    kind, what, line = found
    if args.end_driver:
        from ray._private import state

        here = ray.util.get_node_ip_address()
        if kind == "pending":
            line += f"; {end_driver(group_job(what['placement_group_id']), state.jobs(), here, args.grace)}"
        else:
            own = ray.get_runtime_context().get_job_id()
            jobs = state.jobs()
            drivers = run_drivers(jobs, here, own, args.while_pid)
            done = [end_driver(job, jobs, here, args.grace) for job in drivers]
            line += f"; {', '.join(done) if done else 'no driver of a run on this node to end'}"
    elif kind == "pending":
        line += "; end the run (its ray.get(pg.ready()) waits forever)"
    else:
        line += "; end the run (its ranks on the other nodes may wait for the lost ones forever)"
    line = f"ray_cluster: error: {line}"
    if args.log:
        with open(args.log, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")
    print(line, file=sys.stderr, flush=True)
    return 1


def _shared(args: argparse.Namespace) -> int:
    """Every alive node sees args.folder: a marker file written here, read by a Ray task pinned to each node."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    folder = args.folder.absolute()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        marker = folder / f".ascend_rl-shared-{uuid.uuid4().hex[:12]}"
        token = f"{uuid.uuid4().hex} {os.uname().nodename}"
        marker.write_text(token, encoding="utf-8")
    except OSError as exc:
        raise ClusterError(
            f"{args.what} {folder}: cannot write a file there on this node ({exc.strerror})"
        ) from None
    try:
        nodes = ray_alive_nodes(args.address)()
        look = ray.remote(num_cpus=0)(look_for_marker)
        refs = {
            node_name(node): look.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
            ).remote(str(marker), token)
            for node in nodes
        }
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=args.timeout)
        answers = {}
        for name, ref in refs.items():
            if ref not in ready:
                answers[name] = f"no answer in {args.timeout:g}s"
                continue
            try:
                host, why = ray.get(ref)
            except ray.exceptions.RayError as exc:
                answers[name] = f"its task failed ({type(exc).__name__})"
                continue
            answers[name if host in name else f"{name} ({host})"] = why
    finally:
        marker.unlink(missing_ok=True)
    line = shared_folder_line(args.what, str(folder), answers)
    if line:
        raise ClusterError(line)
    print(f"ray_cluster: {args.what} {folder}: every node of {len(answers)} sees it", flush=True)
    return 0


def _same_env(args: argparse.Namespace, nodes: list[dict]) -> None:
    """Every alive node's workers run this driver's environment (environment_facts), asked by a Ray task pinned
    to each node; ClusterError with one line otherwise."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    driver = environment_facts(args.same_env)
    facts = ray.remote(num_cpus=0)(environment_facts)
    refs = {
        node_name(node): facts.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
        ).remote()
        for node in nodes
    }
    ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=args.timeout)
    answers = {}
    for name, ref in refs.items():
        if ref not in ready:
            raise ClusterError(
                f"node {name} did not say which Python environment it runs in {args.timeout:g}s"
            )
        try:
            answers[name] = ray.get(ref)
        except ray.exceptions.RayError as exc:
            raise ClusterError(
                f"node {name} could not say which Python environment it runs ({type(exc).__name__}: "
                f"{str(exc).strip().splitlines()[-1][:200] if str(exc).strip() else ''}); start its Ray with the "
                f"job's Python (PYTHON={driver['executable']} bash llm_rl/deepseek_r1/ray_start.sh ...)"
            ) from None
    line = environment_line(driver, answers)
    if line:
        raise ClusterError(line)
    print(
        f"ray_cluster: every node of {len(answers)} runs this driver's environment ({driver['python']}, "
        + ", ".join(f"{key} {driver[key] or 'absent'}" for key in ENV_FACTS[1:])
        + ")",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    args = parse_args(argv)
    try:
        if args.verb == "start":
            return _start(args)
        if args.verb == "wait":
            nodes = ray_alive_nodes(args.address)
            wait_for_nodes(lambda: len(settled(nodes())), args.nodes, args.timeout)
            if args.resource:
                check_resources(nodes(), args.resource)
            if args.same_env is not None:
                _same_env(args, nodes())
            return 0
        if args.verb == "watch":
            return _watch(args)
        if args.verb == "shared":
            return _shared(args)
        if args.local:
            job = shlex.join(["env", *args.env, *args.job] if args.env else args.job)
            print(f"this machine (no ray_start.sh: the job starts its own Ray):  {job}")
            return 0
        for line in node_plan(
            args.nodes, args.head_ip, args.ray_start, args.job, args.timeout, args.port, args.env
        ):
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
