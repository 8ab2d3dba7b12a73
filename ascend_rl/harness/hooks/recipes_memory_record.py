"""Test hook: the bytes each process of a CPU run holds in weights, gradients, optimizer states and KV cache, by phase.

With RECIPES_MEMORY_RECORD=<file>, every process of the run appends one JSON line to <file>:
- at each actor update's optimizer step (verl's DataParallelPPOActor._optimizer_step, on verl 0.6.0 and 0.7.1),
  phase "actor update": its torch.distributed rank, the actor's weights (the local shard of every parameter, an
  FSDP2 DTensor's to_local()), their gradients before the step and Adam's exp_avg / exp_avg_sq after it;
- when a vLLM engine allocates its KV cache (vLLM 0.13's GPUModelRunner.initialize_kv_cache, which the CPU model
  runner inherits), phase "generation": the engine's weights, the KV cache tensors and their block count.
They are sums of tensor sizes (each storage once), the quantities ascend_rl/memory_plan.py plans: the plan made
from the same launch settings must equal them (tests/launch/test_plan_memory.py, full tier). Everything here is
best effort: a failure to record never reaches the run.
"""

import os

from recipes_hook_util import append_json_line, install

ENV = "RECIPES_MEMORY_RECORD"
_RECORD = os.environ.get(ENV)
_ACTOR = "verl.workers.actor.dp_actor"
_RUNNER = "vllm.v1.worker.gpu_model_runner"


def _nbytes(tensors):
    """Bytes of the tensors' storages (a DTensor's local shard), each storage counted once."""
    seen, total = set(), 0
    for t in tensors:
        if t is None:
            continue
        t = t.to_local() if hasattr(t, "to_local") else t
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


def _patch_actor(module):
    cls = getattr(module, "DataParallelPPOActor", None)
    if cls is None or not hasattr(cls, "_optimizer_step"):
        return
    step = cls._optimizer_step

    def _optimizer_step(self, *args, **kwargs):
        try:
            params = list(self.actor_module.parameters())
            before = {"weights": _nbytes(params), "gradients": _nbytes(p.grad for p in params)}
        except Exception as exc:  # noqa: BLE001
            before = {"error": repr(exc)}
        out = step(self, *args, **kwargs)
        try:
            states = [
                value
                for state in self.actor_optimizer.state.values()
                for key, value in state.items()
                if key in ("exp_avg", "exp_avg_sq")
            ]
            _write({"phase": "actor update", **before, "optimizer_states": _nbytes(states)})
        except Exception as exc:  # noqa: BLE001
            _write({"phase": "actor update", "error": repr(exc)})
        return out

    cls._optimizer_step = _optimizer_step


def _patch_runner(module):
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
                }
            )
        except Exception as exc:  # noqa: BLE001
            _write({"phase": "generation", "error": repr(exc)})
        return out

    cls.initialize_kv_cache = initialize_kv_cache


if _RECORD:
    install(
        {_ACTOR: _patch_actor, _RUNNER: _patch_runner},
        lambda module, exc: _write({"phase": "hook", "error": repr(exc)}),
    )
