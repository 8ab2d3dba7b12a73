"""Where things are: the repository, the recipes, the shared patch folders (a recipe's verl tree: manifest.verl_tree)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECIPES = REPO / "llm_rl"
OVERLAYS = REPO / "patches"
HARNESS_HOOKS = REPO / "ascend_rl" / "harness" / "hooks"
# The launchers' /dev/shm record (its sitecustomize and hook, also imported by the harness's hooks)
SHM_RECORD = REPO / "ascend_rl" / "shm_record"
# What a measured run puts first on PYTHONPATH: the test hooks (their sitecustomize is the one Python runs) and the
# shm record's hook, which they import
HOOK_PATH = (HARNESS_HOOKS, SHM_RECORD)


def child_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """`env` (default: this process's) with the repository first on PYTHONPATH, so a child Python of
    another interpreter (the e2e environment's, a rank, a launched run) imports this package too."""
    import os

    env = dict(os.environ if env is None else env)
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(REPO)]
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *rest])
    return env
