"""Hard MATH judgements: repeating decimals, unit signs, complex numbers, inequalities, bases, several boxes,
square roots, pi, polynomials and points.

Each category both ways round (the truth in either form), with near misses off by a sign, a factor, an
endpoint or a base.  Where the rule is exact arithmetic, the test also checks that no sympy is needed.
"""

from __future__ import annotations

import warnings

import pytest
from test_reward import load_reward, make

from llm_rl.qwen2_5.reward_cases import RIGHT, WRONG, generated_pairs


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


@pytest.mark.parametrize(
    ("answer", "truth", "expected"),
    [
        ("\\sqrt{12}", "2\\sqrt{3}", True),
        ("\\frac{1}{1+\\sqrt{2}}", "\\sqrt{2}-1", True),
        ("3\\sqrt{2}", "2\\sqrt{3}", False),
        ("\\frac{86}{84}\\pi", "\\frac{43\\pi}{42}", True),
        ("2\\pi r", "2r\\pi", True),  # after _norm: 2\pir
        ("(x+90)(x+79)", "x^2+169x+7110", True),
        ("(x+90)(x+80)", "x^2+169x+7110", False),
        ("x\\cdot y", "yx", None),  # two letters side by side: math_verify reads them
        ("(51,-99)", "(51, -99)", True),
        ("(-99,51)", "(51,-99)", False),
        ("\\sqrt{2}, -\\sqrt{2}", "\\pm\\sqrt{2}", True),
    ],
)
def test_roots_pi_letters_and_points_need_no_sympy(reward, answer, truth, expected):
    """Square roots of rationals, pi and letters are exact too: letters and pi are compared at two points."""
    assert reward.fast_verdict(answer, (truth,)) is expected


@pytest.mark.parametrize(
    ("answer", "truth"),
    [
        ("A", "a"),  # math_verify folds the case of letters
        ("I", "i"),
        ("x(x+1)", "x^2+x"),  # x( may be a function applied
        ("1/2x", "\\frac{x}{2}"),  # math_verify reads 1/(2x)
        ("\\pi/2x", "\\frac{\\pi}{2x}"),
        ("\\sqrt{x^2}", "x"),  # |x|
        ("\\sqrt{-4}", "2i"),
        ("2^{x}", "4"),
        ("\\sqrt[3]{-8}", "-2"),  # sympy's cube root of -8 is the complex principal one
        ("\\ln 8", "3\\ln 2"),  # equal, in different forms
        ("60^\\circ", "\\frac{\\pi}{3}"),  # math_verify reads degrees as radians
        ("3.14159", "\\pi"),  # a decimal keeps math_verify's rounding
        ("3.4641", "2\\sqrt{3}"),
        ("\\sqrt{1000000007}", "\\sqrt{1000000007}+0"),  # too large to factor here
    ],
)
def test_what_the_exact_rules_leave_to_math_verify(reward, answer, truth):
    assert reward.fast_verdict(answer, (truth,)) is None


def test_the_exact_rules_never_disagree_with_math_verify(reward):
    """On 150 generated answers (roots, pi, polynomials, rational functions, points; right and near misses) every
    verdict the caller reaches is math_verify's own, and the caller reaches one for nearly all of them."""
    math_verify = pytest.importorskip("math_verify")
    decided, disagree = 0, []
    for shape, answer, truth in generated_pairs(150, seed=7):
        fast = reward.fast_verdict(answer, (truth,))
        if fast is None:
            continue
        decided += 1
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            slow = math_verify.verify(
                math_verify.parse(f"\\boxed{{{truth}}}"), math_verify.parse(f"\\boxed{{{answer}}}")
            )
        if fast != slow:
            disagree.append((shape, answer, truth, fast, slow))
    assert disagree == []
    assert decided >= 140, f"only {decided} of 150 decided in the caller"


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
