"""The per-answer CPU bound cuts a stuck answer off at the bound, not merely eventually (issue 47).

The bound is the CPU time math_verify spends on one answer in its worker, read from /proc by the caller every
POLL_MAX_S of wall time at most; a worker past it is killed.  So the CPU a stuck answer's worker has used when it
is killed lies between the bound and the bound plus one poll and a few clock ticks: these tests fail when the bound
in the code is loosened (doubled, or the default raised), which the tests of scores alone never notice.
"""

from __future__ import annotations

import os

import pytest
from test_reward import load_reward, make
from test_reward_hostile import NEEDS_SYMPY, STUCK


@pytest.fixture(scope="module")
def reward():
    module = load_reward()
    assert module.compute_score("s", *NEEDS_SYMPY[0][:2]) == 1.0  # a warm pool: no cold first attempt
    return module


def margin(reward) -> float:
    """How far past the bound the CPU may run before the caller sees it: one poll, plus five clock ticks for
    /proc's granularity and the caller being scheduled late on a busy machine (0.1 s at 100 Hz)."""
    return reward.POLL_MAX_S + 5 / os.sysconf("SC_CLK_TCK")


def cut_off(reward, monkeypatch, **kwargs) -> tuple[dict, list[tuple[str, float]], list[float]]:
    """Score the stuck answer; what each attempt returned and the CPU each killed worker had used."""
    attempts: list[tuple[str, float]] = []
    killed: list[float] = []
    attempt, kill = reward._Pool._attempt, reward._Worker.kill

    def record_attempt(self, data, budget, *gold):
        outcome = attempt(self, data, budget, *gold)
        attempts.append(outcome)
        return outcome

    def record_kill(self):
        now = reward._cpu_seconds(self.pid)
        if now is not None and now - self.cpu_base > 0.05:  # not an idle worker found dead
            killed.append(now - self.cpu_base)
        kill(self)

    monkeypatch.setattr(reward._Pool, "_attempt", record_attempt)
    monkeypatch.setattr(reward._Worker, "kill", record_kill)
    result = reward.compute_score_dict("s", STUCK, "1", **kwargs)
    return result, attempts, killed


@pytest.mark.parametrize("bound", [0.3, 0.6])
def test_a_stuck_answer_is_cut_off_within_its_bound(reward, monkeypatch, bound):
    result, attempts, killed = cut_off(reward, monkeypatch, timeout=bound)
    assert result["timed_out"] is True and result["score"] == 0.0
    within(reward, attempts, killed, bound)


def within(reward, attempts, killed, bound) -> None:
    """Each attempt (a cold worker's is retried on a warm one) was cut off between the bound and its margin."""
    outcomes = [outcome for outcome, _ in attempts]
    assert outcomes[-1] == "timeout" and set(outcomes[:-1]) <= {"cold"}, outcomes
    for _, used in attempts:
        assert bound <= used <= bound + margin(reward), (used, bound)
    assert len(killed) == len(attempts), killed
    for cpu in killed:
        assert bound <= cpu <= bound + margin(reward), (killed, bound)


def test_the_default_bound_is_one_second_of_cpu(reward, monkeypatch):
    monkeypatch.delenv("MATH_REWARD_TIMEOUT", raising=False)
    assert reward.DEFAULT_TIMEOUT_S == 1.0
    result, attempts, killed = cut_off(reward, monkeypatch)
    assert result["timed_out"] is True
    within(reward, attempts, killed, 1.0)


def test_the_environment_sets_the_bound(reward, monkeypatch):
    monkeypatch.setenv("MATH_REWARD_TIMEOUT", "0.4")
    result, attempts, killed = cut_off(reward, monkeypatch)
    assert result["timed_out"] is True
    within(reward, attempts, killed, 0.4)


def test_a_right_answer_is_unaffected_by_the_cut_off(reward):
    assert reward.compute_score("s", make("\\boxed{(x+2)(x+5)}"), "x^2+7x+10", timeout=1.0) == 1.0
