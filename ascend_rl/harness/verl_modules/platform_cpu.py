"""verl 0.9.1's platform for a machine with no accelerator: torch's CPU device, gloo, no IPC.

Installed into a verl 0.9.1 tree as verl/plugin/platform/platform_cpu.py by the CPU overlay (cpu-0014) and loaded
through verl's own plugin hook: VERL_USE_EXTERNAL_MODULES=verl.plugin.platform.platform_cpu registers it when verl
is imported, VERL_PLATFORM=cpu selects it (the CPU profile sets both, recipe.toml's [bases."0.9.1"] cpu_env). verl's
platform manager has no CPU platform and falls back to "nvidia" without it.

What it answers, and why:
- device "cpu" (so `trainer.device=cpu` stays cpu), backend gloo, IPC unsupported (verl then sends the rollout its
  weights through shared-memory buckets);
- Ray's resource stays "GPU": the CPU profile gives Ray one fake GPU per rank (`ray_init.num_gpus`), so verl's
  placement bundles and the vLLM server's accelerator id lookups work unchanged;
- the device module is torch.cpu plus the calls verl makes that torch.cpu lacks: the RNG calls go to torch's
  default generator, memory statistics read 0, the cache calls do nothing, mem_get_info reads the host's memory.
"""

from __future__ import annotations

from contextlib import contextmanager
from types import ModuleType
from typing import Any

import torch
from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry

_RNG = {"get_rng_state", "set_rng_state", "manual_seed", "manual_seed_all", "initial_seed"}
_ZERO = {"memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved"}
_NOOP = {"empty_cache", "ipc_collect", "reset_peak_memory_stats", "set_per_process_memory_fraction"}


def _host_memory(*_args: Any, **_kwargs: Any) -> tuple[int, int]:
    """(free, total) bytes of the host, as torch.cuda.mem_get_info gives them for a card."""
    import psutil

    memory = psutil.virtual_memory()
    return memory.available, memory.total


class CpuDevice(ModuleType):
    """torch.cpu, plus the device-module calls verl makes that torch.cpu lacks."""

    def __init__(self) -> None:
        super().__init__("verl_cpu_device")

    def __getattr__(self, name: str) -> Any:
        if hasattr(torch.cpu, name):
            return getattr(torch.cpu, name)
        if name in _RNG:
            return getattr(torch, "manual_seed" if name == "manual_seed_all" else name)
        if name in _ZERO:
            return lambda *args, **kwargs: 0
        if name in _NOOP:
            return lambda *args, **kwargs: None
        if name == "mem_get_info":
            return _host_memory
        if name == "get_device_name":
            return lambda *args, **kwargs: "cpu"
        raise AttributeError(f"torch.cpu has no attribute {name!r}")


_DEVICE = CpuDevice()


@PlatformRegistry.register(platform="cpu")
class PlatformCPU(PlatformBase):
    """A machine with no accelerator (the CPU overlay's runs only; never an NPU launch)."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> ModuleType:
        return _DEVICE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        # chosen by name (VERL_PLATFORM=cpu), never by probing: a host with a card keeps its card's platform
        return False

    def current_device(self) -> Any:
        return torch.cpu.current_device()  # "cpu": tensors made with device=get_device_id() land on the host

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        return {"num_gpus": num_gpus}

    def ray_noset_envvars(self) -> list[str]:
        return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

    def is_ipc_supported(self) -> bool:
        return False

    def rollout_env_vars(self) -> dict[str, str]:
        return {}

    def get_collective_module(self) -> Any:
        return None

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def cudart(self) -> Any:
        return None
