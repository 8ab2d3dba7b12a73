"""verl 0.7.1's bucketed weight sync into vLLM-Ascend (patch ds-0108, with ds-0104's explicit offload), on CPU.

What runs is the patched tree's vLLMColocateWorkerExtension.update_weights_from_ipc itself (compiled from the file),
with the buckets handed to it by a stand-in receiver instead of ZMQ, and vLLM 0.13.0's own
process_weights_after_loading (from the wheel) as the post-load step 0.7.1 calls after all buckets. The engine model
is test_deepseek_weight_sync's DeepSeek-shaped layer, laid out by vllm-ascend 0.13.0's post-load and wake_up bodies
taken from the wheel. The same cycles through the unpatched 0.7.1 series show what the patch changes.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import tomllib
import types
from pathlib import Path

import pytest
import torch
from test_deepseek_weight_sync import (  # noqa: F401 - upstream: a fixture
    FFN,
    E,
    H,
    _compiled,
    _load,
    assert_engine_holds,
    build_model,
    trainer_weights,
    upstream,
)
from test_explicit_offload_071 import OURS, REPO, UTILS, method, patched_071
from test_vllm_ascend_contract import function, vllm_wheel_path

LOADER_UTILS = "vllm/model_executor/model_loader/utils.py"


@pytest.fixture(scope="module")
def trees(tmp_path_factory, pristine_base):
    """(patched, unpatched): the 0.7.1 series with ds-0103/0104/0108, and the 0.7.1 series before ds-0103."""
    pristine = pristine_base("0.7.1")
    patched = patched_071(pristine, tmp_path_factory.mktemp("ds071p") / "verl")
    unpatched = tmp_path_factory.mktemp("ds071s") / "verl"
    shutil.copytree(pristine, unpatched, symlinks=True)
    with open(REPO / "llm_rl/deepseek_r1/recipe.toml", "rb") as fh:
        series = tomllib.load(fh)["bases"]["0.7.1"]["series"]
    for patch in series:
        if patch in OURS:
            break
        subprocess.run(["git", "apply", str(REPO / patch)], cwd=unpatched, check=True, capture_output=True)
    assert not (unpatched / "verl/utils/vllm/ascend_weight_sync.py").exists()
    return patched, unpatched


def _vllm_post_load(model_cls_attention, quant_base):
    """vLLM 0.13.0's process_weights_after_loading from the wheel; its two imports stood in for (no torchao)."""
    fn = function(vllm_wheel_path(), LOADER_UTILS, "process_weights_after_loading")
    fn.body = [n for n in fn.body if not isinstance(n, ast.ImportFrom)]

    class _NoContext:
        def __init__(self, *_):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *_):
            return False

    ns = {
        "QuantizeMethodBase": quant_base,
        "Attention": model_cls_attention,
        "MLAAttention": model_cls_attention,
        "device_loading_context": _NoContext,
        "maybe_save_metadata_and_attributes_for_weight_reloading": lambda *_: None,
        "logger": None,
    }
    return _compiled(fn, ns, LOADER_UTILS)


@pytest.fixture
def worker_factory(upstream, monkeypatch):  # noqa: F811
    """worker_factory(tree, model) -> a vLLM worker stand-in whose update_weights_from_ipc is `tree`'s."""

    def make(tree: Path, model):
        loader_patch = _load(tree / "verl/utils/vllm/patch.py", f"verl_vllm_patch_{id(tree)}")
        loader_patch.SUPPORTED_MOE_MODELS[:] = [type(model)]  # vllm's DeepseekV3ForCausalLM, here
        attention = type(model.model.layers[0].self_attn.mla_attn)
        post_load = _vllm_post_load(attention, upstream.method_cls.__mro__[-2])
        modules = {
            "vllm": types.ModuleType("vllm"),
            "vllm.platforms": types.SimpleNamespace(
                current_platform=types.SimpleNamespace(device_type="cpu")
            ),
            "vllm.model_executor": types.ModuleType("vllm.model_executor"),
            "vllm.model_executor.model_loader": types.ModuleType("vllm.model_executor.model_loader"),
            "vllm.model_executor.model_loader.utils": types.SimpleNamespace(
                process_weights_after_loading=post_load
            ),
            "verl": types.ModuleType("verl"),
            "verl.utils": types.ModuleType("verl.utils"),
            "verl.utils.vllm": types.ModuleType("verl.utils.vllm"),
            "verl.workers.rollout.vllm_rollout.bucketed_weight_transfer": types.SimpleNamespace(
                BucketedWeightReceiver=Receiver
            ),
        }
        sync_file = tree / "verl/utils/vllm/ascend_weight_sync.py"
        if sync_file.exists():
            modules["verl.utils.vllm.ascend_weight_sync"] = _load(sync_file, f"ascend_weight_sync_{id(tree)}")
        for name, module in modules.items():
            monkeypatch.setitem(sys.modules, name, module)
        ns = {
            "torch": torch,
            "patch_vllm_moe_model_weight_loader": loader_patch.patch_vllm_moe_model_weight_loader,
            "is_fp8_model": lambda _: False,
            "logger": types.SimpleNamespace(info=lambda *_: None),
            "VLLM_LORA_INT_ID": 123,
        }
        cls = type(
            "Worker",
            (),
            {
                "update_weights_from_ipc": _compiled(
                    method(tree, UTILS, "vLLMColocateWorkerExtension.update_weights_from_ipc"), ns, UTILS
                ),
                "_update_weights": _compiled(
                    method(tree, UTILS, "vLLMColocateWorkerExtension._update_weights"), ns, UTILS
                ),
                "_get_zmq_handle": lambda self: "ipc:///nowhere",
            },
        )
        worker = cls()
        worker.device, worker._is_qat_model, worker._sleep_saved_buffers = torch.device("cpu"), False, {}
        config = types.SimpleNamespace(
            model_config=types.SimpleNamespace(
                dtype=torch.float32, hf_text_config=types.SimpleNamespace(hidden_size=H)
            ),
            compilation_config=types.SimpleNamespace(static_forward_context={}),
        )
        worker.vllm_config = config
        worker.model_runner = types.SimpleNamespace(model=model, kv_caches=[], vllm_config=config)
        return worker

    monkeypatch.setenv("VLLM_ASCEND_ENABLE_NZ", "0")
    return make


class Receiver:
    """BucketedWeightReceiver's contract: on_bucket_received(list of (name, tensor)) once per bucket."""

    buckets: list = []

    def __init__(self, zmq_handle, device, use_shm):
        pass

    def receive_weights(self, on_bucket_received):
        for bucket in Receiver.buckets:
            on_bucket_received(bucket)


def _sync(worker, weights: dict):
    items = list(weights.items())
    Receiver.buckets = [items[: len(items) // 2], items[len(items) // 2 :]]  # two buckets
    worker.update_weights_from_ipc()


def _explicit_offload(tree, worker, upstream):  # noqa: F811
    """ds-0104's offload_engine at the end of a rollout, then onload_engine(["weights"]) in rollout_mode."""
    offload = _load(tree / "verl/utils/explicit_offload.py", f"explicit_offload_{id(tree)}").EngineOffload(
        worker.model_runner
    )
    offload.release()
    offload.resume(["weights"])


def test_explicit_offload_then_sync_ends_with_the_trainers_weights(upstream, trees, worker_factory):  # noqa: F811
    patched, _ = trees
    model = build_model(upstream)
    worker = worker_factory(patched, model)
    impl = model.model.layers[0].self_attn.mla_attn.impl
    w_uv, w_uk_t = impl.W_UV, impl.W_UK_T
    for step in (1, 2):  # the second sync starts from the first one's run-time layout
        weights = trainer_weights(step)
        _explicit_offload(patched, worker, upstream)
        w13 = model.model.layers[0].mlp.experts.w13_weight.data_ptr()
        _sync(worker, weights)
        assert_engine_holds(upstream, model, weights)
        assert model.model.layers[0].mlp.experts.w13_weight.data_ptr() == w13, "the MoE storage is kept"
        assert impl.W_UV is w_uv and impl.W_UK_T is w_uk_t, (
            "derived tensors refreshed in the ones the engine held"
        )
    print("explicit offload + 2 syncs: trainer weights, run-time layout, fresh W_UV/W_UK_T in place")


def test_sleep_mode_sync_keeps_the_derived_tensors(upstream, trees, worker_factory):  # noqa: F811
    patched, _ = trees
    model = build_model(upstream)
    worker = worker_factory(patched, model)
    impl = model.model.layers[0].self_attn.mla_attn.impl
    w_uv = impl.W_UV
    upstream.allocator.wake_up = lambda tags=None: None  # CaMemAllocator: the storages stay mapped here
    for step in (1, 2):
        # vllm-ascend's NPUWorker.wake_up: back to the loader layout
        upstream.wake_up(worker, tags=["weights"])
        assert model.model.layers[0].mlp.experts.w13_weight.shape == (E, 2 * FFN, H)
        weights = trainer_weights(10 + step)
        _sync(worker, weights)
        assert_engine_holds(upstream, model, weights)
        assert impl.W_UV is w_uv


def test_unpatched_071_fails_the_same_cycles(upstream, trees, worker_factory):  # noqa: F811
    """0.7.1 alone: after explicit offload the load hits the run-time layout; after wake_up W_UV is a new tensor."""
    patched, series = trees
    model = build_model(upstream)
    worker = worker_factory(series, model)
    _explicit_offload(patched, worker, upstream)
    with pytest.raises(RuntimeError):
        _sync(worker, trainer_weights(1))

    model = build_model(upstream)
    worker = worker_factory(series, model)
    impl = model.model.layers[0].self_attn.mla_attn.impl
    w_uv = impl.W_UV
    upstream.allocator.wake_up = lambda tags=None: None
    upstream.wake_up(worker, tags=["weights"])
    weights = trainer_weights(3)
    _sync(worker, weights)
    assert_engine_holds(upstream, model, weights)  # the values are right: 0.7.1 re-runs the post-load step
    assert impl.W_UV is not w_uv, "0.7.1 replaces W_UV: a full ACL graph keeps reading the old one"


def test_sync_refuses_nz_weights_like_wake_up(upstream, trees, worker_factory, monkeypatch):  # noqa: F811
    patched, _ = trees
    worker = worker_factory(patched, build_model(upstream))
    monkeypatch.delenv("VLLM_ASCEND_ENABLE_NZ")  # vLLM-Ascend's default is 1
    with pytest.raises(ValueError, match="VLLM_ASCEND_ENABLE_NZ=0"):
        _sync(worker, trainer_weights(1))


def test_off_vllm_ascend_nothing_changes():
    from llm_rl.deepseek_r1.verl_modules import ascend_weight_sync as sync

    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    ran = []
    assert sync.to_loader_layout(model, 4, env={}) == 0
    assert sync.run_post_load(model, 4, lambda: ran.append(1), env={}) == 0 and ran == [1]
