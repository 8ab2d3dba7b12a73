"""Run the qwen2_5 recipe's GRPO loop for a few steps on CPU with a tiny warm-started model, through verl's code.

Fetches and patches verl 0.6.0 with the overlay tool, builds a tiny Qwen2 model and a tokenizer trained on
the bundled problems (with the recipe's chat template), warm-starts the model on the train problems in the
recipe's answer format, prepares the problems with prepare_math.py, then runs GRPO steps in this process:
verl's RLHFDataset, HFRollout, NaiveRewardManager with new_math_reward.py, GRPO advantage and
DataParallelPPOActor update, on a one-process gloo group.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from ascend_rl.data.util import DataError
from ascend_rl.harness.verl_env import DemoError
from ascend_rl.manifest import verl_tree
from ascend_rl.paths import REPO

EXIT_REFUSED, EXIT_USAGE = 1, 2
DEFAULT_WARM_START_STEPS = 400


def _bool(text: str) -> bool:
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Run a few GRPO steps of the qwen2_5 recipe on CPU with a tiny warm-started model "
        "(verl 0.6.0, patched).",
    )
    parser.add_argument("--steps", type=int, default=8, help="GRPO steps to run (default: %(default)s)")
    parser.add_argument(
        "--out",
        type=Path,
        default=REPO / "demo_out" / "inprocess",
        help="output folder (default: demo_out/inprocess/)",
    )
    parser.add_argument(
        "--verl-tree",
        type=Path,
        default=verl_tree("qwen2_5", base="0.6.0"),
        help="where the patched verl 0.6.0 tree is fetched and patched (default: llm_rl/qwen2_5/verl)",
    )
    parser.add_argument(
        "--warm-start-steps",
        type=int,
        default=DEFAULT_WARM_START_STEPS,
        metavar="N",
        help="supervised steps on the train problems, in the recipe's answer format, before GRPO: the demo's "
        "stand-in for the instruction-tuned checkpoint the recipe starts from; 0 keeps the random model, "
        "whose rewards (and so GRPO advantages) are all 0 (default: %(default)s)",
    )
    parser.add_argument("--seed", type=int, default=1, help="seed for the model, data order and sampling")
    parser.add_argument(
        "--recompute-old-log-prob",
        type=_bool,
        default=True,
        metavar="{true,false}",
        help="actor_rollout_ref.actor.recompute_old_log_prob: false skips the old-log-prob forward pass "
        "(the DeepSeek recipe's skip; exact on-policy). Default: true",
    )
    parser.add_argument(
        "--compare",
        action="store_true",
        help="run twice, recompute_old_log_prob=true then false, from the same seed; print and save the comparison",
    )
    parser.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra Hydra override of verl's ppo_trainer.yaml (repeatable)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print what would run and the Hydra overrides, change nothing"
    )
    return parser


def _prepare_inputs(out: Path, seed: int, tree: Path, warm_start_steps: int) -> tuple[Path, dict[str, Path]]:
    """Patched verl on sys.path, the bundled problems through prepare_math, the tiny (warm-started) checkpoint."""
    from ascend_rl.harness import problems, tiny_model, verl_env

    verl_env.use_patched_tree(verl_env.materialise_patched_tree(tree))
    for shim in verl_env.cpu_shims():
        print(f"cpu shim: {shim}")
    verl_env.init_gloo_group()

    data = problems.prepare(out / "data", log=lambda msg: None)
    model_dir = tiny_model.bundled_checkpoint(out / "model", seed, warm_start_steps)
    print(f"data: {data['train'].parent}; model: {model_dir}")
    return model_dir, data


def _run_once(settings, model_dir: Path, data: dict[str, Path], out: Path, label: str):
    """One run of settings.steps GRPO steps: progress bar, per-step lines, metrics.jsonl, curves.png."""
    from tqdm import tqdm

    from ascend_rl.harness import grpo_loop, report, verl_env

    config = verl_env.compose_config(grpo_loop.hydra_overrides(settings, model_dir, data))
    trainer = grpo_loop.build_trainer(config, settings.seed)
    metrics = report.MetricsFile(out / "metrics.jsonl")
    bar = tqdm(total=settings.steps, desc=f"GRPO {label}", unit="step", file=sys.stdout, disable=None)

    def on_row(row: dict) -> None:
        metrics.write(row)
        bar.update(1)
        bar.write(report.step_line(row))

    before = grpo_loop.evaluate(trainer)
    try:
        rows = grpo_loop.run_steps(trainer, settings.steps, on_row)
    finally:
        bar.close()
        metrics.close()
    after = grpo_loop.evaluate(trainer)
    (out / "eval.json").write_text(
        json.dumps({"before": before, "after": after}, indent=2, sort_keys=True) + "\n", encoding="utf-8"
    )
    print(report.eval_line(before, after))
    png = report.plot_curves(rows, out / "curves.png", f"tiny Qwen2 GRPO on CPU ({label})")
    print(f"wrote {metrics.path} ({len(rows)} rows) and {png}")
    return rows, trainer.actor_module.state_dict()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.steps < 1:
        print("demo_grpo: --steps must be at least 1", file=sys.stderr)
        return EXIT_USAGE
    if args.warm_start_steps < 0:
        print("demo_grpo: --warm-start-steps must be 0 (off) or more", file=sys.stderr)
        return EXIT_USAGE
    from ascend_rl.harness import compare, grpo_loop, report

    start = time.perf_counter()
    settings = grpo_loop.DemoSettings(
        steps=args.steps,
        seed=args.seed,
        recompute_old_log_prob=args.recompute_old_log_prob,
        extra_overrides=tuple(args.override),
    )
    out = args.out.resolve()
    if args.dry_run:
        print(
            f"would patch verl into {args.verl_tree}, write data and a tiny model under {out} "
            f"({args.warm_start_steps} warm-start steps), then run"
        )
        print(
            "\n".join(
                grpo_loop.hydra_overrides(
                    settings,
                    out / "model",
                    {"train": out / "data/train.parquet", "test": out / "data/test.parquet"},
                )
            )
        )
        return 0

    from ascend_rl.harness.launch import HarnessError, check_test_tier

    try:
        check_test_tier()
    except HarnessError as exc:
        print(f"demo_grpo: error: {exc}", file=sys.stderr)
        return 1
    model_dir, data = _prepare_inputs(out, args.seed, args.verl_tree.resolve(), args.warm_start_steps)
    if args.compare:
        runs = {}
        for recompute in (True, False):
            label = "recompute_old_log_prob=" + str(recompute).lower()
            run_settings = grpo_loop.DemoSettings(
                **{**settings.__dict__, "recompute_old_log_prob": recompute}
            )
            runs[recompute] = _run_once(
                run_settings, model_dir, data, out / ("recompute" if recompute else "skip"), label
            )
        (rows_on, weights_on), (rows_off, weights_off) = runs[True], runs[False]
        summary = compare.summarise(rows_on, rows_off, compare.max_weight_diff(weights_on, weights_off))
        (out / "compare.json").write_text(
            json.dumps(summary, indent=2, sort_keys=True) + "\n", encoding="utf-8"
        )
        print(compare.describe(summary))
    else:
        label = f"recompute_old_log_prob={str(settings.recompute_old_log_prob).lower()}"
        _run_once(settings, model_dir, data, out, label)

    wall = time.perf_counter() - start
    kids, kids_mb = report.children_rss_mb()
    workers = f" (+ {kids_mb:.0f} MiB in {kids} reward worker processes)" if kids else ""
    print(f"wall time {wall:.1f} s, peak memory (RSS) {report.peak_rss_mb():.0f} MiB{workers}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (DemoError, DataError) as exc:
        print(f"demo_grpo: {exc}", file=sys.stderr)
        sys.exit(EXIT_REFUSED)
