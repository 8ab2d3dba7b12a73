"""verl 0.9.1's CPU overlay (cpu-0014, cpu-0016, cpu-0017 and the 0.7.1 entries it carries) on the real 0.9.1 sdist.

The overlay is applied to a copy of the sdist with the overlay tool, then verl is imported in a child process with
the environment the recipe gives a CPU launch on 0.9.1 (recipe.toml's [bases."0.9.1"] cpu_env): the platform verl
picks, the process group verl's own helper starts, the `vllm` distribution record and the vLLM plugin it names.
verl 0.9.1 imports in the tool environment (torch's CPU build); vLLM is not needed for these checks. What needs
vLLM's CPU build and main_ppo (the vLLM plugin recipes_vllm_cpu.py, the unpinned FSDP2 offload of the reference) is
the e2e v091 run (tests/harness/test_e2e_091.py, full tier).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ascend_rl import manifest

REPO = Path(__file__).resolve().parents[2]

PROBE = r"""
import json, os
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["PROBE_PORT"], RANK="0", WORLD_SIZE="1")
import torch
import verl  # noqa: F401  (runs VERL_USE_EXTERNAL_MODULES: the platform registers itself)
from importlib.metadata import entry_points, version
from verl.plugin.platform import get_platform
from verl.utils.device import get_device_id, get_device_name, get_nccl_backend, get_torch_device
from verl.utils.distributed import initialize_global_process_group_ray

device = get_torch_device()
device.manual_seed(7)
initialize_global_process_group_ray()
out = {
    "platform": type(get_platform()).__name__,
    "device": get_device_name(),
    "backend": get_nccl_backend(),
    "process_group": torch.distributed.get_backend(),
    "tensor_device": str(torch.zeros(1, device=get_device_id()).device),
    "memory_allocated": device.memory_allocated(),
    "free_total": list(device.mem_get_info()),
    "ipc": get_platform().is_ipc_supported(),
    "vllm_version": version("vllm"),
    "vllm_plugins": sorted(e.value for e in entry_points(group="vllm.general_plugins")),
}
torch.distributed.destroy_process_group()
print("PROBE " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def cpu_tree_091(pristine_base, tmp_path_factory) -> Path:
    """A copy of the verl 0.9.1 sdist with qwen2_5's 0.9.1 series and the CPU overlay's applied by the overlay tool."""
    pristine = pristine_base("0.9.1")
    tree = tmp_path_factory.mktemp("cpu091") / "verl-0.9.1-cpu"
    subprocess.run(["cp", "-a", str(pristine), str(tree)], check=True)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ascend_rl",
            "overlay",
            "apply",
            "qwen2_5",
            "--base",
            "0.9.1",
            "--with",
            "cpu",
            "--target",
            str(tree),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "applied 12 of 12 patches" in proc.stdout, proc.stdout
    return tree


def probe(tree: Path, env_extra: dict[str, str], port: int) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VERL_")}
    env.update(env_extra, PYTHONPATH=str(tree), PROBE_PORT=str(port))
    return subprocess.run(
        [sys.executable, "-c", PROBE], cwd=tree.parent, env=env, capture_output=True, text=True, timeout=300
    )


def cpu_env() -> dict[str, str]:
    return dict(manifest.resolve_launch("qwen2_5", "0.9.1", profile="cpu").cpu_env)


def test_the_cpu_launch_env_selects_the_cpu_platform_and_plain_gloo(cpu_tree_091: Path) -> None:
    env = cpu_env()
    assert (
        env["VERL_PLATFORM"] == "cpu"
        and env["VERL_USE_EXTERNAL_MODULES"] == "verl.plugin.platform.platform_cpu"
    )
    proc = probe(cpu_tree_091, env, 29611)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("PROBE ")), None)
    assert proc.returncode == 0 and line, proc.stdout[-2000:] + proc.stderr[-3000:]
    got = json.loads(line[len("PROBE ") :])
    assert got["platform"] == "PlatformCPU" and got["device"] == "cpu" and got["backend"] == "gloo"
    # verl's own helper built "cpu:gloo,cpu:gloo" before cpu-0014, which torch refuses
    assert got["process_group"] == "gloo"
    assert got["tensor_device"] == "cpu" and got["memory_allocated"] == 0
    free, total = got["free_total"]
    assert 0 < free <= total
    assert got["ipc"] is False  # verl then sends the rollout its weights in shared-memory buckets
    assert got["vllm_version"] == "0.23.0+cpu"
    assert {"recipes_vllm_cpu:keep_linear_weights", "recipes_vllm_cpu:cpu_moe_outside_config"} <= set(
        got["vllm_plugins"]
    )


def test_without_the_plugin_hook_verl_0_9_1_falls_back_to_a_card(cpu_tree_091: Path) -> None:
    """The control: the same tree without the launch's environment picks no CPU platform (verl falls back to
    "nvidia" on a host with no card), so the check above is the environment's doing."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VERL_")}
    env["PYTHONPATH"] = str(cpu_tree_091)
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import verl\nfrom verl.plugin.platform import get_platform\n"
            "print('PLATFORM', type(get_platform()).__name__)",
        ],
        cwd=cpu_tree_091.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "PLATFORM PlatformCUDA" in proc.stdout, proc.stdout[-2000:]


# The Qwen recipe's path on the shared 0.9.1 CPU series: its trainer's engine workers and the FSDP engine. The verl
# tree carries cpu-0016 / cpu-0017 (the Megatron engine on CPU) too; the run must import none of it.
FSDP_PATH = r"""
import json, sys
import verl  # noqa: F401
import verl.workers.engine_workers  # noqa: F401  (TrainingWorker: what the Qwen 0.9.1 run's actor is)
from verl.workers.engine import EngineRegistry
from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

out = {
    "fsdp_engine": EngineRegistry._engines["language_model"]["fsdp"]["cuda"] is FSDPEngineWithLMHead,
    "megatron_modules": sorted(m for m in sys.modules if m.split(".")[0] in ("megatron", "transformer_engine")),
    "overlay_megatron_modules": sorted(
        m for m in ("verl.utils.megatron.cpu_compat", "verl.models.mcore.bridge", "verl.utils.megatron_utils")
        if m in sys.modules
    ),
}
print("FSDP " + json.dumps(out))
"""


def fsdp_path(tree: Path, pythonpath: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VERL_")}
    env.update(cpu_env(), PYTHONPATH=pythonpath)
    proc = subprocess.run(
        [sys.executable, "-c", FSDP_PATH],
        cwd=tree.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("FSDP ")), None)
    assert proc.returncode == 0 and line, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(line[len("FSDP ") :])


def test_the_qwen_fsdp_path_imports_no_megatron_from_the_shared_cpu_series(cpu_tree_091: Path) -> None:
    """cpu-0016 / cpu-0017 are in the tree (the series is shared), yet the FSDP path imports neither megatron nor
    the overlay's Megatron modules: the Qwen environment has no megatron (the DeepSeek CPU path adds its own folder,
    artifacts.megatron_packages), and verl's engine registry then skips the Megatron engine."""
    import importlib.util

    assert (cpu_tree_091 / "verl" / "utils" / "megatron" / "cpu_compat.py").is_file()
    assert importlib.util.find_spec("megatron") is None, "the tool environment must be without megatron"
    got = fsdp_path(cpu_tree_091, str(cpu_tree_091))
    assert got["fsdp_engine"]
    assert got["megatron_modules"] == [] and got["overlay_megatron_modules"] == [], got


@pytest.mark.slow
def test_with_megatron_importable_the_same_imports_reach_it(cpu_tree_091: Path) -> None:
    """The control: with the 0.9.1 Megatron packages on the path (as the DeepSeek CPU path puts them), the same
    imports load megatron, so the check above can fail; what keeps the Qwen path clean is its environment."""
    from ascend_rl import artifacts
    from ci_policy import get_artifact

    packages = get_artifact(
        "megatron-core / megatron-bridge (0.9.1)", artifacts.megatron_packages, Path(sys.executable), "0.9.1"
    )
    got = fsdp_path(cpu_tree_091, f"{cpu_tree_091}{os.pathsep}{packages}")
    assert "megatron" in got["megatron_modules"], got
