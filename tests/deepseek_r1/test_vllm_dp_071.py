"""vLLM DP x EP on verl 0.7.1's server rollout: what ds-0002/ds-0005 did is upstream; ds-0003 is patch ds-0103.

Source facts (the 0.7.1 sdist, the vllm 0.13.0 and vllm-ascend 0.13.0 wheels, read with `ast`) behind retiring
ds-0002 (DP rank/size/master) and ds-0005 (one batch chunk per DP rank) on 0.7.1, and a run of ds-0103: the launcher's
additional_config composes on the patched tree (the pristine one refuses it), arrives in RolloutConfig as a dict and
leaves 0.7.1's build_cli_args_from_config as the JSON vLLM parses.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import zipfile

import pytest
from test_explicit_offload_071 import patched_071
from test_vllm_ascend_contract import PLATFORM, ascend_wheel_path, function, vllm_wheel_path

from ascend_rl import preflight

SERVER = "verl/workers/rollout/vllm_rollout/vllm_async_server.py"
UTILS = "verl/workers/rollout/vllm_rollout/utils.py"
LAUNCHER_KEY = "actor_rollout_ref.rollout.engine_kwargs.vllm.additional_config"


@pytest.fixture(scope="module")
def pristine(pristine_base):
    return pristine_base("0.7.1")


@pytest.fixture(scope="module")
def tree(tmp_path_factory, pristine):
    return patched_071(pristine, tmp_path_factory.mktemp("ds071dp") / "verl")


def _method_source(path, qualname: str) -> str:
    cls, name = qualname.split(".")
    klass = next(n for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef) and n.name == cls)
    return ast.unparse(next(n for n in klass.body if getattr(n, "name", None) == name))


def test_071_server_sets_up_vllm_dp_itself(pristine):
    """vLLMHttpServer passes DP size, local size, start rank and the DP address/RPC port to `vllm serve`."""
    launch = _method_source(pristine / SERVER, "vLLMHttpServer.launch_server")
    for arg in (
        "'enable_expert_parallel'",
        "'data_parallel_size'",
        "'data_parallel_size_local'",
        "'data_parallel_start_rank': self.node_rank * data_parallel_size_local",
        "'data_parallel_address'",
        "'data_parallel_rpc_port'",
    ):
        assert arg in launch, arg
    assert "await self.run_headless(server_args)" in launch  # nodes > 0 run engine cores only
    run_server = _method_source(pristine / SERVER, "vLLMHttpServer.run_server")
    assert "vllm_config.parallel_config.data_parallel_master_port = self._dp_master_port" in run_server


def test_vllm_013_hands_the_dp_master_to_headless_engines_and_balances_requests():
    wheel = vllm_wheel_path()
    handshake = ast.unparse(function(wheel, "vllm/v1/engine/utils.py", "wait_for_engine_startup"))
    assert "'data_parallel_master_port'" in handshake and "EngineHandshakeMetadata" in handshake
    make = ast.unparse(
        function(wheel, "vllm/v1/engine/core_client.py", "EngineCoreClient.make_async_mp_client")
    )
    assert "return DPLBAsyncMPClient(*client_args)" in make  # internal load balancer over the DP engines
    pick = ast.unparse(
        function(wheel, "vllm/v1/engine/core_client.py", "DPLBAsyncMPClient.get_core_engine_for_request")
    )
    assert "min_score" in pick  # each request to the least loaded DP engine, not to all of them
    client = ast.parse(zipfile.ZipFile(wheel).read("vllm/v1/engine/core_client.py").decode())
    klass = next(n for n in client.body if isinstance(n, ast.ClassDef) and n.name == "DPLBAsyncMPClient")
    utility = ast.unparse(next(n for n in klass.body if getattr(n, "name", "") == "call_utility_async"))
    assert "for engine in self.core_engines" in utility  # sleep / wake_up / weight sync reach every DP engine


def test_vllm_ascend_013_turns_off_sequence_parallel_moe():
    """verl issue 4413 / vllm-ascend 4718 (DP + EP + TP>1 failing): the workaround there is what 0.13.0 does."""
    body = ast.unparse(function(ascend_wheel_path(), PLATFORM, "NPUPlatform.check_and_update_config"))
    assert "parallel_config.all2all_backend = 'flashinfer_all2allv'" in body
    sp_moe = ast.unparse(
        function(vllm_wheel_path(), "vllm/config/parallel.py", "ParallelConfig.use_sequence_parallel_moe")
    )
    assert "'flashinfer_all2allv'" not in sp_moe and "self.data_parallel_size > 1" in sp_moe


def _base(extra):
    return ["actor_rollout_ref.rollout.name=vllm", "trainer.n_gpus_per_node=8", "trainer.nnodes=1", *extra]


def test_additional_config_composes_only_on_the_patched_tree(tree, pristine):
    override = f"{LAUNCHER_KEY}={{multistream_overlap_shared_expert:true}}"
    with pytest.raises(Exception, match="additional_config"):
        preflight.compose(pristine, "ppo_megatron_trainer", _base([override]))
    cfg = preflight.compose(tree, "ppo_megatron_trainer", _base([override]))
    assert dict(cfg.actor_rollout_ref.rollout.engine_kwargs.vllm.additional_config) == {
        "multistream_overlap_shared_expert": True
    }
    assert (
        preflight.compose(
            tree, "ppo_megatron_trainer", _base([])
        ).actor_rollout_ref.rollout.engine_kwargs.vllm["additional_config"]
        is None
    )


def test_additional_config_reaches_vllms_command_line_as_json(tree):
    """RolloutConfig from the composed config, the server's engine_kwargs filter, 0.7.1's build_cli_args_from_config."""
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
src = open(tree + "/{UTILS}").read()
fn = next(n for n in ast.parse(src).body if getattr(n, "name", "") == "build_cli_args_from_config")
ns = {{"json": json, "Any": object}}
exec(compile(ast.Module(body=[fn], type_ignores=[]), "{UTILS}", "exec"), ns)
print(json.dumps(ns["build_cli_args_from_config"](kwargs)))
"""
    env = {**os.environ, "PYTHONPATH": str(tree), "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(
        [sys.executable, "-c", script, str(tree)], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    args = json.loads(proc.stdout.strip().splitlines()[-1])
    print("vllm serve args:", args)
    assert args[0] == "--additional_config"
    assert json.loads(args[1]) == {"multistream_overlap_shared_expert": True}
    # vLLM 0.13.0 takes it as a dict (EngineArgs.additional_config: dict[str, Any], --additional-config)
    arg_utils = zipfile.ZipFile(vllm_wheel_path()).read("vllm/engine/arg_utils.py").decode()
    assert re.search(r"additional_config: dict\[str, Any\]", arg_utils)
    assert '"--additional-config"' in arg_utils
