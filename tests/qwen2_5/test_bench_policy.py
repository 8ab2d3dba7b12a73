"""bench_reward's policy-shaped workload (issue 47): kept data its generator reproduces, labels the reward agrees
with, and the original recipe's reward found at run time or skipped with the reason."""

from __future__ import annotations

import pytest
from test_reward import load_reward

from llm_rl.qwen2_5.bench_reward import HOSTILE


@pytest.fixture(scope="module")
def reward():
    return load_reward()


def test_the_kept_policy_workload_is_what_its_generator_writes():
    """tests/qwen2_5/reward_policy_workload.jsonl is reward_cases.policy_answers(512, 47), as its README says."""
    from llm_rl.qwen2_5 import reward_cases
    from llm_rl.qwen2_5.bench_reward import policy_workload

    assert policy_workload(0.0, 0) == reward_cases.policy_answers(512, 47)
    assert sum(item[:2] in HOSTILE for item in policy_workload(0.01, 0)) == 5


def test_the_reward_agrees_with_the_policy_workloads_labels(reward):
    """No false positive and no miss on the 512 policy-shaped answers (the labels say which spelling is right)."""
    from llm_rl.qwen2_5.bench_reward import policy_workload

    items = policy_workload(0.0, 0)
    scores = reward.compute_score_batch(
        ["s"] * len(items), [a for a, _, _ in items], [t for _, t, _ in items]
    )
    assert [(s["score"] > 0) for s in scores] == [ok for *_, ok in items]


def test_without_the_original_reward_the_policy_scenario_says_why(tmp_path, monkeypatch):
    from llm_rl.qwen2_5 import bench_reward

    monkeypatch.delenv(bench_reward.ORIGINAL_ENV, raising=False)
    monkeypatch.setenv(f"{bench_reward.ORIGINAL_ENV}_MIRROR", str(tmp_path / "no-mirror"))
    path, why = bench_reward.original_file(None)
    assert path is None and why.startswith("not found (no --original") and "no-mirror" in why
    path, why = bench_reward.original_file(str(tmp_path / "missing.py"))
    assert path is None and "no such file" in why
    given = tmp_path / "new_math_reward.py"
    given.write_text("def compute_score(*a): return 0.0\n")
    monkeypatch.setenv(bench_reward.ORIGINAL_ENV, str(given))
    assert bench_reward.original_file(None) == (given, f"${bench_reward.ORIGINAL_ENV} {given}")


def test_the_held_out_policy_workload_is_what_its_generator_writes():
    """tests/qwen2_5/reward_policy_heldout.jsonl is reward_cases.policy_answers_heldout(768, 4747): 96 prompts
    of 8, half in answer kinds the first workload does not hold."""
    from llm_rl.qwen2_5 import reward_cases
    from llm_rl.qwen2_5.bench_reward import HELDOUT_PATH, policy_workload

    items = policy_workload(0.0, 0, HELDOUT_PATH)
    assert items == reward_cases.policy_answers_heldout(768, 4747)
    assert not set(items) & set(policy_workload(0.0, 0))


def test_the_reward_agrees_with_the_held_out_workloads_labels(reward):
    """No false positive and no miss on the 768 held-out answers (measured once before any rule saw them)."""
    from llm_rl.qwen2_5.bench_reward import HELDOUT_PATH, policy_workload

    items = policy_workload(0.0, 0, HELDOUT_PATH)
    scores = reward.compute_score_batch(
        ["s"] * len(items), [a for a, _, _ in items], [t for _, t, _ in items]
    )
    assert [(s["score"] > 0) for s in scores] == [ok for *_, ok in items]


def test_the_reward_agrees_with_the_fresh_workloads_labels(reward):
    """No false positive and no miss on the 768 answers of the fresh workload (the kinds the exact rules first left
    to math_verify: roots, powers of e, logarithms, sines, letters under roots, binomials)."""
    from llm_rl.qwen2_5.bench_reward import FRESH_PATH, policy_workload

    items = policy_workload(0.0, 0, FRESH_PATH)
    scores = reward.compute_score_batch(
        ["s"] * len(items), [a for a, _, _ in items], [t for _, t, _ in items]
    )
    assert [(s["score"] > 0) for s in scores] == [ok for *_, ok in items]
