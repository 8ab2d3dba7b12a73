"""The DeepSeek launcher's CPU profile on verl 0.6.0, `VERL_BASE=0.6.0 run_deepseek_r1_a3.sh --cpu` (the recipe's
default base is 0.9.1 since issue 46; the 0.9.1 profile's dry run is tests/launch/test_launch_bases.py's and
test_deepseek_launch_091.py's): its dry run composes the recipe's overrides
with the profile's (Megatron actor and reference with EP=2 on gloo, verl's sync vLLM rollout on the vLLM 0.13.0 CPU
build, explicit offload, actor.recompute_old_log_prob=False, rollout.expert_reshard=alltoallv, MindSpeed's options
dropped) against verl's ppo_megatron_trainer.

The run itself, 3 GRPO steps through main_ppo, is `make e2e`'s deepseek run (tests/harness/test_e2e.py): its rollout/actor
and stale gaps, one actor forward per step, the reshard's bytes per rank against the plan's.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from ascend_rl import artifacts
from ci_policy import get_artifact
from launcher_env import dry_run_plan, exported_names

REPO = Path(__file__).resolve().parents[2]
DEEPSEEK = REPO / "llm_rl" / "deepseek_r1"
LAUNCHER = DEEPSEEK / "run_deepseek_r1_a3.sh"
pytestmark = [pytest.mark.slow, pytest.mark.ci]


@pytest.fixture(scope="module")
def inputs(e2e_python, verl_sdist_path, tmp_path_factory):
    """(e2e python, work folder, env for the launcher): model, data, a fresh verl-cpu tree path, log paths."""
    get_artifact("megatron-core / mbridge", artifacts.megatron_packages, e2e_python)
    work = tmp_path_factory.mktemp("deepseek-cpu-profile")
    code = (
        "from pathlib import Path\n"
        "from ascend_rl.tiny import deepseek_v3 as tiny_deepseek, problems\n"
        f"problems.prepare(Path({str(work / 'data')!r}), log=lambda m: None)\n"
        f"tiny_deepseek.make_checkpoint(Path({str(work / 'model')!r}), seed=1)\n"
    )
    subprocess.run([str(e2e_python), "-c", code], cwd=REPO, check=True, timeout=600)
    env = dict(os.environ)
    env.update(
        VERL_BASE="0.6.0",  # the e2e environment's stack (vLLM 0.13.0), the base whose profile this file checks
        PYTHON=str(e2e_python),
        VERL_DIR=str(work / "verl-cpu"),
        MODEL_DIR=str(work / "model"),
        DATA_DIR=str(work / "data"),
        LOG_DIR=str(work / "log"),
        CKPT_DIR=str(work / "ckpt"),
        VERL_FILE_LOGGER_PATH=str(work / "metrics.jsonl"),
        PYTHONUNBUFFERED="1",
    )
    return e2e_python, work, env


def cpu_dry_run(env: dict) -> dict:
    """The JSON plan of `run_deepseek_r1_a3.sh --cpu --dry-run --json` under env (it must succeed)."""
    proc = subprocess.run(
        ["bash", str(LAUNCHER), "--cpu", "--dry-run", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return dry_run_plan(proc)


def test_the_dry_run_composes_the_cpu_profile(inputs):
    _, work, env = inputs
    plan = cpu_dry_run(env)
    command = plan["argv"]
    for want in (
        "actor_rollout_ref.actor.recompute_old_log_prob=False",
        "actor_rollout_ref.rollout.expert_reshard=alltoallv",
        "actor_rollout_ref.rollout.explicit_offload=True",
        "actor_rollout_ref.actor.megatron.param_offload=True",
        "actor_rollout_ref.actor.megatron.expert_model_parallel_size=2",
        "trainer.device=cpu",
        "actor_rollout_ref.actor.load_weight=False",  # the random variant
        "~actor_rollout_ref.actor.megatron.override_transformer_config.use_flash_attn",
    ):
        assert want in command, want
    # what the profile exports reaches the plan; the trainer's PYTHONPATH carries the tree, then megatron-core
    only_071 = {"RAY_num_workers_soft_limit"}  # exported for --base 0.7.1 only
    assert exported_names(LAUNCHER, DEEPSEEK / "env.sh", DEEPSEEK / "cpu_profile.sh") - only_071 <= set(
        plan["env"]
    )
    assert plan["env"]["VLLM_MLA_DISABLE"] == "1"
    paths = plan["env"]["PYTHONPATH"].split(os.pathsep)
    assert paths[0] == str(work / "verl-cpu") and str(artifacts.megatron_packages(inputs[0])) in paths
    # the recipe adds MindSpeed's flash attention (+key=True), the profile deletes it (~key): deleted wins
    assert (
        plan["overrides"]["actor_rollout_ref.actor.megatron.override_transformer_config.use_flash_attn"]
        is None
    )


@pytest.mark.parametrize("harness_records", [False, True])
def test_the_ray_workers_record_their_dev_shm_names_as_the_driver_does(inputs, tmp_path, harness_records):
    """Issue 48, item 6: the CPU profile replaces the Ray workers' PYTHONPATH (runtime_env), so a launch the
    launcher records itself must put the record's folder (ascend_rl/shm_record, whose sitecustomize records) first
    there too, or the workers' vLLM queues, which a kill leaves, go unrecorded. A run the harness records (it sets
    RECIPES_SHM_RECORD and its own hooks) gets nothing added."""
    _, _, env = inputs
    env = dict(env)
    env.pop("RECIPES_SHM_RECORD", None)
    if harness_records:
        env["RECIPES_SHM_RECORD"] = str(tmp_path / "shm.jsonl")
    overrides = cpu_dry_run(env)["overrides"]
    key = next(k for k in overrides if k.endswith("ray_init.runtime_env.env_vars.PYTHONPATH"))
    workers = str(overrides[key]).split(os.pathsep)
    record_site = str(REPO / "ascend_rl" / "shm_record")
    if harness_records:
        assert record_site not in workers, workers
    else:
        assert workers[0] == record_site, workers
