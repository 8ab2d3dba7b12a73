"""Where things are: the repository, the recipes, the shared patch folders, a recipe's verl tree."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECIPES = REPO / "llm_rl"
OVERLAYS = REPO / "patches"
HARNESS_HOOKS = REPO / "ascend_rl" / "harness" / "hooks"


def verl_tree(recipe: str, overlay: str | None = None, base: str | None = None) -> Path:
    """The verl tree the overlay tool materialises for `recipe` on `base` (default: the recipe's default
    base): llm_rl/<recipe>/verl-<base>/ (git-ignored), or the overlay's own tree of it
    (llm_rl/<recipe>/verl-<base>-<overlay>/: the recipe's series plus the overlay's)."""
    from ascend_rl import manifest

    spec = manifest.load_recipe(recipe, base)
    return (manifest.with_overlay(spec, overlay) if overlay else spec).default_target


def child_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """`env` (default: this process's) with the repository first on PYTHONPATH, so a child Python of
    another interpreter (the e2e environment's, a rank, a launched run) imports this package too."""
    import os

    env = dict(os.environ if env is None else env)
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(REPO)]
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *rest])
    return env
