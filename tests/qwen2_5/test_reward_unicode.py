"""Unicode math is read as the LaTeX it stands for, in answers and truths alike (issue 47)."""

from __future__ import annotations

import pytest
from test_reward import load_reward, make


@pytest.fixture(scope="module")
def reward():
    return load_reward()


SAME = [  # (Unicode, LaTeX): the same value
    ("½", "\\frac12"),
    ("⅓", "\\frac13"),
    ("¾", "\\frac{3}{4}"),
    ("2½", "\\frac52"),
    ("-⅔", "-\\frac{2}{3}"),
    ("√2", "\\sqrt{2}"),
    ("√(2)", "\\sqrt{2}"),
    ("2√3", "2\\sqrt{3}"),
    ("√3/2", "\\frac{\\sqrt3}{2}"),
    ("√(x+1)", "\\sqrt{x+1}"),
    ("3√2 + 1", "1+3\\sqrt{2}"),
    ("∛8", "2"),
    ("x²", "x^2"),
    ("x³−1", "x^3-1"),
    ("2×10³", "2000"),
    ("x⁻¹", "\\frac{1}{x}"),
    ("3·4", "12"),
    ("6÷2", "3"),
    ("2×3", "6"),
    ("−5", "-5"),
    ("７", "7"),
    ("π/2", "\\frac{\\pi}{2}"),
    ("2πr", "2\\pi r"),
    ("45°", "45^\\circ"),
    ("x ≤ 5", "x\\le5"),
    ("x ≥ −2", "x \\geq -2"),
    ("(−∞, 2]", "(-\\infty,2]"),
    ("1011₂", "1011_2"),
]


@pytest.mark.parametrize(("unicode", "latex"), SAME)
def test_unicode_answer_is_read_as_its_latex(reward, unicode, latex):
    assert reward.compute_score("s", make(unicode), latex) == 1.0
    assert reward.compute_score("s", make(f"\\boxed{{{unicode}}}"), latex) == 1.0
    assert reward.compute_score("s", make(f"The answer is ${unicode}$."), latex) == 1.0


@pytest.mark.parametrize(("unicode", "latex"), SAME)
def test_unicode_truth_is_read_as_its_latex(reward, unicode, latex):
    assert reward.compute_score("s", make(f"\\boxed{{{latex}}}"), unicode) == 1.0


@pytest.mark.parametrize(
    ("unicode", "latex"),
    [
        ("½", "\\frac13"),
        ("⅔", "\\frac32"),
        ("√2", "\\sqrt{3}"),
        ("2√3", "3\\sqrt{2}"),
        ("√2/2", "\\sqrt{2}"),
        ("x²", "x^3"),
        ("x²", "2x"),
        ("2½", "\\frac12"),
        ("3·4", "7"),
        ("x ≤ 5", "x<5"),
        ("45°", "46^\\circ"),
    ],
)
def test_unicode_near_miss_stays_wrong(reward, unicode, latex):
    assert reward.compute_score("s", make(unicode), latex) == 0.0
    assert reward.compute_score("s", make(f"\\boxed{{{latex}}}"), unicode) == 0.0
