# Copyright 2025 ascend-rl-recipes maintainers
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""Weight sync into a vLLM-Ascend engine: MoE loader layouts before the load, derived tensors kept in place after it.

vLLM-Ascend reshapes or derives some tensors once the checkpoint is loaded (process_weights_after_loading):
- the unquantized fused MoE (AscendUnquantizedFusedMoEMethod) keeps w13_weight as [E, H, 2I] and w2_weight as
  [E, I, H], the transposes (1, 2) of the [E, 2I, H] / [E, H, I] layouts FusedMoE.weight_loader writes into. Only
  NPUWorker.wake_up (sleep mode) transposes them back; when no wake_up ran (explicit offload, or
  free_cache_engine=False) a load would write into the wrong layout, so the loader layout is restored here the way
  wake_up does it (a transposed view: no copy), and vLLM-Ascend's own post-load step transposes them forward again;
- the attention backends derive tensors from the weights (AscendMLAImpl: W_UV and W_UK_T, contiguous copies of
  slices of kv_b_proj.weight) and the post-load step assigns new ones. Each new tensor that keeps its shape is
  copied into the one the engine already held, so captured graphs and sleep mode's memory pool keep pointing at the
  current values.
Nothing here imports vllm or vllm_ascend; layers are recognised by the vllm_ascend classes they use. Off vLLM-Ascend
every step does nothing but the load.

One file for every verl base (the overlay installs it as verl/utils/vllm/ascend_weight_sync.py); the entry points
differ by base because verl's own sync does:
- verl 0.9.1 (ds-0208, vLLM-Ascend 0.23): update_weights_from_ipc as on 0.7.1, per model (the MTP drafter too); it
  calls to_loader_layout(model, ..., additional_config=...) before the first bucket only: vLLM-Ascend 0.23's MLA
  post-load step copies W_UV / W_UK_T into the tensors it made at start-up itself, and its NZ switches are
  additional_config keys first (weight_nz_mode, enable_fused_mc2), the environment second.
- verl 0.7.1 (ds-0108, vLLM-Ascend 0.13): update_weights_from_ipc loads every bucket, then runs vLLM's
  process_weights_after_loading once; it calls to_loader_layout(model, ...) before the first bucket and
  run_post_load(model, ..., post_load) around vLLM's post-load step (unwrap finds the model inside a graph wrapper).
- verl 0.6.0 (ds-0008): update_weights only calls model.load_weights; sync_weights does the whole sequence around it
  and re-runs each layer's own post-load step (ascend_attention_layers, restore_runtime_layout,
  rederive_attention).
"""

import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

ASCEND_PACKAGE = "vllm_ascend"
ASCEND_MOE_METHOD = "AscendUnquantizedFusedMoEMethod"
MOE_WEIGHTS = ("w13_weight", "w2_weight")


def _from_vllm_ascend(obj: Any) -> bool:
    return any(cls.__module__.split(".")[0] == ASCEND_PACKAGE for cls in type(obj).__mro__)


def ascend_moe_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The fused-MoE layers whose weights vLLM-Ascend transposes after loading."""
    layers = []
    for name, module in model.named_modules():
        method = getattr(module, "quant_method", None)
        if method is None or not _from_vllm_ascend(method) or not hasattr(module, "w13_weight"):
            continue
        if ASCEND_MOE_METHOD not in {cls.__name__ for cls in type(method).__mro__}:
            raise NotImplementedError(
                f"{name}: weight sync into a vLLM-Ascend MoE with {type(method).__name__} is not supported "
                f"(only {ASCEND_MOE_METHOD}, the unquantized bf16/fp16 path)"
            )
        layers.append(module)
    return layers


def ascend_attention_impls(model: torch.nn.Module) -> list[Any]:
    """The attention backend implementations from vllm_ascend that derive tensors from the loaded weights."""
    impls = []
    for module in model.modules():
        impl = getattr(module, "impl", None)
        post_load = getattr(impl, "process_weights_after_loading", None)
        if impl is not None and _from_vllm_ascend(impl) and callable(post_load):
            impls.append(impl)
    return impls


def ascend_attention_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The attention layers whose vLLM-Ascend backend derives tensors and that run their own post-load step
    (verl 0.6.0's vLLM 0.13 Attention layers)."""
    return [
        module
        for module in model.modules()
        if getattr(module, "impl", None) is not None
        and _from_vllm_ascend(module.impl)
        and callable(getattr(module, "process_weights_after_loading", None))
    ]


def _in_runtime_layout(name: str, param: torch.Tensor, hidden_size: int) -> bool:
    # NPUWorker.wake_up's test: the run-time w13 is [E, H, 2I], the run-time w2 is [E, I, H]
    return param.shape[1] == hidden_size if name == "w13_weight" else param.shape[2] == hidden_size


def _ascend_setting(
    additional_config: Mapping[str, Any], key: str, env: Mapping[str, str], env_key: str, default
):
    # vLLM-Ascend 0.23's AscendConfig._get_config_value: the additional_config key first, then the environment
    return additional_config[key] if key in additional_config else int(env.get(env_key, default))


def _refuse_nz(env: Mapping[str, str], additional_config: Mapping[str, Any] | None = None) -> None:
    """Refuse FRACTAL_NZ weights. additional_config None: vLLM-Ascend 0.13, which reads the environment only."""
    if additional_config is None:
        if int(env.get("VLLM_ASCEND_ENABLE_NZ", 1)):
            # NPUWorker.wake_up refuses it too: weights cast to FRACTAL_NZ cannot be loaded into or re-derived as ND
            raise ValueError(
                "weight sync into vLLM-Ascend needs VLLM_ASCEND_ENABLE_NZ=0 (FRACTAL_NZ weights are not "
                "reloadable); export VLLM_ASCEND_ENABLE_NZ=0 on every node"
            )
        return
    if _ascend_setting(additional_config, "weight_nz_mode", env, "VLLM_ASCEND_ENABLE_NZ", 1):
        # NPUWorker.wake_up refuses it too (vLLM-Ascend 0.23 reads weight_nz_mode, default 1)
        raise ValueError(
            "weight sync into vLLM-Ascend needs weight_nz_mode=0 (FRACTAL_NZ weights are not reloadable): set "
            "additional_config weight_nz_mode: 0 (or export VLLM_ASCEND_ENABLE_NZ=0 on every node)"
        )
    if _ascend_setting(additional_config, "enable_fused_mc2", env, "VLLM_ASCEND_ENABLE_FUSED_MC2", 0):
        # AscendUnquantizedFusedMoEMethod.process_weights_after_loading casts the MoE weights to NZ under it
        raise ValueError(
            "weight sync into vLLM-Ascend needs enable_fused_mc2=0: the fused MC2 path casts the MoE weights to "
            "FRACTAL_NZ after loading, which a reload cannot write into"
        )


def _layers_to_loader_layout(layers: Iterable[torch.nn.Module], hidden_size: int) -> int:
    count = 0
    for layer in layers:
        for name in MOE_WEIGHTS:
            param = getattr(layer, name)
            if not _in_runtime_layout(name, param, hidden_size):
                continue  # already in the loader layout (sleep mode: wake_up did it)
            view = torch.nn.Parameter(param.transpose(1, 2), requires_grad=False)
            if hasattr(layer, "weight_loader"):
                view.weight_loader = layer.weight_loader  # what the model's load_weights calls for experts
            setattr(layer, name, view)
            count += 1
    return count


def _refuse_runtime_layout(layers: Iterable[torch.nn.Module], hidden_size: int, already: str) -> None:
    for layer in layers:
        wrong = [n for n in MOE_WEIGHTS if _in_runtime_layout(n, getattr(layer, n), hidden_size)]
        if wrong:
            raise RuntimeError(
                f"{wrong} {already}in the run-time layout before the post-load step; it would transpose twice"
            )


def _keep_in_place(impl: Any, before: dict[str, torch.Tensor], same_stride: bool) -> int:
    """Copy each tensor the post-load step assigned anew into the one it replaced (same shape, dtype and device; and
    stride where asked), and put the old one back; returns how many."""
    refreshed = 0
    for key, old in before.items():
        new = getattr(impl, key, None)
        if new is old or not isinstance(new, torch.Tensor):
            continue
        fits = (new.shape, new.dtype, new.device) == (old.shape, old.dtype, old.device)
        if fits and (not same_stride or new.stride() == old.stride()):
            old.copy_(new)
            setattr(impl, key, old)
            refreshed += 1
    return refreshed


def _tensor_attrs(impl: Any) -> dict[str, torch.Tensor]:
    return {k: v for k, v in vars(impl).items() if isinstance(v, torch.Tensor)}


# --- verl 0.7.1 / 0.9.1: around update_weights_from_ipc's buckets and vLLM's post-load step -----------------------


def to_loader_layout(
    model: torch.nn.Module,
    hidden_size: int,
    env: Mapping[str, str] | None = None,
    additional_config: Mapping[str, Any] | None = None,
) -> int:
    """Replace each MoE weight still in vLLM-Ascend's run-time layout by its transposed view, as NPUWorker.wake_up
    does (no copy); returns how many. After wake_up there is nothing left to do. additional_config: the engine's
    (vLLM-Ascend 0.23 reads its NZ switches there first); None on vLLM-Ascend 0.13."""
    layers = ascend_moe_layers(model)
    if layers:
        _refuse_nz(os.environ if env is None else env, additional_config)
    return _layers_to_loader_layout(layers, hidden_size)


def run_post_load(
    model: torch.nn.Module,
    hidden_size: int,
    post_load: Callable[[], Any],
    env: Mapping[str, str] | None = None,
) -> int:
    """Run post_load() (vLLM's process_weights_after_loading) and keep vLLM-Ascend's derived attention tensors in
    the tensors the engine held before it; returns how many were refreshed in place."""
    moe, impls = ascend_moe_layers(model), ascend_attention_impls(model)
    if moe or impls:
        _refuse_nz(os.environ if env is None else env)
    _refuse_runtime_layout(moe, hidden_size, already="")
    before = [_tensor_attrs(impl) for impl in impls]
    post_load()
    return sum(_keep_in_place(impl, old, same_stride=True) for impl, old in zip(impls, before, strict=True))


def unwrap(model: Any) -> torch.nn.Module:
    """The nn.Module inside a graph wrapper (vLLM-Ascend's ACLGraphWrapper keeps it as .runnable)."""
    while not isinstance(model, torch.nn.Module) and hasattr(model, "runnable"):
        model = model.runnable
    return model


# --- verl 0.6.0: the whole sequence around model.load_weights ------------------------------------------------------


def restore_runtime_layout(layers: Iterable[torch.nn.Module], hidden_size: int) -> None:
    """Run vLLM-Ascend's own post-load step on each MoE layer, from the loader layout back to the run-time one."""
    layers = list(layers)
    _refuse_runtime_layout(layers, hidden_size, already="already ")
    for layer in layers:
        layer.quant_method.process_weights_after_loading(layer)


def rederive_attention(layers: Iterable[torch.nn.Module], act_dtype: torch.dtype) -> int:
    """Re-run each layer's post-load step; a derived tensor that keeps its shape is copied into the old one in place.

    Returns the number of derived tensors refreshed in place.
    """
    refreshed = 0
    for layer in layers:
        before = _tensor_attrs(layer.impl)
        layer.process_weights_after_loading(act_dtype)
        refreshed += _keep_in_place(layer.impl, before, same_stride=False)
    return refreshed


def sync_weights(
    model: torch.nn.Module,
    weights: Iterable[tuple[str, torch.Tensor]],
    *,
    hidden_size: int,
    act_dtype: torch.dtype,
    prepare: Callable[[torch.nn.Module], None] | None = None,
    env: dict | None = None,
) -> Any:
    """model.load_weights(weights), with vLLM-Ascend's post-load layouts undone before and redone after.

    prepare(model) runs right before the load (verl's patch_vllm_moe_model_weight_loader). Off vLLM-Ascend (no
    layer uses its classes) this is prepare + load_weights, as before.
    """
    moe, attention = ascend_moe_layers(model), ascend_attention_layers(model)
    if moe or attention:
        _refuse_nz(os.environ if env is None else env)
    _layers_to_loader_layout(moe, hidden_size)
    if prepare is not None:
        prepare(model)
    loaded = model.load_weights(weights)
    restore_runtime_layout(moe, hidden_size)
    rederive_attention(attention, act_dtype)
    return loaded
