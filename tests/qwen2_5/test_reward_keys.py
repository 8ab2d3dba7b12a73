"""A wrong or missing key is an error, never a silent 0: the command line and TRL's truth column (issue 47)."""

from __future__ import annotations

import json

import pytest
from test_reward import _cli as cli
from test_reward import load_reward, make


@pytest.mark.parametrize(
    ("row", "missing"),
    [
        ({"response": "\\boxed{7}", "truth": "7"}, "no ground truth"),
        ({"response": "\\boxed{7}", "gt": "7"}, "no ground truth"),
        ({"text": "\\boxed{7}", "ground_truth": "7"}, "no response"),
        ({"response": "\\boxed{7}", "reward_model": {"truth": "7"}}, "no ground truth"),
    ],
)
def test_cli_names_the_keys_it_reads_when_one_is_missing(tmp_path, row, missing):
    path = tmp_path / "in.jsonl"
    path.write_text(
        json.dumps({"response": make("\\boxed{7}"), "answer": "7"}) + "\n\n" + json.dumps(row) + "\n"
    )
    done = cli("score", str(path))
    assert done.returncode == 1 and done.stdout == ""
    [line] = done.stderr.strip().splitlines()
    assert f"in.jsonl:3: {missing}" in line  # the line it is on, blank lines counted
    keys = (
        "ground_truth, answer, reward_model.ground_truth" if "truth" in missing else "response, solution_str"
    )
    assert keys in line and repr(sorted(row)) in line


def test_cli_help_names_the_keys():
    done = cli("score", "--help")
    assert "ground_truth, answer, reward_model.ground_truth" in " ".join(done.stdout.split())


MATH_SOLUTION = "We have $3+4=7$, so adding the two counts gives seven apples in all."


def test_trl_skips_a_solution_column_without_a_box_for_the_answer_column():
    reward = load_reward()
    scores = reward.trl_reward(
        [make("\\boxed{7}"), make("\\boxed{8}")], solution=[MATH_SOLUTION, MATH_SOLUTION], answer=["7", "7"]
    )
    assert scores == [1.0, 0.0]


def test_trl_reads_a_boxed_solution_first():
    reward = load_reward()
    scores = reward.trl_reward([make("\\boxed{7}")], solution=["So $3+4=\\boxed{7}$."], answer=["8"])
    assert scores == [1.0]


def test_trl_refuses_when_no_column_holds_an_answer():
    reward = load_reward()
    with pytest.raises(ValueError, match="not every row holds an answer") as err:
        reward.trl_reward(
            [make("\\boxed{7}"), make()], solution=[MATH_SOLUTION, "\\boxed{1}"], level=["1", "2"]
        )
    message = str(err.value)
    assert "\n" not in message and message.endswith("the dataset's columns are ['level', 'solution']")
