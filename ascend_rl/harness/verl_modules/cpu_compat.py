# Copyright 2026 the ascend-rl-recipes authors
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
"""megatron-core (0.12.1, 0.16) on a machine with neither CUDA nor an NPU (CPU overlay of ascend-rl-recipes only).

This module exists only in trees built with `overlay.py apply <recipe> --with cpu` (patches cpu-0005, cpu-0011 on
verl 0.6.0 / 0.7.1 with megatron-core 0.12.1; cpu-0016 on verl 0.9.1 with megatron-core 0.16 and Megatron-Bridge); no
recipe series carries it and no launcher applies it on an accelerator host. apply() does nothing unless
verl's device is "cpu" (verl.utils.device.get_device_name(): no CUDA and no torch_npu), so even a tree
with the overlay is untouched on an NPU or GPU.

What megatron-core 0.12.1 assumes that a CPU process lacks, and what apply() gives it instead:
- CUDA RNG state (tensor_parallel/random.py: CudaRNGStatesTracker.add and fork,
  _get_cuda_rng_state, _set_cuda_rng_state): the tracker keeps CPU generator states;
- a current CUDA device (torch.cuda.current_device() in the tensor-parallel mappings, the MoE experts
  and router, the rotary embedding that MLA builds without passing use_cpu_initialization (an upstream
  bug), the DDP buffers): answers the CPU device;
- tensors made with device="cuda" or moved by .cuda() (the optimizer's scale / found-inf buffers, the
  gradient clipping, the schedules' token count, the MoE aux-loss tracker): made on the CPU, by a
  torch seen through _TorchOnCpu in the modules listed in _CUDA_PLACING_MODULES only;
- the distributed optimizer accepts only parameters whose Tensor.type() is torch.cuda.*Tensor: CPU
  tensors answer that name when asked with no argument;
- CUDA streams (MoE token dispatcher, shared-expert overlap): streams that do nothing, since CPU work
  is ordered already;
- moe_utils.maybe_move_tensor_to_cpu converts only CUDA tensors, so on CPU the EP all-to-all split
  sizes stay tensors although the caller asked for numpy (as_numpy=True) and gloo refuses them
  (an upstream bug that only a CPU run can hit): CPU tensors are converted as asked;
- without TransformerEngine fp8_utils.quantize_param_shard raises, and DistributedOptimizer calls it at
  every step even with no FP8 parameter (an upstream bug): with nothing to quantize it does nothing;
- the local (non-TransformerEngine) DotProductAttention takes neither the k_channels / v_channels
  that MultiLatentAttention passes it (an upstream bug: MLA without TE cannot be built) nor packed
  (THD) sequences, which verl's gptmodel_forward(pack_seqs=True) sends: the local layer specs get
  SDPACoreAttention below instead.
TransformerEngine itself is not installed on CPU: verl's model initializers ask use_transformer_engine(),
and verl's weight export names SequentialMLP's experts as grouped ones (grouped_expert_name).

What megatron-core 0.16 changes (verl 0.9.1's engine, whose model Megatron-Bridge builds):
- the FP8 step no longer raises without TE when no parameter is FP8 (fp8_utils.py:465): no stub;
- the local layer spec takes its core attention from models/backends.py (LocalSpecProvider.core_attention), not
  from gpt_layer_specs: SDPACoreAttention goes there (MLA still passes k_channels, the THD input still comes);
- MultiLatentAttention sets HAVE_TE True without TE (its import of megatron.core.extensions.transformer_engine
  succeeds with a MagicMock te) and then asks isinstance(..., TELinear) of a None: False, as it is;
- moe_utils reads te_general_gemm, which it defines only when TE imports (the router's first forward): None;
- the alltoall dispatcher synchronizes on the event its DtoH stream records: an inert event.
import_megatron_bridge() imports Megatron-Bridge 0.3.1, which imports transformer_engine.pytorch at module scope
(peft/lora_layers.py, peft/lora.py), under a stub of TE for that import only, then resets the HAVE_TE flags the
bridge computed under it (the DeepSeek bridges pick their layer spec by it), and lets the bridge's mappings name
SequentialMLP's experts (grouped_expert_name before its local-to-global renaming: its DeepSeek mapping and its EP
gather know the grouped names only). checkpoints_on_cpu() is what a Megatron checkpoint needs on CPU (cpu-0017).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import re
import sys
import types

import torch
from verl.utils.device import get_device_name

_applied = False


def on_cpu() -> bool:
    """True when verl runs on the CPU (no CUDA, no NPU): the only case in which apply() changes anything."""
    return get_device_name() == "cpu"


def use_transformer_engine() -> bool:
    """Whether verl's Megatron layer specs may use TransformerEngine modules (not on CPU, where TE cannot exist)."""
    return not on_cpu()


def apply() -> None:
    """Make megatron-core usable on CPU; idempotent, and a no-op on an accelerator."""
    global _applied
    if _applied or not on_cpu():
        return
    _cpu_rng_tracker()
    _cpu_current_device()
    _cuda_placements_on_cpu()
    _inert_streams()
    _split_sizes_as_asked()
    if megatron_core_version() >= (0, 16):
        _core_attention_backend()
        _megatron_core_016_without_te()
    else:
        _no_fp8_no_quantize()
        _local_core_attention()
    _applied = True


def megatron_core_version() -> tuple[int, int]:
    """(major, minor) of the installed megatron-core."""
    from megatron.core.package_info import __version__

    major, minor = __version__.split(".")[:2]
    return int(major), int(minor)


_LOCAL_EXPERT = re.compile(r"\.mlp\.experts\.local_experts\.(\d+)\.(linear_fc[12])\.weight$")


def grouped_expert_name(name: str) -> str:
    """A routed expert's weight under the grouped-GEMM name verl's weight export reads
    (`...mlp.experts.linear_fc1.weight3`), also when it comes from megatron-core's SequentialMLP
    (`...mlp.experts.local_experts.3.linear_fc1.weight`), which CPU runs use: grouped GEMM needs TE or
    the grouped_gemm CUDA kernels. Other names are returned as they are."""
    return _LOCAL_EXPERT.sub(r".mlp.experts.\2.weight\1", name)


# --- RNG ---------------------------------------------------------------------------------------------------------


def _cpu_rng_tracker() -> None:
    from megatron.core.tensor_parallel import random as mrandom

    def get_state(clone=False, device="cuda", graph_safe=False):
        return torch.get_rng_state()

    def set_state(new_state, device=-1, graph_safe=False):
        torch.set_rng_state(new_state)

    def add(self, name, seed):
        self._is_initialized = True
        if seed in self.seeds_:
            raise Exception(f"seed {seed} already exists")
        if name in self.states_:
            raise Exception(f"rng state {name} already exists")
        self.seeds_.add(seed)
        saved = torch.get_rng_state()
        torch.manual_seed(seed)
        self.states_[name] = torch.get_rng_state()
        torch.set_rng_state(saved)

    @contextlib.contextmanager
    def fork(self, name=mrandom._MODEL_PARALLEL_RNG_TRACKER_NAME):
        if name not in self.states_:
            raise Exception(f"rng state {name} is not added")
        saved = torch.get_rng_state()
        torch.set_rng_state(self.states_[name])
        try:
            yield
        finally:
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(saved)

    mrandom._get_cuda_rng_state = get_state
    mrandom._set_cuda_rng_state = set_state
    mrandom.CudaRNGStatesTracker.add = add
    mrandom.CudaRNGStatesTracker.fork = fork
    # model_parallel_cuda_manual_seed seeds the default CUDA generator first; on CPU that is the CPU one
    torch.cuda.manual_seed = torch.manual_seed


# --- device and streams ------------------------------------------------------------------------------------------


def _cpu_current_device() -> None:
    torch.cuda.current_device = lambda: torch.device("cpu")


# megatron-core modules that make tensors with device="cuda" (or call .cuda()) on the actor's path: the
# optimizer's found-inf / scale / overflow buffers, the gradient-norm clipping, the schedules' token count,
# the MoE aux-loss tracker, the attention-mask helper, and a checkpoint load's exchange of shards between ranks
_CUDA_PLACING_MODULES = (
    "megatron.core.optimizer.optimizer",
    "megatron.core.optimizer.clip_grads",
    "megatron.core.optimizer.grad_scaler",
    "megatron.core.pipeline_parallel.schedules",
    "megatron.core.transformer.moe.moe_utils",
    "megatron.core.transformer.utils",
    "megatron.core.utils",
    "megatron.core.dist_checkpointing.exchange_utils",
)
_FACTORIES = frozenset({"tensor", "zeros", "ones", "empty", "empty_like", "full", "arange"})


def _placed_on_cpu(factory, *args, device=None, **kwargs):
    if device is not None and torch.device(device).type == "cuda":
        device = "cpu"
    return factory(*args, device=device, **kwargs)


class _TorchOnCpu(types.ModuleType):
    """torch, as the modules above see it: its tensor factories put what they ask for on "cuda" on the CPU."""

    def __getattr__(self, name):
        attr = getattr(torch, name)
        return functools.partial(_placed_on_cpu, attr) if name in _FACTORIES else attr


def _cuda_placements_on_cpu() -> None:
    proxy = _TorchOnCpu("torch")
    for name in _CUDA_PLACING_MODULES:
        importlib.import_module(name).torch = proxy
    # Tensor.cuda() (schedules' token count, language_module's embedding) without CUDA would raise
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    # the (distributed) optimizer sorts parameters by type name and accepts only torch.cuda.*Tensor ones
    plain_type = torch.Tensor.type

    def type_as_on_device(self, dtype=None, non_blocking=False, **kwargs):
        if dtype is None and not kwargs:
            name = plain_type(self)
            return name.replace("torch.", "torch.cuda.", 1) if self.device.type == "cpu" else name
        return plain_type(self, dtype, non_blocking, **kwargs)

    torch.Tensor.type = type_as_on_device


class _InertStream:
    """Stands in for torch.cuda.Stream: CPU kernels run in program order, so there is nothing to wait for."""

    def __init__(self, *args, **kwargs):
        pass

    def wait_stream(self, stream) -> None:
        pass

    def wait_event(self, event) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def record_event(self, event=None):
        return event if event is not None else _INERT_EVENT


_CURRENT_STREAM = _InertStream()
# what an inert stream records (megatron-core 0.16's alltoall dispatcher synchronizes on it)
_INERT_EVENT = types.SimpleNamespace(synchronize=lambda: None, wait=lambda *args: None, query=lambda: True)


def _inert_streams() -> None:
    torch.cuda.Stream = _InertStream
    torch.cuda.current_stream = lambda device=None: _CURRENT_STREAM
    torch.cuda.stream = lambda stream: contextlib.nullcontext(stream)


# --- MoE split sizes ---------------------------------------------------------------------------------------------


def _split_sizes_as_asked() -> None:
    from megatron.core.transformer.moe import moe_utils, token_dispatcher

    def maybe_move_tensor_to_cpu(tensor, as_numpy=False, record_stream=False):
        if torch.is_tensor(tensor):
            tensor = tensor.to("cpu")
            if as_numpy:
                tensor = tensor.numpy()
        return tensor

    moe_utils.maybe_move_tensor_to_cpu = maybe_move_tensor_to_cpu
    token_dispatcher.maybe_move_tensor_to_cpu = maybe_move_tensor_to_cpu


# --- the distributed optimizer's FP8 step ----------------------------------------------------------------------


def _no_fp8_no_quantize() -> None:
    """megatron-core 0.12.1 without TransformerEngine defines fp8_utils.quantize_param_shard to raise, and the
    distributed optimizer calls it at every step, with empty lists when no parameter is FP8 (an upstream bug:
    DistributedOptimizer cannot step without TE). With nothing to quantize there is nothing to do."""
    from megatron.core.optimizer import distrib_optimizer

    without_te = distrib_optimizer.quantize_param_shard

    def quantize_param_shard(model_params, *args, **kwargs):
        if len(model_params) == 0:
            return None
        return without_te(model_params, *args, **kwargs)

    distrib_optimizer.quantize_param_shard = quantize_param_shard


# --- core attention ----------------------------------------------------------------------------------------------


def _local_core_attention() -> None:
    from megatron.core.models.gpt import gpt_layer_specs

    gpt_layer_specs.DotProductAttention = _sdpa_core_attention_class()


def _core_attention_backend() -> None:
    """megatron-core 0.16: the local spec's core attention is LocalSpecProvider.core_attention()'s, the
    DotProductAttention of models/backends.py."""
    from megatron.core.models import backends

    backends.DotProductAttention = _sdpa_core_attention_class()


def _megatron_core_016_without_te() -> None:
    """megatron-core 0.16 upstream bugs without TransformerEngine: MLA believes TE is there (HAVE_TE True from an
    import that succeeds with a MagicMock te; then isinstance(self.linear_proj, TELinear) with TELinear None), and
    the router reads te_general_gemm, defined only when TE imports."""
    from megatron.core.transformer import multi_latent_attention
    from megatron.core.transformer.moe import moe_utils

    multi_latent_attention.HAVE_TE = False
    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None


# --- Megatron-Bridge (verl 0.9.1) -------------------------------------------------------------------------------

_TE_MODULES = ("transformer_engine", "transformer_engine.pytorch", "transformer_engine.pytorch.ops")


class _AbsentTE:
    def __init__(self, *args, **kwargs):
        raise RuntimeError("transformer_engine is a stub on this machine (CPU overlay)")


def _absent(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    return type(name, (_AbsentTE,), {})


def import_megatron_bridge() -> None:
    """Import Megatron-Bridge (megatron.bridge). On CPU: megatron-core first (it decides it has no TE, its layer
    specs the local ones), then the bridge with transformer_engine stubbed for that import only (its peft modules
    import transformer_engine.pytorch at module scope; nothing calls into it without TE), the HAVE_TE flags the
    bridge's modules computed under the stub set back to False, and SequentialMLP's expert names given to its
    mappings. Elsewhere a plain import."""
    if not on_cpu():
        importlib.import_module("megatron.bridge")
        return
    if "megatron.bridge" not in sys.modules:
        for name in (
            "megatron.core",
            "megatron.core.extensions.transformer_engine",
            "megatron.core.models.gpt.gpt_layer_specs",
            "megatron.core.transformer.multi_latent_attention",
        ):
            importlib.import_module(name)
        if any(name in sys.modules for name in _TE_MODULES):  # a TE module already there: not ours to stub
            importlib.import_module("megatron.bridge")
        else:
            _import_bridge_under_te_stub()
    _bridge_names_local_experts()


def _import_bridge_under_te_stub() -> None:
    stubs = {name: types.ModuleType(name) for name in _TE_MODULES}
    stubs["transformer_engine.pytorch"].__getattr__ = _absent
    stubs["transformer_engine.pytorch.ops"].__getattr__ = _absent
    stubs["transformer_engine"].pytorch = stubs["transformer_engine.pytorch"]
    stubs["transformer_engine.pytorch"].ops = stubs["transformer_engine.pytorch.ops"]
    sys.modules.update(stubs)
    try:
        importlib.import_module("megatron.bridge")
        importlib.import_module("megatron.bridge.models.deepseek.deepseek_v3_bridge")
    finally:
        for name in _TE_MODULES:
            sys.modules.pop(name, None)
    for name, module in list(sys.modules.items()):
        if name.startswith("megatron.bridge") and getattr(module, "HAVE_TE", False) is True:
            module.HAVE_TE = False


def _bridge_names_local_experts() -> None:
    """Megatron-Bridge maps routed experts under the grouped names only (its DeepSeek mapping
    `decoder.layers.*.mlp.experts.linear_fc1.weight*`; the local-to-global expert renumbering and the export's EP
    gather read the expert id after `.weight`): SequentialMLP's `local_experts.<L>.linear_fcK.weight` is renamed
    to `linear_fcK.weight<L>` before that renaming, which then numbers it globally as a grouped expert."""
    from megatron.bridge.models.conversion import model_bridge

    local_to_global = model_bridge._megatron_local_name_to_global
    if getattr(local_to_global, "_recipes_local_experts", False):
        return

    @functools.wraps(local_to_global)
    def named_as_grouped(models, config, param_name, *args, **kwargs):
        return local_to_global(models, config, grouped_expert_name(param_name), *args, **kwargs)

    named_as_grouped._recipes_local_experts = True
    model_bridge._megatron_local_name_to_global = named_as_grouped


# --- Megatron checkpoints (verl 0.9.1, megatron-core 0.16) ------------------------------------------------------

_checkpoints_applied = False


def checkpoints_on_cpu() -> None:
    """What megatron-core 0.16's dist_checkpointing and distributed optimizer need to save and load on CPU;
    idempotent, a no-op on an accelerator:
    - the save's preload waits with torch.cuda.synchronize() (filesystem_async.py:230), which raises without a
      driver; CPU kernels have finished when they return: a no-op;
    - the load copies each loaded state in place into the optimizer's (DistributedOptimizer.
      _set_main_param_and_optimizer_states, `dst_tensors[key].copy_(...)`), and with fp32 parameters (the CPU
      check's dtype, no separate main copy) the destination is a leaf that requires grad: the copy under no_grad;
    - DistributedOptimizer.state_dict asserts one 'step' among torch AdamW's states (no apex, no TE), which hold
      none before the first step (a load into a fresh optimizer asks for it): zero states first, which the load
      overwrites."""
    global _checkpoints_applied
    if _checkpoints_applied or not on_cpu():
        return
    from megatron.core.optimizer import distrib_optimizer

    torch.cuda.synchronize = lambda device=None: None
    _optimizer_load_under_no_grad()
    if not distrib_optimizer.HAVE_APEX_OR_TE:
        _optimizer_state_before_first_step()
    _checkpoints_applied = True


def _optimizer_load_under_no_grad() -> None:
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    set_states = DistributedOptimizer._set_main_param_and_optimizer_states

    @functools.wraps(set_states)
    def set_states_no_grad(self, *args, **kwargs):
        with torch.no_grad():
            return set_states(self, *args, **kwargs)

    DistributedOptimizer._set_main_param_and_optimizer_states = set_states_no_grad


def _optimizer_state_before_first_step() -> None:
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    state_dict = DistributedOptimizer.state_dict

    @functools.wraps(state_dict)
    def state_before_first_step(self):
        if len(self.optimizer.state) == 0:
            for group in self.optimizer.param_groups:
                for param in group["params"]:
                    self.optimizer.state[param] = {
                        "step": torch.tensor(0.0),
                        "exp_avg": torch.zeros_like(param.data),
                        "exp_avg_sq": torch.zeros_like(param.data),
                    }
        return state_dict(self)

    DistributedOptimizer.state_dict = state_before_first_step


_SDPA = None


def _sdpa_core_attention_class():
    """SDPACoreAttention, built on first use (MegatronModule needs megatron importable)."""
    global _SDPA
    if _SDPA is not None:
        return _SDPA
    import torch.nn.functional as F
    from megatron.core.transformer.module import MegatronModule

    class SDPACoreAttention(MegatronModule):
        """Causal attention by torch's scaled_dot_product_attention, for unpacked [s, b, h, d] inputs and for
        packed THD inputs ([t, h, d], sequences delimited by packed_seq_params.cu_seqlens_q). One tensor-
        parallel rank's heads; no dropout (verl's actor sets attention_dropout 0)."""

        def __init__(self, config, layer_number, attn_mask_type, attention_type, softmax_scale=None, **_):
            super().__init__(config=config)
            self.softmax_scale = softmax_scale

        def forward(
            self,
            query,
            key,
            value,
            attention_mask=None,
            attn_mask_type=None,
            attention_bias=None,
            packed_seq_params=None,
        ):
            if packed_seq_params is not None:
                return self._packed(query, key, value, packed_seq_params)
            # [s, b, h, d] -> [b, h, s, d]
            q, k, v = (x.permute(1, 2, 0, 3) for x in (query, key, value))
            if attention_mask is None:
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.softmax_scale)
            else:  # Megatron's mask is True where attention is forbidden
                out = F.scaled_dot_product_attention(
                    q, k, v, attn_mask=~attention_mask, scale=self.softmax_scale
                )
            seq, batch = out.shape[2], out.shape[0]
            return out.permute(2, 0, 1, 3).reshape(seq, batch, -1)

        def _packed(self, query, key, value, params):
            q, k, v = (x.reshape(x.shape[0], x.shape[-2], x.shape[-1]) for x in (query, key, value))
            starts = (
                params.cu_seqlens_q_padded if params.cu_seqlens_q_padded is not None else params.cu_seqlens_q
            )
            starts = starts.tolist()
            lengths = (params.cu_seqlens_q[1:] - params.cu_seqlens_q[:-1]).tolist()
            out = q.new_zeros(q.shape[0], q.shape[1], v.shape[-1])
            for start, length in zip(starts[:-1], lengths, strict=True):
                if length == 0:
                    continue
                span = slice(start, start + length)
                qs, ks, vs = (x[span].transpose(0, 1) for x in (q, k, v))  # [h, s, d]
                attended = F.scaled_dot_product_attention(
                    qs, ks, vs, is_causal=True, scale=self.softmax_scale
                )
                out[span] = attended.transpose(0, 1)
            return out.reshape(out.shape[0], -1)

    _SDPA = SDPACoreAttention
    return _SDPA
