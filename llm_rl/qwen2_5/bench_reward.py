"""Benchmark the MATH reward on one GRPO step (256 prompts x 8 samples) against plain math_verify.

Prints answers per second and p50 / p99 / max latency for new_math_reward.py (batch function and
per-answer calls from threads) and, in the same run, for a sequential math_verify scorer.  The faults
scenario then measures, for the reward before the zygote pool (git revision --before) and after it side
by side: hostile and ordinary answers issued from many threads at once (for several pool sizes), a fresh
process's first call, the next answer after every helper is killed, and the helpers' memory.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ascend_rl.paths import REPO
from llm_rl.qwen2_5 import reward_cases

REWARD_PATH = Path(__file__).resolve().parent / "new_math_reward.py"
BEFORE_REV = "b1d5914"  # the reward with a fixed pool of spawned workers and a wall-clock bound


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


def _sympy_problem(rng: random.Random) -> tuple[str, list[str], list[str]]:
    """A problem whose answers only sympy decides: the cheap checks read x, not x_{1}, as a variable."""
    a, b, x = rng.randint(2, 99), rng.randint(2, 99), "x_{1}"
    return f"{x}^2+{a + b}{x}+{a * b}", [f"({x}+{a})({x}+{b})"], [f"({x}+{a})({x}+{b + 1})"]


def make_step(n: int, hostile_rate: float, seed: int, sympy_share: float = 0.0) -> list[tuple[str, str]]:
    """n (response, ground truth) pairs: groups of 8 samples per prompt, hostile_rate of them hostile and
    sympy_share of the prompts with answers only sympy decides."""
    rng = random.Random(seed)
    items: list[tuple[str, str]] = []
    while len(items) < n:
        truth, right, wrong = _sympy_problem(rng) if rng.random() < sympy_share else _problem(rng)
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


def _fresh_pool(module, timeout: float, workers: int, seed: int) -> None:
    """New worker processes, warmed on answers the measured run does not contain; empty caches."""
    module.shutdown()
    module._CACHE.clear()
    warm = make_step(64, 0.0, seed + 1000, sympy_share=1.0)  # answers that reach the workers
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
    return _figures("plain math_verify, sequential", latencies, wall), correct  # the original reward's check


# ---------------------------------------------------------------- faults, load and start-up, before / after

STUCK = "\\boxed{{\\int_0^{{{k}}} \\sin(x^{{x}}) \\, dx}}"  # passes every cheap check; sympy runs for minutes


def _ordinary(k: int) -> tuple[str, str]:
    """A correct answer only math_verify decides, fresh per k so no cache answers it."""
    a, b, x = 2 + k, 3 + 2 * k, "x_{1}"  # the cheap checks read x, not x_{1}, as a variable
    return _response(random.Random(k), f"({x}+{a})({x}+{b})"), f"{x}^2+{a + b}{x}+{a * b}"


def _load_file(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _before_file(rev: str) -> Path | None:
    """The reward as it was at git revision rev, written to a temporary file (None without git)."""
    rel = REWARD_PATH.relative_to(REPO)
    try:
        text = subprocess.run(
            ["git", "-C", str(REWARD_PATH.parent), "show", f"{rev}:{rel}"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"cannot read the reward at {rev} ({exc}); no before figures", file=sys.stderr)
        return None
    path = Path(tempfile.mkdtemp(prefix="reward-before-")) / "new_math_reward.py"
    path.write_text(text)
    return path


def helper_pids(module) -> list[int]:
    """Every helper process of the module's pool (either version's)."""
    pool = module._get_pool()
    if pool is None:  # the version before gave up for good after a failed worker start
        return []
    if hasattr(pool, "pids"):
        return [pid for pids in pool.pids().values() for pid in pids]
    return [w.proc.pid for w in pool.idle]


def _memory(pid: int) -> tuple[float, float] | None:
    """(unique, proportional) resident MiB of a process from /proc/PID/smaps_rollup."""
    try:
        fields = dict(
            line.split(":", 1) for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]
        )
    except OSError:
        return None
    kib = {k: int(v.split()[0]) for k, v in fields.items()}
    return (kib["Private_Clean"] + kib["Private_Dirty"]) / 1024, kib["Pss"] / 1024


def adversarial(module, hostile: int, ordinary: int, timeout: float, workers: int, seed: int) -> str:
    """hostile + ordinary answers issued from one thread each, at once, on a warm pool."""
    module.shutdown()
    module._CACHE.clear()
    module.compute_score("s", *_ordinary(10_000 + seed), num_workers=workers)  # warm, outside the figures
    jobs = [(_response(random.Random(k), STUCK.format(k=k + 2)), "1", True) for k in range(hostile)]
    jobs += [(*_ordinary(seed * 1000 + k), False) for k in range(ordinary)]
    random.Random(seed).shuffle(jobs)
    barrier = threading.Barrier(len(jobs))

    def run(job):
        barrier.wait()
        t0 = time.perf_counter()
        result = module.compute_score_dict("s", job[0], job[1], timeout=timeout)
        return time.perf_counter() - t0, result, job[2]

    with ThreadPoolExecutor(max_workers=len(jobs)) as executor:
        runs = list(executor.map(run, jobs))
    module.shutdown()
    ordinary_s = sorted(t for t, _, bad in runs if not bad)
    hostile_s = sorted(t for t, _, bad in runs if bad)
    lost = sum(not r["correct"] for _, r, bad in runs if not bad)
    p99 = ordinary_s[min(len(ordinary_s) - 1, int(round(0.99 * len(ordinary_s))) - 1)]
    return (
        f"ordinary p50 {statistics.median(ordinary_s):6.2f} s  p99 {p99:6.2f} s  correct scored 0: {lost:2d}/{ordinary}"
        f"   hostile p50 {statistics.median(hostile_s):6.2f} s  max {hostile_s[-1]:6.2f} s"
    )


COLD = """
import importlib.util, json, sys, time
spec = importlib.util.spec_from_file_location("custom_module", sys.argv[1])
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
t0 = time.perf_counter()
score = m.compute_score("s", sys.argv[2], sys.argv[3])
print(json.dumps([time.perf_counter() - t0, score]))
"""


def cold_call(path: Path, runs: int) -> str:
    """A fresh interpreter's first call on an answer that needs sympy (median and max of runs)."""
    figures = []
    for k in range(runs):
        response, truth = _ordinary(k)
        done = subprocess.run(
            [sys.executable, "-c", COLD, str(path), response, truth],
            capture_output=True,
            text=True,
            check=True,
        )
        figures.append(json.loads(done.stdout.splitlines()[-1]))
    seconds = sorted(f[0] for f in figures)
    scores = {f[1] for f in figures}
    return f"first call p50 {statistics.median(seconds):6.2f} s  max {seconds[-1]:6.2f} s  scores {sorted(scores)}"


def heal(module, workers: int) -> str:
    """Kill every helper, then time the next answer that needs sympy and say whether it was scored."""
    module.shutdown()
    module._CACHE.clear()
    module.compute_score("s", *_ordinary(20_000), num_workers=workers)
    lines = []
    for k, what in enumerate(("every helper killed", "killed again")):
        for pid in helper_pids(module):
            os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            score = module.compute_score("s", *_ordinary(20_001 + k))
        lines.append(f"{what}: next answer {time.perf_counter() - t0:5.2f} s, score {score}")
    module.shutdown()
    return "; ".join(lines)


def memory(module, workers: int) -> str:
    """Resident memory of the helpers after a warm-up step, per process."""
    module.shutdown()
    module._CACHE.clear()
    warm = make_step(256, 0.0, 7, sympy_share=1.0)
    module.compute_score_batch(["s"] * 256, [r for r, _ in warm], [t for _, t in warm], num_workers=workers)
    pool = module._get_pool()
    if hasattr(pool, "pids"):
        groups = {"zygote": pool.pids()["zygote"], "worker": pool.pids()["idle"]}
    else:
        groups = {"worker": [w.proc.pid for w in pool.idle]}
    parts = []
    for name, pids in groups.items():
        figures = [m for m in map(_memory, pids) if m is not None]
        if figures:
            uss = statistics.mean(f[0] for f in figures)
            pss = statistics.mean(f[1] for f in figures)
            parts.append(
                f"{len(figures)} {name}{'s' if len(figures) > 1 else ''}: unique {uss:6.1f} MiB, PSS {pss:6.1f} MiB each"
            )
    module.shutdown()
    return "; ".join(parts)


def hard(versions: dict[str, Path]) -> None:
    """Accuracy on the hard judgements (llm_rl/qwen2_5/reward_cases.py: right answers and near misses)."""
    tables = reward_cases
    print(f"\nhard judgements ({len(tables.RIGHT)} right answers, {len(tables.WRONG)} near misses)")
    for name, path in versions.items():
        module = _load_file(path, f"reward_hard_{name}")
        wrong: dict[str, list[int]] = {}
        start = time.perf_counter()
        for expected, cases in ((True, tables.RIGHT), (False, tables.WRONG)):
            for category, answer, truth in cases:
                boxed = answer if answer.startswith("\\boxed") else f"\\boxed{{{answer}}}"
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    got = module.compute_score_dict("s", _response(random.Random(0), boxed), truth)["correct"]
                if got != expected:
                    wrong.setdefault(category, [0, 0])[0 if expected else 1] += 1
        seconds = time.perf_counter() - start
        total = len(tables.RIGHT) + len(tables.WRONG)
        misses = sum(sum(v) for v in wrong.values())
        false_pos = sum(v[1] for v in wrong.values())
        detail = ", ".join(f"{c} {v[0]} missed / {v[1]} false" for c, v in wrong.items()) or "none wrong"
        print(
            f"  {name:<6} accuracy {(total - misses) / total:.3f}  false positives {false_pos}  "
            f"({detail}; {seconds:.1f} s)"
        )
        module.shutdown()


def faults(versions: dict[str, Path], args) -> None:
    """The issue-12 figures for each version side by side."""
    print(
        f"\n{args.hostile} hostile + {args.ordinary} ordinary answers from {args.hostile + args.ordinary} threads at once, bound {args.timeout} s"
    )
    modules = {name: _load_file(path, f"reward_{name}") for name, path in versions.items()}
    for name, module in modules.items():
        sizes = [args.workers or module._default_workers()]
        if name == "after":
            sizes = sorted({1, 2, 4, *sizes})
        for size in sizes:
            os.environ["MATH_REWARD_WORKERS"] = str(size)
            line = adversarial(module, args.hostile, args.ordinary, args.timeout, size, args.seed)
            print(f"  {name:<6} {size} workers  {line}")
        os.environ.pop("MATH_REWARD_WORKERS", None)
    print("\ncold start: a fresh process's first call")
    for name, path in versions.items():
        print(f"  {name:<6} {cold_call(path, args.cold_runs)}")
    print("\nhealing")
    for name, module in modules.items():
        print(f"  {name:<6} {heal(module, args.workers or module._default_workers())}")
    print("\nmemory")
    for name, module in modules.items():
        print(f"  {name:<6} {memory(module, args.workers or module._default_workers())}")


# ---------------------------------------------------------------- a policy's answers against the original reward

WORKLOAD_PATH = (
    REPO / "tests" / "qwen2_5" / "reward_policy_workload.jsonl"
)  # reward_cases.policy_answers(512, 47)
HELDOUT_PATH = (
    REPO / "tests" / "qwen2_5" / "reward_policy_heldout.jsonl"
)  # reward_cases.policy_answers_heldout(768, 4747): held out from the exact rules
FRESH_PATH = (
    REPO / "tests" / "qwen2_5" / "reward_policy_fresh.jsonl"
)  # fresh_policy_answers(768, 2026): written before the speed work of issue 47 item 5, never tuned on


def _fresh_problem(rng: random.Random) -> tuple[str, list[str], list[str]]:
    """(truth, right spellings, near misses) of one MATH-style prompt in kinds that neither earlier workload draws:
    n-th roots, fractional powers, Euler's e, logarithms and trigonometric values, products of two letters, roots of
    a letter, lines, binomials and factorials, scientific notation; a third plain integers and fractions."""
    a, b = rng.randint(2, 30), rng.randint(2, 30)
    b += b == a
    k = rng.randint(2, 9)
    kind = rng.choice(
        ["integer"] * 3
        + ["fraction"] * 2
        + [
            "cube root",
            "power",
            "euler",
            "ln",
            "trig",
            "two letters",
            "letter root",
            "line",
            "binomial",
            "sci",
        ]
    )
    if kind == "integer":
        n = a * b + k
        return str(n), [str(n), f"{n}", f"{a * b} + {k}"], [str(n + 1), str(n - 2), str(a + b + k)]
    if kind == "fraction":
        g = math.gcd(a, a + b + k)
        num, den = a // g, (a + b + k) // g
        return (
            f"\\frac{{{num}}}{{{den}}}",
            [f"\\frac{{{num}}}{{{den}}}", f"\\tfrac{{{num}}}{{{den}}}", f"\\frac{{{3 * num}}}{{{3 * den}}}"],
            [f"\\frac{{{den}}}{{{num}}}", f"\\frac{{{num + 1}}}{{{den}}}"],
        )
    if kind == "cube root":
        return (
            f"\\sqrt[3]{{{a}}}",
            [f"\\sqrt[3]{{{a}}}", f"{a}^{{1/3}}", f"{a}^{{\\frac{{1}}{{3}}}}"],
            [f"\\sqrt{{{a}}}", f"\\sqrt[3]{{{a + 1}}}", f"{a}^{{3}}"],
        )
    if kind == "power":
        return (
            f"{k}^{{3/2}}",
            [f"{k}\\sqrt{{{k}}}", f"\\sqrt{{{k**3}}}", f"{k}^{{\\frac{{3}}{{2}}}}"],
            [f"{k}^{{2/3}}", f"\\sqrt{{{k}}}", f"{k + 1}\\sqrt{{{k + 1}}}"],
        )
    if kind == "euler":
        return f"e^{{{k}}}", [f"e^{{{k}}}", f"e^{k}"], [f"e^{{{k + 1}}}", f"{k}e", f"e^{{-{k}}}"]
    if kind == "ln":
        return (
            f"\\ln {a}",
            [f"\\ln {a}", f"\\ln({a})", f"\\ln{{{a}}}"],
            [f"\\ln {a + 1}", f"\\log_{{10}} {a}", f"\\ln {b}"],
        )
    if kind == "trig":
        angle = rng.choice(["\\frac{\\pi}{5}", "\\frac{\\pi}{7}", "1", "2"])
        fn, other = rng.sample(["\\sin", "\\cos", "\\tan"], 2)
        return (
            f"{k}{fn}{{{angle}}}",
            [f"{k}{fn}{{{angle}}}", f"{k}{fn}({angle})", f"{k} {fn} {angle}"],
            [f"{k + 1}{fn}{{{angle}}}", f"{k}{other}{{{angle}}}"],
        )
    if kind == "two letters":
        return (
            f"{a}xy",
            [f"{a}xy", f"{a}yx", f"{a} x y", f"{a}\\cdot xy"],
            [f"{a + 1}xy", f"{a}x^2y", f"{a}x+y"],
        )
    if kind == "letter root":
        return (
            f"{k}\\sqrt{{x}}",
            [f"{k}\\sqrt{{x}}", f"\\sqrt{{{k * k}x}}", f"{k}x^{{1/2}}"],
            [f"{k}\\sqrt{{2x}}", f"{k + 1}\\sqrt{{x}}", f"{k}x"],
        )
    if kind == "line":
        return (
            f"y={a}x+{b}",
            [f"y={a}x+{b}", f"y = {b} + {a}x", f"y={a}x+{b}"],
            [f"y={a}x-{b}", f"y={b}x+{a}"],
        )
    if kind == "binomial":
        n, r = rng.randint(6, 12), rng.randint(2, 4)
        value = math.comb(n, r)
        return (
            str(value),
            [str(value), f"\\binom{{{n}}}{{{r}}}", f"\\dbinom{{{n}}}{{{r}}}"],
            [
                str(value + n),
                f"\\binom{{{n + 1}}}{{{r}}}",  # never equal: C(n+1, r) > C(n, r)
                str(math.perm(n, r)),
            ],
        )
    return (
        f"{k}.{a % 10}\\times 10^{{{b}}}",
        [
            f"{k}.{a % 10}\\times 10^{{{b}}}",
            f"{k}.{a % 10} \\cdot 10^{{{b}}}",
            f"{k * 10 + a % 10}\\times 10^{{{b - 1}}}",
        ],
        [f"{k}.{a % 10}\\times 10^{{{b + 1}}}", f"{k}.{(a + 1) % 10}\\times 10^{{{b}}}"],
    )


def _fresh_response(rng: random.Random, answer: str, earlier: str) -> str:
    """A response around answer: mostly boxed in <answer>, some bare in the block, untagged, or in shapes neither
    earlier workload writes (a "Final answer:" line, \\(\\boxed{}\\), a box then a remark)."""
    steps = "".join(
        f"{i}. {rng.choice(['Let us compute', 'Simplify the expression', 'Apply the formula', 'So we obtain'])}"
        f" {'term ' * rng.randint(2, 25)}\n"
        for i in range(1, rng.randint(2, 7))
    )
    shape = rng.random()
    if shape < 0.6:
        return f"<think>\n{steps}</think>\n<answer>\n{rng.choice(['', 'Thus ', 'Hence the answer is '])}\\boxed{{{answer}}}\n</answer>"
    if shape < 0.7:
        return f"<think>\n{steps}</think>\n<answer>\nFinal answer: ${answer}$\n</answer>"
    if shape < 0.8:
        return f"<think>\n{steps}</think>\n<answer>\n\\(\\boxed{{{answer}}}\\)\n</answer>"
    if shape < 0.9:
        return f"{steps}Therefore the result is $\\boxed{{{answer}}}$."
    return f"<think>\n{steps}I first wrote \\boxed{{{earlier}}}.\nActually, that is off.\n</think>\n<answer>\n\\boxed{{{answer}}} (checked)\n</answer>"


def fresh_policy_answers(n: int, seed: int) -> list[tuple[str, str, bool]]:
    """n (response, truth, right) items, 8 samples per prompt, about 60 % right, in _fresh_problem's kinds."""
    rng = random.Random(seed)
    out: list[tuple[str, str, bool]] = []
    while len(out) < n:
        truth, right, wrong = _fresh_problem(rng)
        for _ in range(8):
            correct = rng.random() < 0.6
            answer = rng.choice(right if correct else wrong)
            out.append((_fresh_response(rng, answer, rng.choice(wrong)), truth, correct))
    return out[:n]


ORIGINAL_ENV = "ORIGINAL_MATH_REWARD"  # a path to the original recipe's new_math_reward.py
ORIGINAL_MIRROR = Path(
    "/work/.mirror/hicann+cann-recipes-train/repo"
)  # a bare git mirror of cann-recipes-train
ORIGINAL_IN_MIRROR = "llm_rl/qwen2_5/verl_npu_demo/new_math_reward.py"


def original_file(option: str | None) -> tuple[Path | None, str]:
    """The original recipe's reward (Huawei's cann-recipes-train), read at run time, never copied here:
    --original PATH, else $ORIGINAL_MATH_REWARD, else the file in a cann-recipes-train mirror
    ($ORIGINAL_MATH_REWARD_MIRROR, default /work/.mirror/...).  (None, why) when it cannot be had."""
    for where, value in (("--original", option), (f"${ORIGINAL_ENV}", os.environ.get(ORIGINAL_ENV))):
        if value:
            path = Path(value)
            return (path, f"{where} {path}") if path.is_file() else (None, f"{where} {path}: no such file")
    mirror = Path(os.environ.get(f"{ORIGINAL_ENV}_MIRROR", ORIGINAL_MIRROR))
    try:
        text = subprocess.run(
            ["git", f"--git-dir={mirror}", "show", f"HEAD:{ORIGINAL_IN_MIRROR}"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        why = exc.stderr.strip().splitlines()[-1] if getattr(exc, "stderr", None) else str(exc)
        return None, (
            f"not found (no --original, no ${ORIGINAL_ENV}, and {mirror}:{ORIGINAL_IN_MIRROR} unreadable: {why})"
        )
    path = Path(tempfile.mkdtemp(prefix="reward-original-")) / "new_math_reward.py"
    path.write_text(text)
    return path, f"{mirror} HEAD:{ORIGINAL_IN_MIRROR}"


def policy_workload(
    hostile_rate: float, seed: int, path: Path = WORKLOAD_PATH
) -> list[tuple[str, str, bool | None]]:
    """The kept policy-shaped answers (8 samples a prompt), hostile_rate of them replaced by hostile ones
    (labelled None: the labels say which spelling is right, and a hostile answer is no spelling)."""
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    items = [(r["response"], r["ground_truth"], r["right"]) for r in rows]
    rng = random.Random(seed)
    for k, index in enumerate(rng.sample(range(len(items)), round(len(items) * hostile_rate))):
        items[index] = (*HOSTILE[k % len(HOSTILE)], None)  # no label: some are right (\\boxed{1\\x00} for 1)
    return items


MEASURE = """
import importlib.util, json, sys, time, warnings, logging
warnings.simplefilter("ignore"); logging.disable(logging.WARNING)
path, how = sys.argv[1], sys.argv[2]
with open(sys.argv[3]) as f:
    workload, warm = json.load(f)
spec = importlib.util.spec_from_file_location("reward_under_test", path)
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
def score_all(items):
    if how == "batch":
        return [r["score"] for r in m.compute_score_batch(["s"] * len(items), [a for a, _ in items], [t for _, t in items])]
    return [float(m.compute_score("s", a, t)) for a, t in items]
def tree_cpu():  # CPU seconds of this process and every process under it (the reward's helpers), from /proc
    import os
    tick, children = os.sysconf("SC_CLK_TCK"), {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # utime, stime and the reaped children's cutime, cstime (a helper killed at its bound counts too)
        children.setdefault(int(fields[1]), []).append((int(pid), sum(map(int, fields[11:15])) / tick))
    mine = os.times()
    total, stack = time.process_time() + mine.children_user + mine.children_system, [os.getpid()]
    while stack:
        for pid, cpu in children.get(stack.pop(), []):
            total += cpu
            stack.append(pid)
    return total
score_all(warm)  # imports, helpers, caches of the parser: outside the figure, for every contender alike
c0, t0 = tree_cpu(), time.perf_counter()
scores = score_all(workload)
t1, c1 = time.perf_counter(), tree_cpu()
print(json.dumps({"seconds": t1 - t0, "cpu": c1 - c0, "scores": scores}))
"""


def _measure(path: Path, how: str, items, warm, workers: int | None) -> dict:
    env = dict(os.environ)
    if workers:
        env["MATH_REWARD_WORKERS"] = str(workers)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as data:  # too long for argv
        json.dump([[(a, t) for a, t, _ in items], [(a, t) for a, t, _ in warm]], data)
    try:
        done = subprocess.run(
            [sys.executable, "-c", MEASURE, str(path), how, data.name],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
    finally:
        os.unlink(data.name)
    if done.returncode != 0:
        raise RuntimeError(f"{how} on {path} failed: {done.stderr.strip()[-500:]}")
    return json.loads(done.stdout.splitlines()[-1])


def policy(args, versions: dict[str, Path]) -> None:
    """The policy-shaped workload through the original recipe's reward and this one, each in a fresh process,
    in rotated order, args.reps times; answers per second, the ratio and each one's accuracy on the labels."""
    path = Path(args.workload)
    items = policy_workload(args.hostile_rate, args.seed, path)
    warm = [(a, t, ok) for a, t, ok in reward_cases.policy_answers(16, args.seed + 1000)]
    # and 8 that only sympy decides, so that the reward's helpers are started and warm before the figure too (the
    # 16 above all end in the cheap checks, which left the helpers' start and warm-up inside the timed run)
    warm += [(a, t, None) for a, t in make_step(8, 0.0, args.seed + 1000, sympy_share=1.0)]
    module = _load_file(REWARD_PATH, "reward_policy_now")
    left = left_to_sympy(module, [(a, t) for a, t, _ in items])
    module.shutdown()
    hostile = sum((a, t) in HOSTILE for a, t, _ in items)
    right = sum(ok is True for *_, ok in items)
    print(
        f"\npolicy-shaped answers ({path.name}: {len(items)} = {len(items) // 8} prompts x 8 samples, {right} right, "
        f"{hostile} hostile); left to sympy by the cheap checks: {left}/{len(items)} ({left / len(items):.1%})"
    )
    original, where = original_file(args.original)
    contenders = {"now, per answer": (REWARD_PATH, "each"), "now, batch": (REWARD_PATH, "batch")}
    if "before" in versions:  # --before REV: the reward as it was, in the same run
        contenders = {
            f"before {args.before}, per answer": (versions["before"], "each"),
            f"before {args.before}, batch": (versions["before"], "batch"),
            **contenders,
        }
    if original is None:
        print(f"  original recipe's reward: skipped, {where}")
    else:
        print(f"  original recipe's reward: {where}")
        contenders = {"original, per answer": (original, "each"), **contenders}
    names = list(contenders)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    accuracy: dict[str, float] = {}
    for rep in range(args.reps):
        for name in (
            names[rep % len(names) :] + names[: rep % len(names)]
        ):  # rotated: no one always runs first
            path, how = contenders[name]
            got = _measure(path, how, items, warm, args.workers)
            seconds[name].append(got["seconds"])
            cpu[name].append(got["cpu"])
            labelled = [
                (s > 0) == ok for s, (*_, ok) in zip(got["scores"], items, strict=True) if ok is not None
            ]
            accuracy[name] = sum(labelled) / len(labelled)
    for name in names:
        rates = sorted(len(items) / s for s in seconds[name])
        print(
            f"  {name:<22} {statistics.median(rates):8.1f} answers/s (runs {rates[0]:.1f}-{rates[-1]:.1f})"
            f"   agrees with the labels on {accuracy[name]:.3f} (of {len(items) - hostile})"
        )
    if original is not None:
        base = seconds["original, per answer"]
        for name in names[1:]:
            ratios = sorted(b / s for b, s in zip(base, seconds[name], strict=True))
            print(
                f"  {name} / original: {statistics.median(ratios):.1f}x (per rep {ratios[0]:.1f}-{ratios[-1]:.1f},"
                f" {args.reps} reps, fresh processes, rotated)"
            )
        # CPU time of the caller and its helper processes: what a shared machine's load moves least
        base = cpu["original, per answer"]
        for name in names[1:]:
            ratios = sorted(b / c for b, c in zip(base, cpu[name], strict=True) if c > 0)
            if ratios:
                print(
                    f"  {name} / original, CPU time (caller and helpers): {statistics.median(ratios):.1f}x"
                    f" (per rep {ratios[0]:.1f}-{ratios[-1]:.1f}; {statistics.median(cpu[name]):.3f} s against"
                    f" {statistics.median(base):.3f} s)"
                )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2048, help="answers in the step (default 256 x 8)")
    parser.add_argument(
        "--hostile-rate", type=float, default=0.01, help="share of hostile answers (default 0.01)"
    )
    parser.add_argument(
        "--sympy-share",
        type=float,
        default=0.0,
        help="share of the step's prompts whose answers only sympy decides (default 0)",
    )
    parser.add_argument("--timeout", type=float, default=1.0, help="reward's per-answer bound in seconds")
    parser.add_argument("--workers", type=int, default=None, help="worker processes (default: CPUs, max 8)")
    parser.add_argument("--no-baseline", action="store_true", help="skip the sequential math_verify run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--scenario",
        choices=("step", "faults", "hard", "policy", "all"),
        default="all",
        help="what to measure (default all)",
    )
    parser.add_argument(
        "--before",
        default=BEFORE_REV,
        help=f"the reward to measure side by side: a git revision (default {BEFORE_REV}, the last one before "
        "the zygote pool), a file, or 'none'",
    )
    parser.add_argument("--hostile", type=int, default=20, help="hostile answers in the faults scenario")
    parser.add_argument("--ordinary", type=int, default=12, help="ordinary answers in the faults scenario")
    parser.add_argument("--cold-runs", type=int, default=3, help="fresh processes timed for the cold start")
    parser.add_argument(
        "--original",
        default=None,
        help=f"the original recipe's new_math_reward.py for --scenario policy (else ${ORIGINAL_ENV}, else a "
        "cann-recipes-train mirror; skipped with the reason when none is found)",
    )
    parser.add_argument("--reps", type=int, default=3, help="fresh-process runs of each contender (policy)")
    parser.add_argument(
        "--workload",
        default=str(WORKLOAD_PATH),
        help=f"the policy scenario's answers, a JSONL of response, ground_truth, right (default {WORKLOAD_PATH.name}; "
        f"{HELDOUT_PATH.name} is the held-out one)",
    )
    args = parser.parse_args(argv)
    if args.n < 1 or not 0 <= args.hostile_rate <= 1 or not 0 <= args.sympy_share <= 1 or args.timeout <= 0:
        parser.error("--n must be >= 1, --hostile-rate and --sympy-share within [0, 1] and --timeout > 0")
    versions = {}
    if args.before == "none":
        before = None
    elif Path(args.before).is_file():
        before = Path(args.before)
    else:
        before = _before_file(args.before)
    if before is not None:
        versions["before"] = before
    versions["after"] = REWARD_PATH
    print(f"machine: {available_cores()}")
    if args.scenario in ("step", "all"):
        step(args, versions)
    if args.scenario in ("hard", "all"):
        hard(versions)
    if args.scenario in ("policy", "all"):
        policy(args, versions)
    if args.scenario in ("faults", "all"):
        faults(versions, args)
    print(f"machine: {available_cores()}")
    return 0


def available_cores() -> str:
    """How much CPU this run can get now: one busy process per core for 1 s, CPU time over wall time."""
    cpus = len(os.sched_getaffinity(0))
    with ThreadPoolExecutor(max_workers=cpus) as executor:
        procs = [
            executor.submit(
                subprocess.run,
                [
                    sys.executable,
                    "-c",
                    "import time\ne=time.perf_counter()+1\nwhile time.perf_counter()<e: pass\n"
                    "print(time.process_time())",
                ],
                capture_output=True,
                text=True,
            )
            for _ in range(cpus)
        ]
        got = sum(float(p.result().stdout.strip() or 0) for p in procs)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return f"{cpus} cores, {got:.2f} of them available to this run (load average {load})"


def left_to_sympy(module, items) -> int:
    """How many of the (response, truth) items the cheap checks leave to sympy."""
    left = 0
    for response, truth in items:
        prep = module._prepare(response, truth)
        left += prep.answer is not None and module.fast_verdict(prep.answer.text, prep.truths) is None
    return left


def caller_side(module, items) -> str:
    """CPU the cheap checks take in the caller per answer, and how many answers they leave to sympy."""
    start = time.process_time()
    left = left_to_sympy(module, items)
    per_answer = (time.process_time() - start) / len(items) * 1e6
    return f"{'cheap checks in the caller':<34} {per_answer:9.0f} us CPU per answer   left to sympy {left}/{len(items)}"


def step(args, versions: dict[str, Path]) -> None:
    """One GRPO step through each version of the reward, and through plain math_verify for agreement."""
    items = make_step(args.n, args.hostile_rate, args.seed, args.sympy_share)
    scores = []
    for name, path in versions.items():
        module = _load_file(path, f"reward_step_{name}")
        workers = args.workers or module._default_workers()
        print(
            f"{name}: {len(items)} answers, {round(args.n * args.hostile_rate)} hostile, "
            f"{args.sympy_share:.0%} of the prompts for sympy alone, bound {args.timeout} s, {workers} workers"
        )
        print(f"  {caller_side(module, items)}")
        lines, scores = run_reward(module, items, args.timeout, workers, args.seed)
        for line in lines:
            print(f"  {line}")
        module.shutdown()
    if not args.no_baseline:
        line, correct = run_baseline(items)
        print(line)
        agree = sum((s > 0) == c for s, c in zip(scores, correct, strict=True))
        print(f"correctness agreement with plain math_verify: {agree}/{len(items)}")


if __name__ == "__main__":
    sys.exit(main())
