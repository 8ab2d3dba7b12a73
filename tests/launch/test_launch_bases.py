"""The launchers pick a verl base (--base or VERL_BASE=, else the recipe's default_base), name it in --help,
hand it to the preflight and put it in the dry run's plan; an unknown base is refused in one line."""

from __future__ import annotations

import pytest

from ascend_rl import manifest
from ascend_rl import memory_plan as mp
from launcher_env import LAUNCHERS, dry_run_plan, launcher_env, run_launcher

QWEN_LAUNCHERS = LAUNCHERS[:2]


@pytest.mark.parametrize("script", QWEN_LAUNCHERS)
def test_help_names_the_base_option(script, tmp_path, verl_tree):
    proc = run_launcher(script, ["--help"], launcher_env(tmp_path, verl_tree))
    assert proc.returncode == 0 and "--base VERSION" in proc.stdout and "VERL_BASE" in proc.stdout
    assert "set -euo pipefail" not in proc.stdout


@pytest.mark.parametrize("how", ["option", "option=", "env"])
def test_the_base_reaches_the_plan(how, tmp_path, verl_tree):
    env = launcher_env(tmp_path, verl_tree)
    args = ["--dry-run", "--json"]
    if how == "option":
        env.pop("VERL_BASE")
        args = ["--base", "0.6.0", *args]
    elif how == "option=":
        env.pop("VERL_BASE")
        args = ["--base=0.6.0", *args]
    plan = dry_run_plan(run_launcher(LAUNCHERS[0], args, env))
    assert plan["verl"]["base"]["version"] == "0.6.0" and plan["verl"]["version"] == "0.6.0"


@pytest.mark.parametrize("script", LAUNCHERS)
def test_an_unknown_base_is_refused_in_one_line_the_same_by_every_launcher(script, tmp_path, verl_tree):
    """Both recipes' launchers resolve the base through `ascend_rl resolve` (one reader of recipe.toml): the same
    line and exit 2 before anything is checked or started, never another base's behaviour."""
    recipe = manifest.load_recipe(script.parent.name)
    proc = run_launcher(script, ["--dry-run", "--base", "9.9.9"], launcher_env(tmp_path, verl_tree))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"resolve: error: recipe {recipe.name} has no verl base 9.9.9; its bases: {', '.join(recipe.bases)} "
        f"(default {recipe.default})"
    ]
    assert proc.stdout == ""


@pytest.mark.parametrize("script", [LAUNCHERS[1], LAUNCHERS[2]])
def test_every_launcher_hands_verl_the_reward_its_manifest_names(script, tmp_path, verl_tree):
    """The reward path comes from the resolution (recipe.toml's [reward]), not from a path written in the launcher:
    DeepSeek's manifest names the Qwen recipe's file, the one reward file users copy."""
    launch = manifest.resolve_launch(script.parent.name, "0.6.0")
    plan = dry_run_plan(run_launcher(script, ["--dry-run", "--json"], launcher_env(tmp_path, verl_tree)))
    assert plan["overrides"]["custom_reward_function.path"] == str(launch.reward)
    assert plan["overrides"]["custom_reward_function.name"] == launch.reward_function
    assert "new_math_reward" not in script.read_text(), "the launcher names no reward file of its own"


def test_a_missing_base_value_is_a_usage_error(tmp_path, verl_tree):
    missing = run_launcher(LAUNCHERS[0], ["--dry-run", "--base"], launcher_env(tmp_path, verl_tree))
    assert missing.returncode == 2 and "--base needs a version" in missing.stderr


def test_a_tree_of_another_base_is_refused_naming_it(tmp_path, verl_tree):
    # the 0.6.0 tree launched as another base: the refusal says what the tree is
    others = [b for b in manifest.load_recipe("qwen2_5").bases if b != "0.6.0"]
    if not others:
        pytest.skip("the Qwen recipe has one base")
    env = launcher_env(tmp_path, verl_tree, VERL_BASE=others[0])
    proc = run_launcher(LAUNCHERS[0], ["--dry-run"], env)
    assert proc.returncode == 1
    assert "a base of qwen2_5" in proc.stderr and "--base 0.6.0" in proc.stderr


def test_the_0_7_1_base_launches_its_server_mode_rollout_and_cpu_additions(tmp_path, base_tree):
    tree = base_tree("0.7.1")
    env = launcher_env(tmp_path, tree, VERL_BASE="0.7.1")
    plan = dry_run_plan(run_launcher(LAUNCHERS[0], ["--cpu", "--dry-run", "--json"], env))
    assert plan["verl"]["version"] == plan["verl"]["base"]["version"] == "0.7.1"
    final = plan["overrides"]
    assert final["actor_rollout_ref.rollout.mode"] == "async"
    assert final["actor_rollout_ref.rollout.enable_sleep_mode"] == "False"
    assert final["actor_rollout_ref.model.override_config.attn_implementation"] == "sdpa"
    assert final["reward.num_workers"] == "1"
    assert plan["env"]["RAY_num_workers_soft_limit"] == "1"
    npu = dry_run_plan(run_launcher(LAUNCHERS[0], ["--dry-run", "--json"], env))
    assert npu["overrides"]["actor_rollout_ref.rollout.mode"] == "async"
    assert "reward.num_workers" not in npu["overrides"] and "RAY_num_workers_soft_limit" not in npu["env"]
    assert npu["env"]["VLLM_USE_V1"] == plan["env"]["VLLM_USE_V1"] == "1"  # vLLM 0.13 still reads it


def test_the_deepseek_launcher_on_0_7_1_takes_the_server_mode_rollout_and_its_ports(
    tmp_path, base_tree, pristine_base
):
    """--base 0.7.1: async rollout, explicit offload with sleep mode off (ds-0104), the AlltoAllV routing through
    per_tensor_generator (ds-0106, so mbridge off), additional_config without + (ds-0103)."""
    from ascend_rl import overlay

    tree = base_tree("0.7.1")
    overlay.apply_series(manifest.load_recipe("deepseek_r1", "0.7.1"), tree)
    env = launcher_env(tmp_path, tree)
    env.pop("VERL_BASE")
    plan = dry_run_plan(run_launcher(LAUNCHERS[2], ["--base", "0.7.1", "--dry-run", "--json"], env))
    assert plan["verl"]["version"] == plan["verl"]["base"]["version"] == "0.7.1"
    final = plan["overrides"]
    assert final["actor_rollout_ref.rollout.mode"] == "async"
    assert final["actor_rollout_ref.rollout.explicit_offload"] == "True"
    assert final["actor_rollout_ref.rollout.enable_sleep_mode"] == "False"
    assert final["actor_rollout_ref.rollout.enforce_eager"] == "True"
    assert final["actor_rollout_ref.actor.megatron.use_mbridge"] == "False"
    assert final["actor_rollout_ref.rollout.expert_reshard"] == "alltoallv"
    # whole experts per EP rank: 0.7.1's config leaves expert TP null, which megatron-core turns into TP (4), where
    # the reshard falls back to the all-gather
    for role in ("actor", "ref"):
        assert final[f"actor_rollout_ref.{role}.megatron.expert_tensor_parallel_size"] == "1", role
    assert (
        "multistream_overlap_shared_expert"
        in final["actor_rollout_ref.rollout.engine_kwargs.vllm.additional_config"]
    )
    assert plan["env"]["VLLM_USE_V1"] == "1"  # vLLM 0.13 still reads it (env.sh's recipes_base_env)


def test_the_deepseek_launcher_on_0_9_1_exports_no_vllm_use_v1(tmp_path, base_tree):
    """vLLM 0.23 (verl 0.9.1, the DeepSeek default) has no VLLM_USE_V1 (tests/patches/test_contract_091.py): env.sh
    exported it on every base; the default base's plan carries none."""
    from ascend_rl import overlay

    tree = base_tree("0.9.1")
    overlay.apply_series(manifest.load_recipe("deepseek_r1", "0.9.1"), tree)
    env = launcher_env(tmp_path, tree)
    env.pop("VERL_BASE")  # the recipe's default base
    plan = dry_run_plan(run_launcher(LAUNCHERS[2], ["--dry-run", "--json"], env))
    assert plan["verl"]["version"] == "0.9.1"
    assert "VLLM_USE_V1" not in plan["env"], plan["env"].get("VLLM_USE_V1")


def test_ray_start_resolves_the_base_as_the_launcher_does(tmp_path, verl_tree):
    script = LAUNCHERS[2].parent / "ray_start.sh"
    env = launcher_env(tmp_path, verl_tree, VERL_BASE="9.9.9")
    env.pop("VERL_DIR")
    bad = run_launcher(script, ["--head", "--nodes", "2", "--dry-run"], env)
    assert bad.returncode == 2 and bad.stderr.strip().startswith(
        "resolve: error: recipe deepseek_r1 has no verl base"
    )
    env["VERL_BASE"] = "0.7.1"
    good = run_launcher(script, ["--head", "--nodes", "2", "--cpu", "--dry-run"], env)
    assert good.returncode == 0, good.stderr
    assert "with verl 0.7.1 from " + str(LAUNCHERS[2].parent / "verl-0.7.1-cpu") in good.stderr


def test_the_0_9_1_base_launches_on_the_cpu_platform_its_overlay_installs(tmp_path, base_tree):
    """The CPU profile on 0.9.1: the legacy trainer, no sleep mode, and the environment that selects the CPU platform
    (cpu-0014) through verl's plugin hook; none of it on an NPU launch."""
    tree = base_tree("0.9.1")
    env = launcher_env(tmp_path, tree, VERL_BASE="0.9.1")
    plan = dry_run_plan(run_launcher(LAUNCHERS[0], ["--cpu", "--dry-run", "--json"], env))
    assert plan["verl"]["version"] == plan["verl"]["base"]["version"] == "0.9.1"
    final = plan["overrides"]
    assert final["trainer.use_v1"] == "False"
    assert final["actor_rollout_ref.rollout.enable_sleep_mode"] == "False"
    assert final["reward.num_workers"] == "1"
    assert plan["env"]["VERL_PLATFORM"] == "cpu"
    assert plan["env"]["VERL_USE_EXTERNAL_MODULES"] == "verl.plugin.platform.platform_cpu"
    assert plan["env"]["VERL_ENGINE_DEVICE"] == "cuda"
    npu = dry_run_plan(run_launcher(LAUNCHERS[0], ["--dry-run", "--json"], env))
    assert npu["overrides"]["trainer.use_v1"] == "False"
    # vLLM-Ascend 0.23 sizes the KV cache from the whole die (docs/memory_plan.md): the base's share fits an A2 die,
    # the launcher's 0.8 would not; on CPU the profile's own share stays
    assert npu["overrides"]["actor_rollout_ref.rollout.gpu_memory_utilization"] == "0.7"
    assert final["actor_rollout_ref.rollout.gpu_memory_utilization"] == "0.1"
    memory = mp.plan_launch(mp.settings_from_plan(npu))
    assert memory.refusal() is None and memory.peak.name == "generation", memory.refusal()
    # vLLM 0.23 has no VLLM_USE_V1 (tests/patches/test_contract_091.py): the launcher does not carry it here
    assert "VLLM_USE_V1" not in npu["env"] and "VLLM_USE_V1" not in plan["env"]
    assert (
        "VERL_PLATFORM" not in npu["env"]
        and "actor_rollout_ref.rollout.enable_sleep_mode" not in npu["overrides"]
    )
