"""Weight sync into vLLM-Ascend (patches ds-0004 + ds-0008) on CPU tensors, with vLLM-Ascend's and vLLM's own code.

The engine model is small and shaped like vLLM-Ascend's DeepSeek layers; what gives them their layouts is the real
code, taken out of the cached wheels with `ast` and run on CPU: vllm-ascend 0.13.0's
AscendUnquantizedFusedMoEMethod.process_weights_after_loading (w13/w2 transposed), AscendMLAImpl's (W_UV, W_UK_T
from kv_b_proj) and NPUWorker.wake_up (sleep mode's transpose back), vllm 0.13.0's FusedMoE._load_w13 / _load_w2
(what the expert weight loader narrows), and the rollout's update_weights from the patched (and the pristine) verl
tree. Only torch_npu's format cast, the NZ switch and the memory pool are stood in for (identity, off, host copies).
The source facts these rely on are checked in tests/deepseek_r1/test_vllm_ascend_contract.py.
"""

from __future__ import annotations

import ast
import asyncio
import importlib.util
import sys
import types
from pathlib import Path

import pytest
import torch
from test_deepseek_offload import _methods
from test_vllm_ascend_contract import FUSED_MOE, MLA, WORKER, ascend_wheel_path, function, vllm_wheel_path

SPMD = "verl/workers/rollout/vllm_rollout/vllm_rollout_spmd.py"
E, H, FFN = 4, 24, 8  # experts, hidden, expert FFN (2I != H, so wake_up's shape test is unambiguous)
HEADS, LORA, NOPE, V = 2, 8, 4, 6  # MLA: heads, kv_lora_rank, qk_nope_head_dim, v_head_dim


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _compiled(fn: ast.FunctionDef, namespace: dict, filename: str):
    fn.decorator_list, fn.returns = [], None
    exec(compile(ast.Module(body=[fn], type_ignores=[]), filename, "exec"), namespace)
    return namespace[fn.name]


@pytest.fixture(scope="module")
def patched(patched_verl) -> Path:
    return patched_verl("deepseek_r1")


class QuantizeMethodBase:
    """vLLM's base of quantisation methods, stood in for: the post-load loop runs the methods derived from it."""


class FusedMoEMethodBase(QuantizeMethodBase):
    def process_weights_after_loading(self, layer):
        pass


class UnquantizedFusedMoEMethod(FusedMoEMethodBase):
    def _maybe_pad_weight(self, weight):  # vLLM pads on ROCm only
        return weight


def ascend_layer_classes(archive: Path, moe_base: type, moe_ns: dict, impl_attrs: dict | None = None):
    """(AscendUnquantizedFusedMoEMethod, AscendMLAImpl, UnquantizedLinearMethod): the first two with their
    process_weights_after_loading bodies from vllm-ascend's `archive` (wheel or sdist), compiled on CPU stand-ins
    (torch_npu's format cast and maybe_trans_nz as the identity: NZ off); moe_base is the stand-in for vLLM's
    UnquantizedFusedMoEMethod, moe_ns what else the release's MoE body names; impl_attrs class attributes of the
    MLA impl."""
    identity = lambda t, *_: t  # noqa: E731 - torch_npu.npu_format_cast / maybe_trans_nz with NZ off
    ns = {"torch": torch, "UnquantizedFusedMoEMethod": moe_base, "maybe_trans_nz": identity, **moe_ns}
    qual = "AscendUnquantizedFusedMoEMethod.process_weights_after_loading"
    method_cls = type(
        "AscendUnquantizedFusedMoEMethod",
        (moe_base,),
        {
            "process_weights_after_loading": _compiled(function(archive, FUSED_MOE, qual), ns, FUSED_MOE),
            "__module__": "vllm_ascend.ops.fused_moe.fused_moe",
        },
    )

    class UnquantizedLinearMethod:
        pass

    mla_ns = {
        "torch": torch,
        "torch_npu": types.SimpleNamespace(npu_format_cast=identity),
        "ACL_FORMAT_FRACTAL_ND": 2,
        "UnquantizedLinearMethod": UnquantizedLinearMethod,
        "maybe_trans_nz": identity,
    }
    mla_post = _compiled(function(archive, MLA, "AscendMLAImpl.process_weights_after_loading"), mla_ns, MLA)
    impl_cls = type(
        "AscendMLAImpl",
        (),
        {
            "process_weights_after_loading": mla_post,
            "__module__": "vllm_ascend.attention.mla_v1",
            **(impl_attrs or {}),
        },
    )
    return method_cls, impl_cls, UnquantizedLinearMethod


@pytest.fixture(scope="module")
def upstream():
    """The wheels' functions, compiled on CPU stand-ins for torch_npu, the NZ cast and the allocator."""
    vllm_ascend_wheel, vllm_whl = ascend_wheel_path(), vllm_wheel_path()
    ns = {
        "get_ascend_device_type": lambda: "A3",
        "AscendDeviceType": types.SimpleNamespace(_310P="310P"),
    }
    method_cls, impl_cls, UnquantizedLinearMethod = ascend_layer_classes(
        vllm_ascend_wheel, UnquantizedFusedMoEMethod, ns
    )
    layer_post = _compiled(
        function(vllm_whl, "vllm/attention/layer.py", "MLAAttention.process_weights_after_loading"),
        {},
        "vllm/attention/layer.py",
    )

    moe_layer = "vllm/model_executor/layers/fused_moe/layer.py"
    load_w13 = _compiled(function(vllm_whl, moe_layer, "FusedMoE._load_w13"), {"torch": torch}, moe_layer)
    load_w2 = _compiled(function(vllm_whl, moe_layer, "FusedMoE._load_w2"), {"torch": torch}, moe_layer)
    loader = function(vllm_whl, moe_layer, "FusedMoE.weight_loader")
    shard_dims = next(
        ast.literal_eval(n.value)
        for n in ast.walk(loader)
        if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "SHARD_ID_TO_SHARDED_DIM"
    )

    allocator = types.SimpleNamespace(wake=None)
    wake_ns = {
        "torch": torch,
        "envs_ascend": types.SimpleNamespace(VLLM_ASCEND_ENABLE_NZ=0),
        "CaMemAllocator": types.SimpleNamespace(get_instance=lambda: allocator),
    }
    wake_up = _compiled(function(vllm_ascend_wheel, WORKER, "NPUWorker.wake_up"), wake_ns, WORKER)
    return types.SimpleNamespace(
        method_cls=method_cls,
        impl_cls=impl_cls,
        linear_method=UnquantizedLinearMethod,
        layer_post=layer_post,
        load_w13=load_w13,
        load_w2=load_w2,
        shard_dims=shard_dims,
        wake_up=wake_up,
        allocator=allocator,
    )


# --- a DeepSeek-shaped engine model --------------------------------------------------------------------------


def build_model(up):
    """One decoder layer: an MLA attention layer over kv_b_proj and a fused MoE, as vLLM builds them (loader layout)."""

    class FusedMoE(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.moe_config = types.SimpleNamespace(is_act_and_mul=True)
            self.quant_method = up.method_cls()
            self.w13_weight = torch.nn.Parameter(torch.randn(E, 2 * FFN, H), requires_grad=False)
            self.w2_weight = torch.nn.Parameter(torch.randn(E, H, FFN), requires_grad=False)
            for p in (self.w13_weight, self.w2_weight):
                p.weight_loader = self.weight_loader

        _load_w13, _load_w2 = up.load_w13, up.load_w2

        def weight_loader(self, param, loaded_weight, weight_name, shard_id, expert_id, return_success=False):
            # vLLM's FusedMoE.weight_loader for an unquantized, TP1 expert: narrow the expert, then the shard
            expert_data = param.data[expert_id]
            dim = up.shard_dims[shard_id]
            if shard_id == "w2":
                self._load_w2(expert_data, dim, loaded_weight, tp_rank=0)
            else:
                self._load_w13(expert_data, dim, shard_id, loaded_weight, tp_rank=0)
            return True

    class MLAAttention(torch.nn.Module):
        process_weights_after_loading = up.layer_post

        def __init__(self, kv_b_proj):
            super().__init__()
            impl = up.impl_cls()
            impl.kv_b_proj, impl.kv_lora_rank, impl.num_heads = kv_b_proj, LORA, HEADS
            impl.qk_nope_head_dim, impl.v_head_dim = NOPE, V
            impl.enable_mlapo, impl.fused_qkv_a_proj, impl.layer_sharding_kwargs = False, None, []
            self.impl = impl

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.self_attn = torch.nn.Module()
            self.self_attn.kv_b_proj = torch.nn.Linear(LORA, HEADS * (NOPE + V), bias=False)
            self.self_attn.kv_b_proj.quant_method = up.linear_method()
            self.self_attn.mla_attn = MLAAttention(self.self_attn.kv_b_proj)
            self.mlp = torch.nn.Module()
            self.mlp.experts = FusedMoE()

    class TinyDeepseek(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = torch.nn.Module()
            self.model.layers = torch.nn.ModuleList([Layer()])

        def load_weights(self, weights):
            """vLLM-Ascend's DeepSeek load_weights, reduced: experts through param.weight_loader, the rest copied."""
            params = dict(self.named_parameters())
            for name, tensor in weights:
                if ".mlp.experts." in name:
                    prefix, expert, proj, _ = name.rsplit(".", 3)
                    shard = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}[proj]
                    target = f"{prefix}.{'w2_weight' if shard == 'w2' else 'w13_weight'}"
                    param = params[target]
                    param.weight_loader(param, tensor, target, shard_id=shard, expert_id=int(expert))
                else:
                    params[name].data.copy_(tensor)

    model = TinyDeepseek()
    with torch.no_grad():
        post_load(model)
    return model


def post_load(model):
    """What vLLM's loader runs once after load_model: each quant method, then each attention layer."""
    for module in model.modules():
        if hasattr(module, "w13_weight"):
            module.quant_method.process_weights_after_loading(module)
    for module in model.modules():
        if hasattr(module, "impl"):
            module.process_weights_after_loading(torch.float32)


def trainer_weights(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = {"model.layers.0.self_attn.kv_b_proj.weight": torch.randn(HEADS * (NOPE + V), LORA, generator=g)}
    for e in range(E):
        base = f"model.layers.0.mlp.experts.{e}"
        out[f"{base}.gate_proj.weight"] = torch.randn(FFN, H, generator=g)
        out[f"{base}.up_proj.weight"] = torch.randn(FFN, H, generator=g)
        out[f"{base}.down_proj.weight"] = torch.randn(H, FFN, generator=g)
    return out


def fresh_derivation(up, kv_b: torch.Tensor):
    impl = up.impl_cls()
    proj = torch.nn.Linear(LORA, HEADS * (NOPE + V), bias=False)
    proj.weight.data.copy_(kv_b)
    proj.quant_method = up.linear_method()
    impl.kv_b_proj, impl.kv_lora_rank, impl.num_heads, impl.qk_nope_head_dim, impl.v_head_dim = (
        proj,
        LORA,
        HEADS,
        NOPE,
        V,
    )
    impl.enable_mlapo, impl.fused_qkv_a_proj, impl.layer_sharding_kwargs = False, None, []
    impl.process_weights_after_loading(torch.float32)
    return impl.W_UV, impl.W_UK_T


def assert_engine_holds(up, model, weights):
    """Run-time layouts with the trainer's values, derived tensors equal to a fresh derivation from them."""
    layer = model.model.layers[0]
    experts = layer.mlp.experts
    assert experts.w13_weight.shape == (E, H, 2 * FFN) and experts.w2_weight.shape == (E, FFN, H), (
        "run-time layout"
    )
    for e in range(E):
        base = f"model.layers.0.mlp.experts.{e}"
        w13 = torch.cat([weights[f"{base}.gate_proj.weight"], weights[f"{base}.up_proj.weight"]])
        assert torch.equal(experts.w13_weight[e], w13.T)
        assert torch.equal(experts.w2_weight[e], weights[f"{base}.down_proj.weight"].T)
    kv_b = weights["model.layers.0.self_attn.kv_b_proj.weight"]
    assert torch.equal(layer.self_attn.kv_b_proj.weight, kv_b)
    w_uv, w_uk_t = fresh_derivation(up, kv_b)
    impl = layer.self_attn.mla_attn.impl
    assert torch.equal(impl.W_UV, w_uv) and torch.equal(impl.W_UK_T, w_uk_t), "stale MLA W_UV / W_UK_T"


# --- the rollout, as patched -----------------------------------------------------------------------------------


@pytest.fixture
def rollout_factory(patched, monkeypatch):
    """rollout_factory(tree, model, engine_offload) -> a vLLMRollout stand-in running `tree`'s update_weights."""

    sync_module = _load(patched / "verl/utils/vllm/ascend_weight_sync.py", "ascend_weight_sync_under_test")
    loader_patch = _load(patched / "verl/utils/vllm/patch.py", "verl_vllm_patch_under_test")

    def make(tree: Path, model):
        loader_patch.SUPPORTED_MOE_MODELS[:] = [type(model)]  # vllm's DeepseekV3ForCausalLM, here
        for name, module in {
            "verl": types.ModuleType("verl"),
            "verl.utils": types.ModuleType("verl.utils"),
            "verl.utils.vllm": types.ModuleType("verl.utils.vllm"),
            "verl.utils.vllm.ascend_weight_sync": sync_module,
            "verl.utils.vllm.patch": loader_patch,
        }.items():
            monkeypatch.setitem(sys.modules, name, module)
        fns = _methods(tree / SPMD, "vLLMRollout", ["update_weights"], {"torch": torch})
        worker = types.SimpleNamespace(
            model_runner=types.SimpleNamespace(
                model=model,
                kv_caches=[],
                vllm_config=types.SimpleNamespace(
                    compilation_config=types.SimpleNamespace(static_forward_context={})
                ),
            ),
            vllm_config=types.SimpleNamespace(
                model_config=types.SimpleNamespace(
                    dtype=torch.float32, hf_text_config=types.SimpleNamespace(hidden_size=H)
                )
            ),
            _sleep_saved_buffers={},
        )
        engine = types.SimpleNamespace(
            llm_engine=types.SimpleNamespace(
                model_executor=types.SimpleNamespace(driver_worker=types.SimpleNamespace(worker=worker))
            )
        )
        rollout = types.SimpleNamespace(inference_engine=engine, worker=worker)
        rollout.update_weights = types.MethodType(fns["update_weights"], rollout)
        return rollout

    monkeypatch.setenv("VLLM_ASCEND_ENABLE_NZ", "0")
    return make


def _sync(rollout, weights):
    asyncio.run(rollout.update_weights(iter(weights.items())))


def _explicit_cycle(eo, rollout, weights):
    """ds-0004's release() at the end of a rollout, resume(["weights"]) in rollout_mode, then the sync."""
    offload = eo.ExplicitEngineOffload(rollout.worker)
    offload.release()
    assert all(p.untyped_storage().nbytes() == 0 for p in rollout.worker.model_runner.model.parameters())
    offload.resume(["weights"])
    onloaded = rollout.worker.model_runner.model.model.layers[0].mlp.experts.w13_weight.data_ptr()
    _sync(rollout, weights)
    return onloaded


@pytest.fixture(scope="module")
def eo(patched):
    return _load(patched / "verl/utils/explicit_offload.py", "explicit_offload_under_test")


def test_explicit_offload_sync_ends_with_the_trainers_weights(upstream, patched, eo, rollout_factory):
    model = build_model(upstream)
    rollout = rollout_factory(patched, model)
    impl = model.model.layers[0].self_attn.mla_attn.impl
    w_uv_ptr = impl.W_UV.data_ptr()
    for step in (1, 2):  # the second sync starts from the first one's run-time layout
        weights = trainer_weights(step)
        onloaded = _explicit_cycle(eo, rollout, weights)
        assert_engine_holds(upstream, model, weights)
        # restored without a copy, re-derived in place: the storages the engine holds stay the same
        assert model.model.layers[0].mlp.experts.w13_weight.data_ptr() == onloaded
        assert impl.W_UV.data_ptr() == w_uv_ptr


def _sleep_mode_cycle(upstream, eo, rollout, weights):
    """NPUWorker.sleep (level 1: weights to host) and wake_up(["weights"]) from the wheel, then the sync."""
    model = rollout.worker.model_runner.model
    pool = eo.StorageOffloader(keep_host_copy=True)  # CaMemAllocator: everything load_model allocated
    impl = model.model.layers[0].self_attn.mla_attn.impl
    pool.offload([*model.parameters(), impl.W_UV, impl.W_UK_T])
    upstream.allocator.wake_up = lambda tags=None: pool.onload()
    upstream.wake_up(rollout.worker, tags=["weights"])
    assert model.model.layers[0].mlp.experts.w13_weight.shape == (E, 2 * FFN, H), "wake_up: the loader layout"
    _sync(rollout, weights)


def test_sleep_mode_sync_ends_with_the_trainers_weights(upstream, patched, eo, rollout_factory):
    model = build_model(upstream)
    rollout = rollout_factory(patched, model)
    for step in (1, 2):
        weights = trainer_weights(10 + step)
        _sleep_mode_cycle(upstream, eo, rollout, weights)
        assert_engine_holds(upstream, model, weights)


def test_verl_060_update_weights_fails_on_the_same_engine(upstream, pristine_verl, eo, rollout_factory):
    """The same cycles with verl 0.6.0's update_weights: the explicit onload crashes, sleep mode decodes stale."""
    model = build_model(upstream)
    rollout = rollout_factory(pristine_verl, model)
    with pytest.raises(RuntimeError):
        _explicit_cycle(eo, rollout, trainer_weights(1))

    model = build_model(upstream)
    rollout = rollout_factory(pristine_verl, model)
    weights = trainer_weights(2)
    _sleep_mode_cycle(upstream, eo, rollout, weights)
    with pytest.raises(AssertionError, match="run-time layout"):
        assert_engine_holds(upstream, model, weights)
    impl = model.model.layers[0].self_attn.mla_attn.impl
    w_uv, _ = fresh_derivation(upstream, weights["model.layers.0.self_attn.kv_b_proj.weight"])
    assert not torch.equal(impl.W_UV, w_uv), "0.6.0 leaves W_UV as the engine built it"


def test_sync_refuses_nz_weights_like_wake_up(upstream, patched, rollout_factory, monkeypatch):
    model = build_model(upstream)
    rollout = rollout_factory(patched, model)
    monkeypatch.delenv("VLLM_ASCEND_ENABLE_NZ")  # vLLM-Ascend's default is 1
    with pytest.raises(ValueError, match="VLLM_ASCEND_ENABLE_NZ=0"):
        _sync(rollout, trainer_weights(1))


def test_off_vllm_ascend_the_sync_is_load_weights():
    """A model with no vllm_ascend classes: sync_weights only runs prepare and load_weights."""
    from llm_rl.deepseek_r1.verl_modules import ascend_weight_sync as sync

    calls = []

    class Plain(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w13_weight = torch.nn.Parameter(torch.zeros(E, H, 2 * FFN))  # would look "run-time" by shape
            self.quant_method = object()

        def load_weights(self, weights):
            calls.append(list(weights))

    model = Plain()
    sync.sync_weights(
        model, [("a", torch.ones(1))], hidden_size=H, act_dtype=torch.float32, prepare=calls.append, env={}
    )
    assert calls[0] is model and len(calls[1]) == 1 and model.w13_weight.shape == (E, H, 2 * FFN)
