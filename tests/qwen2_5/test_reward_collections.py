"""One rule for pairs, sets and \\pm, the same in both directions (issue 47): a bracketed tuple is an ordered
pair (or interval) and is right only for the same tuple; a list of solutions ("3, -3", "3 or -3", "\\pm 3",
"\\{3,-3\\}") is a set, right for the same set in any spelling and order; a pair is never right for a set, nor a
set for a pair."""

from __future__ import annotations

import itertools

import pytest
from test_reward import load_reward, make


@pytest.fixture(scope="module")
def reward():
    return load_reward()


PAIRS = ["(3, -3)", "(3,-3)"]
SETS = ["3, -3", "-3, 3", "3 or -3", "-3 or 3", "\\pm 3", "\\{3,-3\\}", "\\{-3, 3\\}", "x=3 or x=-3", "3,-3"]


@pytest.mark.parametrize(("answer", "truth"), itertools.product(PAIRS + SETS, repeat=2))
def test_pair_and_set_judged_by_one_rule_both_ways(reward, answer, truth):
    same_kind = (answer in PAIRS) == (truth in PAIRS)
    assert reward.compute_score("s", make(answer), truth) == (1.0 if same_kind else 0.0)
    assert reward.compute_score("s", make(answer), truth) == reward.compute_score("s", make(truth), answer)


@pytest.mark.parametrize(
    ("answer", "truth", "score"),
    [
        ("(-3, 3)", "(3,-3)", 0.0),  # a pair is ordered
        ("(1,2)", "\\{1,2\\}", 0.0),
        ("\\{1,2\\}", "(1,2)", 0.0),
        ("1 and 2", "(1, 2)", 0.0),
        ("(1, 2)", "1, 2", 0.0),
        ("(1,2), (3,4)", "(3,4),(1,2)", 1.0),  # a set of points, in any order
        ("(1,2), (3,4)", "(1,2)", 0.0),
        ("3 + \\sqrt{2}, 3 - \\sqrt{2}", "3\\pm\\sqrt{2}", 1.0),
        ("(3+\\sqrt{2}, 3-\\sqrt{2})", "3\\pm\\sqrt{2}", 0.0),
        ("\\{x \\mid -2<x<3\\}", "(-2,3)", 1.0),  # set-builder notation for an interval is that interval
        ("1,000", "1000", 1.0),  # a thousands separator is not a list
    ],
)
def test_pairs_sets_and_points(reward, answer, truth, score):
    assert reward.compute_score("s", make(answer), truth) == score


@pytest.mark.parametrize(
    ("answer", "truth", "score"),
    [
        # a tuple written out as the values of different unknowns (issue 61: 0 since the rule above, 1 before)
        ("x=2, y=3", "(2,3)", 1.0),
        ("\\boxed{x=2, y=3}", "(2,3)", 1.0),
        ("$x=2$, $y=3$", "(2,3)", 1.0),
        ("x = 2 and y = 3", "(2,3)", 1.0),
        ("a=1, b=2, c=3", "(1,2,3)", 1.0),
        ("x=2, y=\\frac{6}{2}", "(2,3)", 1.0),
        ("y=3, x=2", "x=2, y=3", 1.0),  # the same unknowns: in any order
        ("(2,3)", "x=2, y=3", 1.0),
        # in the order written, and never one value or a set
        ("x=2, y=3", "(3,2)", 0.0),
        ("a=1, b=2, c=4", "(1,2,3)", 0.0),
        ("x=2, y=3", "(2,3,4)", 0.0),
        ("x=2, z=3", "x=2, y=3", 0.0),
        ("x=2, y=3", "2", 0.0),
        ("x=2, y=3", "3", 0.0),
        ("x=2, y=3", "2, 3", 0.0),
        ("x = 2 and y = 7", "7", 0.0),
        ("x = 2 or y = 3", "(2,3)", 0.0),  # or offers alternatives, not a tuple
        ("x=2, x=3", "(2,3)", 0.0),  # one unknown twice: a list of solutions
        ("x=2, x=3", "2, 3", 1.0),
    ],
)
def test_assignments_to_different_unknowns_are_a_tuple(reward, answer, truth, score):
    assert reward.compute_score("s", make(answer), truth) == score
