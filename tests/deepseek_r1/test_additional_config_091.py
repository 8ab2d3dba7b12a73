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

from ascend_rl import artifacts, manifest, preflight
from ascend_rl.paths import REPO
from ci_policy import get_artifact
from patched_tree import patched_copy

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
    return patched_copy(pristine, tmp_path_factory.mktemp("ds091cfg") / "verl", recipe)


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


# The composed rollout section (stdin, YAML) through RolloutConfig, the server's null filter
# (vllm_async_server.py:288) and the tree's own build_cli_args_from_config (argv[1]: its utils.py; the module imports
# vLLM, so the function is taken out of it and run alone): the vLLM command line, as JSON on the last line.
_TO_CLI = r"""
import ast, json, sys
from omegaconf import OmegaConf
from verl.utils.config import omega_conf_to_dataclass

rollout = omega_conf_to_dataclass(OmegaConf.create(sys.stdin.read()))
engine = {k: v for k, v in rollout.engine_kwargs.get("vllm", {}).items() if v is not None}
builder = [n for n in ast.parse(open(sys.argv[1]).read()).body if getattr(n, "name", "") == "build_cli_args_from_config"]
space = {"json": json, "Any": object}
exec(compile(ast.Module(body=builder, type_ignores=[]), sys.argv[1], "exec"), space)
print(json.dumps(space["build_cli_args_from_config"](engine)))
"""


def _vllm_args(tree, overrides) -> list[str]:
    from omegaconf import OmegaConf

    cfg = preflight.compose(tree, "ppo_megatron_trainer", _base(overrides))
    proc = subprocess.run(
        [sys.executable, "-c", _TO_CLI, str(tree / UTILS)],
        input=OmegaConf.to_yaml(cfg.actor_rollout_ref.rollout, resolve=True),
        env={**os.environ, "PYTHONPATH": str(tree), "CUDA_VISIBLE_DEVICES": ""},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_additional_config_reaches_vllms_command_line_as_json(tree, recipe):
    """The launcher's override, composed on the patched tree, leaves 0.9.1's command-line builder as the JSON vLLM
    parses; unset (null) it leaves no --additional_config at all."""
    args = _vllm_args(tree, [_launcher_override(recipe)])
    i = args.index("--additional_config")
    assert json.loads(args[i + 1]) == {"multistream_overlap_shared_expert": True}
    assert "--additional_config" not in _vllm_args(tree, [])
    server = (tree / "verl/workers/rollout/vllm_rollout/vllm_async_server.py").read_text().splitlines()
    assert "if val is not None" in server[287], "the server's null filter moved: re-read vllm_async_server.py"


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
