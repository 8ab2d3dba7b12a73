"""The bundled MATH-style problems: written out as a MATH-lighteval parquet folder, then run through prepare_math."""

from __future__ import annotations

import json
import time
from pathlib import Path

from ascend_rl.paths import REPO

BUNDLED = REPO / "llm_rl" / "qwen2_5" / "demo" / "problems.jsonl"
COLUMNS = ("problem", "level", "type", "solution")


def load_problems(path: Path = BUNDLED) -> list[dict]:
    """The bundled problems, one dict per JSONL line (MATH-lighteval columns plus split)."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def write_lighteval_dir(problems: list[dict], raw_dir: Path) -> Path:
    """Write the problems as data/{train,test}-00000-of-00001.parquet, the layout of the hub download."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    data_dir = raw_dir / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    for split in ("train", "test"):
        rows = [p for p in problems if p["split"] == split]
        table = pa.table({c: [r[c] for r in rows] for c in COLUMNS})
        pq.write_table(table, data_dir / f"{split}-00000-of-00001.parquet")
    return raw_dir


def prepare(out_dir: Path, log=print, rows: list[dict] | None = None, summary=None) -> dict[str, Path]:
    """Problems (default: the bundled ones) -> raw parquet -> prepare_math.convert -> {split: verl parquet path};
    log gets prepare_math's lines, summary (if given) one line with the rows per split and the time taken."""
    from ascend_rl.data import prepare_math

    start = time.monotonic()
    raw = write_lighteval_dir(load_problems() if rows is None else rows, out_dir / "raw")
    stats = prepare_math.convert(raw, out_dir, log=log)
    if summary is not None:
        counts = ", ".join(f"{st.written} {split}" for split, st in stats.splits.items())
        summary(f"data: {counts} problems -> {out_dir} ({time.monotonic() - start:.0f} s)")
    return dict(stats.outputs)


def render_prompts(problems: list[dict], chat_template: str) -> list[str]:
    """Each problem as the chat template renders it, for training the demo tokenizer."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    template = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(chat_template)
    return [
        template.render(messages=[{"role": "user", "content": p["problem"]}], add_generation_prompt=True)
        for p in problems
    ]


# (level, type, problem, solution) makers; every solution is one sentence per reasoning step, the last
# one holding the \boxed{} answer, so warm_start.target_response can turn it into the recipe's format.
def _sum(rng) -> tuple[str, str, str, str]:
    a, b = rng.randint(1, 9), rng.randint(1, 9)
    return (
        "Level 1",
        "Prealgebra",
        f"Compute ${a} + {b}$.",
        f"Calculate the sum: ${a} + {b} = {a + b}$. Therefore the answer is $\\boxed{{{a + b}}}$.",
    )


def _difference(rng) -> tuple[str, str, str, str]:
    a = rng.randint(6, 18)
    b = rng.randint(1, min(9, a - 1))
    return (
        "Level 1",
        "Prealgebra",
        f"Compute ${a} - {b}$.",
        f"Calculate the difference: ${a} - {b} = {a - b}$. Therefore the answer is $\\boxed{{{a - b}}}$.",
    )


def _sum_then_difference(rng) -> tuple[str, str, str, str]:
    a, b = rng.randint(1, 9), rng.randint(1, 9)
    c = rng.randint(1, a + b - 1)
    s = a + b
    return (
        "Level 2",
        "Prealgebra",
        f"Compute ${a} + {b} - {c}$.",
        f"Calculate the sum: ${a} + {b} = {s}$. Calculate the difference: ${s} - {c} = {s - c}$. "
        f"Therefore the answer is $\\boxed{{{s - c}}}$.",
    )


def _product(rng) -> tuple[str, str, str, str]:
    a, b = rng.randint(2, 5), rng.randint(2, 5)
    return (
        "Level 1",
        "Prealgebra",
        f"What is ${a} \\times {b}$?",
        f"Calculate the product: ${a} \\times {b} = {a * b}$. Therefore the answer is $\\boxed{{{a * b}}}$.",
    )


def _linear_equation(rng) -> tuple[str, str, str, str]:
    x, a = rng.randint(1, 9), rng.randint(1, 9)
    return (
        "Level 2",
        "Algebra",
        f"Solve for $x$: $x + {a} = {x + a}$.",
        f"Subtract {a} from both sides: $x = {x + a} - {a}$. Calculate the difference: ${x + a} - {a} = {x}$. "
        f"Therefore the answer is $\\boxed{{{x}}}$.",
    )


TEMPLATES = (_sum, _difference, _sum_then_difference, _product, _linear_equation)


def generate_problems(train: int = 240, test: int = 16, seed: int = 2026) -> list[dict]:
    """Distinct small-integer problems in MATH-lighteval shape, the first `train` marked train, the rest test."""
    import random

    rng = random.Random(seed)
    seen: set[str] = set()
    rows: list[dict] = []
    while len(rows) < train + test:
        level, kind, problem, solution = rng.choice(TEMPLATES)(rng)
        if problem in seen:
            continue
        seen.add(problem)
        split = "train" if len(rows) < train else "test"
        rows.append({"problem": problem, "level": level, "type": kind, "solution": solution, "split": split})
    return rows


def write_problems(rows: list[dict], path: Path = BUNDLED) -> Path:
    """Write rows as JSONL, one problem a line."""
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path
