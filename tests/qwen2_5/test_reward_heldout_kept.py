"""The held-out sets stay exactly where they stood before issue 47's rules (hedging, Unicode, pairs and sets).

The held-out tests themselves keep floors (>= 0.99, >= 0.95) that a regression of one or two answers passes: a
first version of the hedging rule read `\\pm7` (no space) as one value and cost `-7 or 7` and `x=-5 or x=5`
their scores unnoticed.  Here every miss is named: none on the shapes and words sets, and on the second set only
the one it had when it was first scored (README, "The MATH reward")."""

from __future__ import annotations

import pytest
from test_reward import load_reward
from test_reward_shapes import HELD_OUT as SHAPES
from test_reward_shapes import figures
from test_reward_words import HELD_OUT as WORDS
from test_reward_words import SECOND_HELD_OUT, held_out


@pytest.fixture(scope="module")
def reward():
    return load_reward()


@pytest.mark.parametrize(
    ("path", "misses"),
    [
        (SHAPES, []),
        (WORDS, []),
        (SECOND_HELD_OUT, [("word answer", "The meeting falls on a Thursday.", "\\text{Thursday}")]),
    ],
    ids=["shapes", "words", "second"],
)
def test_every_held_out_miss_is_the_one_it_had(reward, path, misses):
    result = figures(reward, held_out(path))
    assert result["false_positives"] == [] and result["misses"] == misses, result
