"""compute_score_batch parses each distinct ground truth once per step (issue 47, item 5: GRPO's n samples of a
prompt share one truth), sends a truth's answers to the helper that has parsed it, and sizes the helpers to the
cores the caller may run on."""

from __future__ import annotations

import pytest
from test_reward import load_reward, make

from llm_rl.qwen2_5.bench_reward import HELDOUT_PATH, policy_workload


@pytest.fixture(scope="module")
def reward():
    return load_reward()


@pytest.fixture
def parses(reward, monkeypatch):
    """The ground truths _parse_truth was called with, and the truths _norm'd through a _Gold."""
    seen: list = []
    real = reward._parse_truth

    def counting(ground_truth):
        seen.append(ground_truth)
        return real(ground_truth)

    monkeypatch.setattr(reward, "_parse_truth", counting)
    return seen


def test_a_grpo_shaped_batch_parses_each_truth_once_and_scores_as_one_by_one(reward, parses):
    items = policy_workload(0.0, 0, HELDOUT_PATH)  # 96 prompts x 8 samples, 8.9 % of them for math_verify
    reward._CACHE.clear()
    batch = reward.compute_score_batch(None, [a for a, _, _ in items], [t for _, t, _ in items])
    truths = [t for _, t, _ in items]
    assert sorted(parses) == sorted(set(truths)) and len(parses) == len(set(truths)) < len(items) // 7
    del parses[:]
    reward._CACHE.clear()
    alone = [reward.compute_score_dict(None, a, t) for a, t, _ in items]
    assert batch == alone
    assert len(parses) == len(items)  # one by one, each call parses its own truth


def test_equal_truths_of_other_types_are_not_merged(reward, parses):
    responses = [make("\\boxed{1}")] * 5
    truths = ["1", 1, 1.0, ["1"], ("1", "2")]
    scores = reward.compute_score_batch(None, responses, truths)
    assert len(parses) == 5
    assert [r["score"] for r in scores] == [
        reward.compute_score(None, r, t) for r, t in zip(responses, truths, strict=True)
    ]
    # True == 1 in Python, yet it is no answer (issue 61: an error, not a 0): merged with 1 it would score 1
    with pytest.raises(reward.NoGroundTruth, match="^item 1: the ground truth True holds no answer"):
        reward.compute_score_batch(None, responses[:2], [1, True])


def test_an_unhashable_truth_is_parsed_for_each_answer(reward, parses):
    scores = reward.compute_score_batch(None, [make("\\boxed{3}")] * 3, [[{"x": 1}, "3"]] * 3)
    assert [r["score"] for r in scores] == [1.0] * 3 and len(parses) == 3


def test_the_normalised_truth_is_worked_out_once_for_all_its_answers(reward, monkeypatch):
    calls: list[str] = []
    real = reward._norm

    def counting(s):
        calls.append(s)
        return real(s)

    monkeypatch.setattr(reward, "_norm", counting)
    reward._CACHE.clear()
    truth = "\\frac{3}{7}"
    answers = ["\\frac{6}{14}", "3/7", "\\frac{3}{8}", "0.5", "\\frac{12}{28}", "\\frac{9}{21}", "4/7", "1"]
    scores = reward.compute_score_batch(None, [make(f"\\boxed{{{a}}}") for a in answers], [truth] * 8)
    assert [r["score"] > 0 for r in scores] == [True, True, False, False, True, True, False, False]
    assert calls.count(truth) == 1


class _Idle:
    def __init__(self, name, golds):
        self.name, self.golds = name, set(golds)

    def fresh(self):
        return True


def test_an_answer_goes_to_the_idle_helper_that_has_parsed_its_truth(reward):
    pool = reward._Pool.__new__(reward._Pool)
    pool.cond = reward.threading.Condition()
    pool.busy = set()
    a, b, c = _Idle("a", [("x",)]), _Idle("b", [("y",)]), _Idle("c", [])
    pool.idle = [a, b, c]
    assert pool._take(("x",)) is a  # not c, the one a plain pop would give
    assert pool._take(("z",)) is c  # none has it: the most recently idle one
    assert pool._take(None) is b


@pytest.mark.parametrize(("cores", "expected"), [(1, 1), (2, 2), (6, 6), (64, 8)])
def test_the_helpers_follow_the_cores_the_caller_may_use(reward, monkeypatch, cores, expected):
    monkeypatch.delenv("MATH_REWARD_WORKERS", raising=False)
    monkeypatch.setattr(reward.os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    monkeypatch.setattr(reward.os, "cpu_count", lambda: 128)
    assert reward._default_workers() == expected


def test_without_an_affinity_the_helpers_follow_the_cpu_count(reward, monkeypatch):
    monkeypatch.delenv("MATH_REWARD_WORKERS", raising=False)

    def unavailable(pid):
        raise OSError("no affinity here")

    monkeypatch.setattr(reward.os, "sched_getaffinity", unavailable, raising=False)
    monkeypatch.setattr(reward.os, "cpu_count", lambda: 3)
    assert reward._default_workers() == 3
    monkeypatch.setattr(reward.os, "cpu_count", lambda: None)
    assert reward._default_workers() == 1


def test_the_environment_overrides_the_cores(reward, monkeypatch):
    monkeypatch.setattr(reward.os, "sched_getaffinity", lambda pid: {0}, raising=False)
    monkeypatch.setenv("MATH_REWARD_WORKERS", "12")
    assert reward._default_workers() == 12
    monkeypatch.setenv("MATH_REWARD_WORKERS", "zero")
    assert reward._default_workers() == 1
