"""Run verl's own components in this process on CPU: the patched tree first on sys.path, a gloo group, the config."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

from ascend_rl.manifest import verl_tree

RECIPE = "qwen2_5"
BASE = "0.6.0"  # the in-process harness imports the .venv's verl, which is 0.6.0 (scripts/setup_dev.sh)
PATCHED_TREE = verl_tree(RECIPE, base=BASE)


class DemoError(Exception):
    """A predictable problem, reported to the user as one line."""


def materialise_patched_tree(tree: Path = PATCHED_TREE, log=print) -> Path:
    """Fetch verl 0.6.0 (checksummed sdist) and apply the recipe's patch series through the overlay tool."""
    from ascend_rl import overlay

    try:
        recipe = overlay.load_recipe(RECIPE, BASE)
        if not (tree / "verl" / "__init__.py").is_file():
            overlay.fetch(recipe, source="sdist", dest=tree, log=log)
        states = overlay.apply_series(recipe, tree)
    except overlay.OverlayError as exc:
        raise DemoError(f"could not prepare the patched verl tree: {exc}") from exc
    fresh = sum(1 for s in states if s.state != "applied")
    log(f"verl {recipe.version} at {tree}: {len(states)} patches in the series, {fresh} applied now")
    return tree


def use_patched_tree(tree: Path = PATCHED_TREE) -> None:
    """Import verl from the patched tree, not from site-packages; refuse if verl was imported already."""
    loaded = sys.modules.get("verl")
    if loaded is not None and not Path(loaded.__file__).resolve().is_relative_to(tree.resolve()):
        raise DemoError(f"verl was already imported from {loaded.__file__}; run the demo in a fresh process")
    if str(tree) not in sys.path:
        sys.path.insert(0, str(tree))
    # Ray and Hydra workers started by verl code see the same tree.
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(tree), os.environ.get("PYTHONPATH")) if p)


def cpu_shims() -> list[str]:
    """Test-only shims verl 0.6.0 needs on a machine without CUDA/NPU; returns what was shimmed."""
    import torch

    shimmed = []
    # verl calls get_torch_device().empty_cache() after HF generation; torch.cpu has no such function.
    if not hasattr(torch.cpu, "empty_cache"):
        torch.cpu.empty_cache = lambda: None
        shimmed.append("torch.cpu.empty_cache (no-op)")
    return shimmed


def init_gloo_group() -> None:
    """A one-process gloo group: verl's actor asks torch.distributed for its rank."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)


def compose_config(overrides: list[str]):
    """verl's own ppo_trainer.yaml from the imported (patched) tree, with the demo's Hydra overrides."""
    import verl
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    config_dir = Path(verl.__file__).parent / "trainer" / "config"
    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base=None):
            return compose("ppo_trainer", overrides=overrides)
    except (HydraException, OmegaConfBaseException) as exc:
        first = str(exc).strip().splitlines()[0]
        raise DemoError(
            f"verl's config rejected the demo overrides ({first}); is the recipe's patch series applied?"
        ) from exc
