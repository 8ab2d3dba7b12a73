"""run_deepseek_r1_a3.sh --base 0.9.1 (issue 46, step 1): the dry run composes verl 0.9.1's own ppo_megatron_trainer
with the launcher's overrides on a patched copy of the tree, runs 0.9.1's validate_config and writes nothing; the
overrides 0.9.1 has no key for are the other bases' only; while recipe.toml lists a port as pending, a real NPU
launch is refused in one line naming it, before anything is fetched, patched or started (none is left now)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ascend_rl import manifest
from ascend_rl.paths import REPO
from launcher_env import LAUNCHERS, dry_run_plan, launcher_env, run_launcher

BASE = "0.9.1"
LAUNCHER = LAUNCHERS[2]
# what the other bases' launches carry and 0.9.1's config has no key for (or its series no port of yet)
NOT_ON_091 = (
    "actor_rollout_ref.actor.megatron.use_mbridge",  # 0.9.1's engine asserts the bridge
    "actor_rollout_ref.actor.megatron.grad_offload",  # no key; param_offload frees the gradient buffer
    "actor_rollout_ref.actor.load_weight",  # no key; every engine loads the checkpoint
    "actor_rollout_ref.ref.load_weight",
)
# and the keys a pending port declares: absent while it is pending (the launch could not compose them)
KEY_OF_PORT = {
    "ds-0106": "actor_rollout_ref.rollout.expert_reshard",
    "ds-0104": "actor_rollout_ref.rollout.explicit_offload",
}


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def pristine_091(tmp_path, pristine_base) -> Path:
    import shutil

    tree = tmp_path / "verl-0.9.1"
    shutil.copytree(pristine_base(BASE), tree, symlinks=True)
    return tree


def test_the_dry_run_composes_0_9_1s_config_and_writes_nothing(tmp_path, pristine_091):
    recipe = manifest.load_recipe("deepseek_r1", BASE)
    before = tree_bytes(pristine_091)
    env = launcher_env(tmp_path, pristine_091)
    env.pop("VERL_BASE")
    proc = run_launcher(LAUNCHER, ["--base", BASE, "--dry-run", "--json"], env)
    plan = dry_run_plan(proc)
    assert plan["verl"]["version"] == plan["verl"]["base"]["version"] == BASE
    assert plan["verl"]["base"]["pending"] == recipe.pending
    report = proc.stderr
    assert (
        f"{len(recipe.series)} of {len(recipe.series)} patches to apply: checked on a patched copy" in report
    )
    assert "validate   ok       verl's validate_config passes" in report
    # every port landed (issue 46 steps 3-5): nothing pending, no refusal announced
    assert recipe.pending == {} and "ports " not in report and "still lacks ports" not in report
    final = plan["overrides"]
    assert final["trainer.use_v1"] == "False"
    assert (
        "multistream_overlap_shared_expert"
        in final["actor_rollout_ref.rollout.engine_kwargs.vllm.additional_config"]
    )
    assert final["actor_rollout_ref.actor.recompute_old_log_prob"] == "False"  # shared-0016's key composes
    absent = set(NOT_ON_091) | {key for pid, key in KEY_OF_PORT.items() if pid in recipe.pending}
    assert not [k for k in final if k.lstrip("+") in absent], [k for k in final if k.lstrip("+") in absent]
    assert final["actor_rollout_ref.actor.megatron.param_offload"] == "True"
    # whole experts per EP rank, which ds-0206's AlltoAllV needs (0.9.1's config leaves expert TP null: TP's 4)
    for role in ("actor", "ref"):
        assert final[f"actor_rollout_ref.{role}.megatron.expert_tensor_parallel_size"] == "1", role
    # ds-0204's explicit offload in place of sleep level 1, as on 0.7.1 (0.9.1's validate_config took them above)
    assert final["actor_rollout_ref.rollout.explicit_offload"] == "True"
    assert final["actor_rollout_ref.rollout.enforce_eager"] == "True"
    assert final["actor_rollout_ref.rollout.enable_sleep_mode"] == "False"
    # ds-0208's sync refuses NZ weights: vllm-ascend 0.23 falls back to this variable when additional_config has no
    # weight_nz_mode (the launcher's has none)
    assert plan["env"]["VLLM_ASCEND_ENABLE_NZ"] == "0"
    assert "weight_nz_mode" not in final["actor_rollout_ref.rollout.engine_kwargs.vllm.additional_config"]
    # nothing written: the tree, the run folders
    assert tree_bytes(pristine_091) == before
    assert not (tmp_path / "run_log").exists() and not (tmp_path / "ckpt").exists()


def test_the_random_variant_on_0_9_1_loads_one_random_checkpoint_and_the_others_keep_load_weight(
    tmp_path, pristine_091
):
    """0.9.1 has no load_weight: the model path (the actor's, the reference's and the rollout's) is the random
    checkpoint of MODEL_DIR's config under RANDOM_MODEL_DIR, which the dry run names and does not write."""
    from llm_rl.deepseek_r1 import random_checkpoint

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "deepseek_v3", "num_hidden_layers": 2}')
    random_root = tmp_path / "random"
    env = launcher_env(
        tmp_path, pristine_091, VERL_BASE=BASE, MODEL_DIR=str(model), RANDOM_MODEL_DIR=str(random_root)
    )
    proc = run_launcher(LAUNCHER, ["--variant", "random", "--dry-run", "--json"], env)
    final = dry_run_plan(proc)["overrides"]
    assert final["actor_rollout_ref.rollout.expert_parallel_size"] == "256"
    assert (
        "actor_rollout_ref.actor.load_weight" not in final
        and "actor_rollout_ref.ref.load_weight" not in final
    )
    want = random_checkpoint.checkpoint_dir(model, random_root, seed=1)
    assert final["actor_rollout_ref.model.path"] == str(want) and want.parent == random_root
    assert f"random checkpoint: {want} (not written yet: a launch writes it)" in proc.stderr
    assert not random_root.exists()  # a dry run writes nothing
    assert manifest.load_recipe("deepseek_r1", BASE).random_checkpoint
    for base in ("0.6.0", "0.7.1"):
        other = manifest.load_recipe("deepseek_r1", base)
        assert not other.random_checkpoint
        assert other.random_overrides == (
            "actor_rollout_ref.actor.load_weight=False",
            "actor_rollout_ref.ref.load_weight=False",
        )
        assert "actor_rollout_ref.rollout.expert_reshard=alltoallv" in other.overrides
        assert "actor_rollout_ref.actor.megatron.grad_offload=True" in other.overrides


def _with_pending(monkeypatch, pending: dict[str, str]) -> None:
    """The preflight resolves its launch once (manifest.resolve_launch): here with `pending` as the base's table, as
    recipe.toml had it before issue 46's ports landed."""
    from dataclasses import replace

    real = manifest.resolve_launch

    def resolve(*args, **kwargs):
        launch = real(*args, **kwargs)
        return replace(launch, recipe=replace(launch.recipe, pending=pending))

    monkeypatch.setattr(manifest, "resolve_launch", resolve)


def _preflight(tree: Path, *extra: str, base: str = BASE) -> list[str]:
    return ["--recipe", "deepseek_r1", "--base", base, "--config-name", "ppo_megatron_trainer",
            "--verl-dir", str(tree), *extra, "--", "trainer.no_such_key=1"]  # fmt: skip


def test_a_pending_port_refuses_the_npu_launch_only_in_one_line(base_tree, monkeypatch, capsys):
    """While a base's `pending` table names a port, an NPU launch stops at it in one line, before anything is
    checked (a misspelt key is not reached); the CPU profile and a base with nothing pending go on to their checks,
    where the misspelt key stops them. 0.9.1's own table is empty now: its launch is not refused."""
    from ascend_rl.cli import preflight

    tree = base_tree(BASE)
    assert preflight.main(_preflight(tree)) == 1  # the real table: no refusal, the key is what stops it
    err = capsys.readouterr().err
    assert "still lacks ports" not in err and "config has no key trainer.no_such_key" in err, err
    _with_pending(
        monkeypatch, {"ds-0104": "issue 46 step 4: explicit offload", "ds-0108": "issue 46 step 4: sync"}
    )
    assert preflight.main(_preflight(tree)) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "no_such_key" not in lines[0], lines
    assert lines[0].startswith(
        "preflight: error: deepseek_r1 on verl 0.9.1 still lacks ports an NPU launch needs (ds-0104, ds-0108;"
    )
    assert "--base 0.6.0 or 0.7.1" in lines[0] and "--dry-run" in lines[0]
    assert preflight.main(_preflight(tree, "--cpu", "--with", "cpu")) == 1
    err = capsys.readouterr().err
    assert "still lacks ports" not in err and "config has no key trainer.no_such_key" in err, err


def test_resolve_names_the_base_its_series_image_and_what_is_pending():
    proc = subprocess.run(
        [sys.executable, "-m", "ascend_rl", "resolve", "deepseek_r1", "--base", BASE],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    recipe = manifest.load_recipe("deepseek_r1", BASE)
    assert out["base"] == BASE and out["default_base"] == BASE and BASE in out["bases"]
    assert out["series"] == [str(p.relative_to(REPO)) for p in recipe.series]
    assert out["image"] == "quay.io/ascend/cann:9.1.0-a3-ubuntu22.04-py3.12"
    assert out["constraints"] == "constraints-0.9.1.txt" and out["pending"] == recipe.pending
    assert "trainer.use_v1=False" in out["overrides"]


def test_the_cpu_profile_on_0_9_1_puts_the_random_checkpoint_beside_its_inputs(tmp_path, pristine_091):
    """The CPU profile runs the random variant: on 0.9.1 the tiny model's random checkpoint goes under
    e2e_out/deepseek_inputs/random (not the recipe folder) unless RANDOM_MODEL_DIR says otherwise; a dry run names it
    and writes nothing."""
    from llm_rl.deepseek_r1 import random_checkpoint

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "deepseek_v3", "num_hidden_layers": 2}')
    env = launcher_env(tmp_path, pristine_091, VERL_BASE=BASE, MODEL_DIR=str(model))
    env.pop("RANDOM_MODEL_DIR", None)
    want = random_checkpoint.checkpoint_dir(model, REPO / "e2e_out" / "deepseek_inputs" / "random", seed=1)
    existed = (
        want.exists()
    )  # (the key hashes this test's config: only an earlier launch of it could have made it)
    final = dry_run_plan(run_launcher(LAUNCHER, ["--cpu", "--dry-run", "--json"], env))["overrides"]
    assert final["actor_rollout_ref.model.path"] == str(want)
    assert want.exists() == existed


def test_a_bad_model_config_stops_the_random_variant_in_one_line_before_anything_is_written(
    tmp_path, pristine_091
):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("[1, 2]")
    env = launcher_env(
        tmp_path,
        pristine_091,
        VERL_BASE=BASE,
        MODEL_DIR=str(model),
        RANDOM_MODEL_DIR=str(tmp_path / "random"),
    )
    proc = run_launcher(LAUNCHER, ["--variant", "random"], env)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        f"error: {model / 'config.json'} holds a JSON list, not a model config"
    ]
    assert not (tmp_path / "random").exists() and not (tmp_path / "run_log").exists()
