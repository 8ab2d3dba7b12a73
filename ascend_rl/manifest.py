"""The one reader of the manifests: a recipe's recipe.toml (its upstream pin and patch series) and an
overlay's patches/<name>/overlay.toml (a series applied on top of a recipe's)."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, replace
from pathlib import Path

from ascend_rl.errors import OverlayError, UsageError
from ascend_rl.paths import OVERLAYS, RECIPES, REPO


def read_toml(path: Path) -> dict:
    """One manifest file, parsed (tomllib's errors propagate: the caller says which file and what to do)."""
    with open(path, "rb") as fh:
        return tomllib.load(fh)


def recipe_manifests(recipes: Path = RECIPES) -> dict[str, dict]:
    """Recipe folder name -> its recipe.toml, for every recipe folder that has one."""
    return {p.parent.name: read_toml(p) for p in sorted(recipes.glob("*/recipe.toml"))}


def overlay_manifests(overlays: Path = OVERLAYS) -> dict[str, dict]:
    """Overlay folder name -> its overlay.toml, for every folder under patches/ that has one."""
    return {p.parent.name: read_toml(p) for p in sorted(overlays.glob("*/overlay.toml"))}


@dataclass(frozen=True)
class Recipe:
    """A recipe manifest: the upstream pin and the ordered patch series."""

    name: str
    folder: Path
    project: str
    version: str
    git_url: str
    tag: str
    commit: str
    sdist: str
    sdist_sha256: str
    series: tuple[Path, ...]
    tree: str = ""  # folder name of the default target; the project's name when empty

    @property
    def default_target(self) -> Path:
        return self.folder / (self.tree or self.project)

    @property
    def cli(self) -> str:
        """How the command line names this recipe ("qwen2_5", "qwen2_5 --with cpu")."""
        return self.name.replace("+", " --with ")


def recipe_names() -> list[str]:
    """Every recipe folder that has a manifest."""
    return sorted(p.parent.name for p in RECIPES.glob("*/recipe.toml"))


def load_recipe(name_or_dir: str | Path) -> Recipe:
    """Read llm_rl/<name>/recipe.toml (or <dir>/recipe.toml)."""
    folder = Path(name_or_dir)
    if not (folder / "recipe.toml").is_file():
        folder = RECIPES / str(name_or_dir)
    manifest = folder / "recipe.toml"
    if not manifest.is_file():
        known = ", ".join(recipe_names()) or "none"
        raise UsageError(f"unknown recipe '{name_or_dir}'; known recipes: {known}")
    try:
        data = read_toml(manifest)
        up = data["upstream"]
        series = tuple(REPO / p for p in data["patches"]["series"])
        return Recipe(
            name=data.get("recipe", {}).get("name", folder.name),
            folder=folder.resolve(),
            project=up["project"],
            version=up["version"],
            git_url=up["git_url"],
            tag=up["tag"],
            commit=up["commit"],
            sdist=up["sdist"],
            sdist_sha256=up["sdist_sha256"],
            series=series,
        )
    except (tomllib.TOMLDecodeError, KeyError, TypeError) as exc:
        raise OverlayError(
            f"{manifest}: malformed manifest ({exc}); compare it with llm_rl/qwen2_5/recipe.toml"
        ) from exc


def overlay_names() -> list[str]:
    """Every overlay folder under patches/ that has a manifest."""
    return sorted(p.parent.name for p in OVERLAYS.glob("*/overlay.toml"))


def with_overlay(recipe: Recipe, name: str) -> Recipe:
    """`recipe` with overlay `name`'s series after its own, aimed at llm_rl/<recipe>/verl-<name>/."""
    manifest = OVERLAYS / name / "overlay.toml"
    if not manifest.is_file():
        raise UsageError(f"unknown overlay '{name}'; known overlays: {', '.join(overlay_names()) or 'none'}")
    try:
        data = read_toml(manifest)
        project, version = data["overlay"]["project"], data["overlay"]["version"]
        series = tuple(REPO / p for p in data["patches"]["series"])
    except (tomllib.TOMLDecodeError, KeyError, TypeError) as exc:
        raise OverlayError(
            f"{manifest}: malformed manifest ({exc}); compare it with patches/cpu/overlay.toml"
        ) from exc
    if (project, version) != (recipe.project, recipe.version):
        raise OverlayError(
            f"overlay {name} targets {project} {version}, recipe {recipe.name} pins "
            f"{recipe.project} {recipe.version}; update {manifest.relative_to(REPO)}"
        )
    return replace(
        recipe, name=f"{recipe.name}+{name}", series=recipe.series + series, tree=f"{recipe.project}-{name}"
    )
