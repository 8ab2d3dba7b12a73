"""Where things are: the repository, the recipes, the shared patch folders (a recipe's verl tree: manifest.verl_tree)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECIPES = REPO / "llm_rl"
OVERLAYS = REPO / "patches"
HARNESS_HOOKS = REPO / "ascend_rl" / "harness" / "hooks"


def child_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """`env` (default: this process's) with the repository first on PYTHONPATH, so a child Python of
    another interpreter (the e2e environment's, a rank, a launched run) imports this package too."""
    import os

    env = dict(os.environ if env is None else env)
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(REPO)]
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *rest])
    return env
