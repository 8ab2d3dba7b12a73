"""Whole runs killed mid-step resume from the newest complete checkpoint (shared-0012), and end by themselves.

`python -m ascend_rl faults` through each recipe launcher's CPU profile (main_ppo, Ray, vLLM's CPU build;
Qwen: FSDP2, one rank; DeepSeek: the Megatron actor on 2 gloo ranks), a checkpoint every step and one kept:
the harness's hook pauses the step-2 save at a trainer rank's first torch.save and the script kills the
run's whole process group or only that rank, or it kills the vLLM engine's process in step 2 (verl 0.7.1's
server; on 0.6.0's sync rollout the trainer rank that runs it), or (Qwen 0.6.0) the checkpoints sit on a
tmpfs that step 2's save fills; then it reruns the launcher with resume_mode=auto. make test (CI) kills each
recipe's run on its default base inside the step-2 save (CI_PLAN: both on verl 0.9.1, DeepSeek's the dist checkpoint
of its Megatron engine); make test-full adds a trainer rank, the engine on every base where it is tried, the save on
the other bases and the full disk (FULL_PLAN); `python -m ascend_rl faults` with no options runs every kill each recipe's CPU run supports.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

import tier_report
from ascend_rl.harness import faults

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow
# make test (CI): one kill per recipe on its default base, the whole group inside the step-2 save, with the
# rerun's resume check; the killed run and its rerun also carry make e2e's proof of the run (--e2e-checks: steps,
# one actor forward per step, weight sync, DeepSeek's reshard bytes and reference), in place of an uninterrupted
# e2e run of each (test_e2e.py's e2e_default, now in make test-full). make test-full: the rest of the plan.
# DeepSeek first: its tiny random model is quick to build, while on a fresh machine the e2e unit beside it is
# building the Qwen runs' warm start (once per machine, under a lock this unit would otherwise wait on)
CI_PLAN = (
    # the DeepSeek default, verl 0.9.1's Megatron engine in its own environment (e2e_python_091): its dist checkpoint
    ("deepseek_r1", "0.9.1", "group@save"),
    # the Qwen default, verl 0.9.1, in its own environment (e2e_python_091): the engine workers' save
    ("qwen2_5", "0.9.1", "group@save"),
)
FULL_PLAN = (
    ("qwen2_5", "0.6.0", "group@save,rank@save,diskfull@save"),
    ("qwen2_5", "0.7.1", "group@save,engine@step2"),
    # the vLLM 0.23 server's engine
    ("qwen2_5", "0.9.1", "engine@step2"),
    # on verl 0.6.0's sync rollout the engine runs inside a trainer rank: its kill is also the dead trainer rank
    ("deepseek_r1", "0.6.0", "group@save,engine@step2"),
    ("deepseek_r1", "0.7.1", "group@save,engine@step2"),
)
PLANS = {"ci": CI_PLAN, "full": FULL_PLAN}


MOE_ENV = "RECIPES_VLLM_CPU_MOE"  # ascend_rl/harness/verl_modules/recipes_vllm_cpu.py


def _faults(python: Path, out: Path, plan, *options: str, env: dict | None = None) -> tuple[list, dict]:
    procs, rows = [], []
    for recipe, base, kills in plan:
        proc = subprocess.run(
            [
                str(python),
                "-m",
                "ascend_rl",
                "faults",
                "--out",
                str(out),
                "--recipes",
                recipe,
                "--bases",
                base,
                "--kills",
                kills,
                *options,
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=2400,
            env=None if env is None else {**os.environ, **env},
        )
        procs.append(proc)
        report = out / "faults.json"
        got = json.loads(report.read_text())["rows"] if report.is_file() else []
        for row in got:
            wall = (row.get("killed_wall_s") or 0) + (row.get("rerun_wall_s") or 0)
            pss = max(row.get("killed_peak_pss_gib") or 0, row.get("rerun_peak_pss_gib") or 0)
            rss = max(row.get("killed_peak_rss_gib") or 0, row.get("rerun_peak_rss_gib") or 0)
            name = f"{row['recipe']} {row['base']} {row['kind']} + rerun"
            tier_report.record("test_faults", name, row["ok"], wall or None, pss or None, rss or None)
        if not got:
            tier_report.record("test_faults", f"{recipe} {base} {kills}", False, None, None)
        rows += got
    return procs, {(r["recipe"], r["kind"], r["base"]): r for r in rows}


@pytest.fixture(scope="module")
def faults_ci_out(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("faults") / "out"


@pytest.fixture(scope="module")
def faults_ci(e2e_python, e2e_python_091, faults_ci_out):
    """CI_PLAN with e2e's proof (--e2e-checks); vLLM's CPU MoE forced onto its torch path (RECIPES_VLLM_CPU_MOE=torch),
    the one an x86 CPU without AVX-512 takes, so CI runs it whatever the machine (make test-full's DeepSeek runs
    leave the choice to vLLM)."""
    return _faults(e2e_python, faults_ci_out, CI_PLAN, "--e2e-checks", env={MOE_ENV: "torch"})


@pytest.fixture(scope="module")
def faults_full(e2e_python, e2e_python_091, tmp_path_factory):
    return _faults(e2e_python, tmp_path_factory.mktemp("faults-full") / "out", FULL_PLAN)


TIERS = [pytest.param("ci", marks=pytest.mark.ci), pytest.param("full", marks=pytest.mark.full)]


def _tail(procs) -> str:
    return "\n".join(f"stdout:\n{p.stdout[-2500:]}\nstderr:\n{p.stderr[-1500:]}" for p in procs)


@pytest.mark.parametrize("tier", TIERS)
def test_every_kill_resumes_from_the_last_complete_checkpoint(request, tier):
    procs, rows = request.getfixturevalue(f"faults_{tier}")
    want = [(recipe, kind, base) for recipe, base, kills in PLANS[tier] for kind in kills.split(",")]
    assert sorted(rows) == sorted(want), _tail(procs)
    for row in rows.values():
        if row["kind"] == "diskfull@save" and row.get("why", "").startswith("cannot mount"):
            continue  # test_a_full_disk... says why
        if (row["recipe"], row["base"], row["kind"]) == ("deepseek_r1", "0.7.1", "engine@step2"):
            # the 0.7.1 server's title outlives its generate call: the kill can land after step 2's save, and the
            # rerun must then take that newest complete checkpoint (seen: resumed from 2)
            assert row["resumed_from"] == row["newest_complete"] in (1, 2), row
            assert row["rerun_steps"] == list(range(row["resumed_from"] + 1, 4)) and row["left"] == 0, row
            assert row["ok"], row
            continue
        # what the kill left: step 1 complete, the tracker at 1, step 2 at most under its temporary name
        assert "global_step_1" in row["folders"] and "global_step_2" not in row["folders"], row
        assert row["resumed_from"] == 1 and row["steps_lost"] == 1 and row["rerun_steps"] == [2, 3], row
        assert row["left"] == 0, row  # no process of the killed run outlives it
        assert row["ok"], row
    disk = rows.get(("qwen2_5", "diskfull@save", "0.6.0"), {})
    if not disk.get("why", "").startswith("cannot mount"):
        assert all(p.returncode == 0 for p in procs), _tail(procs)
        assert all("pass" in p.stdout and "FAIL" not in p.stdout for p in procs), _tail(procs)


@pytest.mark.parametrize("tier", TIERS)
def test_the_save_kills_happen_inside_the_step_2_save(request, tier):
    _, rows = request.getfixturevalue(f"faults_{tier}")
    saves = [row for (_recipe, kind, _base), row in rows.items() if kind in ("group@save", "rank@save")]
    assert saves, rows
    for row in saves:
        assert row["paused_in"].startswith("global_step_2.partial/actor/"), row


@pytest.mark.full
def test_a_dead_worker_ends_the_run_by_itself_with_one_line(faults_full):
    _, rows = faults_full
    dead = [row for (_recipe, kind, _base), row in rows.items() if kind in ("rank@save", "engine@step2")]
    assert len(dead) == 5, rows
    for row in dead:
        assert row["ended_by_itself"], row  # without the script's forced kill, within --end-within
        assert row["said"] and row["said"].startswith("run: ") and " in step 2" in row["said"], row
    assert "trainer rank 0" in rows[("qwen2_5", "rank@save", "0.6.0")]["said"]
    assert "the vLLM server" in rows[("qwen2_5", "engine@step2", "0.7.1")]["said"]
    assert "the vLLM server" in rows[("qwen2_5", "engine@step2", "0.9.1")]["said"]
    # DeepSeek's two ranks: the one killed (it ran its vLLM engine) is named, and the survivor, left waiting in
    # the rollout's collective, does not keep the run alive
    assert "trainer rank" in rows[("deepseek_r1", "engine@step2", "0.6.0")]["said"]
    assert "the vLLM server" in rows[("deepseek_r1", "engine@step2", "0.7.1")]["said"]


@pytest.mark.full
def test_a_full_disk_during_a_save_stops_the_run_in_one_line_and_step_1_stays_loadable(faults_full):
    _, rows = faults_full
    row = rows[("qwen2_5", "diskfull@save", "0.6.0")]
    if row.get("why", "").startswith("cannot mount"):
        pytest.skip(f"the disk-full run needs a small tmpfs: {row['why']}")
    assert row["ended_by_itself"] and row["said"].startswith(
        "run: failed in step 2 (saving its checkpoint): "
    ), row
    assert "the disk is full writing " in row["said"] and "global_step_2.partial" in row["said"], row
    # the previous checkpoint stays complete and the rerun (on a disk with room) resumes from it
    assert row["resumed_from"] == 1 and row["rerun_steps"] == [2, 3] and row["ok"], row


# make e2e's proof of each recipe's default base, carried by make test's kills (--e2e-checks, e2e.killed_run_proof):
# what test_e2e.py's e2e_default proves of an uninterrupted run (make test-full), here over the killed run's step 1
# and the resumed rerun's steps 2 and 3
E2E_RUNS = {"qwen2_5": "v091", "deepseek_r1": "deepseek-v091"}


def _rerun_log(out: Path, recipe: str) -> str:
    name = faults.run_name(recipe, "group@save", "0.9.1")
    return (out / f"{name}-rerun" / "launcher.log").read_text(errors="replace")


def _metrics(out: Path, recipe: str) -> list[dict]:
    name = faults.run_name(recipe, "group@save", "0.9.1")
    return [
        json.loads(line)
        for folder in (name, f"{name}-rerun")
        for line in (out / folder / "metrics.jsonl").read_text().splitlines()
        if line.strip()
    ]


@pytest.mark.ci
@pytest.mark.parametrize("recipe", E2E_RUNS)
def test_the_killed_default_base_run_trains_with_one_forward_and_synced_weights_across_its_resume(
    faults_ci, faults_ci_out, recipe
):
    """verl 0.9.1, each recipe's default: the launcher's CPU profile through main_ppo (Qwen: the engine workers,
    FSDP2 on gloo; DeepSeek: 0.9.1's MegatronEngine on 2 gloo ranks, EP=2), vLLM 0.23.0's CPU server. Killed in its
    step-2 save, resumed from step 1: steps 1 (the killed run) then 2 and 3 (the rerun) logged with a reward and a
    non-zero gradient; one actor forward per step (the old-log-prob pass skipped, cpu-0015 / ds); at the last step the
    policy has moved from the initial weights (stale gap >= 0.01, the reference is built from the model path, not
    the checkpoint) and the rerun's vLLM samples from the updated weights (rollout gap <= a fifth of it)."""
    procs, rows = faults_ci
    row = rows.get((recipe, "group@save", "0.9.1"))
    assert row and "e2e" in row, _tail(procs)
    name = E2E_RUNS[recipe]
    run, checks = row["e2e"]["run"], {c["check"]: c for c in row["e2e"]["checks"]}
    assert run["base"] == "0.9.1" and run["steps_done"] == [1, 2, 3], run
    assert run["killed_steps"] == [1] and run["resumed_from_step"] == 1 and run["rerun_steps"] == [2, 3], run
    want = {"steps", "resumed", "one forward", "policy moved", "weight sync"}
    if recipe == "deepseek_r1":
        want |= {"reference", "reshard bytes"}
    assert set(checks) == want, checks
    assert all(c["ok"] for c in checks.values()), checks
    assert run["forward_passes"] == [1, 1, 1] and not any(run["old_log_prob_pass"]), run
    gap = run["gap"]  # probs for Qwen; log_probs for the random-weight DeepSeek policy (p ~ 1/vocabulary)
    assert gap == ("log_probs" if recipe == "deepseek_r1" else "probs")
    stale, rollout = run[f"stale_{gap}_diff_mean"][-1], run[f"rollout_{gap}_diff_mean"][-1]
    assert stale >= 0.01, (
        f"{name}: the policy barely moved (stale gap {stale}); the check would prove nothing"
    )
    assert rollout <= stale / 5, f"{name}: rollout gap {rollout} vs stale gap {stale}: vLLM holds old weights"
    # the stale gap is to the initial weights across the resume: the rerun's reference is built from the model path,
    # not the checkpoint, so at the rerun's first step (2) the actor is already an update away from it
    assert run[f"stale_{gap}_diff_mean"][1] > 1e-6, f"{name}: the rerun's reference is the checkpoint's actor"
    metrics = _metrics(faults_ci_out, recipe)
    assert [r["step"] for r in metrics] == [1, 2, 3], "verl's file logger"
    assert all("critic/score/mean" in r["data"] and r["data"]["actor/grad_norm"] > 0 for r in metrics)
    log = _rerun_log(faults_ci_out, recipe)
    tree = "deepseek_r1/verl-0.9.1-cpu" if recipe == "deepseek_r1" else "verl-0.9.1-cpu"
    assert tree in log, "the run did not use the 0.9.1 CPU tree"
    assert "vllm-cpu 0.23.0" in log, "the preflight did not see vLLM 0.23.0's CPU build"


@pytest.mark.ci
def test_the_killed_deepseek_default_base_run_routes_the_planned_bytes_on_the_forced_avx2_moe_path(
    faults_ci, faults_ci_out
):
    """DeepSeek on verl 0.9.1: every rank's AlltoAllV bytes per sync equal the planner's and the model's arithmetic
    (ds-0006), through collective calls (ds-0206's adapter), in each process: the killed run's two syncs (before
    step 1, after its update) and the rerun's three (before step 2, after each update); the reference starts from the
    actor's weights (the step-1 stale gap, the killed run's); vLLM's MoE on the torch path an AVX2-only CPU takes
    (forced: RECIPES_VLLM_CPU_MOE=torch)."""
    procs, rows = faults_ci
    row = rows.get(("deepseek_r1", "group@save", "0.9.1"))
    assert row and "e2e" in row, _tail(procs)
    run = row["e2e"]["run"]
    expected = run["reshard_expected_recv_bytes"]
    assert expected and expected > 0
    for reshard, syncs in ((run["reshard_killed"], 2), (run["reshard"], 3)):
        assert {(r["sync"], r["rank"]) for r in reshard} == {
            (s, k) for s in range(1, syncs + 1) for k in (0, 1)
        }
        for r in reshard:
            assert r["calls"] > 0, r
            assert r["recv_bytes"] == r["plan_recv_bytes"] == expected, r
            assert r["sent_bytes"] == r["plan_sent_bytes"] == expected, (
                r
            )  # two ranks: what one receives, the other sent
    assert run["stale_log_probs_diff_mean"][0] <= 1e-6, "the reference is not the initial actor"
    log = _rerun_log(faults_ci_out, "deepseek_r1")
    assert f"recipes: vLLM CPU MoE path forward_torch ({MOE_ENV}=torch)" in log, (
        "the rollout's MoE path is not said"
    )
