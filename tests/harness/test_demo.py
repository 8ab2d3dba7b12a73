"""The in-process GRPO demo (ascend_rl/harness/inprocess.py, `make demo-inprocess`): two real steps through verl's own components, both old-log-prob modes."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEMO = "ascend_rl.harness.inprocess"
STEPS = 2


def _demo(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    # A fresh interpreter: the demo must import verl from the patched tree, not from site-packages.
    return subprocess.run(
        [sys.executable, "-m", DEMO, *args], capture_output=True, text=True, timeout=timeout, cwd=REPO
    )


@pytest.fixture(scope="module")
def compare_run(tmp_path_factory, verl_sdist_path) -> tuple[subprocess.CompletedProcess, Path]:
    """demo_grpo.py --compare --steps 2 on a private patched tree: recompute=true, then false, same seed."""
    base = tmp_path_factory.mktemp("demo")
    out = base / "out"
    proc = _demo("--compare", "--steps", str(STEPS), "--out", str(out), "--verl-tree", str(base / "verl"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, out


def _rows(out: Path, run: str) -> list[dict]:
    lines = (out / run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


@pytest.mark.slow
@pytest.mark.ci
@pytest.mark.parametrize("run", ["recompute", "skip"])
def test_metrics_file_has_one_row_per_step(compare_run, run):
    _, out = compare_run
    assert [r["step"] for r in _rows(out, run)] == list(range(1, STEPS + 1))


@pytest.mark.slow
@pytest.mark.ci
@pytest.mark.parametrize("run", ["recompute", "skip"])
def test_loss_is_finite_and_every_response_scored(compare_run, run):
    _, out = compare_run
    for row in _rows(out, run):
        for key in ("actor/loss", "actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "reward/mean"):
            assert math.isfinite(row[key]), (key, row)
        # prompts per step x rollout.n responses, each scored once by verl's reward manager
        assert row["responses"] == 32
        assert row["scored"] == row["responses"], row
        assert {"reward/accuracy", "reward/format", "reward/cot"} <= row.keys(), sorted(row)


@pytest.mark.slow
@pytest.mark.ci
@pytest.mark.parametrize("run", ["recompute", "skip"])
def test_grpo_sees_mixed_rewards_and_a_policy_gradient(compare_run, run):
    rows = _rows(compare_run[1], run)
    # The warm-started policy is right sometimes: some prompt group has rewards that differ, so GRPO's
    # advantages are not all zero (with a random policy every reward is 0 and so is every advantage).
    assert all(r["groups/reward_varied"] >= 1 for r in rows), [r["groups/reward_varied"] for r in rows]
    assert all(0 < r["reward/mean"] < 1 for r in rows), [r["reward/mean"] for r in rows]
    assert all(r["advantage/nonzero_frac"] > 0 and r["advantage/abs_mean"] > 0 for r in rows)
    assert any(r["reward/format"] > 0 and r["reward/cot"] > 0 for r in rows)
    # At step 1 the actor equals the reference (KL term 0) and AdamW's decay is not in the gradient, so
    # any gradient is the policy-gradient term's.
    first = rows[0]
    assert first["actor/kl_loss"] == 0.0
    assert first["actor/grad_norm"] > 1e-2, first
    assert all(r["actor/pg_loss"] != 0 for r in rows)


@pytest.mark.slow
@pytest.mark.ci
@pytest.mark.parametrize("run", ["recompute", "skip"])
def test_weights_changed(compare_run, run):
    _, out = compare_run
    # AdamW moves weights by about lr (1e-4) a step under a real gradient; its decay alone, by lr x 0.01 x w.
    assert _rows(out, run)[-1]["weights/changed_from_init"] > 1e-5


@pytest.mark.slow
@pytest.mark.ci
def test_skip_runs_one_actor_forward_fewer_per_step(compare_run):
    _, out = compare_run
    assert [r["actor/forward_passes"] for r in _rows(out, "recompute")] == [2.0] * STEPS
    assert [r["actor/forward_passes"] for r in _rows(out, "skip")] == [1.0] * STEPS
    assert all("actor/entropy" not in r for r in _rows(out, "skip"))


@pytest.mark.slow
@pytest.mark.ci
def test_skip_gives_the_same_update(compare_run):
    _, out = compare_run
    summary = json.loads((out / "compare.json").read_text(encoding="utf-8"))
    for key, diff in summary["max_abs_diff"].items():
        assert diff <= 1e-6, (key, diff)
    assert summary["final_weights_max_abs_diff"] <= 1e-6
    assert summary["same_update"] and summary["one_pass_fewer"]
    # ...and the update it agrees on is driven by non-zero advantages, not by weight decay alone.
    assert summary["nonzero_advantage"] and min(summary["groups_reward_varied"]) >= 1
    on, off = _rows(out, "recompute"), _rows(out, "skip")
    assert [r["actor/grad_norm"] for r in on] == pytest.approx([r["actor/grad_norm"] for r in off], abs=1e-7)


@pytest.mark.slow
@pytest.mark.ci
def test_output_a_person_reads(compare_run):
    proc, out = compare_run
    for run in ("recompute", "skip"):
        assert (out / run / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "step 2 | reward" in proc.stdout
    assert "wall time" in proc.stdout and "peak memory (RSS)" in proc.stdout
    assert "actor forward passes per step: 2 vs 1 (one fewer)" in proc.stdout
    assert "(non-zero GRPO advantage) per step" in proc.stdout and "(every step)" in proc.stdout
    assert "warm start step 400/400: response cross-entropy" in proc.stdout


@pytest.mark.slow
@pytest.mark.ci
def test_held_out_test_set_is_scored_before_and_after(compare_run):
    proc, out = compare_run
    assert "test accuracy (greedy, 16 held-out problems, new_math_reward.py): " in proc.stdout
    evals = {
        run: json.loads((out / run / "eval.json").read_text(encoding="utf-8"))
        for run in ("recompute", "skip")
    }
    for run in evals.values():
        for when in ("before", "after"):
            assert run[when]["problems"] == 16 and 0 <= run[when]["correct"] <= 16, run
            assert 0 <= run[when]["reward"] <= 1, run
    # Greedy decoding of the same start and the same update: both old-log-prob modes score the same.
    assert evals["recompute"] == evals["skip"]


def test_help_and_dry_run_change_nothing(tmp_path):
    proc = _demo("--help", timeout=120)
    assert proc.returncode == 0 and "--recompute-old-log-prob" in proc.stdout
    proc = _demo(
        "--dry-run", "--recompute-old-log-prob", "false", "--out", str(tmp_path / "out"), timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert "actor_rollout_ref.actor.recompute_old_log_prob=False" in proc.stdout
    assert not (tmp_path / "out").exists()


def test_bad_flag_is_a_usage_error():
    proc = _demo("--recompute-old-log-prob", "maybe", timeout=120)
    assert proc.returncode == 2
    assert "expected true or false" in proc.stderr
    proc = _demo("--warm-start-steps", "-1", timeout=120)
    assert proc.returncode == 2
    assert "--warm-start-steps must be 0 (off) or more" in proc.stderr


def test_bundled_problems_are_the_generated_ones():
    from ascend_rl.harness import problems

    rows = problems.load_problems()
    assert rows == problems.generate_problems()
    assert {r["split"] for r in rows} == {"train", "test"}
    assert all(set(r) == {"problem", "level", "type", "solution", "split"} for r in rows)
    assert len({r["problem"] for r in rows}) == len(rows)


def test_warm_start_targets_score_full_marks_with_the_recipe_reward(repo_root):
    """What the warm start teaches is what new_math_reward.py rewards: right answer, exact format, numbered steps."""
    import importlib.util

    from ascend_rl.data.util import last_boxed
    from ascend_rl.harness import problems, warm_start

    spec = importlib.util.spec_from_file_location("reward", repo_root / "llm_rl/qwen2_5/new_math_reward.py")
    reward = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reward)
    for row in problems.load_problems():
        response = warm_start.target_response(row["solution"])
        assert response.startswith("<think>\nStep 1: ") and response.endswith("\n</answer>")
        result = reward.compute_score_dict(None, response, last_boxed(row["solution"]))
        assert result["correct"] and result["format"] == 0.2, (response, result)
        # two-step solutions earn half the chain-of-thought points, three-step ones all of them
        assert result["cot"] == (0.1 if response.count("Step ") >= 3 else 0.05), (response, result)
