"""compute_score_batch decides in the calling thread what the cheap checks decide, and starts threads only for
the answers that need math_verify, no more threads than those answers (issue 47: on two shared cores the batch
entry point was slower than per-answer calls)."""

from __future__ import annotations

import pytest
from test_reward import load_reward, make


@pytest.fixture(scope="module")
def reward():
    return load_reward()


@pytest.fixture
def pools(reward, monkeypatch):
    """The max_workers of every thread pool compute_score_batch opens."""
    opened: list[int] = []
    real = reward.ThreadPoolExecutor

    def recording(max_workers=None, **kwargs):
        opened.append(max_workers)
        return real(max_workers=max_workers, **kwargs)

    monkeypatch.setattr(reward, "ThreadPoolExecutor", recording)
    return opened


def test_a_batch_the_cheap_checks_decide_opens_no_thread_pool(reward, pools):
    responses = [make(f"\\boxed{{{n}}}") for n in range(40)] + [make("\\boxed{\\frac{2}{4}}")]
    scores = reward.compute_score_batch(None, responses, [str(n) for n in range(40)] + ["0.5"])
    assert [r["score"] for r in scores] == [1.0] * 41
    assert pools == []


def test_only_the_answers_for_math_verify_get_threads(reward, pools):
    reward._CACHE.clear()
    cheap = [(make("\\boxed{7}"), "7", 1.0), (make("\\boxed{8}"), "7", 0.0)] * 10
    # x_{1} is no variable to the cheap checks: only math_verify decides these
    jobs = cheap + [
        (make("\\boxed{(x_{1}+2)(x_{1}+5)}"), "x_{1}^2+7x_{1}+10", 1.0),
        (make("\\boxed{(x_{1}+2)(x_{1}+6)}"), "x_{1}^2+7x_{1}+10", 0.0),
    ]
    scores = reward.compute_score_batch(None, [j[0] for j in jobs], [j[1] for j in jobs], num_workers=4)
    assert [r["score"] for r in scores] == [j[2] for j in jobs]
    assert pools == [2]  # two answers for math_verify: two threads, not 4 x 4
