"""Shapes that used to reach sympy, decided exactly in the caller (issue 47): multiple-choice letters,
matrices and vectors, intervals and unions of intervals, percent against percent, logarithms of one base."""

from __future__ import annotations

import pytest
from test_reward import load_reward, make


@pytest.fixture(scope="module")
def reward():
    return load_reward()


RIGHT = [
    ("\\text{(C)}", "\\text{(C)}"),
    ("(C)", "\\text{(C)}"),
    ("C", "\\text{(C)}"),
    ("\\text{C}", "(C)"),
    ("\\begin{bmatrix} 25 \\\\ -18 \\end{bmatrix}", "\\begin{pmatrix} 25 \\\\ -18 \\end{pmatrix}"),
    ("\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}", "\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}"),
    (
        "\\begin{pmatrix} \\frac12 \\\\ 0.5 \\end{pmatrix}",
        "\\begin{pmatrix} 0.5 \\\\ \\frac{1}{2} \\end{pmatrix}",
    ),
    ("(-\\infty, 40) \\cup (53, \\infty)", "(-\\infty,40)\\cup(53,\\infty)"),
    ("(53,\\infty)\\cup(-\\infty,40)", "(-\\infty,40)\\cup(53,\\infty)"),
    ("(1,3]\\cup(3,5)", "(1,5)"),
    ("[2, 7)", "[2,7)"),
    ("34\\%", "34\\%"),
    ("\\log_2 16", "\\log_{2}{16}"),
    ("\\log_{3}(10)", "\\log_3 10"),
]
WRONG = [
    ("\\text{(B)}", "\\text{(C)}"),
    ("(B)", "\\text{(C)}"),
    ("D", "(C)"),
    ("\\begin{pmatrix} 25 \\\\ 18 \\end{pmatrix}", "\\begin{pmatrix} 25 \\\\ -18 \\end{pmatrix}"),
    ("\\begin{pmatrix} -18 \\\\ 25 \\end{pmatrix}", "\\begin{pmatrix} 25 \\\\ -18 \\end{pmatrix}"),
    ("\\begin{pmatrix} 25 & -18 \\end{pmatrix}", "\\begin{pmatrix} 25 \\\\ -18 \\end{pmatrix}"),
    ("(-\\infty,40]\\cup[53,\\infty)", "(-\\infty,40)\\cup(53,\\infty)"),
    ("(40,53)", "(-\\infty,40)\\cup(53,\\infty)"),
    ("(1,3)\\cup(3,5)", "(1,5)"),
    ("[30,43]", "[30,43)"),
    ("(10,21)", "[10,21)"),
    ("35\\%", "34\\%"),
    ("\\log_2 17", "\\log_{2} 16"),
]


@pytest.mark.parametrize(("answer", "truth"), RIGHT)
def test_right_without_sympy(reward, answer, truth):
    assert reward.fast_verdict(answer, (truth,)) is True
    assert reward.compute_score("s", make(f"\\boxed{{{answer}}}"), truth) == 1.0


@pytest.mark.parametrize(("answer", "truth"), WRONG)
def test_near_miss_wrong_without_sympy(reward, answer, truth):
    assert reward.fast_verdict(answer, (truth,)) is False
    assert reward.compute_score("s", make(f"\\boxed{{{answer}}}"), truth) == 0.0


@pytest.mark.parametrize(
    ("answer", "truth"),
    [
        ("\\log_4 256", "\\log_2 16"),  # another base: math_verify decides
        ("[\\sqrt{2}, 3)", "[\\sqrt2,3]"),  # an endpoint that is not rational
        ("(1,2)", "(1,2)\\cup(3,x)"),
    ],
)
def test_what_is_not_exact_is_left_to_sympy(reward, answer, truth):
    assert reward.fast_verdict(answer, (truth,)) is None


def test_the_rules_agree_with_math_verify_where_it_decides():
    """math_verify's own verdict on each pair (run here, in the caller, once)."""
    from math_verify import parse, verify

    for pairs, expected in ((RIGHT, True), (WRONG, False)):
        for answer, truth in pairs:
            got = verify(parse(f"\\boxed{{{truth}}}"), parse(f"\\boxed{{{answer}}}"))
            assert got is expected, (answer, truth)


LOG_PAIRS = [  # (answer, truth): logarithms of different bases
    ("\\log_3 34", "\\log_{2} 34"),
    ("\\log_3 10", "\\log_2 10"),
    ("\\log_{10} 2", "\\log_2 10"),
    ("\\log_2 17", "\\log_{3} 16"),
    ("\\log_{0.5} 5", "\\log_2 5"),
    ("\\log_2 4", "\\log_3 9"),  # equal values: left to sympy, which says they are equal
    ("\\log_5 7", "\\log_{25} 49"),
    ("\\log_{9} 3", "\\log_4 2"),
]


def test_logarithms_of_different_bases_are_told_apart_without_sympy_as_math_verify_does(reward):
    """Two logarithms whose values differ by far more than rounding are wrong for each other (math_verify takes
    up to half a second in sympy for it); equal values stay with sympy."""
    from math_verify import parse, verify

    for answer, truth in LOG_PAIRS:
        expected = verify(
            parse(f"\\boxed{{{reward._for_sympy(reward._norm(truth))}}}"),
            parse(f"\\boxed{{{reward._for_sympy(reward._norm(answer))}}}"),
        )
        assert reward.fast_verdict(answer, (truth,)) is (None if expected else False), (answer, truth)
