"""Patch ds-0007 and the preflight: the rollout's max_num_batched_tokens check, run from the tree's own source.

The check is the statements of vLLMRollout.__init__ between `max_model_len = ...` and `load_format = ...`, taken
out of the pristine and the patched vllm_rollout_spmd.py and run on a grid of settings; the preflight must refuse
exactly the settings that raise there. vLLM 0.13's own rule is checked against the wheel in
tests/deepseek_r1/test_vllm_ascend_contract.py.
"""

from __future__ import annotations

import ast
import importlib.util
import itertools
import sys
import types
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from ascend_rl import preflight
from launcher_env import LAUNCHERS
from launcher_env import launcher_env as _env
from launcher_env import run_launcher as _run

SPMD = "verl/workers/rollout/vllm_rollout/vllm_rollout_spmd.py"
# --variant real in run_deepseek_r1_a3.sh: data.max_prompt_length=1024, data.max_response_length=3072
REAL = {
    "max_num_batched_tokens": 1024,
    "prompt_length": 1024,
    "response_length": 3072,
    "enable_chunked_prefill": True,
}


def _rollout_check(tree: Path):
    """check(settings) runs the tree's construction-time budget check; raises what vLLMRollout.__init__ raises."""
    module = ast.parse((tree / SPMD).read_text())
    cls = next(n for n in module.body if isinstance(n, ast.ClassDef) and n.name == "vLLMRollout")
    init = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    targets = [ast.unparse(s.targets[0]) if isinstance(s, ast.Assign) else None for s in init.body]
    body = init.body[targets.index("max_model_len") : targets.index("load_format")]
    assert any(isinstance(s, ast.If | ast.ImportFrom) for s in body), "the check moved out of this span"
    code = compile(ast.Module(body=body, type_ignores=[]), str(tree / SPMD), "exec")
    budget = tree / "verl/utils/vllm/token_budget.py"

    def check(settings: dict) -> None:
        config = types.SimpleNamespace(max_model_len=None, max_num_seqs=1024, enable_chunked_prefill=True)
        config.__dict__.update(settings)
        namespace = {"config": config, "self": types.SimpleNamespace(config=config)}
        namespace["max_num_batched_tokens"] = config.max_num_batched_tokens
        saved = {
            k: sys.modules.get(k)
            for k in ("verl", "verl.utils", "verl.utils.vllm", "verl.utils.vllm.token_budget")
        }
        try:
            if budget.is_file():
                spec = importlib.util.spec_from_file_location("verl.utils.vllm.token_budget", budget)
                rule = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(rule)
                sys.modules.update(
                    {k: types.ModuleType(k) for k in ("verl", "verl.utils", "verl.utils.vllm")}
                    | {"verl.utils.vllm.token_budget": rule}
                )
            exec(code, namespace)
        finally:
            for key, value in saved.items():
                if value is None:
                    sys.modules.pop(key, None)
                else:
                    sys.modules[key] = value

    return check


def _refuses(check, settings) -> bool:
    try:
        check(settings)
    except ValueError:
        return True
    return False


@pytest.fixture(scope="module")
def patched(patched_verl) -> Path:
    return patched_verl("deepseek_r1")


def test_launcher_real_variant_raised_in_060_and_builds_when_patched(patched, pristine_verl):
    with pytest.raises(ValueError, match="max_num_batched_tokens is smaller than max_model_len"):
        _rollout_check(pristine_verl)(REAL)
    _rollout_check(patched)(REAL)  # no exception: vLLM 0.13 accepts it under chunked prefill
    refused = [{**REAL, "enable_chunked_prefill": False}, {**REAL, "max_num_seqs": 2048}]
    assert all(_refuses(_rollout_check(patched), s) for s in refused)


GRID = [
    {
        "max_num_batched_tokens": tokens,
        "prompt_length": 1024,
        "response_length": 3072,
        "max_model_len": model_len,
        "enable_chunked_prefill": chunked,
        "max_num_seqs": seqs,
    }
    for tokens, model_len, chunked, seqs in itertools.product(
        (512, 1024, 4096, 8192), (None, 2048), (True, False), (256, 1024)
    )
]


@pytest.mark.parametrize("which", ["patched", "pristine"])
def test_preflight_refuses_exactly_what_the_tree_refuses(which, patched, pristine_verl):
    tree = patched if which == "patched" else pristine_verl
    check = _rollout_check(tree)
    seen = set()
    for settings in GRID:
        cfg = OmegaConf.create(
            {"actor_rollout_ref": {"rollout": {"name": "vllm", "mode": "sync", **settings}}}
        )
        verdict = preflight.check_rollout_budget(cfg, tree)
        assert (verdict.status == "FAIL") == _refuses(check, settings), (settings, verdict.detail)
        seen.add(verdict.status)
    assert seen == {"ok", "FAIL"}


def test_dry_run_refuses_a_budget_the_launch_would_raise_on(tmp_path, verl_tree):
    env = _env(tmp_path, verl_tree)
    ok = _run(LAUNCHERS[2], ["--variant", "real", "--dry-run"], env)
    assert ok.returncode == 0, ok.stderr
    assert "budget     ok       max_num_batched_tokens 1024, max_model_len 4096" in ok.stdout
    refused = _run(
        LAUNCHERS[2],
        ["--variant", "real", "--dry-run", "actor_rollout_ref.rollout.enable_chunked_prefill=False"],
        env,
    )
    assert refused.returncode == 1
    assert (
        "preflight: error: max_num_batched_tokens (1024) < max_model_len (4096) needs enable_chunked_prefill"
        in (refused.stderr)
    )
