"""Benchmark the MATH reward on one GRPO step (256 prompts x 8 samples) against plain math_verify.

Prints answers per second and p50 / p99 / max latency for new_math_reward.py (batch function and
per-answer calls from threads) and, in the same run, for a sequential math_verify scorer.
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REWARD_PATH = Path(__file__).resolve().parents[1] / "llm_rl" / "qwen2_5" / "new_math_reward.py"


def _problem(rng: random.Random) -> tuple[str, list[str], list[str]]:
    """(ground truth, equivalent spellings, wrong answers) with fresh numbers, so no two prompts share them."""
    a, b = rng.randint(2, 99), rng.randint(2, 99)
    kind = rng.randrange(6)
    if kind == 0:
        return (
            f"\\frac{{{a}}}{{{a * b}}}",
            [f"\\dfrac{{1}}{{{b}}}", f"1/{b}", f"\\frac{{{a}}}{{{a * b}}}"],
            [f"1/{b + 1}"],
        )
    if kind == 1:
        return (
            f"x^2+{a + b}x+{a * b}",
            [f"(x+{a})(x+{b})", f"(x+{b})(x+{a})"],
            [f"(x+{a})(x+{b + 1})", f"x^2+{a}x"],
        )
    if kind == 2:
        return (
            f"{a}\\sqrt{{{b}}}",
            [f"\\sqrt{{{a * a * b}}}", f"{a} \\sqrt{{{b}}}"],
            [f"{a + 1}\\sqrt{{{b}}}"],
        )
    if kind == 3:
        return f"({a},-{b})", [f"({a}, -{b})", f"({a},-{b})"], [f"(-{b},{a})", f"({a},{b})"]
    if kind == 4:
        return str(a * b), [str(a * b), f"{a * b}.0"], [str(a * b + 1), str(a + b)]
    return (
        f"\\frac{{{a}\\pi}}{{{b}}}",
        [f"{a}\\pi/{b}", f"\\frac{{{a}}}{{{b}}}\\pi"],
        [f"\\frac{{\\pi}}{{{b}}}"],
    )


HOSTILE = [
    ("\\boxed{9^{9^{9^{9^{9}}}}}", "1"),
    ("\\boxed{(10^{10})!}", "1"),
    ("\\boxed{" + "{" * 5000 + "1" + "}" * 5000 + "}", "1"),
    (" ".join(f"\\boxed{{{i}}}" for i in range(20_000)), "1"),
    ("x" * 2_000_000 + "\\boxed{1}", "1"),
    ("\\boxed{1\x00}", "1"),
    ("\\boxed{1", "1"),
    ("\\boxed{3}", "2^{2^{2^{2^{2^{2}}}}}"),
    ("\\boxed{\\int_0^{10^{9}} \\sin(x^{x}) \\, dx}", "1"),
]


def _response(rng: random.Random, answer: str) -> str:
    steps = "".join(
        f"Step {i}: {rng.choice(['We solve the equation', 'Substitute the value', 'Therefore we simplify', 'Look again'])}"
        f" and {'compute ' * rng.randint(5, 40)}.\n"
        for i in range(1, rng.randint(2, 6))
    )
    boxed = answer if answer.startswith("\\boxed") else f"\\boxed{{{answer}}}"
    return f"<think>\n{steps}</think>\n<answer>\nThe answer is {boxed}.\n</answer>"


def make_step(n: int, hostile_rate: float, seed: int) -> list[tuple[str, str]]:
    """n (response, ground truth) pairs: groups of 8 samples per prompt, hostile_rate of them hostile."""
    rng = random.Random(seed)
    items: list[tuple[str, str]] = []
    while len(items) < n:
        truth, right, wrong = _problem(rng)
        for _ in range(8):
            answer = rng.choice(right) if rng.random() < 0.6 else rng.choice(wrong)
            items.append((_response(rng, answer), truth))
    items = items[:n]
    hostile_count = round(n * hostile_rate)
    for k, index in enumerate(rng.sample(range(n), hostile_count)):
        items[index] = HOSTILE[k % len(HOSTILE)]
    return items


def _figures(name: str, latencies: list[float], wall: float) -> str:
    ordered = sorted(latencies)
    p99 = ordered[min(len(ordered) - 1, int(round(0.99 * len(ordered))) - 1)]
    return (
        f"{name:<34} {len(ordered) / wall:9.1f} answers/s   p50 {statistics.median(ordered) * 1000:8.1f} ms"
        f"   p99 {p99 * 1000:8.1f} ms   max {ordered[-1] * 1000:8.1f} ms   wall {wall:7.2f} s"
    )


def _load_reward():
    spec = importlib.util.spec_from_file_location("custom_module", REWARD_PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fresh_pool(module, timeout: float, workers: int, seed: int) -> None:
    """New worker processes, warmed on answers the measured run does not contain; empty caches."""
    module.shutdown()
    module._CACHE.clear()
    warm = make_step(64, 0.0, seed + 1000)
    module.compute_score_batch(
        ["s"] * 64, [r for r, _ in warm], [t for _, t in warm], timeout=timeout, num_workers=workers
    )
    module._CACHE.clear()


def run_reward(module, items, timeout: float, workers: int, seed: int) -> tuple[list[str], list[float]]:
    """Figures for the batch function and for per-answer calls from `workers` threads."""
    lines = []
    _fresh_pool(module, timeout, workers, seed)
    start = time.perf_counter()
    module.compute_score_batch(
        ["s"] * len(items), [r for r, _ in items], [t for _, t in items], timeout=timeout, num_workers=workers
    )
    wall = time.perf_counter() - start
    lines.append(
        f"{'new_math_reward compute_score_batch':<34} {len(items) / wall:9.1f} answers/s   wall {wall:7.2f} s"
    )

    def timed(item: tuple[str, str]) -> tuple[float, float]:
        t0 = time.perf_counter()
        score = module.compute_score("s", item[0], item[1], timeout=timeout)
        return time.perf_counter() - t0, score

    _fresh_pool(module, timeout, workers, seed)
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers) as executor:
        results = list(executor.map(timed, items))
    wall = time.perf_counter() - start
    lines.append(_figures(f"new_math_reward, {workers} threads", [lat for lat, _ in results], wall))
    return lines, [score for _, score in results]


def run_baseline(items) -> tuple[str, list[bool]]:
    """Plain math_verify, one answer after another in the main thread (its own SIGALRM timeouts)."""
    import logging
    import warnings

    from math_verify import parse, verify

    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)  # latex2sympy2_extended logs a deprecation on every parse
    latencies, correct = [], []
    start = time.perf_counter()
    for response, truth in items:
        t0 = time.perf_counter()
        try:
            ok = bool(verify(parse("\\boxed{" + truth + "}"), parse(response)))
        except Exception:  # noqa: BLE001 - a crash counts as a wrong answer, as in a training loop
            ok = False
        latencies.append(time.perf_counter() - t0)
        correct.append(ok)
    wall = time.perf_counter() - start
    return _figures("plain math_verify, sequential", latencies, wall), correct


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2048, help="answers in the step (default 256 x 8)")
    parser.add_argument(
        "--hostile-rate", type=float, default=0.01, help="share of hostile answers (default 0.01)"
    )
    parser.add_argument("--timeout", type=float, default=1.0, help="reward's per-answer bound in seconds")
    parser.add_argument("--workers", type=int, default=None, help="worker processes (default: CPUs, max 8)")
    parser.add_argument("--no-baseline", action="store_true", help="skip the sequential math_verify run")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.n < 1 or not 0 <= args.hostile_rate <= 1 or args.timeout <= 0:
        parser.error("--n must be >= 1, --hostile-rate within [0, 1] and --timeout > 0")
    module = _load_reward()
    workers = args.workers or module._default_workers()
    items = make_step(args.n, args.hostile_rate, args.seed)
    print(
        f"{len(items)} answers, {round(args.n * args.hostile_rate)} hostile, bound {args.timeout} s, {workers} workers"
    )
    lines, scores = run_reward(module, items, args.timeout, workers, args.seed)
    for line in lines:
        print(line)
    module.shutdown()
    if not args.no_baseline:
        line, correct = run_baseline(items)
        print(line)
        agree = sum((s > 0) == c for s, c in zip(scores, correct, strict=True))
        print(f"correctness agreement with plain math_verify: {agree}/{len(items)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
