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
from launcher_env import dry_run_plan, exported_names

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
    assert exported_names(QWEN / "run_qwen2_5_1_5b.sh", QWEN / "cpu_profile.sh") - only_071 <= set(
        plan["env"]
    )
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
