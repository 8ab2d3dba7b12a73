"""The evaluate command (ascend_rl.evaluate): evaluate a model on a test parquet the way the recipe's results table does: vLLM answers, new_math_reward.py scores."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from ascend_rl import evaluate as _library
from ascend_rl.errors import EXIT_OK, EXIT_REFUSED
from ascend_rl.evaluate import (
    DEFAULT_REWARD,
    EvalError,
    build_engine,
    context_length,
    default_verl_dir,
    generate,
    load_problems,
    load_reward,
    load_tokenizer,
    render,
    resolve_model,
    score,
    summarise,
    table,
    warm_up,
    write_answers,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python3 -m ascend_rl evaluate",
        description=_library.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Example: python3 -m ascend_rl evaluate --model llm_rl/qwen2_5/checkpoints/<run>/global_step_145 "
        "--data llm_rl/qwen2_5/data/math500/test.parquet --out eval/step145.json",
    )
    parser.add_argument(
        "--model", required=True, type=Path, help="Hugging Face folder or verl global_step_N folder"
    )
    parser.add_argument("--data", required=True, type=Path, help="test parquet in the recipe's format")
    parser.add_argument("--out", type=Path, help="write the JSON report here")
    parser.add_argument("--answers", type=Path, help="write every problem's answers and scores here (JSONL)")
    parser.add_argument("--label", help="the model's name in the table and report (default: the folder name)")
    parser.add_argument("--n", type=int, default=1, help="answers per problem (default: 1, greedy)")
    parser.add_argument(
        "--temperature",
        type=float,
        help="sampling temperature (default: 0, greedy, for --n 1; 1.0 for --n > 1)",
    )
    parser.add_argument(
        "--top-p", type=float, default=1.0, help="nucleus sampling when sampling (default: 1.0)"
    )
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=1024,
        help="answer length limit, the recipe's max_response_length (default: %(default)s)",
    )
    parser.add_argument("--limit", type=int, help="only the first N problems")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (default: %(default)s)")
    parser.add_argument(
        "--dtype", default="bfloat16", help="vLLM dtype, the recipe's rollout dtype (default: %(default)s)"
    )
    parser.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=0.8,
        help="vLLM's share of device memory (default: %(default)s)",
    )
    parser.add_argument(
        "--chat-template", type=Path, help="tokenizer_config.json or .jinja whose chat template to use"
    )
    parser.add_argument(
        "--reward", type=Path, default=DEFAULT_REWARD, help="reward file (default: the recipe's)"
    )
    parser.add_argument(
        "--verl-dir", type=Path, help="verl tree for merging a checkpoint (default: the recipe's)"
    )
    parser.add_argument(
        "--merged-dir", type=Path, help="where a merged checkpoint goes (default: beside its actor/)"
    )
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.n < 1:
        parser.error("--n must be at least 1")
    if args.temperature is None:
        args.temperature = 0.0 if args.n == 1 else 1.0
    if args.temperature < 0:
        parser.error("--temperature must be 0 (greedy) or more")
    if args.n > 1 and args.temperature == 0:
        parser.error("--n > 1 with --temperature 0 gives n identical greedy answers; pass a temperature")
    if args.max_tokens < 1 or (args.limit is not None and args.limit < 1):
        parser.error("--max-tokens and --limit must be at least 1")
    return args


def evaluate(args: argparse.Namespace, log=print) -> dict:
    """Load, generate, score; returns the report (also written to --out / --answers)."""
    start = time.perf_counter()
    problems = load_problems(args.data, args.limit)
    model_dir = resolve_model(args.model, args.verl_dir or default_verl_dir(), args.merged_dir, log)
    tokenizer = load_tokenizer(model_dir, args.chat_template)
    reward = load_reward(args.reward)
    prompt_ids = render(problems, tokenizer)
    # vLLM's CPU build reserves ~12 GiB of KV cache by default; a test set needs far less. No effect on NPU.
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    engine = build_engine(model_dir, args, context_length(model_dir, prompt_ids, args.max_tokens))
    warm_up(engine, prompt_ids[0])
    load_s = time.perf_counter() - start
    t0 = time.perf_counter()
    generated = generate(engine, prompt_ids, args)
    gen_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    score(problems, generated, reward)
    score_s = time.perf_counter() - t0
    report = summarise(problems, args.n)
    label = args.label or (args.model.name if args.model.name != "actor" else args.model.parent.name)
    run_s = gen_s + score_s
    report.update(
        label=label,
        model=str(args.model),
        merged_model=str(model_dir) if model_dir != args.model else None,
        data=str(args.data),
        sampling={
            "n": args.n,
            "temperature": args.temperature,
            "top_p": args.top_p,
            "max_tokens": args.max_tokens,
        },
        timing_s={"load": round(load_s, 2), "generate": round(gen_s, 2), "score": round(score_s, 2)},
        problems_per_s=round(len(problems) / run_s, 1) if run_s > 0 else None,
    )
    log(table(report, label))
    log(
        f"evaluate: load {load_s:.1f} s; then {len(problems)} problems in {run_s:.2f} s "
        f"({report['problems_per_s']} problems/s: generate {gen_s:.2f} s, score {score_s:.2f} s)"
    )
    metric = f"mean@{args.n}"
    log(f"| {label} | {report['overall']['problems']} | {metric} {100 * report['overall'][metric]:.2f} |")
    if args.out:
        from ascend_rl.data.util import write_json_atomic

        write_json_atomic(args.out, report)
        log(f"evaluate: wrote {args.out}")
    if args.answers:
        write_answers(args.answers, problems)
        log(f"evaluate: wrote {args.answers}")
    return report


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        evaluate(args)
    except EvalError as exc:
        print(f"evaluate: error: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    except ModuleNotFoundError as exc:
        print(
            f"evaluate: error: {sys.executable} has no module {exc.name!r}; run it with a Python that has vLLM "
            "(the NPU stack, or .venv-e2e after `make e2e-setup`)",
            file=sys.stderr,
        )
        return EXIT_REFUSED
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
