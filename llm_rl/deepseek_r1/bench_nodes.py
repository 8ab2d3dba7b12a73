"""Bytes over the network per GRPO step and node of the multi-node CPU runs, next to the reshard plan's bytes.

Reads what `python3 -m ascend_rl e2e --runs deepseek-2n,deepseek-v071-2n` wrote: each run's <out>/<run>/cluster.json
(each simulated node's eth0 counters, read in the node's own network namespace whenever verl logged a step:
the bytes it received and sent in that step) and reshard.jsonl (the AlltoAllV routed-expert bytes each rank
received per weight sync, and the planner's figure for the same calls). Runs nothing itself; a run folder
without those files is skipped with one line. Everything a step sends across the nodes is in the eth0 figures:
gloo collectives of the Megatron actor (gradient all-reduce of the data-parallel weights, the EP token
all-to-all), Ray's object transfers, the weight sync's expert routing; the bridge is memory copies, so the
counts mean bytes, not time.

    python3 -m llm_rl.deepseek_r1.bench_nodes [--out e2e_out] [--runs deepseek-2n,deepseek-v071-2n] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

RUNS = ("deepseek-2n", "deepseek-v071-2n")
MIB = 2**20


def read_run(run_dir: Path) -> dict | None:
    """The figures of one run folder: per step and node eth0 rx / tx, the reshard rows; None when absent."""
    cluster = run_dir / "cluster.json"
    if not cluster.is_file():
        return None
    record = json.loads(cluster.read_text(encoding="utf-8"))
    reshard_path = run_dir / "reshard.jsonl"
    reshard = []
    if reshard_path.is_file():
        reshard = [
            json.loads(line) for line in reshard_path.read_text(encoding="utf-8").splitlines() if line.strip()
        ]
    return {
        "addresses": record.get("addresses", {}),
        "steps": record.get("eth0_bytes_per_step", []),
        "reshard": reshard,
    }


def table(name: str, run: dict) -> list[str]:
    """Rows: step, node, MiB received and sent over eth0; then the reshard's bytes per rank and sync."""
    lines = [f"{name}: eth0 bytes per GRPO step and node (step 1 includes Ray's start-up and the model load)"]
    lines.append(f"  {'step':>4}  {'node':<6} {'received MiB':>13} {'sent MiB':>10}")
    for row in run["steps"]:
        for node in sorted(k for k in row if k != "step"):
            rx, tx = row[node]["rx"], row[node]["tx"]
            lines.append(f"  {row['step']:>4}  {node:<6} {rx / MIB:>13.2f} {tx / MIB:>10.2f}")
    reshard = run["reshard"]
    if reshard:
        syncs = sorted({r["sync"] for r in reshard})
        recv = sorted({r["recv_bytes"] for r in reshard})
        plan = sorted({r["plan_recv_bytes"] for r in reshard})
        lines.append(
            f"  reshard (AlltoAllV, routed experts): {len(syncs)} syncs, received per rank and sync {recv} B, "
            f"the plan's {plan} B; {sum(r['recv_bytes'] for r in reshard) / MIB:.2f} MiB over all ranks and syncs"
        )
    else:
        lines.append("  reshard: no reshard.jsonl in the run folder")
    return lines


def main(argv: Sequence[str] | None = None, out: Callable[[str], None] = print) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--out", type=Path, default=Path("e2e_out"), help="the e2e output folder (default: e2e_out)"
    )
    ap.add_argument(
        "--runs", default=",".join(RUNS), help="comma-separated run folders (default: %(default)s)"
    )
    ap.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = ap.parse_args(argv)
    found = {}
    for name in (r.strip() for r in args.runs.split(",") if r.strip()):
        run = read_run(args.out / name)
        if run is None:
            print(
                f"bench_nodes: {args.out / name} has no cluster.json (run `python3 -m ascend_rl e2e --runs {name}`)",
                file=sys.stderr,
            )
            continue
        found[name] = run
    if args.json:
        out(json.dumps(found, indent=1))
    else:
        for name, run in found.items():
            for line in table(name, run):
                out(line)
    return 0 if found else 1


if __name__ == "__main__":
    sys.exit(main())
