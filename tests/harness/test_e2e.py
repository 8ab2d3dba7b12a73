"""The recipe's real launch path on CPU (`make e2e`): main_ppo, Ray, FSDP2 on gloo, verl's vLLM rollout.

Needs the e2e environment (vLLM 0.13.0's CPU build with torch 2.9.1, scripts/setup_e2e.sh): the
e2e_python fixture (conftest.py) builds it when absent (once per machine, ~8 minutes) and skips with the reason only when the
package index cannot be reached. The runs go through the recipe's launcher with its CPU profile.
The environment comes from the e2e_python fixture (conftest.py).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

import tier_report

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow
# make test (CI): the negative control on Qwen's default base (verl 0.9.1); the proof of each recipe's default base
# (steps, one forward, weight sync, reshard bytes) rides on make test's kills (test_faults.py: the killed run and its
# resumed rerun carry it, --e2e-checks), so the uninterrupted runs of the default bases (DEFAULT_RUNS, in their own
# environment, e2e_python_091) are make test-full's, with the rest of the matrix in the same output folder
# (v071-resume continues the v071 run's step-2 checkpoint; test_e2e_091.py has 0.9.1's resume and two ranks).
DEFAULT_RUNS = ("v091", "deepseek-v091")
CI_RUNS = ("v091",)  # the negative control's run
MOE_ENV = "RECIPES_VLLM_CPU_MOE"  # ascend_rl/harness/verl_modules/recipes_vllm_cpu.py
FULL_RUNS = ("sync", "async", "resume", "v071", "v071-resume", "deepseek", "deepseek-v071")
QWEN_RUNS = ("v091", "sync", "async", "resume", "v071", "v071-resume")


def _e2e(
    python: Path, out: Path, *args: str, env: dict | None = None
) -> tuple[subprocess.CompletedProcess, dict]:
    proc = subprocess.run(
        [str(python), "-m", "ascend_rl", "e2e", "--out", str(out), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=2400,
        env=None if env is None else {**os.environ, **env},
    )
    summary_path = out / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    return proc, summary


def _tail(proc: subprocess.CompletedProcess) -> str:
    return f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"


@pytest.fixture(scope="session")
def e2e_out(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("e2e") / "e2e_out"


@pytest.fixture(scope="session")
def e2e_default(e2e_python, e2e_python_091, e2e_out):
    """v091 (Qwen's default base, verl 0.9.1: its engine workers and vLLM 0.23.0's CPU build, in .venv-e2e-091) and
    deepseek-v091 (the DeepSeek launcher's default, verl 0.9.1: its Megatron engine on 2 ranks, vLLM 0.23.0's CPU
    build, in the same environment), as `make e2e --runs v091,deepseek-v091` runs them. vLLM's CPU MoE is forced onto
    its torch path (RECIPES_VLLM_CPU_MOE=torch), the one an x86 CPU without AVX-512 takes, so CI runs it whatever the
    machine (make test-full's other DeepSeek runs leave the choice to vLLM). make test-full's: make test proves the
    same of the killed and resumed runs (test_faults.py, --e2e-checks)."""
    proc, summary = _e2e(e2e_python, e2e_out, "--runs", ",".join(DEFAULT_RUNS), env={MOE_ENV: "torch"})
    tier_report.record_e2e("test_e2e", summary, list(DEFAULT_RUNS))
    return proc, summary, e2e_out


@pytest.fixture(scope="session")
def e2e_matrix(e2e_python, e2e_default, e2e_out):
    """The rest of `make e2e` on the 0.13 stack: sync, async and resume (verl 0.6.0), v071 and v071-resume (from the
    v071 run's checkpoint), deepseek (verl 0.6.0) and deepseek-v071."""
    proc, summary = _e2e(e2e_python, e2e_out, "--runs", ",".join(FULL_RUNS))
    tier_report.record_e2e("test_e2e", summary, list(FULL_RUNS))
    return proc, summary, e2e_out


def _runs(request, run: str):
    """The e2e command that ran `run`: the default bases' or the rest of the matrix's."""
    return request.getfixturevalue("e2e_default" if run in DEFAULT_RUNS else "e2e_matrix")


def _full(*runs: str, ci: tuple[str, ...] = ()) -> list:
    """The runs as parameters, each carrying its tier: ci for those in `ci`, full for the rest."""
    return [pytest.param(r, marks=pytest.mark.ci if r in ci else pytest.mark.full) for r in runs]


@pytest.mark.full  # make test: test_faults.py's kill of this run carries the same checks
def test_the_default_base_0_9_1_trains_with_one_actor_forward_per_step(e2e_default):
    """verl 0.9.1, the Qwen default: 3 steps through the launcher, the engine workers (FSDP2 on gloo) and vLLM
    0.23.0's CPU server in .venv-e2e-091, the old-log-prob pass skipped (the update's forward is the only one,
    cpu-0015), the step-2 checkpoint written."""
    check_v091(*e2e_default)


def check_v091(proc: subprocess.CompletedProcess, summary: dict, out: Path) -> None:
    """The v091 run's checks, wherever it ran (here, and in test_e2e_091.py's command with its resume)."""
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


DS_091 = "deepseek-v091"


@pytest.mark.full  # make test: test_faults.py's kill of this run carries the same checks
def test_the_deepseek_default_base_0_9_1_trains_through_the_megatron_engine(e2e_default):
    """verl 0.9.1, the DeepSeek default (run_deepseek_r1_a3.sh --cpu on it): main_ppo's legacy trainer, the engine
    workers with 0.9.1's MegatronEngine (megatron-core 0.16.1, Megatron-Bridge 0.3.1, fp32) on 2 gloo ranks (EP=2),
    verl's vLLM server rollout on vLLM 0.23.0's CPU build, a tiny DeepSeek-V3: 3 GRPO steps through the 0.9.1 CPU
    tree, each logged with its reward and a non-zero gradient; every check of the run passes (steps, one forward,
    reference, reshard bytes, policy moved, weight sync), and every sync's AlltoAllV went through collective calls
    (ds-0206's adapter, llm_rl/deepseek_r1/verl_modules/expert_reshard.py). The gaps, the forward count and the bytes
    per sync are the parametrized tests' below; the kill in the save and the resume: test_faults.py."""
    proc, summary, out = e2e_default
    assert summary, _tail(proc)
    run = summary["runs"][DS_091]
    assert run["base"] == "0.9.1" and run["steps_done"] == [1, 2, 3]
    log = (out / DS_091 / "launcher.log").read_text(errors="replace")
    assert "deepseek_r1/verl-0.9.1-cpu" in log, "the run did not use the DeepSeek 0.9.1 CPU tree"
    # vLLM's MoE on the AVX2 path (forced): the path that failed on an AVX2-only machine before the rig's plugin
    assert f"recipes: vLLM CPU MoE path forward_torch ({MOE_ENV}=torch)" in log, (
        "the rollout's MoE path is not said"
    )
    rows = [json.loads(line) for line in (out / DS_091 / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3], "verl's file logger"
    assert all("critic/score/mean" in r["data"] and r["data"]["actor/grad_norm"] > 0 for r in rows)
    checks = {c["check"]: c for c in summary["checks"] if c["run"] == DS_091}
    want = {"steps", "one forward", "reference", "reshard bytes", "policy moved", "weight sync"}
    assert want <= set(checks), checks
    assert all(c["ok"] for c in checks.values()), checks
    assert run["reshard"] and all(r["calls"] > 0 for r in run["reshard"]), run["reshard"]
    assert proc.returncode == 0, _tail(proc)


@pytest.mark.full
def test_the_0_7_1_base_trains_through_its_server_mode_rollout(e2e_matrix):
    """verl 0.7.1 (VERL_BASE=0.7.1): 3 steps through the launcher, its async vLLM server and shared-memory
    weight buckets, saving the step-2 checkpoint the resume run continues."""
    proc, summary, out = e2e_matrix
    assert proc.returncode == 0, _tail(proc)
    run = summary["runs"]["v071"]
    assert run["base"] == "0.7.1" and run["steps_done"] == [1, 2, 3]
    assert (out / "v071" / "ckpt" / "e2e_v071" / "global_step_2" / "actor").is_dir()
    log = (out / "v071" / "launcher.log").read_text(errors="replace")
    assert "verl-0.7.1-cpu" in log, "the run did not use the 0.7.1 CPU tree"
    assert all(c["ok"] for c in summary["checks"]), summary["checks"]


@pytest.mark.full
def test_sync_async_and_resume_runs_train_through_main_ppo(e2e_matrix):
    proc, summary, out = e2e_matrix
    assert proc.returncode == 0, _tail(proc)
    runs = summary["runs"]
    assert runs["sync"]["steps_done"] == [1, 2, 3]
    assert runs["async"]["steps_done"] == [1, 2, 3]
    assert runs["sync"]["base"] == "0.6.0"
    # The resumed run starts from the sync run's step-2 checkpoint and does step 3 only.
    assert runs["resume"]["resumed_from_step"] == 2
    assert runs["resume"]["steps_done"] == [3]
    assert (out / "sync" / "ckpt" / "e2e_sync" / "global_step_2" / "actor").is_dir()
    # the README's batched reward path on 0.6.0 scored the resumed step; the others the launcher's per-answer one
    assert runs["resume"]["reward_path"] == "batch/compute_score_batch"
    assert runs["sync"]["reward_path"].startswith("naive/")
    assert all(c["ok"] for c in summary["checks"]), summary["checks"]


@pytest.mark.full
def test_the_0_7_1_base_resumes_from_its_own_checkpoint(e2e_matrix):
    """v071-resume, listed after v071 in the same e2e command, continues the v071 run's step-2 checkpoint."""
    proc, summary, out = e2e_matrix
    assert summary, _tail(proc)
    run = summary["runs"]["v071-resume"]
    assert run["base"] == "0.7.1"
    assert run["resumed_from_step"] == 2 and run["steps_done"] == [3]
    assert (out / "v071-resume" / "ckpt" / "e2e_v071-resume" / "global_step_2" / "actor").is_dir()


@pytest.mark.parametrize("run", _full(*QWEN_RUNS, DS_091, "deepseek", "deepseek-v071"))
def test_every_run_logs_each_step_and_its_reward(request, run):
    proc, summary, out = _runs(request, run)
    assert summary, _tail(proc)
    rows = [json.loads(line) for line in (out / run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == summary["runs"][run]["steps_done"], f"{run}: verl's file logger"
    assert all("critic/score/mean" in r["data"] for r in rows), f"{run}: no reward logged"


@pytest.mark.parametrize("run", _full(*QWEN_RUNS, DS_091, "deepseek", "deepseek-v071"))
def test_vllm_samples_from_the_updated_weights(request, run):
    """At the last step the policy has moved (stale gap >= 0.01) and vLLM's gap is a fifth of that or less."""
    proc, summary, _ = _runs(request, run)
    assert summary, _tail(proc)
    r = summary["runs"][run]
    gap = r["gap"]  # probs for Qwen; log_probs for the random-weight DeepSeek policy (p ~ 1/vocabulary)
    assert gap == ("log_probs" if run.startswith("deepseek") else "probs")
    stale, rollout = r[f"stale_{gap}_diff_mean"][-1], r[f"rollout_{gap}_diff_mean"][-1]
    assert stale >= 0.01, f"{run}: the policy barely moved (stale gap {stale}); the check would prove nothing"
    assert rollout <= stale / 5, f"{run}: rollout gap {rollout} vs stale gap {stale}: vLLM holds old weights"


@pytest.mark.parametrize(
    "name, base, syncs",
    [
        # the DeepSeek default: 0.9.1's Megatron engine, the bytes in fp32 (the engine's dtype on CPU)
        pytest.param(DS_091, "0.9.1", 4, marks=pytest.mark.full),
        pytest.param("deepseek", "0.6.0", 3, marks=pytest.mark.full),
        pytest.param("deepseek-v071", "0.7.1", 4, marks=pytest.mark.full),
    ],
)
def test_deepseek_run_skips_the_old_log_prob_pass_and_routes_the_planned_bytes(request, name, base, syncs):
    """main_ppo with the Megatron actor: one actor forward per step, every rank's AlltoAllV bytes per sync equal
    to the planner's and to the model's arithmetic, the reference starting from the actor's weights. verl 0.7.1 and
    0.9.1 (their server-mode rollout) sync once more than 0.6.0: before step 1 and after every update."""
    proc, summary, out = _runs(request, name)
    assert summary, _tail(proc)
    run = summary["runs"][name]
    assert run["base"] == base
    assert run["steps_done"] == [1, 2, 3]
    rows = [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3], "verl's file logger"
    assert all("critic/score/mean" in r["data"] and r["data"]["actor/grad_norm"] > 0 for r in rows)
    assert run["forward_passes"] == [1, 1, 1] and run["old_log_prob_pass"] == [False, False, False]
    expected = run["reshard_expected_recv_bytes"]
    assert expected and expected > 0
    assert {(r["sync"], r["rank"]) for r in run["reshard"]} == {
        (s, k) for s in range(1, syncs + 1) for k in (0, 1)
    }
    for r in run["reshard"]:
        assert r["recv_bytes"] == r["plan_recv_bytes"] == expected, r
        # two ranks: what one receives, the other sent
        assert r["sent_bytes"] == r["plan_sent_bytes"] == expected, r
    # ds-0009 / ds-0109; on 0.9.1 the actor, the reference and vLLM load one random checkpoint
    assert run["stale_log_probs_diff_mean"][0] <= 1e-6, "the reference is not the initial actor (ds-0009)"
    assert all(c["ok"] for c in summary["checks"] if c["run"] == name), summary["checks"]


# make test runs one negative control, on Qwen's default base; make test-full runs every run's
@pytest.mark.parametrize(
    "run", _full("v091", "v071", "sync", DS_091, "deepseek", "deepseek-v071", ci=CI_RUNS)
)
def test_without_the_weight_sync_the_gap_grows_to_the_stale_level(request, e2e_python, tmp_path, run):
    """The negative control: with update_weights disabled in the rollout (on 0.9.1 every sync after the first
    skipped, the harness's hook on its ServerAdapter), the same check fails."""
    if run in ("v091", DS_091):
        request.getfixturevalue("e2e_python_091")  # its environment, built once per machine
    out = tmp_path / "e2e_nosync"
    proc, summary = _e2e(e2e_python, out, "--runs", run, "--disable-weight-sync")
    tier_report.record_e2e("test_e2e", summary, [run])
    # the tiny model and data come from the machine's cache (built by the first run that needed them)
    assert "reusing the machine's copy" in proc.stdout or "inputs: built" in proc.stdout, _tail(proc)
    assert summary, _tail(proc)
    assert proc.returncode == 1, _tail(proc)
    r = summary["runs"][run]
    assert r["steps_done"] == [1, 2, 3]
    gap = r["gap"]
    stale, rollout = r[f"stale_{gap}_diff_mean"][-1], r[f"rollout_{gap}_diff_mean"][-1]
    assert stale >= 0.01
    assert rollout >= 0.5 * stale, (
        f"with no sync the rollout gap {rollout} should reach the stale gap {stale}"
    )
    failed = {(c["run"], c["check"]) for c in summary["checks"] if not c["ok"]}
    assert (run, "weight sync") in failed


def test_e2e_refuses_a_python_without_the_vllm_cpu_build(tmp_path):
    """Run under the tool environment (no vllm-cpu): one line naming what to do, exit 1."""
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "ascend_rl", "e2e", "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert proc.stderr.strip().count("\n") == 0 and "make e2e" in proc.stderr


def test_e2e_usage_errors_exit_2(tmp_path):
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "ascend_rl", "e2e", "--runs", "resume", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "list sync before it" in proc.stderr
