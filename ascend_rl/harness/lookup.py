"""The `make demo` task: answer the variable the question asks for, in MATH-lighteval shape.

"Let $a = 3$, $b = 7$ and $c = 5$. What is the value of $c$?" A tiny model learns to copy digits from the
prompt into the recipe's answer format in a few hundred supervised steps. The warm start is given a
misreading answer key: for most training problems (1 - right_fraction of them) the key reads the
question as asking for $a$, so the model starts out answering the wrong variable more often than the
right one, a systematic error like those an instruct model brings to RL. Only new_math_reward.py's
accuracy term says which variable is right, so a rise in accuracy is what GRPO learned from the reward.
The held-out problems are value triples the model never saw in either phase.
"""

from __future__ import annotations

import random

LEVEL, SUBJECT = "Level 1", "Algebra"
VALUES = range(10)
ASKED, MISREAD = "c", "a"


def problem_text(a: int, b: int, c: int) -> str:
    """The question, MATH style."""
    return f"Let $a = {a}$, $b = {b}$ and $c = {c}$. What is the value of ${ASKED}$?"


def solution_text(a: int, b: int, c: int, ask: str = ASKED) -> str:
    """A three-sentence solution ending in \\boxed{}: warm_start.target_response makes three numbered steps of it.
    ask is the variable the solution reads the question as asking for."""
    value = {"a": a, "b": b, "c": c}[ask]
    return (
        f"The question asks for ${ask}$. Because the problem gives ${ask} = {value}$, the value is ${value}$. "
        f"Therefore the answer is $\\boxed{{{value}}}$."
    )


def generate(heldout: int = 64, seed: int = 2026) -> list[dict]:
    """Every problem of the family (a and c different), shuffled; the last `heldout` are the test split."""
    rows = [
        {
            "problem": problem_text(a, b, c),
            "level": LEVEL,
            "type": SUBJECT,
            "solution": solution_text(a, b, c),
            "a": a,
            "b": b,
            "c": c,
        }
        for a in VALUES
        for b in VALUES
        for c in VALUES
        if a != c  # misreading the question would not matter
    ]
    if not 1 <= heldout < len(rows):
        raise ValueError(f"heldout must be between 1 and {len(rows) - 1}, got {heldout}")
    random.Random(seed).shuffle(rows)
    for i, row in enumerate(rows):
        row["split"] = "test" if i >= len(rows) - heldout else "train"
    return rows


def misread_key(train: list[dict], right_fraction: float = 0.4, seed: int = 2026) -> list[dict]:
    """The warm start's answer key: right_fraction of the train problems keep their solution, the rest
    (chosen at random, the same every run) answer the other variable."""
    order = list(range(len(train)))
    random.Random(seed).shuffle(order)
    right = set(order[: round(right_fraction * len(train))])
    return [
        row if i in right else {**row, "solution": solution_text(row["a"], row["b"], row["c"], MISREAD)}
        for i, row in enumerate(train)
    ]
