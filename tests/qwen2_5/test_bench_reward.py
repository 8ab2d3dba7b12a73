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


def test_the_fresh_policy_workload_is_what_its_generator_writes():
    """tests/qwen2_5/reward_policy_fresh.jsonl is fresh_policy_answers(768, 2026), shares no answer with the other
    two policy workloads, and about 60 % of it is right."""
    from llm_rl.qwen2_5.bench_reward import FRESH_PATH, HELDOUT_PATH, fresh_policy_answers, policy_workload

    items = policy_workload(0.0, 0, FRESH_PATH)
    assert items == fresh_policy_answers(768, 2026)
    assert not set(items) & (set(policy_workload(0.0, 0)) | set(policy_workload(0.0, 0, HELDOUT_PATH)))
    assert 0.5 < sum(ok for *_, ok in items) / len(items) < 0.7
