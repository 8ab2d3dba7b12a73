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
"""Explicit offload/onload of a vLLM engine's weights and KV cache, in place of vLLM's sleep mode.

Device memory is freed by resizing each tensor's storage to zero and re-allocated by resizing it back, so every view,
tied weight, attention layer's kv_cache reference and attention backend's derived tensor (MLA W_UV / W_UK_T) stays
bound to the same storage object. The device addresses change, which is why this path needs an eager engine (no
captured graphs).

One file for every verl base (the overlay installs it as verl/utils/explicit_offload.py); where the engine lives
differs by base:
- verl 0.7.1 and 0.9.1 (ds-0104, ds-0204, the server rollout): EngineOffload runs inside each vLLM worker process
  (the worker extension calls it), offloads the attention backends' derived tensors with the weights
  (weight_tensors) and hands the freed blocks back to the device (release_cached_memory). On 0.9.1 the server
  reaches the workers of every DP engine through vLLM's collective_rpc, with the schedulers paused around it.
- verl 0.6.0 (ds-0004, the SPMD engine inside the trainer's process): ExplicitEngineOffload wraps that in-process
  worker (engine_worker) and moves the parameters and buffers only (model_tensors), leaving the allocator's cache to
  the caller; the Megatron worker also checks and frees the actor's buffers (actor_params_resident,
  free_actor_grads).
"""

from collections.abc import Iterable, Iterator
from typing import Any

import torch


def _tensors(obj: Any) -> Iterator[torch.Tensor]:
    """Tensors in obj, a tensor or nested lists/tuples/dicts of them (vLLM-Ascend keeps (k, v) tuples per layer)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from _tensors(value)
    elif isinstance(obj, list | tuple):
        for value in obj:
            yield from _tensors(value)


def _byte_view(storage: torch.UntypedStorage) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


def release_cached_memory() -> None:
    """Hand the caching allocator's free blocks back to the device, so another process can use them."""
    if hasattr(torch, "npu"):
        torch.npu.empty_cache()
    elif torch.cuda.is_available():
        torch.cuda.empty_cache()


class StorageOffloader:
    """Frees and re-allocates the storages behind a set of tensors, optionally keeping a host copy."""

    def __init__(self, keep_host_copy: bool):
        self.keep_host_copy = keep_host_copy
        # (storage, its size in bytes, host copy or None); one entry per distinct storage
        self._saved: list[tuple[torch.UntypedStorage, int, torch.Tensor | None]] = []

    @property
    def offloaded(self) -> bool:
        return bool(self._saved)

    def offload(self, tensors: Iterable[Any]) -> int:
        """Free the storage of every tensor (each shared storage once); returns the bytes freed; a no-op if done."""
        if self._saved:
            return 0
        seen: set[int] = set()
        for tensor in _tensors(list(tensors)):
            storage = tensor.untyped_storage()
            nbytes = storage.nbytes()
            if nbytes == 0 or storage.data_ptr() in seen:
                continue
            seen.add(storage.data_ptr())
            host = None
            if self.keep_host_copy:
                pin = storage.device.type != "cpu"
                host = torch.empty(nbytes, dtype=torch.uint8, device="cpu", pin_memory=pin)
                host.copy_(_byte_view(storage))  # blocking: the storage is freed right after
            self._saved.append((storage, nbytes, host))
        for storage, _, _ in self._saved:
            storage.resize_(0)
        return sum(nbytes for _, nbytes, _ in self._saved)

    def onload(self) -> int:
        """Re-allocate every freed storage at its old size: host copy restored if kept, else zero-filled."""
        total = 0
        for storage, nbytes, host in self._saved:
            storage.resize_(nbytes)
            view = _byte_view(storage)
            if host is None:
                view.zero_()
            else:
                view.copy_(host)
            total += nbytes
        self._saved = []
        return total


def weight_tensors(model: torch.nn.Module) -> list[torch.Tensor]:
    """The engine model's weights: parameters, buffers and the tensors attention backends derive from them."""
    derived = []
    for module in model.modules():
        impl = getattr(module, "impl", None)  # vLLM's Attention / MLAAttention keep their backend here
        if impl is not None and not isinstance(impl, torch.nn.Module):
            derived += [v for v in vars(impl).values() if isinstance(v, torch.Tensor)]
    return [*model.parameters(), *model.buffers(), *derived]


def model_tensors(model: torch.nn.Module) -> list[torch.Tensor]:
    """The engine model's weights as verl 0.6.0's offload takes them: parameters and buffers."""
    return [*model.parameters(), *model.buffers()]


def engine_worker(inference_engine: Any) -> Any:
    """The in-process vLLM worker of an SPMD (external_launcher) engine, the one verl 0.6.0's update_weights loads
    into."""
    return inference_engine.llm_engine.model_executor.driver_worker.worker


def kv_cache_tensors(model_runner: Any) -> list[torch.Tensor]:
    """The KV cache: the runner's kv_caches and what each attention layer of the forward context is bound to."""
    layers = model_runner.vllm_config.compilation_config.static_forward_context.values()
    bound = [getattr(layer, "kv_cache", None) for layer in layers]
    return list(_tensors([getattr(model_runner, "kv_caches", None), bound]))


class EngineOffload:
    """release/resume of one vLLM worker as explicit weight offload/onload and KV-cache free/re-create (verl 0.7.1)."""

    def __init__(self, model_runner: Any):
        self.model_runner = model_runner
        # not every tensor of the model comes from the trainer's weights (buffers, derived tensors): keep a copy
        self.weights = StorageOffloader(keep_host_copy=True)
        self.kv_cache = StorageOffloader(keep_host_copy=False)

    def _weights(self) -> list[torch.Tensor]:
        return weight_tensors(self.model_runner.model)

    def _offload(self) -> dict[str, int]:
        return {
            "kv_cache": self.kv_cache.offload(kv_cache_tensors(self.model_runner)),
            "weights": self.weights.offload(self._weights()),
        }

    def release(self) -> dict[str, int]:
        """Free the KV cache, offload the weights to host memory; the bytes freed of each."""
        freed = self._offload()
        release_cached_memory()
        return freed

    def resume(self, tags: list[str] | None = None) -> dict[str, int]:
        """Onload the weights ("weights") and/or re-create the KV cache ("kv_cache"); None means both."""
        tags = ["weights", "kv_cache"] if tags is None else tags
        restored = {}
        if "weights" in tags:
            restored["weights"] = self.weights.onload()
        if "kv_cache" in tags:
            restored["kv_cache"] = self.kv_cache.onload()
        return restored


class ExplicitEngineOffload(EngineOffload):
    """verl 0.6.0: the SPMD engine's in-process worker; the weights are its parameters and buffers, and the caller
    (the rollout's sleep/wake path) empties the allocator's cache."""

    def __init__(self, worker: Any):
        super().__init__(worker.model_runner)
        self.worker = worker

    def _weights(self) -> list[torch.Tensor]:
        return model_tensors(self.model_runner.model)

    def release(self) -> dict[str, int]:
        """Free the KV cache, then offload the weights to host memory; the bytes freed of each."""
        return self._offload()


def actor_params_resident(models: Iterable[Any]) -> bool:
    """Whether the training model's parameters are on the device (Megatron DDP buffers or plain parameters)."""
    for chunk in models:
        buffers = _ddp_buffers(chunk)
        if buffers:
            if any(buffer.param_data.untyped_storage().nbytes() == 0 for buffer in buffers):
                return False
        elif any(p.device.type == "cpu" or p.untyped_storage().nbytes() == 0 for p in chunk.parameters()):
            return False
    return True


def free_actor_grads(models: Iterable[Any]) -> None:
    """Free the gradient buffers only, the way Megatron's offload does, so the next load re-creates them."""
    for chunk in models:
        buffers = _ddp_buffers(chunk)
        for buffer in buffers:
            if buffer.grad_data.untyped_storage().nbytes() > 0:
                buffer.grad_data_size = buffer.grad_data.storage().size()
                buffer.grad_data.storage().resize_(0)
        if not buffers:
            for param in chunk.parameters():
                param.grad = None


def _ddp_buffers(chunk: Any) -> list[Any]:
    # Megatron's DDP keeps its param/grad buffers in list attributes (nn.Module.buffers is a method)
    found = []
    for name in ("buffers", "expert_parallel_buffers"):
        value = getattr(chunk, name, None)
        if isinstance(value, list):
            found += value
    return found
