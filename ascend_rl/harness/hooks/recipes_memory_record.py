"""Test hook: the bytes each process of a CPU run holds in weights, gradients, optimizer states and KV cache, by phase.

With RECIPES_MEMORY_RECORD=<file>, every process of the run appends one JSON line to <file>:
- at each actor update's optimizer step, phase "actor update": its torch.distributed rank, the actor's weights,
  their gradients before the step and the optimizer's states after it.
  FSDP (verl's DataParallelPPOActor._optimizer_step, verl 0.6.0 and 0.7.1; verl 0.9.1's engine workers:
  FSDPEngine.optimizer_step): the local shard of every parameter (an FSDP2 DTensor's to_local()), its gradient,
  AdamW's exp_avg / exp_avg_sq.
  Megatron (verl's MegatronPPOActor on 0.6.0 / 0.7.1: its actor_optimizer.step(), wrapped per actor; verl
  0.9.1's engine workers: MegatronEngine.optimizer_step, workers/engine/megatron/transformer_impl.py, which
  MindspeedEngineWithLMHead inherits): the parameters, which the DDP wrapper has made views of its contiguous
  param buffers when the distributed optimizer is on (so the buffers are counted, padding included), their
  main_grad views of the grad buffers, and per optimizer of a ChainedOptimizer (dense and expert-parallel) the
  fp32 main weights its inner torch optimizer steps (the distributed optimizer's shards) with their exp_avg /
  exp_avg_sq, less any storage the weights already hold (with fp32 weights the main weights are views of the
  param buffers: megatron-core 0.16's distrib_optimizer.py, fp32 params);
- when a vLLM engine allocates its KV cache (GPUModelRunner.initialize_kv_cache: vLLM 0.13's CPU model runner
  inherits it, 0.23's overrides it and calls it through super()), phase "generation": the engine's weights, the KV
  cache tensors and their block count (and whether it was vLLM 0.23's minimal cache for profiling).
They are sums of tensor sizes (each storage once), the quantities ascend_rl/memory_plan.py plans: the plan made
from the same launch settings must equal them (tests/launch/test_plan_memory.py, full tier). Beside them, for
reading a disagreement: param_numel (the parameters' elements, no padding) and, for Megatron, main_params (the
optimizer's fp32 main weights alone). Everything here is best effort: a failure to record never reaches the run.
"""

import os

from recipes_hook_util import install
from recipes_shm_record import append_json_line  # ascend_rl/shm_record/, beside these hooks on PYTHONPATH

ENV = "RECIPES_MEMORY_RECORD"
_RECORD = os.environ.get(ENV)
_ACTOR = "verl.workers.actor.dp_actor"
_ENGINE = "verl.workers.engine.fsdp.transformer_impl"
_MEGATRON_ACTOR = "verl.workers.actor.megatron_actor"
_MEGATRON_ENGINE = "verl.workers.engine.megatron.transformer_impl"
_RUNNER = "vllm.v1.worker.gpu_model_runner"


def _local(t):
    """A DTensor's local shard, any other tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def _nbytes(tensors):
    """Bytes of the tensors' storages (a DTensor's local shard), each storage counted once."""
    seen, total = set(), 0
    for t in tensors:
        if t is None:
            continue
        t = _local(t)
        try:
            key = (t.untyped_storage().data_ptr(), t.device)
            size = t.untyped_storage().nbytes()
        except (RuntimeError, AttributeError):  # no storage (a meta tensor)
            key, size = id(t), t.numel() * t.element_size()
        if key not in seen:
            seen.add(key)
            total += size
    return total


def _rank():
    try:
        import torch.distributed as dist

        return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    except Exception:  # noqa: BLE001  (recording never breaks the run)
        return None


def _write(event):
    event.update(pid=os.getpid(), rank=_rank())
    append_json_line(_RECORD, event)


def _patch_step(cls, method, model_of, optimizer_of):
    """Wrap cls.<method> (an FSDP actor's optimizer step): the model's weights and gradients before it, the AdamW
    states after it, one record per call."""
    step = getattr(cls, method)

    def wrapped(self, *args, **kwargs):
        try:
            params = list(model_of(self).parameters())
            before = {
                "weights": _nbytes(params),
                "gradients": _nbytes(p.grad for p in params),
                "param_numel": sum(_local(p).numel() for p in params),
                "strategy": "fsdp",
            }
        except Exception as exc:  # noqa: BLE001
            before = {"error": repr(exc)}
        out = step(self, *args, **kwargs)
        try:
            states = _adam_states([optimizer_of(self)])
            _write({"phase": "actor update", **before, "optimizer_states": _nbytes(states)})
        except Exception as exc:  # noqa: BLE001
            _write({"phase": "actor update", "error": repr(exc)})
        return out

    setattr(cls, method, wrapped)


def _patch_actor(module):
    """verl 0.6.0 / 0.7.1: DataParallelPPOActor._optimizer_step."""
    cls = getattr(module, "DataParallelPPOActor", None)
    if cls is not None and hasattr(cls, "_optimizer_step"):
        _patch_step(cls, "_optimizer_step", lambda a: a.actor_module, lambda a: a.actor_optimizer)


def _patch_engine(module):
    """verl 0.9.1's engine workers: FSDPEngine.optimizer_step (workers/engine/fsdp/transformer_impl.py), which
    BaseEngine.train_batch calls after the mini-batch's backward passes; the reference's engine (forward_only)
    never steps."""
    cls = getattr(module, "FSDPEngine", None)
    if cls is not None and hasattr(cls, "optimizer_step"):
        _patch_step(cls, "optimizer_step", lambda e: e.module, lambda e: e.optimizer)


def _adam_states(optimizers):
    """AdamW's exp_avg / exp_avg_sq of the torch optimizers given."""
    return [
        value
        for opt in optimizers
        for state in opt.state.values()
        for key, value in state.items()
        if key in ("exp_avg", "exp_avg_sq")
    ]


def _megatron_step(modules_of, optimizer_of, step):
    """A Megatron optimizer's step (`step`, called with the step's own arguments), recording around it the state of
    the model chunks `modules_of()` and the optimizer `optimizer_of()`."""

    def wrapped(*args, **kwargs):
        try:
            params = [p for chunk in modules_of() for p in chunk.parameters()]
            grads = [
                getattr(p, "main_grad", None) if getattr(p, "main_grad", None) is not None else p.grad
                for p in params
            ]
            before = {
                "weights": _nbytes(params),
                "gradients": _nbytes(grads),
                "param_numel": sum(_local(p).numel() for p in params),
                "strategy": "megatron",
            }
        except Exception as exc:  # noqa: BLE001
            params, before = [], {"error": repr(exc)}
        out = step(*args, **kwargs)
        try:
            # a ChainedOptimizer (dense + expert-parallel) or one Megatron optimizer; each wraps a torch optimizer
            # whose param_groups hold the fp32 main weights (the distributed optimizer: this rank's shard of them)
            optimizer = optimizer_of()
            megatron_opts = getattr(optimizer, "chained_optimizers", None) or [optimizer]
            inner = [o.optimizer for o in megatron_opts]
            mains = [p for opt in inner for group in opt.param_groups for p in group["params"]]
            held = _nbytes(params)  # storages the weights already count (fp32 main weights are their views)
            _write(
                {
                    "phase": "actor update",
                    **before,
                    "optimizer_states": _nbytes(params + mains + _adam_states(inner)) - held,
                    "main_params": _nbytes(params + mains) - held,
                }
            )
        except Exception as exc:  # noqa: BLE001
            _write({"phase": "actor update", "error": repr(exc)})
        return out

    return wrapped


def _patch_megatron_actor(module):
    cls = getattr(module, "MegatronPPOActor", None)
    if cls is None:
        return
    init = cls.__init__

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        opt = getattr(self, "actor_optimizer", None)
        if opt is not None:  # the reference's MegatronPPOActor has none
            opt.step = _megatron_step(lambda: self.actor_module, lambda: opt, opt.step)

    cls.__init__ = __init__


def _patch_megatron_engine(module):
    """verl 0.9.1's engine workers: MegatronEngine.optimizer_step (workers/engine/megatron/transformer_impl.py),
    which BaseEngine.train_batch calls after the mini-batch's backward passes and its subclasses (the LM-head
    engine, MindSpeed's) inherit; the reference's engine (forward_only) has no optimizer and never steps."""
    cls = getattr(module, "MegatronEngine", None)
    if cls is None or not hasattr(cls, "optimizer_step"):
        return
    step = cls.optimizer_step

    def optimizer_step(self, *args, **kwargs):
        return _megatron_step(
            lambda: self.module, lambda: self.optimizer, lambda: step(self, *args, **kwargs)
        )()

    cls.optimizer_step = optimizer_step


def _patch_runner(module):
    """GPUModelRunner.initialize_kv_cache (vllm/v1/worker/gpu_model_runner.py in vLLM 0.13 and 0.23): the CPU
    model runner's KV cache goes through it (vLLM 0.23: CPUModelRunner.initialize_kv_cache calls super(), and the
    CPU worker takes that V1 runner where there is no Triton: cpu_worker.py:150-159, config/vllm.py:527-531)."""
    cls = getattr(module, "GPUModelRunner", None)
    if cls is None or not hasattr(cls, "initialize_kv_cache"):
        return
    init = cls.initialize_kv_cache

    def initialize_kv_cache(self, kv_cache_config, *args, **kwargs):
        out = init(self, kv_cache_config, *args, **kwargs)
        try:
            caches = self.kv_caches
            flat = []
            stack = [caches]
            while stack:  # a list per layer, or (k, v) tuples
                item = stack.pop()
                if isinstance(item, (list, tuple)):
                    stack.extend(item)
                elif isinstance(item, dict):
                    stack.extend(item.values())
                else:
                    flat.append(item)
            _write(
                {
                    "phase": "generation",
                    "rollout_weights": _nbytes(self.model.parameters()),
                    "kv_cache": _nbytes(flat),
                    "num_blocks": int(kv_cache_config.num_blocks),
                    "block_size": int(self.cache_config.block_size),
                    "dtype": str(self.model_config.dtype),
                    "profiling": bool(kwargs.get("is_profiling", args[0] if args else False)),
                }
            )
        except Exception as exc:  # noqa: BLE001
            _write({"phase": "generation", "error": repr(exc)})
        return out

    cls.initialize_kv_cache = initialize_kv_cache


if _RECORD:
    install(
        {
            _ACTOR: _patch_actor,
            _ENGINE: _patch_engine,
            _MEGATRON_ACTOR: _patch_megatron_actor,
            _MEGATRON_ENGINE: _patch_megatron_engine,
            _RUNNER: _patch_runner,
        },
        lambda module, exc: _write({"phase": "hook", "error": repr(exc)}),
    )
