"""Hard MATH judgements: repeating decimals, unit signs, complex numbers, inequalities, bases, several boxes.

Each category both ways round (the truth in either form), with near misses off by a sign, a factor, an
endpoint or a base.  Where the rule is exact arithmetic, the test also checks that no sympy is needed.
"""

from __future__ import annotations

import pytest
from test_reward import load_reward, make

from llm_rl.qwen2_5.reward_cases import RIGHT, WRONG


@pytest.fixture(scope="module")
def reward():
    return load_reward()


def judged(reward, answer: str, truth: str) -> bool:
    boxed = answer if answer.startswith("\\boxed") else f"\\boxed{{{answer}}}"
    result = reward.compute_score_dict("s", make(boxed), truth)
    assert result["timed_out"] is False
    return result["correct"]


def test_subscripts_that_are_not_bases_are_left_alone(reward):
    assert judged(reward, "P_2", "P_2")
    assert judged(reward, "x_{1}", "x_1")
    assert judged(reward, "a_2+1", "1+a_2")


@pytest.mark.parametrize(("category", "answer", "truth"), RIGHT)
def test_equal_in_value_is_right(reward, category, answer, truth):
    assert judged(reward, answer, truth), category


@pytest.mark.parametrize(("category", "answer", "truth"), WRONG)
def test_near_miss_is_wrong(reward, category, answer, truth):
    assert not judged(reward, answer, truth), category


@pytest.mark.parametrize(
    ("answer", "truth", "expected"),
    [
        ("0.\\overline{6}", "\\frac{2}{3}", True),
        ("0.\\overline{6}", "\\frac{1}{6}", False),
        ("36°", "36^\\circ", True),
        ("12.5", "12.5\\%", True),
        ("0.6+0.8i", "\\frac{3}{5}+\\frac{4}{5}i", True),
        ("\\frac{3+4i}{5}", "\\frac{4}{5}+\\frac{3}{5}i", False),
        ("3>x>-2", "-2<x<3", True),
        ("3\\geq x>-2", "-2<x<3", False),
        ("1011_3", "1011_2", False),
        ("1011", "1011_2", True),
    ],
)
def test_exact_rules_need_no_sympy(reward, answer, truth, expected):
    """The categories are decided in the caller, by exact rationals: no worker, no float tolerance."""
    assert reward.fast_verdict(answer, (truth,)) is expected


def test_exact_arithmetic_refuses_what_it_cannot_hold(reward):
    for huge in ("{{{2^{64}}^{64}}^{64}}^{64}", "(1+i)^{10^{9}}", "\\frac{1}{0}"):
        assert reward._exact(huge) is None
    assert reward._exact("\\frac{1}{3}-0.\\overline{3}") == (0, 0, True)
    assert reward._exact("0.1") == (
        reward.Fraction(1, 10),
        0,
        False,
    )  # a decimal keeps math_verify's rounding


def test_mixed_numbers_are_still_left_to_math_verify(reward):
    assert reward.fast_verdict("1\\frac12", ("\\frac32",)) is None
    assert judged(reward, "1\\frac12", "\\frac32")  # as before these rules: math_verify reads 1 1/2


def test_close_decimals_are_still_left_to_math_verify(reward):
    assert reward.fast_verdict("0.33333", ("\\frac{1}{3}",)) is None
    assert reward.fast_verdict("0.33333+0.33333i", ("\\frac{1}{3}+\\frac{1}{3}i",)) is None
    assert reward.fast_verdict("0.5", ("50\\%",)) is None  # what math_verify makes of a percent stands
