"""verl 0.9.1's bucketed weight sync into vLLM-Ascend 0.23 (patch ds-0208, with ds-0204's explicit offload), on CPU.

What runs is the patched tree's vLLMColocateWorkerExtension.update_weights_from_ipc itself (compiled from the file,
with its model iteration helpers), the buckets handed to it by a stand-in receiver instead of ZMQ, and the post-load
step verl calls after all buckets, which vllm-ascend 0.23.0.post1 rebinds to its own
ascend_process_weights_after_loading (patch/worker/patch_process_weights_after_loading.py, taken from its sdist). The
engine model is test_deepseek_weight_sync's DeepSeek-shaped layer, laid out by vllm-ascend 0.23.0.post1's own
fused-MoE and MLA post-load bodies (sdist) and loaded through vLLM 0.23.0's FusedMoE._load_w13 / _load_w2 (wheel).
The MLA layer's post-load step is the part vllm-ascend's AscendMultiHeadLatentAttention wrapper adds (the impl's
derivation of W_UV / W_UK_T, which its kernels read); vLLM's own layer-level views are left out. The same cycles
through the 0.9.1 series without ds-0208 (and without ds-0204) show what the patches change.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import shutil
import sys
import types
from pathlib import Path

import pytest
import torch
from test_deepseek_weight_sync import (
    FFN,
    E,
    H,
    QuantizeMethodBase,
    UnquantizedFusedMoEMethod,
    _compiled,
    _load,
    ascend_layer_classes,
    assert_engine_holds,
    build_model,
    trainer_weights,
)
from test_explicit_offload_071 import UTILS, method
from test_vllm_ascend_contract import WORKER, function
from test_vllm_ascend_contract_023 import ascend_023_path, vllm_023_path

REPO = Path(__file__).resolve().parents[2]
BASE = "0.9.1"
OURS = [
    "llm_rl/deepseek_r1/patches/ds-0204-npu-explicit-offload-091.patch",
    "llm_rl/deepseek_r1/patches/ds-0208-vllm-ascend-weight-sync-091.patch",
]
POST_LOAD = "vllm_ascend/patch/worker/patch_process_weights_after_loading.py"
MOE_LAYER = "vllm/model_executor/layers/fused_moe/layer.py"
# the extension's methods update_weights_from_ipc reaches on the standard (unquantized, no LoRA) path
SYNC_METHODS = (
    "update_weights_from_ipc",
    "_update_weights",
    "_iter_all_models",
    "_iter_all_models_with_config",
    "_use_mtp_drafter_weight_sync",
    "_get_drafter_model",
    "_get_draft_model_config",
    "_apply_buffer_updates_all_models",
)


def series_091(pristine: Path, dest: Path, leave_out: tuple[str, ...] = ()) -> Path:
    """verl 0.9.1 with the recipe's 0.9.1 series, less the patches of OURS named in leave_out."""
    from ascend_rl import overlay

    recipe = overlay.load_recipe("deepseek_r1", BASE)
    listed = [str(p.relative_to(REPO)) for p in recipe.series]
    assert all(patch in listed for patch in OURS), listed
    shutil.copytree(pristine, dest, symlinks=True)
    series = tuple(p for p in recipe.series if str(p.relative_to(REPO)) not in leave_out)
    overlay.apply_series(dataclasses.replace(recipe, series=series), dest)
    return dest


@pytest.fixture(scope="module")
def trees(tmp_path_factory, pristine_base):
    """{"full": the 0.9.1 series, "no-0208": without ds-0208, "no-0204": without either}."""
    pristine = pristine_base(BASE)
    made = {
        name: series_091(pristine, tmp_path_factory.mktemp(f"ds091-{name}") / "verl", leave_out)
        for name, leave_out in (("full", ()), ("no-0208", tuple(OURS[1:])), ("no-0204", tuple(OURS)))
    }
    assert (made["full"] / "verl/utils/vllm/ascend_weight_sync.py").is_file()
    assert not (made["no-0208"] / "verl/utils/vllm/ascend_weight_sync.py").exists()
    assert (made["no-0208"] / "verl/utils/explicit_offload.py").is_file()
    assert not (made["no-0204"] / "verl/utils/explicit_offload.py").exists()
    return made


def bare(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> ast.FunctionDef | ast.AsyncFunctionDef:
    """fn without its annotations (their names are not in the stand-in namespaces)."""
    for arg in [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs, fn.args.vararg, fn.args.kwarg]:
        if arg is not None:
            arg.annotation = None
    return fn


@pytest.fixture(scope="module")
def upstream_023():
    """vllm-ascend 0.23.0.post1's and vLLM 0.23.0's bodies, compiled on CPU stand-ins for torch_npu and the
    allocator; NZ and fused MC2 off (what ds-0208 demands)."""
    ascend, vllm = ascend_023_path(), vllm_023_path()
    identity = lambda t, *_: t  # noqa: E731 - torch_npu.npu_format_cast / maybe_trans_nz with NZ off, fp32
    ascend_config = types.SimpleNamespace(
        enable_fused_mc2=0, weight_nz_mode=0, enable_sleep_mode_extra_cleanup=False
    )

    ns = {
        "torch_npu": types.SimpleNamespace(npu_format_cast=identity),
        "get_ascend_config": lambda: ascend_config,
        "ACL_FORMAT_FRACTAL_NZ": 29,
    }
    method_cls, impl_cls, UnquantizedLinearMethod = ascend_layer_classes(
        ascend, UnquantizedFusedMoEMethod, ns, impl_attrs={"fa_quant_layer": False}
    )

    def layer_post(self, act_dtype):
        """AscendMultiHeadLatentAttention's wrapped_process_weights, the impl's half (ops/mla.py:130-135)."""
        self.impl.process_weights_after_loading(act_dtype)

    loaders = {
        name: _compiled(bare(function(vllm, MOE_LAYER, f"FusedMoE.{name}")), {"torch": torch}, MOE_LAYER)
        for name in ("_load_w13", "_load_w2", "_get_hidden_dim", "_narrow_expert_data_for_padding")
    }
    loader = function(vllm, MOE_LAYER, "FusedMoE.weight_loader")
    shard_dims = next(
        ast.literal_eval(n.value)
        for n in ast.walk(loader)
        if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "SHARD_ID_TO_SHARDED_DIM"
    )

    allocator = types.SimpleNamespace(wake_up=lambda tags=None: None)  # CaMemAllocator: storages stay mapped
    wake_ns = {
        "torch": torch,
        "get_ascend_config": lambda: ascend_config,
        "CaMemAllocator": types.SimpleNamespace(get_instance=lambda: allocator),
    }
    wake_up = _compiled(bare(function(ascend, WORKER, "NPUWorker.wake_up")), wake_ns, WORKER)
    post_load_fn = bare(function(ascend, POST_LOAD, "ascend_process_weights_after_loading"))
    return types.SimpleNamespace(
        method_cls=method_cls,
        impl_cls=impl_cls,
        linear_method=UnquantizedLinearMethod,
        layer_post=layer_post,
        load_w13=loaders["_load_w13"],
        load_w2=loaders["_load_w2"],
        get_hidden_dim=loaders["_get_hidden_dim"],
        narrow_for_padding=loaders["_narrow_expert_data_for_padding"],
        shard_dims=shard_dims,
        wake_up=wake_up,
        allocator=allocator,
        quant_base=QuantizeMethodBase,
        post_load_fn=post_load_fn,
    )


def build_model_023(up):
    """test_deepseek_weight_sync's model with vLLM 0.23's FusedMoE loader attributes (TP 1, no padding)."""
    model = build_model(up)
    experts = model.model.layers[0].mlp.experts
    experts.moe_config.moe_parallel_config = types.SimpleNamespace(tp_size=1)
    cls = type(experts)
    cls._get_hidden_dim = staticmethod(up.get_hidden_dim)
    cls._narrow_expert_data_for_padding = staticmethod(up.narrow_for_padding)
    return model


def ascend_post_load(up, attention_cls):
    """vllm-ascend 0.23.0.post1's ascend_process_weights_after_loading (what verl's import of vLLM's
    process_weights_after_loading gets once vllm-ascend has patched it)."""

    @contextlib.contextmanager
    def on_device(
        module, target_device
    ):  # vLLM's device_loading_context with a CPU target: yields the module
        yield module

    ns = {
        "QuantizeMethodBase": up.quant_base,
        "Attention": attention_cls,
        "MLAAttention": attention_cls,
        "MMEncoderAttention": attention_cls,
        "_is_dsa_attention": lambda module: False,
        "device_loading_context": on_device,
        "set_torchao_reload_attrs": None,
    }
    return _compiled(up.post_load_fn, ns, POST_LOAD)


ATTENTION_CLASSES: list[type] = []


class Receiver:
    """BucketedWeightReceiver's contract in 0.9.1: on_bucket_received(list of (name, tensor), is_last) per bucket."""

    buckets: list = []

    def __init__(self, zmq_handle, device, use_shm):
        pass

    def receive_weights(self, on_bucket_received):
        for i, bucket in enumerate(Receiver.buckets):
            on_bucket_received(bucket, i == len(Receiver.buckets) - 1)


def two_buckets(weights: dict) -> None:
    items = list(weights.items())
    Receiver.buckets = [items[: len(items) // 2], items[len(items) // 2 :]]


def make_worker(tree: Path, model, up, monkeypatch, additional_config=None):
    """A vLLM worker stand-in whose extension methods (sync, and ds-0204's offload where the tree has them) are
    `tree`'s, and whose wake_up is vllm-ascend 0.23.0.post1's NPUWorker.wake_up."""
    loader_patch = _load(tree / "verl/utils/vllm/patch.py", f"verl_vllm_patch_{id(tree)}")
    loader_patch.SUPPORTED_MOE_MODELS[:] = [type(model)]  # vllm's DeepseekV3ForCausalLM, here
    buffers = _load(tree / "verl/workers/rollout/vllm_rollout/weight_update_utils.py", f"wuu_{id(tree)}")
    # every model builds its own MLAAttention class: the post-load step knows those of all engines made so far
    ATTENTION_CLASSES.append(type(model.model.layers[0].self_attn.mla_attn))
    attention = tuple(ATTENTION_CLASSES)
    modules = {
        "vllm": types.ModuleType("vllm"),
        "vllm.model_executor": types.ModuleType("vllm.model_executor"),
        "vllm.model_executor.model_loader": types.ModuleType("vllm.model_executor.model_loader"),
        "vllm.model_executor.model_loader.utils": types.SimpleNamespace(
            process_weights_after_loading=ascend_post_load(up, attention)
        ),
        "verl": types.ModuleType("verl"),
        "verl.utils": types.ModuleType("verl.utils"),
        "verl.utils.vllm": types.ModuleType("verl.utils.vllm"),
        "verl.workers.rollout.vllm_rollout.bucketed_weight_transfer": types.SimpleNamespace(
            BucketedWeightReceiver=Receiver
        ),
    }
    for module, path in (
        ("verl.utils.vllm.ascend_weight_sync", "verl/utils/vllm/ascend_weight_sync.py"),
        ("verl.utils.explicit_offload", "verl/utils/explicit_offload.py"),
    ):
        if (tree / path).exists():
            modules[module] = _load(tree / path, f"{module}_{id(tree)}")
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    ns = {
        "torch": torch,
        "get_device_name": lambda: "cpu",
        "is_quantized_model": lambda _: False,
        "patch_vllm_moe_model_weight_loader": loader_patch.patch_vllm_moe_model_weight_loader,
        "split_buffer_updates": buffers.split_buffer_updates,
        "apply_buffer_updates": buffers.apply_buffer_updates,
        "logger": types.SimpleNamespace(info=lambda *_: None),
    }
    names = list(SYNC_METHODS)
    text = (tree / UTILS).read_text()
    names += [n for n in ("offload_engine", "onload_engine", "_explicit_offload") if f"def {n}(" in text]
    attrs = {
        n: _compiled(bare(method(tree, UTILS, f"vLLMColocateWorkerExtension.{n}")), ns, UTILS) for n in names
    }
    attrs["_get_zmq_handle"] = lambda self: "ipc:///nowhere"
    attrs["wake_up"] = up.wake_up  # NPUWorker.wake_up, 0.23.0.post1's body
    worker = type("Worker", (), attrs)()
    worker.device, worker.local_rank, worker._is_qat_model, worker._is_modelopt_qat = (
        torch.device("cpu"),
        0,
        0,
        0,
    )
    worker._sleep_saved_buffers = {}
    kv = [torch.randn(2, 3, 4, 8)]
    config = types.SimpleNamespace(
        model_config=types.SimpleNamespace(
            dtype=torch.float32, quantization=None, hf_text_config=types.SimpleNamespace(hidden_size=H)
        ),
        quant_config=None,
        speculative_config=None,
        additional_config={"weight_nz_mode": 0} if additional_config is None else additional_config,
        compilation_config=types.SimpleNamespace(
            static_forward_context={"model.layers.0.self_attn.attn": types.SimpleNamespace(kv_cache=kv[0])}
        ),
    )
    worker.vllm_config = config
    worker.model_runner = types.SimpleNamespace(model=model, kv_caches=kv, vllm_config=config)
    return worker


def sync(worker, weights: dict) -> None:
    two_buckets(weights)
    worker.update_weights_from_ipc()


def explicit_cycle(worker, weights: dict) -> None:
    """ds-0204's offload_engine at sleep_replicas, then update_weights' order: onload_engine(["weights"]), the
    sync, onload_engine(["kv_cache"])."""
    freed = worker.offload_engine()
    assert freed["weights"] > 0 and freed["kv_cache"] > 0
    worker.onload_engine(["weights"])
    experts = worker.model_runner.model.model.layers[0].mlp.experts
    assert experts.w13_weight.shape == (E, H, 2 * FFN), "onloaded in the run-time layout"
    sync(worker, weights)
    assert worker.onload_engine(["kv_cache"]) == {"kv_cache": freed["kv_cache"]}


def test_explicit_offload_then_sync_ends_with_the_trainers_weights(upstream_023, trees, monkeypatch):
    model = build_model_023(upstream_023)
    worker = make_worker(trees["full"], model, upstream_023, monkeypatch)
    impl = model.model.layers[0].self_attn.mla_attn.impl
    w_uv, w_uk_t = impl.W_UV, impl.W_UK_T
    for step in (1, 2):  # the second sync starts from the first one's run-time layout
        weights = trainer_weights(step)
        explicit_cycle(worker, weights)
        assert_engine_holds(upstream_023, model, weights)
        assert impl.W_UV is w_uv and impl.W_UK_T is w_uk_t, "0.23 re-derives W_UV / W_UK_T in place"
    print(
        "ds-0204 offload/onload + ds-0208 sync, twice: trainer weights, run-time layout, W_UV/W_UK_T in place"
    )


def test_sleep_mode_sync_still_ends_with_the_trainers_weights(upstream_023, trees, monkeypatch):
    """explicit_offload off: NPUWorker.wake_up(["weights"]) has put the MoE weights into the loader layout, and
    ds-0208's step does nothing."""
    model = build_model_023(upstream_023)
    worker = make_worker(trees["full"], model, upstream_023, monkeypatch)
    impl = model.model.layers[0].self_attn.mla_attn.impl
    w_uv, w_uk_t = impl.W_UV, impl.W_UK_T
    for step in (1, 2):
        worker.wake_up(tags=["weights"])
        assert model.model.layers[0].mlp.experts.w13_weight.shape == (E, 2 * FFN, H), "wake_up: loader layout"
        weights = trainer_weights(10 + step)
        sync(worker, weights)
        assert_engine_holds(upstream_023, model, weights)
        assert impl.W_UV is w_uv and impl.W_UK_T is w_uk_t


def test_a_weights_wake_up_without_a_sync_leaves_the_experts_in_the_loader_layout(
    upstream_023, trees, monkeypatch
):
    """The 0.23 hazard explicit offload avoids: a wake_up with "weights" that no sync and post-load step follow
    leaves the engine with its experts transposed (what its kernels would read as the run-time layout)."""
    model = build_model_023(upstream_023)
    worker = make_worker(trees["full"], model, upstream_023, monkeypatch)
    weights = trainer_weights(5)
    sync(worker, weights)
    assert_engine_holds(upstream_023, model, weights)
    worker.wake_up(tags=["weights"])
    with pytest.raises(AssertionError, match="run-time layout"):
        assert_engine_holds(upstream_023, model, weights)
    worker.wake_up(tags=["kv_cache"])  # the KV-cache wake_up leaves weights alone
    assert model.model.layers[0].mlp.experts.w13_weight.shape == (E, 2 * FFN, H)


def test_without_ds_0208_the_explicit_offload_sync_fails(upstream_023, trees, monkeypatch):
    """The 0.9.1 series with ds-0204 and without ds-0208: the load writes into the run-time layout."""
    model = build_model_023(upstream_023)
    worker = make_worker(trees["no-0208"], model, upstream_023, monkeypatch)
    weights = trainer_weights(1)
    with pytest.raises((RuntimeError, AssertionError)) as failed:
        explicit_cycle(worker, weights)
        assert_engine_holds(upstream_023, model, weights)
    print("without ds-0208:", failed.value)


def test_unpatched_091_sleep_mode_keeps_w_uv_in_place(upstream_023, trees, monkeypatch):
    """What 0.23 fixed itself (why ds-0208 no longer wraps the post-load step): the same sleep-mode cycle through
    the series without ds-0204 / ds-0208 ends with the trainer's weights and W_UV / W_UK_T in place."""
    model = build_model_023(upstream_023)
    worker = make_worker(trees["no-0204"], model, upstream_023, monkeypatch)
    impl = model.model.layers[0].self_attn.mla_attn.impl
    w_uv = impl.W_UV
    worker.wake_up(tags=["weights"])
    weights = trainer_weights(3)
    sync(worker, weights)
    assert_engine_holds(upstream_023, model, weights)
    assert impl.W_UV is w_uv


@pytest.mark.parametrize(
    "additional_config,env,refused",
    [
        ({"weight_nz_mode": 0}, {}, None),
        ({"weight_nz_mode": 0}, {"VLLM_ASCEND_ENABLE_NZ": "1"}, None),  # the key wins over the environment
        ({}, {"VLLM_ASCEND_ENABLE_NZ": "0"}, None),
        ({}, {}, "weight_nz_mode=0"),  # vLLM-Ascend's default is 1
        ({"weight_nz_mode": 2}, {"VLLM_ASCEND_ENABLE_NZ": "0"}, "weight_nz_mode=0"),
        ({"weight_nz_mode": 0, "enable_fused_mc2": 1}, {}, "enable_fused_mc2=0"),
        ({"weight_nz_mode": 0}, {"VLLM_ASCEND_ENABLE_FUSED_MC2": "2"}, "enable_fused_mc2=0"),
    ],
)
def test_the_sync_refuses_nz_weights_as_vllm_ascend_0_23_configures_them(
    upstream_023, trees, monkeypatch, additional_config, env, refused
):
    for name in ("VLLM_ASCEND_ENABLE_NZ", "VLLM_ASCEND_ENABLE_FUSED_MC2"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    model = build_model_023(upstream_023)
    worker = make_worker(trees["full"], model, upstream_023, monkeypatch, additional_config=additional_config)
    weights = trainer_weights(7)
    if refused is None:
        explicit_cycle(worker, weights)
        assert_engine_holds(upstream_023, model, weights)
    else:
        with pytest.raises(ValueError, match=refused):
            explicit_cycle(worker, weights)
