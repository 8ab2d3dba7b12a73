"""The Qwen launcher's CPU profile (--cpu / PROFILE=cpu) and the preflight fences it relies on.

Dry runs only: they apply the recipe's series plus the CPU overlay to a fresh verl 0.6.0 sdist copy
and compose the full override list with verl's own Hydra config. The real CPU runs are test_e2e.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ascend_rl import overlay
from launcher_env import dry_run_plan, exported_names, launcher_env, run_launcher

REPO = Path(__file__).resolve().parents[2]
QWEN = REPO / "llm_rl" / "qwen2_5"
SINGLE = QWEN / "run_qwen2_5_1_5b_single.sh"


def _launch(tmp_path: Path, verl_tree: Path, *args: str, **env_extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.update(VERL_DIR=str(verl_tree), LOG_DIR=str(tmp_path / "run_log"), CKPT_DIR=str(tmp_path / "ckpt"))
    env["VERL_BASE"] = "0.6.0"  # the fixture's tree
    env.update(env_extra)
    return subprocess.run(["bash", str(SINGLE), *args], capture_output=True, text=True, env=env, timeout=300)


def test_cpu_profile_keeps_the_recipe_overrides_and_appends_its_own(tmp_path, verl_tree):
    proc = _launch(tmp_path, verl_tree, "--cpu", "--dry-run", "--json", "trainer.total_training_steps=3")
    assert proc.returncode == 0, proc.stderr
    plan = dry_run_plan(proc)
    argv, report = plan["argv"], proc.stderr  # with --json the report goes to stderr
    # The recipe's list first (its NPU settings included), the profile after it, the user's last.
    assert argv.index("trainer.device=npu") < argv.index("trainer.device=cpu")
    assert "actor_rollout_ref.rollout.n=8" in argv and "actor_rollout_ref.rollout.n=4" in argv
    assert argv[-1] == "trainer.total_training_steps=3"
    assert "trainer.device = cpu" in report  # what Hydra composed: the later value won
    # The preflight checked for vLLM's CPU build instead of an NPU (this Python lacks it: a warning).
    assert "  cpu " in report and "  npu " not in report
    # The plan names what the profile exports, with the values the trainer gets.
    only_071 = {"RAY_num_workers_soft_limit"}  # exported for VERL_BASE=0.7.1 only (test_launch_bases.py)
    only_ranks = {"VLLM_CPU_OMP_THREADS_BIND"}  # exported with NPUS > 1 only (below)
    assert exported_names(
        QWEN / "run_qwen2_5_1_5b.sh", QWEN / "cpu_profile.sh"
    ) - only_071 - only_ranks <= set(plan["env"])
    assert plan["env"]["RAY_USE_UVLOOP"] == "0" and plan["env"]["OMP_NUM_THREADS"] == "1"
    assert plan["verl"]["overlay"] == "cpu"
    # ... and checked the recipe's series plus the CPU overlay, which a real launch applies (a dry run writes nothing).
    cpu = overlay.with_overlay(overlay.load_recipe("qwen2_5", "0.6.0"), "cpu")
    assert {s.state for s in overlay.series_status(cpu, verl_tree)} == {"applicable"}
    assert plan["changes"][0].startswith(
        f"verl tree: apply the {len(cpu.series)} patches of qwen2_5 --with cpu"
    )


def test_npu_profile_never_applies_the_cpu_overlay(tmp_path, verl_tree):
    proc = _launch(tmp_path, verl_tree, "--dry-run", "--json")
    assert proc.returncode == 0, proc.stderr
    plan = dry_run_plan(proc)
    assert "trainer.device=cpu" not in plan["argv"]
    recipe = overlay.load_recipe("qwen2_5", "0.6.0")
    assert (
        plan["changes"][0]
        == f"verl tree: apply the {len(recipe.series)} patches of qwen2_5 (verl 0.6.0) to {verl_tree}"
    )


def test_unknown_profile_and_option_are_one_line_usage_errors(tmp_path, verl_tree):
    for proc in (
        _launch(tmp_path, verl_tree, "--dry-run", PROFILE="gpu"),
        _launch(tmp_path, verl_tree, "--dry-run", "--cpus"),
    ):
        assert proc.returncode == 2
        assert len(proc.stderr.strip().splitlines()) == 1
    # Refused before the preflight: the tree was not touched.
    recipe = overlay.load_recipe("qwen2_5", "0.6.0")
    assert {s.state for s in overlay.series_status(recipe, verl_tree)} == {"applicable"}


def test_lora_with_the_vllm_rollout_is_refused(tmp_path, verl_tree):
    proc = _launch(tmp_path, verl_tree, "--dry-run", "actor_rollout_ref.model.lora_rank=8")
    assert proc.returncode == 1
    assert "lora_rank=8 with the vLLM 0.13 rollout is not supported" in proc.stderr
    assert "command:" not in proc.stdout


def _ranks_plan(tmp_path: Path, tree: Path, script: Path, **env: str) -> tuple[dict, str]:
    proc = run_launcher(
        script, ["--cpu", "--dry-run", "--json"], launcher_env(tmp_path, tree, VERL_BASE="0.7.1", **env)
    )
    return dry_run_plan(proc), proc.stderr


def test_npus_sizes_the_cpu_profile_ranks_and_one_stays_the_single_card_run(tmp_path, base_tree):
    """NPUS=2 on the four-card launcher's CPU profile (make e2e's qwen-2r, verl 0.7.1): two FSDP ranks, Ray's GPU
    count and lowercase cpu resource for two bundles, CPU slots for two vLLM servers, a batch each rank's share of
    which is one micro-batch, TP 1 so each rank gets its own engine, unbound engine threads. The single-card
    launcher composes the one-rank values it always had."""
    tree = base_tree("0.7.1")
    plan, report = _ranks_plan(tmp_path, tree, QWEN / "run_qwen2_5_1_5b.sh", NPUS="2")
    final = plan["overrides"]
    assert final["trainer.n_gpus_per_node"] == "2" and final["trainer.nnodes"] == "1"
    assert final["ray_kwargs.ray_init.num_gpus"] == "2"
    assert final["ray_kwargs.ray_init.resources"] == "{cpu:2}"
    assert final["ray_kwargs.ray_init.num_cpus"] == "12"
    assert final["data.train_batch_size"] == final["actor_rollout_ref.actor.ppo_mini_batch_size"] == "4"
    samples_per_rank = 4 * int(final["actor_rollout_ref.rollout.n"]) // 2
    assert samples_per_rank % int(final["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"]) == 0
    assert final["actor_rollout_ref.rollout.tensor_model_parallel_size"] == "1"
    assert final["actor_rollout_ref.rollout.mode"] == "async"
    assert plan["env"]["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
    assert "2 devices, rollout 2 vLLM engines of TP1" in report

    one, report = _ranks_plan(tmp_path, tree, SINGLE)
    final = one["overrides"]
    assert final["trainer.n_gpus_per_node"] == final["ray_kwargs.ray_init.num_gpus"] == "1"
    assert final["ray_kwargs.ray_init.resources"] == "{cpu:1}"
    assert final["ray_kwargs.ray_init.num_cpus"] == "8"
    assert final["data.train_batch_size"] == final["actor_rollout_ref.actor.ppo_mini_batch_size"] == "2"
    assert "VLLM_CPU_OMP_THREADS_BIND" not in one["env"]
    assert "1 device, rollout 1 vLLM engine of TP1" in report
