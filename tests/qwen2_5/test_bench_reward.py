"""The reward benchmark's workload is what its figures say it is: which answers reach sympy."""

from __future__ import annotations

import subprocess
import sys

import pytest
from test_reward import load_reward

from ascend_rl.paths import REPO
from llm_rl.qwen2_5.bench_reward import HOSTILE, left_to_sympy, make_step


@pytest.fixture(scope="module")
def reward():
    return load_reward()


def test_the_sympy_share_decides_which_answers_reach_sympy(reward):
    assert (
        left_to_sympy(reward, make_step(256, 0.0, 0)) == 0
    )  # the step's own shapes: all decided in the caller
    assert left_to_sympy(reward, make_step(256, 0.0, 0, sympy_share=1.0)) == 256
    some = left_to_sympy(reward, make_step(2048, 0.0, 0, sympy_share=0.25))
    assert 0.15 * 2048 < some < 0.35 * 2048


def test_hostile_answers_are_placed_as_asked():
    items = make_step(200, 0.05, 3)
    assert sum(item in HOSTILE for item in items) == 10


def test_a_share_outside_0_1_is_refused_in_one_line():
    result = subprocess.run(
        [sys.executable, "-m", "llm_rl.qwen2_5.bench_reward", "--sympy-share", "1.5"],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
        timeout=60,
    )
    assert result.returncode == 2
    assert "--sympy-share within [0, 1]" in result.stderr.strip().splitlines()[-1]


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
