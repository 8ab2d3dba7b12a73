"""ds-0103 on verl 0.9.1: the DeepSeek launcher's engine_kwargs.vllm.additional_config composes on the patched tree
(the pristine one refuses it), arrives in RolloutConfig as a dict, and leaves 0.9.1's build_cli_args_from_config as the
JSON vLLM 0.23.0 parses for --additional-config; vllm-ascend 0.23.0.post1 still reads the key the launcher sets."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import tarfile
import zipfile

import pytest

from ascend_rl import artifacts, manifest, overlay, preflight
from ascend_rl.paths import REPO
from ci_policy import get_artifact

BASE = "0.9.1"
UTILS = "verl/workers/rollout/vllm_rollout/utils.py"
LAUNCHER_KEY = "actor_rollout_ref.rollout.engine_kwargs.vllm.additional_config"


@pytest.fixture(scope="module")
def recipe():
    return manifest.load_recipe("deepseek_r1", BASE)


@pytest.fixture(scope="module")
def pristine(pristine_base):
    return pristine_base(BASE)


@pytest.fixture(scope="module")
def tree(tmp_path_factory, pristine, recipe):
    import shutil

    dest = tmp_path_factory.mktemp("ds091cfg") / "verl"
    shutil.copytree(pristine, dest, symlinks=True)
    overlay.apply_series(recipe, dest, log=lambda m: None)
    return dest


def _base(extra):
    return ["actor_rollout_ref.rollout.name=vllm", "trainer.n_gpus_per_node=8", "trainer.nnodes=1", *extra]


def _launcher_override(recipe) -> str:
    """The base's additional_config override, as recipe.toml gives it to the launcher."""
    return next(o for o in recipe.overrides if o.startswith(LAUNCHER_KEY + "="))


def test_additional_config_composes_only_on_the_patched_tree(tree, pristine, recipe):
    override = _launcher_override(recipe)
    with pytest.raises(preflight.PreflightError, match="additional_config"):
        preflight.compose(pristine, "ppo_megatron_trainer", _base([override]))
    cfg = preflight.compose(tree, "ppo_megatron_trainer", _base([override]))
    assert dict(cfg.actor_rollout_ref.rollout.engine_kwargs.vllm.additional_config) == {
        "multistream_overlap_shared_expert": True
    }
    unset = preflight.compose(tree, "ppo_megatron_trainer", _base([]))
    assert unset.actor_rollout_ref.rollout.engine_kwargs.vllm["additional_config"] is None
    # the FSDP trainer's config takes it too (the generated YAMLs and rollout.yaml are one schema)
    assert preflight.compose(
        tree, "ppo_trainer", _base([override])
    ).actor_rollout_ref.rollout.engine_kwargs.vllm


def test_additional_config_reaches_vllms_command_line_as_json(tree):
    """RolloutConfig from the composed config, the server's null filter (vllm_async_server.py:288), 0.9.1's own
    build_cli_args_from_config (read from the tree, run here)."""
    script = f"""
import ast, json, sys
from omegaconf import OmegaConf
from verl.utils.config import omega_conf_to_dataclass
tree = sys.argv[1]
cfg = OmegaConf.load(tree + "/verl/trainer/config/_generated_ppo_megatron_trainer.yaml").actor_rollout_ref.rollout
cfg.name = "vllm"
cfg.engine_kwargs.vllm.additional_config = {{"multistream_overlap_shared_expert": True}}
rollout = omega_conf_to_dataclass(cfg)
kwargs = {{k: v for k, v in rollout.get("engine_kwargs", {{}}).get("vllm", {{}}).items() if v is not None}}
unset = {{k: v for k, v in OmegaConf.to_container(
    OmegaConf.load(tree + "/verl/trainer/config/rollout/rollout.yaml").engine_kwargs.vllm).items() if v is not None}}
src = open(tree + "/{UTILS}").read()
fn = next(n for n in ast.parse(src).body if getattr(n, "name", "") == "build_cli_args_from_config")
ns = {{"json": json, "Any": object}}
exec(compile(ast.Module(body=[fn], type_ignores=[]), "{UTILS}", "exec"), ns)
print(json.dumps([ns["build_cli_args_from_config"](kwargs), ns["build_cli_args_from_config"](unset)]))
"""
    env = {**os.environ, "PYTHONPATH": str(tree), "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(
        [sys.executable, "-c", script, str(tree)], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    args, unset = json.loads(proc.stdout.strip().splitlines()[-1])
    assert args[0] == "--additional_config" and len(args) == 2
    assert json.loads(args[1]) == {"multistream_overlap_shared_expert": True}
    assert unset == [], "null leaves vLLM's additional_config unset"
    # the server drops null engine arguments before it builds the command line
    server = (tree / "verl/workers/rollout/vllm_rollout/vllm_async_server.py").read_text().splitlines()
    assert "if val is not None" in server[287]


def test_vllm_0_23_and_vllm_ascend_0_23_take_the_launchers_key(recipe):
    constraints = REPO / recipe.constraints
    vllm = artifacts.pinned("vllm", constraints)
    wheel = get_artifact(f"vllm {vllm} wheel", artifacts.wheel, "vllm", vllm)
    arg_utils = zipfile.ZipFile(wheel).read("vllm/engine/arg_utils.py").decode()
    assert re.search(r"additional_config: dict\[str, Any\]", arg_utils)
    assert '"--additional-config"' in arg_utils
    ascend = artifacts.pinned("vllm-ascend", constraints)
    sdist = get_artifact(f"vllm-ascend {ascend} sdist", artifacts.vllm_ascend_sdist, ascend)
    with tarfile.open(sdist) as tar:
        top = tar.getnames()[0].split("/")[0]
        source = tar.extractfile(f"{top}/vllm_ascend/ascend_config.py").read().decode()
    reads = {
        node.args[0].value
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "get"
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "additional_config"
        and node.args
        and isinstance(node.args[0], ast.Constant)
    }
    launcher = re.search(r"=\{(\w+):", _launcher_override(recipe)).group(1)
    assert launcher in reads, f"vllm-ascend {ascend} no longer reads additional_config[{launcher!r}]"
