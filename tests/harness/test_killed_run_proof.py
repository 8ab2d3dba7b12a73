"""The quick half of make test's kills carrying make e2e's proof (faults --e2e-checks, e2e.killed_run_proof).

The real runs: tests/harness/test_faults.py (CI_PLAN). Here the checks are fed what those runs write (verl's file
logger's metrics.jsonl, ds-0006's reshard.jsonl, the tiny DeepSeek-V3's config.json) for a killed run and its rerun,
as a good resume left them and as three broken ones would: a rerun that started again from step 1 (no complete
checkpoint left), a rerun whose vLLM kept the checkpoint's weights (the sync after the rerun's update gone), a rerun whose ranks
synced once too few. Each broken one must fail the check that names it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ascend_rl.harness import e2e, faults

# the tiny DeepSeek-V3's shape, as far as the reshard's arithmetic reads it (e2e.expected_reshard_recv)
DS_CONFIG = {
    "n_routed_experts": 4,
    "moe_intermediate_size": 8,
    "hidden_size": 16,
    "num_hidden_layers": 2,
    "first_k_dense_replace": 1,
}


def _metrics(run_dir: Path, steps, stale, rollout, forwards=None) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    lines = []
    for i, step in enumerate(steps):
        data = {
            "critic/score/mean": 0.25,
            "actor/forward_passes": (forwards or [1] * len(steps))[i],
            "actor/stale_probs_diff_mean": stale[i],
            "actor/rollout_probs_diff_mean": rollout[i],
            "actor/stale_log_probs_diff_mean": stale[i],
            "actor/rollout_log_probs_diff_mean": rollout[i],
        }
        lines.append(json.dumps({"step": step, "data": data}))
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def _reshard(run_dir: Path, syncs: int, recv: int) -> None:
    rows = [
        {
            "rank": rank,
            "sync": sync,
            "calls": 2,
            "recv_bytes": recv,
            "plan_recv_bytes": recv,
            "sent_bytes": recv,
            "plan_sent_bytes": recv,
        }
        for sync in range(1, syncs + 1)
        for rank in (0, 1)
    ]
    (run_dir / "reshard.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _runs(out: Path, name: str, *, rerun_steps=(2, 3), rerun_rollout=None, rerun_syncs=3):
    """A killed run (step 1) and its rerun under out, as the faults harness names them; their folders."""
    killed, rerun = out / "killed", out / "killed-rerun"
    _metrics(killed, [1], [0.0], [0.001])
    stale = {2: 0.03, 3: 0.06, 1: 0.0}
    _metrics(
        rerun,
        list(rerun_steps),
        [stale[s] for s in rerun_steps],
        rerun_rollout or [0.002] * len(rerun_steps),
    )
    if name.startswith("deepseek"):
        model = e2e.deepseek_inputs_dir(out, "0.9.1") / "model"
        model.mkdir(parents=True)
        (model / "config.json").write_text(json.dumps(DS_CONFIG))
        recv = e2e.expected_reshard_recv(rerun, "0.9.1")
        _reshard(killed, 2, recv)
        _reshard(rerun, rerun_syncs, recv)
    return killed, rerun


def _verdicts(proof: dict) -> dict[str, bool]:
    return {c["check"]: c["ok"] for c in proof["checks"]}


@pytest.mark.parametrize("name", e2e.KILLED_RUNS)
def test_a_run_killed_in_its_step_2_save_and_resumed_carries_every_check_of_the_run(tmp_path, name):
    killed, rerun = _runs(tmp_path, name)
    proof = e2e.killed_run_proof(name, killed, rerun, 3)
    verdicts = _verdicts(proof)
    want = {"steps", "resumed", "one forward", "policy moved", "weight sync"}
    if name.startswith("deepseek"):
        want |= {"reference", "reshard bytes"}
    assert set(verdicts) == want and all(verdicts.values()), proof["checks"]
    run = proof["run"]
    assert run["steps_done"] == [1, 2, 3] and run["killed_steps"] == [1] and run["rerun_steps"] == [2, 3]
    assert run["resumed_from_step"] == 1 and run["forward_passes"] == [1, 1, 1]


@pytest.mark.parametrize("name", e2e.KILLED_RUNS)
def test_a_rerun_that_started_again_from_step_1_fails_the_resume_and_steps_checks(tmp_path, name):
    """No complete checkpoint handed to the rerun (global_step_1 gone; the tracker alone is not enough, shared-0012
    finds the newest complete folder without it): verl starts from scratch and logs steps 1 to 3 again, as Qwen's
    real rerun so broken did (steps [1, 1, 2, 3], resumed from 0)."""
    killed, rerun = _runs(tmp_path, name, rerun_steps=(1, 2, 3), rerun_syncs=4)
    verdicts = _verdicts(e2e.killed_run_proof(name, killed, rerun, 3))
    assert verdicts["resumed"] is False and verdicts["steps"] is False, verdicts


@pytest.mark.parametrize("name", e2e.KILLED_RUNS)
def test_a_rerun_whose_vllm_kept_the_checkpoint_weights_fails_the_weight_sync_check(tmp_path, name):
    """The rerun's first sync loads the step-1 checkpoint and the ones after its updates are lost: at step 3 vLLM is
    one update behind, its gap near the stale gap (two updates from the initial weights; Qwen's real rerun so broken:
    0.185 against 0.239)."""
    killed, rerun = _runs(tmp_path, name, rerun_rollout=[0.002, 0.046])
    verdicts = _verdicts(e2e.killed_run_proof(name, killed, rerun, 3))
    assert verdicts["weight sync"] is False and verdicts["policy moved"] is True, verdicts


def test_a_deepseek_rerun_with_a_sync_missing_fails_the_reshard_check(tmp_path):
    killed, rerun = _runs(tmp_path, "deepseek-v091", rerun_syncs=2)
    check = {c["check"]: c for c in e2e.killed_run_proof("deepseek-v091", killed, rerun, 3)["checks"]}
    assert check["reshard bytes"]["ok"] is False
    assert (
        "rerun: " in check["reshard bytes"]["detail"] and "want [1, 2, 3]" in check["reshard bytes"]["detail"]
    )


def test_the_proof_is_only_for_the_runs_that_skip_the_old_log_prob_pass(tmp_path):
    killed, rerun = _runs(tmp_path, "v071")
    with pytest.raises(e2e.HarnessError, match="carries no proof through a kill"):
        e2e.killed_run_proof("v071", killed, rerun, 3)


def test_faults_refuses_the_e2e_checks_for_a_kill_that_does_not_carry_them(capsys):
    with pytest.raises(SystemExit) as done:
        faults.parse_args(
            ["--recipes", "qwen2_5", "--bases", "0.9.1", "--kills", "engine@step2", "--e2e-checks"]
        )
    assert done.value.code == 2
    assert "--e2e-checks is for group@save on verl 0.9.1 only" in capsys.readouterr().err
    # the kill it carries them on: the default bases' reshard report goes to the faults run's own folder
    args = faults.parse_args(["--bases", "0.9.1", "--kills", "group@save", "--e2e-checks"])
    assert args.plan == [("qwen2_5", "0.9.1", "group@save"), ("deepseek_r1", "0.9.1", "group@save")]
    report = [o for o in faults.overrides("deepseek_r1", "0.9.1", Path("/o/ds-run")) if "RESHARD_REPORT" in o]
    assert report == [
        "+ray_kwargs.ray_init.runtime_env.env_vars.RECIPE_RESHARD_REPORT=/o/ds-run/reshard.jsonl"
    ]
