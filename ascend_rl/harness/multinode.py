"""The DeepSeek launcher across simulated nodes: the e2e harness's 2-node runs (deepseek-2n, deepseek-v071-2n).

A run makes a simulated cluster (ascend_rl.harness.sim_cluster: one Linux-namespace "node" per rank, 198.18.S.<i>
on eth0), starts Ray on it the way the recipe README says (`ray_start.sh --cpu --head --nodes N` on node1, `ray_start.sh
--cpu --worker HEAD_IP:6379` on the others, SOCKET_IFNAME=eth0 as a user sets it), then runs the launcher's CPU
profile on node1 with NNODES=N: main_ppo attaches to that Ray cluster and verl places one Megatron rank (and with
it one vLLM engine) per node. The cluster goes down however the run ends.

What the run did is read from what its processes wrote, never from the launcher's settings:
- memory: the summed PSS of every process in the cluster's nodes, sampled every second (Ray's workers are
  children of each node's raylet, not of the launcher, so the launcher's process tree would miss most of them);
- where each rank ran: the rank_evidence hook (ascend_rl/harness/hooks/rank_evidence.py) makes every
  trainer rank, vLLM engine and (verl 0.7.1) vLLM server append one JSON line to <run>/ranks.jsonl, and
  check_evidence() fails a run whose ranks shared a node, or whose sockets, master address or connections were
  on loopback.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path

from ascend_rl import artifacts, manifest
from ascend_rl.errors import OverlayError
from ascend_rl.harness import sim_cluster as lib
from ascend_rl.harness.launch import HarnessError, RunResult, base_python, launch, read_jsonl
from ascend_rl.harness.runner import pss_bytes

RAY_START = Path("llm_rl") / "deepseek_r1" / "ray_start.sh"
EVIDENCE_ENV = "RECIPES_RANK_EVIDENCE"
EVIDENCE_FILE, CLUSTER_FILE, RAY_START_LOG = "ranks.jsonl", "cluster.json", "ray_start.log"
IFNAME = "eth0"  # the node's own interface in the simulated cluster
# Logical CPUs each node's Ray offers. Each raylet counts the machine's cores (2 here), and one is already held by
# the node's placement-group bundle (one rank) and, on one node, one by verl's TaskRunner; verl 0.7.1's vLLM server
# (pinned to its rank's node), agent-loop and reward-loop actors each need a free CPU to be placed, so with 2 per
# node the server on the TaskRunner's node would find none (Ray's placement rule; not tried). The one-node CPU
# profile asks for 8 in all.
NODE_CPUS = 4
RAY_START_S = 180  # seconds for a node's ray_start.sh: a hang, not a measurement
LOOPBACK = ("127.", "0.0.0.0", "localhost", "::1")


def node_env(base: str | None) -> dict[str, str]:
    """A node's shell for ray_start.sh: no venv on PATH (the script finds its Python; PYTHON names the base's e2e
    one, launch.base_python: the job's, so every node runs the job's Ray), the cluster interface named as the README
    says, the run's verl base."""
    env = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": os.environ.get("HOME", "/root"),
        "LANG": "C.UTF-8",
        "SOCKET_IFNAME": IFNAME,
        "PYTHON": str(base_python(base)),
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_OVERRIDE_RESOURCES": json.dumps({"CPU": NODE_CPUS}),  # read by `ray start`: see NODE_CPUS
    }
    if base:
        env["VERL_BASE"] = base
    return env


class ClusterSampler(threading.Thread):
    """Samples, every second until stopped, the summed PSS and RSS of every process in the cluster's nodes (the
    members of their network namespaces), keeping the peak and each node's share at that moment; and each node's
    eth0 byte counters (its own network namespace's, /proc/<its init>/net/dev) whenever verl's file logger has
    written one more step to `metrics`, so the bytes each node sent and received per GRPO step are the deltas."""

    def __init__(self, cl: lib.Cluster, metrics: Path, every_s: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.cl, self.metrics, self.every_s = cl, metrics, every_s
        self.peak_pss = self.peak_rss = 0
        self.at_peak: dict[str, int] = {}
        self.net: list[dict] = [{"after_step": 0, **self.counters()}]  # from before Ray started
        self._stop_event = threading.Event()

    def sample(self) -> tuple[int, int, dict[str, int]]:
        node_of = {}
        for node in self.cl.nodes:
            ident = lib._ns_id(Path("/run/netns", node.netns))
            if ident:
                node_of[ident] = node.name
        pss = rss = 0
        per_node = dict.fromkeys(node_of.values(), 0)
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            name = node_of.get(lib._ns_id(f"/proc/{entry.name}/ns/net"))
            if name is None:
                continue
            node_pss = pss_bytes(int(entry.name))
            per_node[name] += node_pss
            pss += node_pss
            rss += _rss_bytes(int(entry.name))
        return pss, rss, per_node

    def counters(self) -> dict[str, dict[str, int]]:
        """Each node's eth0 received and sent bytes, as its own network namespace counts them."""
        found = {}
        for node in self.cl.nodes:
            found[node.name] = _eth0_bytes(node.init_pid)
        return found

    def steps_logged(self) -> int:
        try:
            return self.metrics.read_bytes().count(b"\n")
        except OSError:
            return 0

    def run(self) -> None:
        while not self._stop_event.is_set():
            pss, rss, per_node = self.sample()
            if pss > self.peak_pss:
                self.peak_pss, self.at_peak = pss, per_node
            self.peak_rss = max(self.peak_rss, rss)
            steps = self.steps_logged()
            if steps > self.net[-1]["after_step"]:
                self.net.append({"after_step": steps, **self.counters()})
            self._stop_event.wait(self.every_s)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=10)

    def bytes_per_step(self) -> list[dict]:
        """Per GRPO step and node, the eth0 bytes received and sent since the previous step was logged (step 1:
        since before Ray started, so Ray's start-up, the model load and the first weight sync are in it)."""
        rows = []
        for before, after in zip(self.net, self.net[1:], strict=False):
            row = {"step": after["after_step"]}
            for node in self.cl.nodes:
                a, b = after.get(node.name), before.get(node.name)
                if a and b:
                    row[node.name] = {"rx": a["rx"] - b["rx"], "tx": a["tx"] - b["tx"]}
            rows.append(row)
        return rows


def _eth0_bytes(pid: int) -> dict[str, int] | None:
    """eth0's received and sent byte counters in the network namespace of process `pid` (/proc/PID/net/dev)."""
    try:
        for line in Path(f"/proc/{pid}/net/dev").read_text().splitlines():
            name, _, rest = line.partition(":")
            if name.strip() == IFNAME:
                fields = rest.split()
                return {"rx": int(fields[0]), "tx": int(fields[8])}
    except (OSError, ValueError, IndexError):
        pass
    return None


def _rss_bytes(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def cache_for_nodes(base: str | None, megatron: bool = True) -> None:
    """What a simulated node would download on a fresh machine, fetched here from the host's network, since a node
    reaches no index: the base's pinned verl sdist in the download cache (ray_start.sh makes a node's verl tree from
    it when the tree is absent) and, with `megatron`, the base's Megatron packages the launcher on node1 puts on the
    trainer's path (artifacts.megatron_packages, as run_deepseek_r1_a3.sh asks for them). HarnessError (one line)
    when either cannot be had."""
    try:
        spec = manifest.load_recipe("deepseek_r1", base)
        artifacts.verl_sdist(spec.version, spec.sdist_sha256)
        if megatron:
            stack = spec.version if spec.version in artifacts.MEGATRON_STACKS else None
            artifacts.megatron_packages(base_python(spec.version), stack)
    except (OverlayError, artifacts.DownloadError, artifacts.ChecksumError) as exc:
        raise HarnessError(f"what the simulated nodes cannot download: {exc}") from None


def start_ray(cl: lib.Cluster, base: str | None, log_path: Path, repo: Path) -> dict[str, float]:
    """ray_start.sh on every node as the README says: the head first (it waits for all nodes), then each worker;
    each makes the verl tree ready first (from the cached sdist when absent: cache_for_nodes). Both scripts' output
    goes to log_path. Returns the seconds each part took; a failure is one HarnessError line."""
    cache_for_nodes(base)
    nodes = len(cl.nodes)
    head_ip = cl.address("node1")
    env = node_env(base)
    t0 = time.monotonic()
    timings = {}
    with open(log_path, "w", encoding="utf-8") as log:
        head_cmd = ["bash", str(RAY_START), "--cpu", "--head", "--nodes", str(nodes), "--timeout", "120"]
        log.write(f"node1$ SOCKET_IFNAME={IFNAME} {' '.join(head_cmd)}\n")
        log.flush()
        head = cl.popen(
            "node1", head_cmd, wd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        lines: list[str] = []

        def read() -> None:
            for line in head.stdout:
                lines.append(line)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            deadline = time.monotonic() + RAY_START_S
            while not any(f"ray: 1/{nodes} nodes alive" in line for line in lines):
                if head.poll() is not None and not reader.is_alive():
                    raise HarnessError(
                        f"ray_start.sh --head on node1 exited {head.returncode}: {_last(lines)}"
                    )
                if time.monotonic() > deadline:
                    raise HarnessError(f"ray_start.sh --head on node1: Ray not up after {RAY_START_S}s")
                time.sleep(0.2)
            timings["head_s"] = round(time.monotonic() - t0, 1)
            for node in cl.nodes[1:]:
                cmd = ["bash", str(RAY_START), "--cpu", "--worker", f"{head_ip}:6379"]
                log.write(f"{node.name}$ SOCKET_IFNAME={IFNAME} {' '.join(cmd)}\n")
                log.flush()
                worker = cl.run(
                    node.name,
                    cmd,
                    wd=repo,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    timeout=RAY_START_S,
                )
                if worker.returncode != 0:
                    raise HarnessError(
                        f"ray_start.sh --worker on {node.name} exited {worker.returncode}; see {log_path}"
                    )
            if head.wait(timeout=RAY_START_S) != 0:
                reader.join(timeout=5)
                raise HarnessError(f"ray_start.sh --head on node1 exited {head.returncode}: {_last(lines)}")
            reader.join(timeout=5)
        except subprocess.TimeoutExpired:
            raise HarnessError(f"ray_start.sh did not finish in {RAY_START_S}s; see {log_path}") from None
        finally:
            head.kill()
            head.wait()
            log.write("node1 (head):\n" + "".join(lines))
    timings["joined_s"] = round(time.monotonic() - t0, 1)
    return timings


def _last(lines: list[str]) -> str:
    text = [line.strip() for line in lines if line.strip()]
    return text[-1][:300] if text else "no output"


def launch_on_cluster(
    name: str,
    launcher: Path,
    overrides: list[str],
    out: Path,
    model_dir: Path,
    data_dir: Path,
    *,
    nodes: int,
    timeout_s: float,
    base: str | None,
    repo: Path,
    disable_weight_sync: bool = False,
) -> RunResult:
    """The launcher's CPU profile with NNODES=nodes on node1 of a fresh simulated cluster whose Ray the
    recipe's ray_start.sh started; the RunResult's memory is the whole cluster's. Writes <out>/<name>/cluster.json
    (addresses, Ray start-up, memory per node at the peak) beside the run's ranks.jsonl."""
    try:
        lib.check_support()
    except lib.Unsupported as exc:
        raise HarnessError(f"{name} needs the simulated cluster: {exc}") from None
    run_dir = out / name
    evidence = run_dir / EVIDENCE_FILE
    record: dict = {"nodes": nodes}
    cl_name = f"{name}-{os.getpid()}"[:32].rstrip("-")
    t0 = time.monotonic()
    try:
        with lib.Cluster(cl_name, nodes) as cl:
            record["addresses"] = {node.name: node.address for node in cl.nodes}
            record["up_s"] = round(time.monotonic() - t0, 1)
            # an earlier run's metrics would read as steps already done (launch() clears the folder later)
            (run_dir / "metrics.jsonl").unlink(missing_ok=True)
            memory = ClusterSampler(cl, run_dir / "metrics.jsonl")
            memory.start()
            try:
                # launch() makes run_dir afresh, then calls this: Ray starts before the launcher, logged there
                def seed(run_dir: Path) -> None:
                    record["ray_start"] = start_ray(cl, base, run_dir / RAY_START_LOG, repo)

                prefix = cl.exec_argv(
                    "node1", ["env", f"RAY_TMPDIR={cl.ray_tmpdir}", f"NNODES={nodes}"], wd=repo
                )
                result = launch(
                    name,
                    launcher,
                    overrides,
                    out,
                    model_dir,
                    data_dir,
                    timeout_s=timeout_s,
                    disable_weight_sync=disable_weight_sync,
                    seed=seed,
                    base=base,
                    hook_env={EVIDENCE_ENV: str(evidence)},
                    cmd_prefix=prefix,
                )
            finally:
                memory.stop()
                record["peak_pss_gib"] = round(memory.peak_pss / 2**30, 2)
                record["peak_rss_gib"] = round(memory.peak_rss / 2**30, 2)
                record["pss_gib_at_peak"] = {k: round(v / 2**30, 2) for k, v in memory.at_peak.items()}
                record["eth0_bytes_per_step"] = memory.bytes_per_step()
                if run_dir.is_dir():
                    (run_dir / CLUSTER_FILE).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    except lib.ClusterError as exc:
        raise HarnessError(f"{name}: the simulated cluster: {exc}") from None
    # the run's figures are the cluster's: its wall time from `up` to `down` (Ray's start-up included; the
    # launcher's own is in cluster.json), the memory of every process of every node
    record["launcher_s"] = round(result.wall_s, 1)
    record["total_s"] = round(time.monotonic() - t0, 1)
    (run_dir / CLUSTER_FILE).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    result.wall_s = record["total_s"]
    result.peak_pss_gib = memory.peak_pss / 2**30
    result.peak_rss_gib = memory.peak_rss / 2**30
    at_peak = ", ".join(f"{node} {gib:.1f}" for node, gib in record["pss_gib_at_peak"].items())
    print(
        f"e2e: {name}: {nodes} nodes in {result.wall_s:.0f} s from cluster up to down, peak memory "
        f"{result.peak_pss_gib:.1f} GiB (PSS of every process on the nodes: {at_peak}; summed RSS "
        f"{result.peak_rss_gib:.1f} GiB)",
        flush=True,
    )
    return result


# --- the evidence ----------------------------------------------------------------------------------


def _loopback(address) -> bool:
    return not address or str(address).startswith(LOOPBACK)


def _node_of(rec: dict) -> str | None:
    """The address a process ran at: its Ray node's, else its socket interface's."""
    ip = rec.get("ray_node_ip")
    return ip if ip and not str(ip).startswith("error") else rec.get("ifname_addr")


def _is_trainer(rec: dict) -> bool:
    """A trainer rank's torch.distributed start: verl's worker called it (vLLM's own groups are vllm's calls)."""
    return str(rec.get("caller", "")).startswith("verl.")


def read_evidence(run_dir: Path) -> list[dict]:
    """The rank_evidence hook's lines of a run (<run>/ranks.jsonl)."""
    return read_jsonl(run_dir / EVIDENCE_FILE, "the rank evidence")


def summarise_evidence(records: list[dict]) -> dict:
    """Per trainer rank, vLLM engine and server: the node, host name, socket interface settings and the master
    and data-parallel addresses each saw (for the run's summary)."""
    ranks, engines, servers = [], [], []
    # the sockets of the trainer ranks' process group: the master's store and every port a rank's group listens on
    trainer = [r for r in records if r.get("kind") == "torch.distributed" and _is_trainer(r)]
    group = {(str(r.get("master_addr")), int(r.get("master_port") or 0)) for r in trainer}
    group |= {(ip, port) for r in trainer for ip, port in r.get("listen", [])}
    for rec in records:
        where = {
            "node": _node_of(rec),
            "hostname": rec.get("hostname"),
            "ifname": rec.get("ifname"),
            "ifname_addr": rec.get("ifname_addr"),
            "pid": rec.get("pid"),
        }
        if rec.get("kind") == "torch.distributed" and _is_trainer(rec):
            ranks.append(
                {
                    "rank": rec.get("rank"),
                    "world_size": rec.get("world_size"),
                    **where,
                    "backend": rec.get("backend"),
                    "master_addr": rec.get("master_addr"),
                    "master_port": rec.get("master_port"),
                    "connections": sorted(
                        {
                            f"{lip}->{rip}"
                            for lip, lport, rip, rport in rec.get("tcp", [])
                            if (lip, lport) in group or (rip, rport) in group
                        }
                    ),
                }
            )
        elif rec.get("kind") == "vllm.engine":
            p = rec.get("parallel") or {}
            dp = p.get("data_parallel_size")
            engines.append(
                {
                    **where,
                    "data_parallel_size": dp,
                    "tensor_parallel_size": p.get("tensor_parallel_size"),
                    "dp_master": (
                        f"{p.get('data_parallel_master_ip')}:{p.get('data_parallel_master_port')}"
                        if dp and dp > 1
                        else f"DP=1 per engine: no DP group (vLLM's unused default {p.get('data_parallel_master_ip')})"
                    ),
                    "dp_rpc_port": p.get("data_parallel_rpc_port") if dp and dp > 1 else None,
                    "nnodes": p.get("nnodes"),
                    "error": rec.get("error"),
                }
            )
        elif rec.get("kind") == "vllm.server":
            s = rec.get("server") or {}
            servers.append(
                {
                    **where,
                    "server_address": s.get("server_address"),
                    "replica_rank": s.get("replica_rank"),
                    "master_address": s.get("master_address"),
                    "master_port": s.get("master_port"),
                    "dp_rpc_port": s.get("dp_rpc_port"),
                    "dp_master_port": s.get("dp_master_port"),
                    "rollout": rec.get("rollout"),
                    "error": rec.get("error"),
                }
            )
    ranks.sort(key=lambda r: (r["rank"] is None, r["rank"]))
    engines.sort(key=lambda e: str(e["node"]))
    servers.sort(key=lambda s: (str(s["node"]), s["replica_rank"] or 0))
    return {"ranks": ranks, "engines": engines, "servers": servers}


def check_evidence(
    ev: dict, nodes: int, addresses: list[str] | None = None, ifname: str = IFNAME
) -> list[str]:
    """What is wrong with where a run's processes ran ([] when nothing): every trainer rank and vLLM engine on
    its own node across all `nodes` (of `addresses` when given), each rank's socket interfaces `ifname` (never
    lo) carrying its node's address, one non-loopback torch.distributed master for all ranks (rank 0's node),
    a connection from each rank to another node and none on loopback; an engine whose DP size is above 1 with
    a master address off loopback; each vLLM server serving on its own node's address."""
    problems = []
    ranks, engines, servers = ev.get("ranks", []), ev.get("engines", []), ev.get("servers", [])
    if not ranks:
        return ["no trainer rank recorded where it ran (the rank_evidence hook did not run)"]
    world = ranks[0].get("world_size")
    if sorted(r["rank"] for r in ranks) != list(range(world or 0)):
        problems.append(f"ranks {sorted(r['rank'] for r in ranks)} recorded, world size {world}")
    on = sorted({r["node"] for r in ranks if r["node"]})
    if len(on) != nodes:
        problems.append(f"the {len(ranks)} ranks ran on {len(on)} node(s) {on}, not {nodes}")
    if len({r["hostname"] for r in ranks}) != nodes:
        problems.append(
            f"the ranks' host names {sorted({str(r['hostname']) for r in ranks})} are not {nodes}"
        )
    if addresses and not set(on) <= set(addresses):
        problems.append(f"ranks ran at {on}, outside the cluster's {sorted(addresses)}")
    masters = {(r["master_addr"], r["master_port"]) for r in ranks}
    rank0 = next((r for r in ranks if r["rank"] == 0), None)
    if len(masters) != 1:
        problems.append(f"the ranks disagree on the torch.distributed master: {sorted(map(str, masters))}")
    for r in ranks:
        tag = f"rank {r['rank']} ({r['hostname']}, {r['node']})"
        if _loopback(r["node"]):
            problems.append(f"{tag} ran on loopback")
        bad = {k: v for k, v in (r["ifname"] or {}).items() if v != ifname}
        if bad or not r["ifname"]:
            problems.append(f"{tag}: socket interface {bad or 'unset'}, not {ifname}")
        if r["ifname_addr"] != r["node"]:
            problems.append(f"{tag}: {ifname} has {r['ifname_addr']}, not the node's address")
        if _loopback(r["master_addr"]) or (rank0 and r["master_addr"] != rank0["node"]):
            problems.append(f"{tag}: master {r['master_addr']}, not rank 0's node address")
        peers = [c.split("->") for c in r["connections"]]
        if any(_loopback(a) or _loopback(b) for a, b in peers):
            problems.append(f"{tag}: a torch.distributed connection on loopback {r['connections']}")
        if not any(a == r["node"] and b != r["node"] and b in on for a, b in peers):
            problems.append(f"{tag}: no torch.distributed connection to another node {r['connections']}")
    if len(engines) != len(ranks):
        problems.append(f"{len(engines)} vLLM engine(s) for {len(ranks)} ranks (one per rank expected)")
    if sorted({e["node"] for e in engines if e["node"]}) != on:
        problems.append(f"vLLM engines on {sorted({str(e['node']) for e in engines})}, the ranks on {on}")
    for e in engines:
        if e.get("error"):
            problems.append(f"vLLM engine on {e['node']}: the hook could not read it: {e['error']}")
        elif (e["data_parallel_size"] or 1) > 1 and _loopback(e["dp_master"]):
            problems.append(f"vLLM engine on {e['node']}: DP master {e['dp_master']} on loopback")
        if e["ifname"] and any(v != ifname for v in e["ifname"].values()):
            problems.append(f"vLLM engine on {e['node']}: socket interface {e['ifname']}, not {ifname}")
    for s in servers:
        if s["server_address"] != s["node"] or _loopback(s["server_address"]):
            problems.append(
                f"vLLM server on {s['node']} serves at {s['server_address']}, not its node's address"
            )
    return problems
