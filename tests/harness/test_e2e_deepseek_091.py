"""The DeepSeek launcher on verl 0.9.1 (`make e2e E2E_ARGS="--runs deepseek-v091"`): run_deepseek_r1_a3.sh --cpu
--base 0.9.1, main_ppo's legacy trainer, the engine workers with 0.9.1's MegatronEngine (megatron-core 0.16.1,
Megatron-Bridge 0.3.1, fp32) on 2 gloo ranks (EP=2), verl's vLLM server rollout on vLLM 0.23.0's CPU build, a tiny
DeepSeek-V3, in the second e2e environment (.venv-e2e-091; the e2e_python_091 fixture builds it).

Full tier. The checks are those of the 0.6.0 and 0.7.1 DeepSeek runs (test_e2e.py): the weight-sync proof (the
rollout/actor log-prob gap a fifth of the stale gap or less) and its negative control (with the sync disabled the
same check fails), one actor forward per step (the old-log-prob skip, shared-0016/0017), every rank's AlltoAllV
bytes at every sync equal to the planner's and the model's arithmetic (ds-0206's adapter,
llm_rl/deepseek_r1/verl_modules/expert_reshard.py). The kill in the save and the resume: test_faults.py.
"""

from __future__ import annotations

import json

import pytest
from test_e2e import _e2e, _tail

import tier_report

pytestmark = [pytest.mark.slow, pytest.mark.full]
RUN = "deepseek-v091"


@pytest.fixture(scope="module")
def ds_091(e2e_python, e2e_python_091, tmp_path_factory):
    out = tmp_path_factory.mktemp("e2e-ds091") / "e2e_out"
    proc, summary = _e2e(e2e_python, out, "--runs", RUN)
    tier_report.record_e2e("test_e2e_deepseek_091", summary, [RUN])
    return proc, summary, out


def test_the_0_9_1_deepseek_run_trains_through_the_megatron_engine(ds_091):
    """3 GRPO steps through the 0.9.1 CPU tree, each logged with its reward and a non-zero gradient; every check of
    the run passes (steps, one forward, reference, reshard bytes, policy moved, weight sync)."""
    proc, summary, out = ds_091
    assert summary, _tail(proc)
    run = summary["runs"][RUN]
    assert run["base"] == "0.9.1" and run["steps_done"] == [1, 2, 3]
    log = (out / RUN / "launcher.log").read_text(errors="replace")
    assert "deepseek_r1/verl-0.9.1-cpu" in log, "the run did not use the DeepSeek 0.9.1 CPU tree"
    rows = [json.loads(line) for line in (out / RUN / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3], "verl's file logger"
    assert all("critic/score/mean" in r["data"] and r["data"]["actor/grad_norm"] > 0 for r in rows)
    checks = {c["check"]: c for c in summary["checks"] if c["run"] == RUN}
    want = {"steps", "one forward", "reference", "reshard bytes", "policy moved", "weight sync"}
    assert want <= set(checks), checks
    assert all(c["ok"] for c in checks.values()), checks
    assert proc.returncode == 0, _tail(proc)


def test_vllm_samples_from_the_synced_weights_and_one_forward_per_step(ds_091):
    """The update's own forward gives the old log-probs (no old-log-prob pass), and at the last step the rollout's
    log-prob gap is a fifth of the stale gap or less, the stale gap at least 0.01; step 1's stale gap is 0 (vLLM and
    the actor start from the same checkpoint)."""
    proc, summary, _ = ds_091
    assert summary, _tail(proc)
    run = summary["runs"][RUN]
    assert run["gap"] == "log_probs"
    assert run["forward_passes"] == [1, 1, 1] and run["old_log_prob_pass"] == [False, False, False], run
    stale, rollout = run["stale_log_probs_diff_mean"], run["rollout_log_probs_diff_mean"]
    assert stale[0] <= 1e-6, stale
    assert stale[-1] >= 0.01, f"the policy barely moved (stale gap {stale}); the check would prove nothing"
    assert rollout[-1] <= stale[-1] / 5, f"rollout gap {rollout} vs stale gap {stale}: vLLM holds old weights"


def test_every_rank_moves_the_planned_expert_bytes_at_every_sync(ds_091):
    """verl 0.9.1 syncs before step 1 and after each update (4 syncs in 3 steps); at each, both ranks' AlltoAllV
    bytes equal the planner's and the model's arithmetic (fp32: the engine's dtype on CPU)."""
    proc, summary, _ = ds_091
    assert summary, _tail(proc)
    run = summary["runs"][RUN]
    expected = run["reshard_expected_recv_bytes"]
    assert expected and expected > 0
    assert {(r["sync"], r["rank"]) for r in run["reshard"]} == {(s, k) for s in range(1, 5) for k in (0, 1)}
    for r in run["reshard"]:
        assert r["recv_bytes"] == r["plan_recv_bytes"] == expected, r
        # two ranks: what one receives, the other sent
        assert r["sent_bytes"] == r["plan_sent_bytes"] == expected, r
        assert r["calls"] > 0, r


def test_without_the_weight_sync_the_0_9_1_deepseek_gap_grows_to_the_stale_level(
    e2e_python, e2e_python_091, tmp_path
):
    """The negative control: every sync after the first skipped (the harness's hook on 0.9.1's ServerAdapter), the
    same weight-sync check fails and the rollout gap reaches the stale gap."""
    out = tmp_path / "e2e_nosync"
    proc, summary = _e2e(e2e_python, out, "--runs", RUN, "--disable-weight-sync")
    tier_report.record_e2e("test_e2e_deepseek_091", summary, [RUN])
    assert summary, _tail(proc)
    assert proc.returncode == 1, _tail(proc)
    run = summary["runs"][RUN]
    assert run["steps_done"] == [1, 2, 3]
    stale, rollout = run["stale_log_probs_diff_mean"][-1], run["rollout_log_probs_diff_mean"][-1]
    assert stale >= 0.01
    assert rollout >= 0.5 * stale, (
        f"with no sync the rollout gap {rollout} should reach the stale gap {stale}"
    )
    failed = {(c["run"], c["check"]) for c in summary["checks"] if not c["ok"]}
    assert (RUN, "weight sync") in failed
