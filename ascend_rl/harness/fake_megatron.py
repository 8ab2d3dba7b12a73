"""What building one rank of a Megatron layout needs on a CPU with torch.distributed's fake backend and the meta
device (the shape check's builder, ascend_rl/harness/fake_ranks.py): each stand-in with the upstream line it
stands in for. tests/harness/test_shape_check_091.py (megatron-core 0.16.1) and test_shape_check_012.py (0.12.1)
show each upstream fact still holds, so a megatron-core that changes under a stand-in fails there, not in a silently
different build.

Run inside a verl tree made by the overlay's CPU series (its verl/utils/megatron/cpu_compat.py: what megatron-core
lacks on a CPU, shared with the CPU runs) with the base's Megatron packages on PYTHONPATH. On top of cpu_compat:
- the fake process group (torch.testing._internal.distributed.fake_pg.FakeStore, backend "fake"): every collective
  returns at once; a process is one rank of a world of any size;
- parallel_state.initialize_model_parallel(..., create_gloo_process_groups=False): verl's engine calls it without
  (verl 0.9.1 engine/megatron/transformer_impl.py:271; verl 0.7.1 / 0.6.0's Megatron worker too,
  workers/megatron_workers.py:285-294 / :203-212), and megatron-core's default gloo groups cannot be made on the
  fake store (c10d: "Not implemented" from the fake backend's gloo group); megatron-core 0.12.1 has the same switch
  (parallel_state.py:450), so the one stand-in serves both;
- torch.cuda.current_device() answers the meta device: the DDP buffers (megatron-core 0.16.1
  distributed/param_and_grad_buffer.py allocates them on it; 0.12.1 the same, :623-631) and the rotary embedding's
  buffers are then shapes, no bytes (cpu_compat answers the CPU, where a 671B rank's 22 GB buffer would be
  allocated);
- the config builds weights without initialising them (use_cpu_initialization=True, perform_initialization=False;
  transformer_config.py: GPU initialisation needs the CUDA RNG tracker), under `torch.device("meta")`;
- the local norm refuses sequence parallel (torch_norm.py:32 `assert not config.sequence_parallel`), which
  TransformerEngine's norms take: the same torch norm, its weight tagged `sequence_parallel` as TE's are;
- the fused kernels the launch asks for exist only with TE / GPU kernels (moe_permute_fusion,
  gradient_accumulation_fusion, moe_grouped_gemm, persist_layer_norm): off, which changes no parameter's shape
  (SequentialMLP holds the experts grouped GEMM would: the same elements per rank).
Only verl 0.6.0 / 0.7.1's worker path (megatron-core 0.12.1, verl's get_model) needs, on the meta device:
- a module of meta tensors stays where it is when verl moves it to the device (meta_modules_stay_on_meta);
- DDP.broadcast_params, which get_model calls, skips a module of meta parameters (meta_broadcast_params).
tests/harness/test_shape_check_012.py shows the upstream facts these two and the gloo switch rest on.
"""

from __future__ import annotations

import copy

import torch

# override_transformer_config keys the build turns off (what only TE / GPU kernels run; no parameter changes shape)
CPU_BUILD_OVERRIDES = {
    "moe_permute_fusion": False,
    "gradient_accumulation_fusion": False,
    "moe_grouped_gemm": False,
    "persist_layer_norm": False,
    "use_cpu_initialization": True,
    "perform_initialization": False,
}
# keys of the launch's override_transformer_config that are MindSpeed's (NPU options megatron-core has no field for)
MINDSPEED_KEYS = ("use_flash_attn", "use_fused_rotary_pos_emb", "use_fused_swiglu", "swap_optimizer")


def init_fake_process_group(rank: int, world_size: int) -> None:
    """This process as rank `rank` of a `world_size` world whose collectives do nothing."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)


def initialize_model_parallel(**sizes) -> None:
    """megatron-core's parallel state as verl's engine sets it up, without the gloo groups the fake store cannot
    make."""
    from megatron.core import parallel_state as mpu

    mpu.initialize_model_parallel(
        use_sharp=False, nccl_communicator_config_path=None, create_gloo_process_groups=False, **sizes
    )


def on_meta_device() -> None:
    """torch.cuda.current_device() as the meta device (after cpu_compat.apply(), which answers the CPU)."""
    torch.cuda.current_device = lambda: torch.device("meta")


def meta_modules_stay_on_meta() -> None:
    """A module whose tensors are all on the meta device stays there when moved: verl 0.6.0 / 0.7.1's model provider
    moves each model to the device (utils/megatron_utils.py, make_megatron_module's megatron_model_provider:
    `parallel_model.to(get_device_name())`, 0.7.1:307 / 0.6.0:210; and get_model's GPU allocation, 0.7.1:133-135 /
    0.6.0:126-128, which runs because make_megatron_module passes no transformer_config), and a meta tensor cannot
    be copied to the CPU ("Cannot copy out of meta tensor; no data!")."""
    module_cls = torch.nn.Module
    if getattr(module_cls.to, "_recipes_meta", False):
        return
    plain_to = module_cls.to

    def to(self, *args, **kwargs):
        tensors = [*self.parameters(), *self.buffers()]
        if tensors and all(t.is_meta for t in tensors):
            return self
        return plain_to(self, *args, **kwargs)

    to._recipes_meta = True
    module_cls.to = to


def meta_broadcast_params() -> None:
    """megatron-core's DDP.broadcast_params (0.12.1 distributed/distributed_data_parallel.py:503-520: a
    torch.distributed.broadcast of every parameter from the first DP rank, which verl 0.6.0 / 0.7.1's get_model calls
    after wrapping, utils/megatron_utils.py 0.7.1:163-164) with nothing to copy on the meta device: c10d's broadcast
    has no meta kernel ("c10d::broadcast_: attempted to run this operator with Meta tensors"). It moves values, not
    shapes: a module of meta parameters skips it."""
    from megatron.core.distributed import DistributedDataParallel as DDP

    if getattr(DDP.broadcast_params, "_recipes_meta", False):
        return
    plain = DDP.broadcast_params

    def broadcast_params(self):
        if all(param.is_meta for param in self.module.parameters()):
            return None
        return plain(self)

    broadcast_params._recipes_meta = True
    DDP.broadcast_params = broadcast_params


def sequence_parallel_torch_norm() -> None:
    """megatron-core's local norm with sequence parallel: built as without it, its parameters tagged as TE tags them."""
    from megatron.core.transformer import torch_norm

    wrapped = torch_norm.WrappedTorchNorm
    if getattr(wrapped, "_recipes_sp", False):
        return
    plain_new = wrapped.__new__

    def new(cls, config, hidden_size, *args, **kwargs):
        if not config.sequence_parallel:
            return plain_new(cls, config, hidden_size, *args, **kwargs)
        unsharded = copy.copy(config)
        unsharded.sequence_parallel = False
        norm = plain_new(cls, unsharded, hidden_size, *args, **kwargs)
        for param in norm.parameters():
            param.sequence_parallel = True
        return norm

    wrapped.__new__ = staticmethod(new)
    wrapped._recipes_sp = True


def build_overrides(launch_otc: dict) -> dict:
    """The launch's override_transformer_config as the build takes it: MindSpeed's NPU keys dropped, what needs TE /
    GPU kernels off, weights uninitialised."""
    out = {k: v for k, v in launch_otc.items() if k not in MINDSPEED_KEYS}
    out.update(CPU_BUILD_OVERRIDES)
    return out


# ------------------------------------------------------------------------------------------------ upstream facts


def _fact_gloo_groups_need_a_real_store() -> str:
    """Without create_gloo_process_groups=False, initialize_model_parallel fails on the fake store."""
    init_fake_process_group(0, 8)
    from megatron.core import parallel_state as mpu

    try:
        mpu.initialize_model_parallel(tensor_model_parallel_size=2)
    except Exception as exc:  # noqa: BLE001 - whatever the fake backend raises
        return f"holds: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
    return "CHANGED: megatron-core made its gloo groups on the fake store"


def _fact_local_norm_refuses_sequence_parallel() -> str:
    """megatron-core's local norm asserts sequence parallel off (torch_norm.py:32)."""
    import types

    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    config = types.SimpleNamespace(
        layernorm_zero_centered_gamma=False,
        persist_layer_norm=False,
        sequence_parallel=True,
        memory_efficient_layer_norm=False,
        normalization="RMSNorm",
    )
    try:
        WrappedTorchNorm(config, 8)
    except AssertionError as exc:
        return f"holds: {exc}"
    return "CHANGED: the local norm builds with sequence parallel"


def _fact_ddp_buffers_on_the_current_device() -> str:
    """megatron-core's DDP buffers are allocated on torch.cuda.current_device() (what on_meta_device answers)."""
    import inspect

    from megatron.core.distributed import param_and_grad_buffer

    source = inspect.getsource(param_and_grad_buffer._ParamAndGradBuffer.__init__)
    if "device=torch.cuda.current_device()" in source:
        return "holds: _ParamAndGradBuffer allocates with device=torch.cuda.current_device()"
    return "CHANGED: _ParamAndGradBuffer no longer allocates on torch.cuda.current_device()"


def _fact_gpu_initialisation_needs_the_cuda_rng_tracker() -> str:
    """Initialising weights on the GPU path forks the CUDA RNG tracker (why the build asks use_cpu_initialization
    with perform_initialization off)."""
    import inspect

    from megatron.core.tensor_parallel import layers

    source = inspect.getsource(layers._initialize_affine_weight_gpu)
    if "get_cuda_rng_tracker" in source:
        return "holds: _initialize_affine_weight_gpu forks get_cuda_rng_tracker()"
    return "CHANGED: _initialize_affine_weight_gpu no longer uses the CUDA RNG tracker"


UPSTREAM_FACTS = {
    "gloo groups on the fake store": _fact_gloo_groups_need_a_real_store,
    "local norm and sequence parallel": _fact_local_norm_refuses_sequence_parallel,
    "DDP buffers on the current device": _fact_ddp_buffers_on_the_current_device,
    "GPU initialisation and the CUDA RNG": _fact_gpu_initialisation_needs_the_cuda_rng_tracker,
}


def upstream_facts() -> dict[str, str]:
    """Each stand-in's upstream fact, checked in a process of its own (a fork: each starts from the same imports,
    none sees another's process group): "holds: ..." or "CHANGED: ..." per fact."""
    import json
    import os

    out = {}
    for name, fact in UPSTREAM_FACTS.items():
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            try:
                said = fact()
            except BaseException as exc:  # noqa: BLE001 - a fact that cannot even be checked is a change
                said = f"CHANGED: {type(exc).__name__}: {exc}"
            os.write(write, json.dumps(said).encode())
            os._exit(0)
        os.close(write)
        with os.fdopen(read) as pipe:
            text = pipe.read()
        os.waitpid(pid, 0)
        out[name] = json.loads(text) if text else "CHANGED: the check died"
    return out


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(upstream_facts(), indent=1))
    sys.exit(0)
