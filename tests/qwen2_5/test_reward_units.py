"""Answers with units decided exactly, without sympy (issue 47, item 5): where the answer and the truth are
numbers, each bare or followed by a unit word (the same unit where both have one), the numbers decide, as they
do for math_verify, which drops the unit.  Each verdict is checked against math_verify's own."""

from __future__ import annotations

import itertools

import pytest
from test_reward import load_reward, make


@pytest.fixture(scope="module")
def reward():
    return load_reward()


UNITS = ["\\text{ cm}", "\\text{ inches}", "\\text{ miles}", "\\text{ m}", "\\text{ cm}^2", "\\mbox{ feet}"]
NUMBERS = [
    ("5", "5"),
    ("5", "6"),
    ("\\frac{5}{2}", "2.5"),
    ("2.5", "3"),
    ("500", "5"),
    ("-4", "4"),
    ("16", "4"),
]


def _pairs() -> list[tuple[str, str]]:
    """(answer, truth): the truth with a unit, the answer bare, with the same unit, or \\$ against a bare truth."""
    out = []
    for (x, y), unit in itertools.product(NUMBERS, UNITS):
        out += [(x, f"{y}{unit}"), (f"{x}{unit}", f"{y}{unit}"), (f"{x} {unit}", y)]
    out += [(f"\\${x}", y) for x, y in NUMBERS] + [(x, f"{y}\\text{{ dollars}}") for x, y in NUMBERS]
    return out


PAIRS = _pairs()


def test_answers_with_units_are_decided_without_sympy_as_math_verify_decides_them(reward):
    from math_verify import parse, verify

    for answer, truth in PAIRS:
        fast = reward.fast_verdict(answer, (truth,))
        assert fast is not None, (answer, truth)
        expected = verify(
            parse(f"\\boxed{{{reward._for_sympy(reward._norm(truth))}}}"),
            parse(f"\\boxed{{{reward._for_sympy(reward._norm(answer))}}}"),
        )
        assert fast is expected, (answer, truth, expected)


@pytest.mark.parametrize(
    ("answer", "truth"),
    [
        ("4", "3\\text{ k}"),  # a letter, not a unit: what math_verify makes of it stands
        ("4", "3\\text{e}"),
        ("0.5", "50\\%"),
        ("6", "5\\text{ cm}^\\circ"),
    ],
)
def test_a_letter_or_a_percent_is_not_taken_for_a_unit(reward, answer, truth):
    assert reward.fast_verdict(answer, (truth,)) is None


def test_different_units_stay_wrong_and_the_same_number_stays_right(reward):
    assert reward.fast_verdict("5\\text{ m}", ("5\\text{ cm}",)) is False
    assert reward.fast_verdict("5", ("5\\text{ cm}",)) is True
    assert reward.fast_verdict("6", ("5\\text{ cm}",)) is False
    assert reward.fast_verdict("6\\text{ cm}", ("5",)) is False


def test_a_step_of_wrong_answers_with_units_opens_no_thread_pool(reward, monkeypatch):
    opened: list = []
    monkeypatch.setattr(reward, "ThreadPoolExecutor", lambda *a, **k: opened.append(k) or None)
    reward._CACHE.clear()
    answers = ["14", "26\\text{ inches}", "30", "17\\text{ cm}^2", "25", "25\\text{ inches}"]
    truths = ["25\\text{ inches}"] * 2 + ["29\\text{ cm}^2", "16\\text{ cm}^2"] + ["25\\text{ inches}"] * 2
    scores = reward.compute_score_batch(None, [make(f"\\boxed{{{a}}}") for a in answers], truths)
    assert [r["score"] > 0 for r in scores] == [False, False, False, False, True, True] and opened == []
