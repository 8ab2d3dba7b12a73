"""No credit for hedging (issue 47): an answer that offers more than one value, a range, a bound or an
alternative scores 0, unless the truth itself is that kind of object (an inequality, an interval, a set)."""

from __future__ import annotations

import pytest
from test_reward import load_reward, make


@pytest.fixture(scope="module")
def reward():
    return load_reward()


# every one names the truth 5 among what it offers
HEDGES = [
    # alternatives: probably X, maybe Y
    "I think it's 4 but maybe 5",
    "It's 5, but maybe 4.",
    "Probably 5, possibly 6.",
    "Maybe $4$, maybe $5$.",
    "Perhaps 5; it could be 6 though.",
    "It might be 4 or it might be 5.",
    "Either 5 or 6.",
    "$5$ (or possibly $6$)",
    "\\boxed{5} (maybe \\boxed{6})",
    "\\boxed{5}, but I am not sure; it might also be 7",
    "I guess 6, but 5 is likely too.",
    "5, unless it is 6? Not sure.",
    "\\boxed{4 \\text{ or maybe } 5}",
    # lists with question marks
    "Not sure: 3? 4? 5?",
    "5? 6?",
    "Is it $4$? Or $5$?",
    "\\boxed{5}? \\boxed{6}?",
    # ranges
    "between 4 and 5",
    "Somewhere between $4$ and $6$.",
    "The answer lies between \\boxed{4} and \\boxed{6}.",
    "4 to 6",
    "from 4 to 6",
    "4–6",
    "$4$—$6$",
    "\\boxed{4 \\text{ to } 6}",
    # bounds
    "at least 5",
    "At most $5$.",
    "The answer is at least \\boxed{5}.",
    "no more than 5",
    "not less than 5",
    "more than 4",
    "less than 6",
    "greater than 4",
    "above 4",
    "5 or more",
    "5 or fewer",
    "5 and above",
    "5 at least",
    "5+",
    "\\boxed{\\geq 5}",
    "\\boxed{\\le 5}",
    "x \\ge 5",
    "$x \\leq 5$",
    "x ≥ 5",
    "n > 4",
    "5 or so",
]


@pytest.mark.parametrize("answer", HEDGES)
def test_a_hedged_answer_scores_zero(reward, answer):
    assert reward.compute_score("s", make(answer), "5") == 0.0


@pytest.mark.parametrize("answer", [a for a in HEDGES if "boxed" in a])
def test_a_hedged_final_line_without_tags_scores_zero(reward, answer):
    response = "Step 1: Solve it.\nStep 2: Check it.\nSo the answer is " + answer
    assert reward.compute_score("s", response, "5") == 0.0


STATED_ONCE = [  # one value, however it is worded: the hedge rules must not take these for hedges
    "5",
    "\\boxed{5}",
    "Probably 5.",
    "I think the answer is $5$.",
    "The answer is $\\boxed{5}$. Is that right? Yes.",
    "$5$? Yes, $5$.",
    "The distance between $A$ and $B$ is $5$.",
    "The distance between $(1,2)$ and $(4,6)$ is $5$.",
    "The largest integer less than $6$ is $5$.",
    "The number of integers between 1 and 10 divisible by 2 is 5.",
    "Since $x \\ge 2$, the value is $5$.",
    "From $x=2$, we get $y=5$.",
    "It is at least 4, and in fact exactly 5, so the answer is $5$.",
]


@pytest.mark.parametrize("answer", STATED_ONCE)
def test_one_value_stated_with_such_words_stays_right(reward, answer):
    assert reward.compute_score("s", make(answer), "5") > 0.0


@pytest.mark.parametrize(
    ("answer", "truth", "score"),
    [
        ("x \\ge 5", "x \\ge 5", 1.0),
        ("$x \\geq 5$", "[5,\\infty)", 1.0),
        ("x ≥ 5", "x\\geq5", 1.0),
        ("x > 4", "x \\ge 5", 0.0),
        ("$-2 < x < 3$", "(-2,3)", 1.0),
        ("1 or 2", "1, 2", 1.0),
        ("x = 5 or x = -5", "\\pm 5", 1.0),
        ("-7 or 7", "\\pm7", 1.0),  # \pm written against its number (the held-out sets have it)
        ("x=-5 or x=5", "\\pm5", 1.0),
        ("-7 or 8", "\\pm7", 0.0),
        ("4 or 5", "4, 5", 1.0),
        ("4 or 6", "4, 5", 0.0),
    ],
)
def test_when_the_truth_is_several_values_or_a_range_the_answer_is_judged(reward, answer, truth, score):
    assert reward.compute_score("s", make(answer), truth) == score


THINK = "<think>\nStep 1: Solve it.\nStep 2: Check it.\n</think>\n"


@pytest.mark.parametrize(
    "blocks",
    [
        ["1", "2", "3", "4"],  # issue 61: scored 0.7 against 4, where two disagreeing boxes score 0
        ["4", "5"],
        ["5", "4"],
        ["\\boxed{3}", "\\boxed{4}"],
        ["4 or 5", "4"],  # an earlier block that hedges
        ["\\frac{1}{2}", "4"],
    ],
)
def test_answer_blocks_that_disagree_score_zero_as_boxes_do(reward, blocks):
    assert (
        reward.compute_score("s", make("\\boxed{1} \\boxed{2} \\boxed{3} \\boxed{4}"), "4") == 0.0
    )  # the rule
    response = THINK + "\n".join(f"<answer>\n{b}\n</answer>" for b in blocks)
    assert reward.compute_score("s", response, "4") == 0.0
    assert reward.compute_score("s", response, blocks[0]) == 0.0  # whichever block the truth names


@pytest.mark.parametrize(
    ("response", "truth"),
    [
        (THINK + "<answer>\n\\boxed{4}\n</answer>\n<answer>\n4\n</answer>", "4"),  # the same value twice
        (THINK + "<answer>\n\\frac{1}{2}\n</answer>\n<answer>\n0.5\n</answer>", "0.5"),
        (THINK + "<answer>\n(x+1)^2\n</answer>\n<answer>\nx^2+2x+1\n</answer>", "x^2+2x+1"),  # sympy agrees
        (THINK + "<answer>\n3\n</answer>\nWait, I made an error.\n<answer>\n4\n</answer>", "4"),  # taken back
        (
            "<think>\nI will write <answer>3</answer> at the end.\n</think>\n<answer>\n4\n</answer>",
            "4",
        ),  # quoted
        (THINK + "<answer>\n</answer>\n<answer>\n4\n</answer>", "4"),  # an empty block offers no value
    ],
)
def test_answer_blocks_that_agree_or_are_taken_back_keep_the_answer(reward, response, truth):
    assert reward.compute_score("s", response, truth) > 0.0
