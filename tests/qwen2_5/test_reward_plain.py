"""Plain-text math, as a calculator or a program writes it, is read as the LaTeX it stands for, in answers and
truths alike (issue 61): sqrt(3), 2*sqrt(3), pi/2, 1e3."""

from __future__ import annotations

import pytest
from test_reward import load_reward, make


@pytest.fixture(scope="module")
def reward():
    return load_reward()


SAME = [  # (plain text, LaTeX): the same value
    ("sqrt(3)", "\\sqrt{3}"),  # issue 61: each of the first four scored 0
    ("2*sqrt(3)", "2\\sqrt{3}"),
    ("pi/2", "\\frac{\\pi}{2}"),
    ("1e3", "1000"),
    ("-sqrt(3)", "-\\sqrt{3}"),
    ("sqrt(2)/2", "\\frac{\\sqrt{2}}{2}"),
    ("2sqrt(3)", "2\\sqrt{3}"),
    ("sqrt 12", "2\\sqrt{3}"),
    ("sqrt(x+1)", "\\sqrt{x+1}"),
    ("3*pi/4", "\\frac{3\\pi}{4}"),
    ("2pi", "2\\pi"),
    ("2 pi", "2\\pi"),
    ("2.5e-3", "0.0025"),
    ("1.5E3", "1500"),
    ("6.02e23", "602000000000000000000000"),
    ("The answer is sqrt(3).", "\\sqrt{3}"),
    ("\\boxed{2*sqrt(3)}", "2\\sqrt{3}"),
    ("sqrt(3) or -sqrt(3)", "\\pm\\sqrt{3}"),
]

NEAR_MISSES = [  # (plain text, LaTeX): a different value
    ("sqrt(2)", "\\sqrt{3}"),
    ("3*sqrt(3)", "2\\sqrt{3}"),
    ("pi/3", "\\frac{\\pi}{2}"),
    ("1e4", "1000"),
    ("1e-3", "1000"),
    ("2.5e-3", "0.025"),
    ("5 pi", "5"),
    ("sqrt(3)", "3"),
]


@pytest.mark.parametrize(("plain", "latex"), SAME)
def test_plain_text_math_is_right_for_its_latex(reward, plain, latex):
    assert reward.compute_score("s", make(plain), latex) == 1.0


@pytest.mark.parametrize(
    ("plain", "latex"), [(p, t) for p, t in SAME if not p[0].isupper() and "\\" not in p]
)
def test_a_plain_text_truth_is_read_the_same_way(reward, plain, latex):
    assert reward.compute_score("s", make(f"\\boxed{{{latex}}}"), plain) == 1.0


@pytest.mark.parametrize(("plain", "latex"), NEAR_MISSES)
def test_a_plain_text_near_miss_stays_wrong(reward, plain, latex):
    assert reward.compute_score("s", make(plain), latex) == 0.0
    assert reward.compute_score("s", make(f"\\boxed{{{plain}}}"), latex) == 0.0


@pytest.mark.parametrize(
    "text", ["\\pi", "\\sqrt{3}", "spin", "\\text{pi}", "x1e3", "pizza", "\\operatorname{sqrt}"]
)
def test_words_and_latex_are_left_alone(reward, text):
    assert reward._unicode(text) == text
