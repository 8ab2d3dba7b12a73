"""Answers judged by value whatever their shape, part two (issue 36, item 5).

Inside ``<answer>`` without ``\\boxed{}``: a word answer (``Monday``, ``odd``, ``yes``, ``neither``, ``no solution``)
against a ``\\text{...}`` truth, a number word (``five``, ``twelve``) against a number, several solutions joined by
"or" / "and" (``1 or 2``, ``x=1 or x=2``, ``$1$ or $2$``) against ``1, 2`` and ``x = 5 or x = -5`` against
``\\pm 5``.  Without tags, a box taken back on the same line (``First \\boxed{5}. Wait, I made an error. The answer
is \\boxed{6}.``) counts as it does with a newline before "Wait": the last box is the answer.  Each has its near
misses, which score 0.  The tables below are the development set; the held-out set
(tests/qwen2_5/reward_words_heldout.jsonl) was written apart from them, before the reward changed, and is only
scored.

``python tests/qwen2_5/test_reward_words.py [REWARD_FILE]`` prints the figures for a reward file (default: this
checkout's), e.g. for the reward before this work, written out with ``git show REV:llm_rl/...``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_reward import REWARD_PATH, load_reward, make
from test_reward_shapes import figures, print_figures

HELD_OUT = Path(__file__).resolve().parent / "reward_words_heldout.jsonl"
# Written after the word rules and the exact rules for roots, pi and letters, scored once, not tuned against:
# the five shapes in new wordings, plus exact values (73 answers; the README gives its figure).
SECOND_HELD_OUT = Path(__file__).resolve().parent / "reward_exact_heldout.jsonl"


@pytest.fixture(scope="module")
def reward():
    return load_reward()


RIGHT = [  # (answer block, ground truth), each equal in value
    ("Monday", "\\text{Monday}"),
    ("odd", "\\text{odd}"),
    ("yes", "\\text{yes}"),
    ("neither", "\\text{neither}"),
    ("no solution", "\\text{no solution}"),
    ("five", "5"),
    ("twelve", "12"),
    ("1 or 2", "1, 2"),
    ("x=1 or x=2", "1, 2"),
    ("$1$ or $2$", "1, 2"),
    ("x = 5 or x = -5", "\\pm 5"),
    ("The answer is Monday.", "\\text{Monday}"),
    ("It is even.", "\\text{even}"),
    ("twenty-one", "21"),
    ("The roots are 3 and -1.", "-1, 3"),
]

WRONG = [  # (answer block, ground truth), each a near miss
    ("Tuesday", "\\text{Monday}"),
    ("even", "\\text{odd}"),
    ("yes", "\\text{no}"),
    ("1 or 3", "1, 2"),
    ("x=5", "\\pm 5"),
    ("six", "5"),
    ("1 or 2", "2"),
    ("x = 5 or x = -5", "5"),
    ("x = 1 or y = 2", "1, 2"),
    ("1 or 2", "(1, 2)"),
    ("odd or even", "\\text{odd}"),
    ("not odd", "\\text{odd}"),
]

ONE_LINE = "First \\boxed{5}. Wait, I made an error. The answer is \\boxed{6}."


@pytest.mark.parametrize(("block", "truth"), RIGHT)
def test_equal_in_value_scores_as_correct(reward, block, truth):
    result = reward.compute_score_dict("s", make(block), truth)
    assert result["correct"] and result["timed_out"] is False, (block, truth)


@pytest.mark.parametrize(("block", "truth"), WRONG)
def test_near_miss_scores_zero(reward, block, truth):
    result = reward.compute_score_dict("s", make(block), truth)
    assert result["score"] == 0.0 and result["format"] == 0.0 and result["cot"] == 0.0, (block, truth)


@pytest.mark.parametrize(
    ("block", "truth"), [("Monday", "\\text{Monday}"), ("1 or 2", "1, 2"), ("five", "5")]
)
def test_scored_as_the_boxed_form_is(reward, block, truth):
    """0.7 + 0.2 + 0.1, as for \\boxed{} in the block."""
    assert reward.compute_score_dict("s", make(block), truth)["score"] == 1.0


@pytest.mark.parametrize("separator", [" ", "\n"])
def test_a_box_taken_back_on_the_same_line_counts_as_on_the_next(reward, separator):
    response = ONE_LINE.replace(" Wait", separator + "Wait")
    assert reward.compute_score("s", response, "6") == 0.7
    assert reward.compute_score("s", response, "5") == 0.0


@pytest.mark.parametrize(
    "response",
    [
        "The answer is \\boxed{5} or \\boxed{6}.",
        "The answer is \\boxed{5}, or maybe \\boxed{6}.",
        "It is \\boxed{5}. It could also be \\boxed{6}.",
    ],
)
def test_two_boxes_without_a_correction_are_still_ambiguous(reward, response):
    assert reward.compute_score("s", response, "6") == 0.0


def test_word_and_list_verdicts_need_no_sympy(reward):
    """Decided in the caller: word against word, number words, solution sets of exact values."""
    assert reward.fast_verdict("\\text{Monday}", ("\\text{Monday}",)) is True
    assert reward.fast_verdict("\\text{Tuesday}", ("\\text{Monday}",)) is False
    assert reward.fast_verdict("five", ("5",)) is True
    assert reward.fast_verdict("1, 2", ("1, 2",)) is True
    assert reward.fast_verdict("5, -5", ("\\pm 5",)) is True
    assert reward.fast_verdict("5", ("\\pm 5",)) is False
    assert reward.fast_verdict("1, 3", ("1, 2",)) is False


# Long runs of spaces, joins, commas and corrections, each up to ~20,000 characters: the reading of words, lists
# and corrections must stay linear (a join pattern with two adjacent \\s* took minutes on the first case).
PATHOLOGICAL = """
    import importlib.util, json, sys, time
    from test_reward import make
    spec = importlib.util.spec_from_file_location("reward_under_test", sys.argv[1])
    m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
    cases = {
        "spaces before or": (make("1" + " " * 15000 + "x or 2"), "1, 2"),
        "3000 ors": (make(" or ".join(["1"] * 3000)), "1, 2"),
        "3000 commas then or": (make(", ".join(str(i) for i in range(3000)) + " or 5"), "1, 2"),
        "2000 ands of words": (make(" and ".join(["odd"] * 2000)), "\\\\text{odd}"),
        "spaces after a full stop": ("\\\\boxed{1}." + " " * 15000 + "x \\\\boxed{2}", "2"),
        "tabs after a newline": ("\\\\boxed{1}\\n" + "\\t" * 15000 + "x \\\\boxed{2}", "2"),
        "800 corrections": ("x \\\\boxed{1}. Wait, " * 800 + "\\\\boxed{2}.", "2"),
        "3000 number words": (make("one " * 3000), "1"),
        "a long open pair": (make("1 or 2"), "(" + "1," * 6000 + "x"),
    }
    for name, (response, truth) in cases.items():
        start = time.process_time()
        prep = m._prepare(response, truth)
        if prep.answer is not None:
            m.fast_verdict(prep.answer.text, prep.truths)
        print(json.dumps({"case": name, "cpu": time.process_time() - start}), flush=True)
"""


def test_long_runs_are_read_in_linear_time():
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(PATHOLOGICAL), str(REWARD_PATH)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parent,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    cpu = {row["case"]: row["cpu"] for row in map(json.loads, done.stdout.splitlines())}
    assert len(cpu) == 9 and all(seconds < 1.0 for seconds in cpu.values()), cpu


# ---------------------------------------------------------------- the held-out set


def held_out(path: Path = HELD_OUT) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert rows and all({"category", "truth", "right"} <= set(row) for row in rows)
    assert all(("block" in row) != ("response" in row) for row in rows)
    return rows


def test_held_out_words_and_lists(reward):
    """The issue's target on the held-out set: accuracy >= 0.99 and no false positive."""
    result = figures(reward, held_out())
    assert result["items"] >= 130
    assert result["false_positives"] == [], result
    assert result["accuracy"] >= 0.99, result


def test_second_held_out_set(reward):
    """No false positive; its first score was 0.986 (one sentence without a copula, "The meeting falls on a
    Thursday.", read as prose), so the floor below stops a regression rather than restating that figure."""
    result = figures(reward, held_out(SECOND_HELD_OUT))
    assert result["items"] >= 70
    assert result["false_positives"] == [], result
    assert result["accuracy"] >= 0.95, result


def main(argv: list[str]) -> int:
    development = [
        {"category": "table", "block": b, "truth": t, "right": right}
        for right, table in ((True, RIGHT), (False, WRONG))
        for b, t in table
    ] + [
        {"category": "one line", "response": ONE_LINE, "truth": "6", "right": True},
        {"category": "one line", "response": ONE_LINE, "truth": "5", "right": False},
    ]
    return print_figures(
        Path(argv[0]) if argv else REWARD_PATH,
        {"development": development, "held-out": held_out(), "second": held_out(SECOND_HELD_OUT)},
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
