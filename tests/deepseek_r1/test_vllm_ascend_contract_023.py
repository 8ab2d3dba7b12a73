"""Source contracts of the DeepSeek 0.9.1 sync patches (ds-0204, ds-0208): vllm-ascend 0.23.0.post1 and vLLM 0.23.0.

As tests/deepseek_r1/test_vllm_ascend_contract.py does for 0.13: vllm-ascend's sdist (0.23.0.post1 has no wheel) and
vLLM's wheel, the pins of constraints-0.9.1.txt, are read as source with `ast`, never imported. Each check states a
fact a patch assumes; the behaviour is run on CPU tensors in test_mla_sync_091.py and test_explicit_offload_091.py.
"""

from __future__ import annotations

import ast
import re
import types
from pathlib import Path

import pytest
from test_vllm_ascend_contract import (
    FUSED_MOE,
    MLA,
    WORKER,
    _assignments,
    _source,
    _text,
    function,
    python_files,
)
from test_vllm_ascend_contract import where as _where

from ascend_rl import artifacts
from ascend_rl.paths import REPO
from ci_policy import get_artifact

CONSTRAINTS = REPO / "constraints-0.9.1.txt"
ASCEND_CONFIG = "vllm_ascend/ascend_config.py"
ENVS = "vllm_ascend/envs.py"
CORE_CLIENT = "vllm/v1/engine/core_client.py"
CORE = "vllm/v1/engine/core.py"
ASYNC_LLM = "vllm/v1/engine/async_llm.py"


def ascend_023_path() -> Path:
    """vllm-ascend's sdist at constraints-0.9.1.txt's pin (0.23.0.post1)."""
    version = artifacts.pinned("vllm-ascend", CONSTRAINTS)
    return get_artifact(f"vllm-ascend {version} sdist", artifacts.vllm_ascend_sdist, version)


def vllm_023_path() -> Path:
    """vLLM's wheel at constraints-0.9.1.txt's pin (0.23.0), read as a zip."""
    version = artifacts.pinned("vllm", CONSTRAINTS)
    return get_artifact(f"vllm {version} wheel", artifacts.wheel, "vllm", version)


@pytest.fixture(scope="module")
def ascend_023() -> Path:
    return ascend_023_path()


@pytest.fixture(scope="module")
def vllm_023() -> Path:
    return vllm_023_path()


def test_the_pins_are_the_ones_the_patches_name():
    assert artifacts.pinned("vllm-ascend", CONSTRAINTS) == "0.23.0.post1"
    assert artifacts.pinned("vllm", CONSTRAINTS) == "0.23.0"


# --- ds-0208: the MoE layouts ---------------------------------------------------------------------------------------


def test_fused_moe_post_load_still_transposes_into_new_tensors(ascend_023):
    qual = "AscendUnquantizedFusedMoEMethod.process_weights_after_loading"
    msg = _where(ascend_023, FUSED_MOE, qual)
    assigned = _assignments(function(ascend_023, FUSED_MOE, qual))
    for name in ("w13", "w2"):
        data = assigned.get(f"{name}_data", [""])[0]
        assert f"layer.{name}_weight.data" in data and ".transpose(1, 2).contiguous()" in data, msg
        assert any(
            f"{name}_data" in v and "Parameter" in v for v in assigned.get(f"layer.{name}_weight", [])
        ), msg
    # the NZ cast ds-0208 refuses through enable_fused_mc2
    text = _text(function(ascend_023, FUSED_MOE, qual))
    assert (
        "enable_fused_mc2 = get_ascend_config().enable_fused_mc2" in text and "ACL_FORMAT_FRACTAL_NZ" in text
    ), msg


def test_only_wake_up_and_the_post_load_transpose_the_moe_weights(ascend_023):
    """Nowhere else in 0.23.0.post1 are w13/w2 transposed back: without wake_up (explicit offload) ds-0208 must."""
    wake = _text(function(ascend_023, WORKER, "NPUWorker.wake_up"))
    msg = _where(ascend_023, WORKER, "NPUWorker.wake_up")
    assert "'w2_weight' in name and param.shape[2] == hidden_size" in wake, msg
    assert "'w13_weight' in name and param.shape[1] == hidden_size" in wake, msg
    assert wake.count("param.transpose(1, 2)") == 2 and "setattr(parent_module, param_name" in wake, msg
    assert "self.vllm_config.quant_config is None and (tags is None or 'weights' in tags)" in wake, msg
    transposing = []
    for path in python_files(ascend_023):
        if not path.startswith("vllm_ascend/") or "quantization" in path:
            continue
        for node in ast.walk(ast.parse(_source(ascend_023, path))):
            if isinstance(node, ast.FunctionDef):
                body = _text(node)
                if re.search(r"w(13|2)_(weight|data)", body) and ".transpose(1, 2)" in body:
                    transposing.append(f"{path}:{node.name}")
    assert sorted(transposing) == sorted(
        [
            f"{FUSED_MOE}:process_weights_after_loading",
            # the 310P chip's own fused MoE, a post-load step too (an A3 runs ops/fused_moe)
            "vllm_ascend/_310p/fused_moe/fused_moe.py:process_weights_after_loading",
            f"{WORKER}:wake_up",
        ]
    ), f"{ascend_023.name}: MoE transposes moved; re-read {transposing}"


def test_the_mla_post_load_copies_into_the_tensors_it_made_at_start_up(ascend_023):
    """Why ds-0208 does not wrap the post-load step as ds-0108 did: 0.23 keeps W_UV / W_UK_T in place itself."""
    fn = function(ascend_023, MLA, "AscendMLAImpl.process_weights_after_loading")
    branch = next(
        n for n in ast.walk(fn) if isinstance(n, ast.If) and _text(n.test) == "not hasattr(self, 'W_UV')"
    )
    then, orelse = (_text(ast.Module(body=b, type_ignores=[])) for b in (branch.body, branch.orelse))
    assert "self.W_UV = W_UV.transpose(0, 1).contiguous()" in then, _where(ascend_023, MLA, "process_weights")
    assert "self.W_UV.copy_(W_UV.transpose(0, 1).contiguous())" in orelse
    assert "self.W_UK_T.copy_(W_UK.permute(1, 2, 0).contiguous())" in orelse
    # what follows only re-binds W_UK_T through maybe_trans_nz, which returns it as it is with NZ off
    assert "self.W_UK_T = maybe_trans_nz(self.W_UK_T)" in _text(fn)
    trans = _text(function(ascend_023, "vllm_ascend/utils.py", "_should_trans_nz"))
    assert "nz_mode = config.weight_nz_mode" in trans and "if not nz_mode:\n        return False" in trans


# --- the NZ switches: additional_config first, then the environment -----------------------------------------------


def _config_value(ascend_023):
    fn = function(ascend_023, ASCEND_CONFIG, "AscendConfig._get_config_value")
    log = types.SimpleNamespace(info_once=lambda *_: None)
    ns = {"logger": log, "os": __import__("os"), "Any": object}
    fn.decorator_list = []
    exec(compile(ast.Module(body=[fn], type_ignores=[]), ASCEND_CONFIG, "exec"), ns)
    return ns["_get_config_value"]


def test_ds_0208_reads_weight_nz_mode_and_fused_mc2_as_ascend_config_does(ascend_023):
    assigned = _assignments(function(ascend_023, ASCEND_CONFIG, "AscendConfig.__init__"))
    for key, env in (
        ("weight_nz_mode", "VLLM_ASCEND_ENABLE_NZ"),
        ("enable_fused_mc2", "VLLM_ASCEND_ENABLE_FUSED_MC2"),
    ):
        call = f"self._get_config_value(additional_config, '{key}', '{env}', ascend_envs.{env})"
        assert assigned.get(f"self.{key}") == [call], _where(
            ascend_023, ASCEND_CONFIG, "AscendConfig.__init__"
        )
    envs = _source(ascend_023, ENVS).replace("'", '"')
    assert '"VLLM_ASCEND_ENABLE_NZ": lambda: int(os.getenv("VLLM_ASCEND_ENABLE_NZ", 1))' in envs
    assert (
        '"VLLM_ASCEND_ENABLE_FUSED_MC2": lambda: int(os.getenv("VLLM_ASCEND_ENABLE_FUSED_MC2", "0"))' in envs
    )
    wake = _text(function(ascend_023, WORKER, "NPUWorker.wake_up"))
    assert wake.index("nz_mode = get_ascend_config().weight_nz_mode") < wake.index("raise ValueError")

    from llm_rl.deepseek_r1.verl_modules import ascend_weight_sync as sync

    real = _config_value(ascend_023)
    seen = set()
    for key, env_key, default in (
        ("weight_nz_mode", "VLLM_ASCEND_ENABLE_NZ", 1),
        ("enable_fused_mc2", "VLLM_ASCEND_ENABLE_FUSED_MC2", 0),
    ):
        for config in ({}, {key: 0}, {key: 1}, {key: 2}):
            for env in ({}, {env_key: "0"}, {env_key: "1"}):
                env_value = int(
                    env.get(env_key, default)
                )  # ascend_envs' lambda, as AscendConfig evaluates it
                expected = real(config, key, env_key, env_value)
                assert sync._ascend_setting(config, key, env, env_key, default) == expected, (
                    key,
                    config,
                    env,
                )
                seen.add(bool(expected))
    assert seen == {True, False}


# --- ds-0204: what reaches every DP engine, and a wake_up that reaches no worker -----------------------------------


def test_collective_rpc_sleep_and_wake_up_are_utility_calls_every_dp_engine_gets(vllm_023):
    for qual, call in (
        (
            "AsyncMPClient.collective_rpc_async",
            "self.call_utility_async('collective_rpc', method, timeout, args, kwargs)",
        ),
        ("AsyncMPClient.sleep_async", "self.call_utility_async('sleep', level, mode)"),
        ("AsyncMPClient.wake_up_async", "self.call_utility_async('wake_up', tags)"),
    ):
        assert call in _text(function_async(vllm_023, CORE_CLIENT, qual)), _where(vllm_023, CORE_CLIENT, qual)
    fan_out = _text(function_async(vllm_023, CORE_CLIENT, "DPLBAsyncMPClient.call_utility_async"))
    assert "for engine in self.core_engines" in fan_out and "asyncio.gather" in fan_out
    make = _text(function(vllm_023, CORE_CLIENT, "EngineCoreClient.make_async_mp_client"))
    assert (
        "if parallel_config.data_parallel_external_lb:" in make
        and "return DPLBAsyncMPClient(*client_args)" in make
    )
    for qual, call in (
        ("AsyncLLM.collective_rpc", "self.engine_core.collective_rpc_async(method, timeout, args, kwargs)"),
        ("AsyncLLM.sleep", "self.engine_core.sleep_async(level, mode)"),
        ("AsyncLLM.wake_up", "self.engine_core.wake_up_async(tags)"),
    ):
        assert call in _text(function_async(vllm_023, ASYNC_LLM, qual)), _where(vllm_023, ASYNC_LLM, qual)


def test_verl_091_runs_the_dp_engines_behind_one_internal_lb_client(pristine_base):
    """The server passes data_parallel_start_rank, never data_parallel_rank, so vLLM does not pick external LB."""
    server = (pristine_base("0.9.1") / "verl/workers/rollout/vllm_rollout/vllm_async_server.py").read_text()
    assert '"data_parallel_start_rank": self.node_rank * data_parallel_size_local,' in server
    assert '"data_parallel_rank"' not in server and "data_parallel_external_lb" not in server


def function_async(archive: Path, path: str, qualname: str) -> ast.AsyncFunctionDef:
    """`function` for an async method."""
    body = ast.parse(_source(archive, path)).body
    cls, name = qualname.split(".")
    klass = next(n for n in body if isinstance(n, ast.ClassDef) and n.name == cls)
    found = [n for n in klass.body if isinstance(n, ast.AsyncFunctionDef) and n.name == name]
    if not found:
        pytest.fail(f"{archive.name}: {path} has no async {qualname}; re-read it")
    return found[-1]


def test_a_scheduling_only_wake_up_reaches_no_worker_and_level_0_sleep_frees_nothing(vllm_023):
    wake = _text(function(vllm_023, CORE, "EngineCore.wake_up"))
    assert "tags = [t for t in tags if t != 'scheduling']" in wake and "if tags is None or tags:" in wake
    assert "self.resume_scheduler()" in wake
    sleep = _text(function(vllm_023, CORE, "EngineCore.sleep"))
    assert sleep.index("if level < 1:") < sleep.index("model_executor.sleep(level)"), _where(
        vllm_023, CORE, "sleep"
    )
