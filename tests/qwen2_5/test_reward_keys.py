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


# A truth that holds no answer: every response would score 0 and a run would learn from the zeros (issue 61: these
# scored 0 silently, where a missing key is an error).  The hostile-input tests held the first three as 0.
NO_ANSWER = [None, "", {"a": 1}, "  ", "$$", "\\boxed{}", [], [None, ""]]


@pytest.mark.parametrize("truth", NO_ANSWER, ids=repr)
def test_a_truth_that_holds_no_answer_is_an_error(truth):
    reward = load_reward()
    for score in (reward.compute_score, reward.compute_score_dict):
        with pytest.raises(ValueError, match="holds no answer") as err:
            score("s", make(), truth)
        assert isinstance(err.value, reward.NoGroundTruth) and "\n" not in str(err.value)
    with pytest.raises(reward.NoGroundTruth, match=r"^item 2: the ground truth .* holds no answer"):
        reward.compute_score_batch(None, [make()] * 3, ["1", "1", truth])


def test_a_truth_with_an_answer_among_others_is_scored():
    reward = load_reward()
    assert reward.compute_score("s", make(), [None, "", "1"]) == 1.0
    assert (
        reward.compute_score("s", None, "1") == 0.0
    )  # a response that is not text is the policy's, scored 0


@pytest.mark.parametrize("truth", ["", "$$", []], ids=repr)
def test_cli_refuses_a_line_whose_truth_holds_no_answer(tmp_path, truth):
    path = tmp_path / "in.jsonl"
    path.write_text(
        json.dumps({"response": make(), "answer": "1"})
        + "\n"
        + json.dumps({"response": make(), "ground_truth": truth})
        + "\n"
    )
    done = cli("score", str(path))
    assert done.returncode == 1 and done.stdout == ""
    [line] = done.stderr.strip().splitlines()
    assert "in.jsonl:2: the ground truth" in line and "holds no answer" in line
