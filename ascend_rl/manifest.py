"""The one reader of the manifests: a recipe's recipe.toml (its verl bases, each with a pin and an
ordered patch series, and the default base) and an overlay's patches/<name>/overlay.toml (a series per
base, applied on top of a recipe's).

A recipe manifest names its bases as `[bases."<version>"]` tables (tag, commit, sdist, sdist_sha256,
series, optionally `retired`: the patches of another base this one no longer needs, with the evidence, and
`pending`: the patches of another base this one still needs and does not carry yet, each with what ports it)
and the default as `[upstream] default_base`. The older one-base form (`[upstream] version` with
`[patches] series`) still reads, as a recipe with that single base. `[recipe] die` names the NPU die its launches
run on, `[reward] path` and `function` the reward file (relative to the repository root) the launchers hand to verl.
"""

from __future__ import annotations

import shlex
import tomllib
from dataclasses import dataclass, field, replace
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


def manifest_bases(data: dict) -> dict[str, dict]:
    """A recipe.toml's bases, version -> its table (series as listed), in the file's order; the one-base
    form gives one entry. KeyError/TypeError when malformed (the caller names the file)."""
    up = data["upstream"]
    if "bases" in data:
        bases = {str(v): dict(t) for v, t in data["bases"].items()}
        if not bases:
            raise KeyError("bases (no base listed)")
        for table in bases.values():
            table["series"] = list(table["series"])
        return bases
    table = {k: up[k] for k in ("tag", "commit", "sdist", "sdist_sha256")}
    table["series"] = list(data["patches"]["series"])
    return {str(up["version"]): table}


def default_base(data: dict) -> str:
    """The base a recipe uses when none is named: [upstream] default_base, or its only base."""
    bases = manifest_bases(data)
    base = str(data["upstream"].get("default_base") or next(iter(bases)))
    if base not in bases:
        raise KeyError(f"default_base {base!r} is not one of the bases {', '.join(bases)}")
    return base


def overlay_series(data: dict) -> dict[str, list[str]]:
    """An overlay.toml's series per base (version -> patch paths); the one-base form gives one entry."""
    if "bases" in data:
        return {str(v): list(t["series"]) for v, t in data["bases"].items()}
    return {str(data["overlay"]["version"]): list(data["patches"]["series"])}


@dataclass(frozen=True)
class Recipe:
    """A recipe on one verl base: that base's pin and ordered patch series (plus an overlay's, if any)."""

    name: str
    folder: Path
    project: str
    version: str  # the base: what verl/version/version reads in its tree
    git_url: str
    tag: str
    commit: str
    sdist: str
    sdist_sha256: str
    series: tuple[Path, ...]
    tree: str = ""  # folder name of the default target; <project>-<version> when empty
    bases: tuple[str, ...] = ()  # every base the recipe has, in its manifest's order
    default: str = ""  # the base used when none is named
    retired: dict[str, str] = field(default_factory=dict, compare=False)  # patch id -> evidence
    # patch id -> what ports it: a fix this base still needs and its series lacks (a base with any is not ready for
    # an NPU launch: the preflight refuses one, naming them)
    pending: dict[str, str] = field(default_factory=dict, compare=False)
    note: str = ""  # what this base is for, from its manifest table
    image: str = ""  # the container image (CANN release) the base is run with on an NPU host
    image_source: str = ""  # where that image is named
    overrides: tuple[str, ...] = ()  # the Hydra overrides this base needs on top of the launcher's own
    cpu_overrides: tuple[str, ...] = ()  # and on top of the CPU profile's, when the launch runs on CPU
    # and on top of a launcher's random-weights variant (DeepSeek's --variant random): how this base starts from
    # random weights
    random_overrides: tuple[str, ...] = ()
    # whether that variant starts from a random Hugging Face checkpoint the launcher writes once from the model's
    # config (a base whose engine always loads a checkpoint: verl 0.9.1, llm_rl/deepseek_r1/random_checkpoint.py)
    random_checkpoint: bool = False
    # environment the CPU profile sets on this base (a user's value wins)
    cpu_env: tuple[tuple[str, str], ...] = ()
    die: str = ""  # the NPU die its launches run on ([recipe] die)
    reward: str = ""  # the reward file, relative to the repository root ([reward] path; "": none)
    reward_function: str = ""  # the function verl calls in it ([reward] function)
    # the stack pins of this base: a constraints file relative to the repository root (the base table's
    # `constraints`; constraints.txt, the vLLM 0.13 stack's, where it names none)
    constraints: str = "constraints.txt"

    @property
    def recipe(self) -> str:
        """The recipe's folder name, without an overlay's suffix."""
        return self.folder.name

    @property
    def default_target(self) -> Path:
        return self.folder / (self.tree or f"{self.project}-{self.version}")

    def pending_line(self) -> str | None:
        """One line naming the ports this base still lacks (its `pending` table) and what to do, or None when it
        has none: what the preflight refuses an NPU launch with."""
        if not self.pending:
            return None
        ports = ", ".join(self.pending)
        others = [b for b in self.bases if b != self.version]
        instead = f"launch on --base {' or '.join(others)}, " if others else ""
        return (
            f"{self.recipe} on verl {self.version} still lacks ports an NPU launch needs ({ports}; "
            f"python3 -m ascend_rl overlay status {self.recipe} --base {self.version} says what ports each): "
            f"{instead}or check this one with --dry-run"
        )

    @property
    def cli(self) -> str:
        """How the command line names this recipe ("qwen2_5", "qwen2_5 --with cpu --base 0.6.0")."""
        text = self.name.replace("+", " --with ")
        if self.bases and len(self.bases) > 1 and self.version != self.default:
            text += f" --base {self.version}"
        return text


def recipe_die(name: str) -> str | None:
    """The die a recipe's launches run on ([recipe] die in its recipe.toml), or None for an unknown recipe."""
    path = RECIPES / name / "recipe.toml"
    if not path.is_file():
        return None
    return str(read_toml(path).get("recipe", {}).get("die", "")) or None


def recipe_names() -> list[str]:
    """Every recipe folder that has a manifest."""
    return sorted(p.parent.name for p in RECIPES.glob("*/recipe.toml"))


def _flag(table: dict, key: str) -> bool:
    """A true/false key of a base table (absent: false); anything else is a malformed manifest (TypeError)."""
    value = table.get(key, False)
    if not isinstance(value, bool):
        raise TypeError(f"{key} must be true or false, not {value!r}")
    return value


def load_recipe(name_or_dir: str | Path, base: str | None = None) -> Recipe:
    """Read llm_rl/<name>/recipe.toml (or <dir>/recipe.toml) on `base` (default: the manifest's default)."""
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
        bases = manifest_bases(data)
        default = default_base(data)
        chosen = default if base is None else str(base)
        if chosen not in bases:
            raise UsageError(
                f"recipe {data.get('recipe', {}).get('name', folder.name)} has no verl base {chosen}; "
                f"its bases: {', '.join(bases)} (default {default})"
            )
        table = bases[chosen]
        return Recipe(
            name=data.get("recipe", {}).get("name", folder.name),
            folder=folder.resolve(),
            project=up["project"],
            version=chosen,
            git_url=up["git_url"],
            tag=table["tag"],
            commit=table.get("commit", ""),
            sdist=table["sdist"],
            sdist_sha256=table["sdist_sha256"],
            series=tuple(REPO / p for p in table["series"]),
            bases=tuple(bases),
            default=default,
            retired={str(k): str(v) for k, v in table.get("retired", {}).items()},
            pending={str(k): str(v) for k, v in table.get("pending", {}).items()},
            note=str(table.get("note", "")),
            image=str(table.get("image", "")),
            image_source=str(table.get("image_source", "")),
            overrides=tuple(str(o) for o in table.get("overrides", ())),
            cpu_overrides=tuple(str(o) for o in table.get("cpu_overrides", ())),
            random_overrides=tuple(str(o) for o in table.get("random_overrides", ())),
            random_checkpoint=_flag(table, "random_checkpoint"),
            cpu_env=tuple((str(k), str(v)) for k, v in table.get("cpu_env", {}).items()),
            die=str(data.get("recipe", {}).get("die", "")),
            reward=str(data.get("reward", {}).get("path", "")),
            reward_function=str(data.get("reward", {}).get("function", "")),
            constraints=str(table.get("constraints", "constraints.txt")),
        )
    except (tomllib.TOMLDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise OverlayError(
            f"{manifest}: malformed manifest ({exc}); compare it with llm_rl/qwen2_5/recipe.toml"
        ) from exc


def recipe_bases(name: str) -> list[Recipe]:
    """The recipe on each of its bases, in its manifest's order."""
    first = load_recipe(name)
    return [first if b == first.version else load_recipe(name, b) for b in first.bases]


def overlay_names() -> list[str]:
    """Every overlay folder under patches/ that has a manifest."""
    return sorted(p.parent.name for p in OVERLAYS.glob("*/overlay.toml"))


def with_overlay(recipe: Recipe, name: str) -> Recipe:
    """`recipe` with overlay `name`'s series for its base after its own, aimed at
    llm_rl/<recipe>/verl-<base>-<name>/."""
    manifest = OVERLAYS / name / "overlay.toml"
    if not manifest.is_file():
        raise UsageError(f"unknown overlay '{name}'; known overlays: {', '.join(overlay_names()) or 'none'}")
    try:
        data = read_toml(manifest)
        project = data["overlay"]["project"]
        per_base = overlay_series(data)
    except (tomllib.TOMLDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise OverlayError(
            f"{manifest}: malformed manifest ({exc}); compare it with patches/cpu/overlay.toml"
        ) from exc
    if project != recipe.project or recipe.version not in per_base:
        raise OverlayError(
            f"overlay {name} targets {project} {', '.join(per_base)}, recipe {recipe.name} is on "
            f'{recipe.project} {recipe.version}; add a [bases."{recipe.version}"] series to '
            f"{manifest.relative_to(REPO)}"
        )
    series = tuple(REPO / p for p in per_base[recipe.version])
    return replace(
        recipe,
        name=f"{recipe.name}+{name}",
        series=recipe.series + series,
        tree=f"{recipe.project}-{recipe.version}-{name}",
    )


def verl_tree(recipe: str, overlay: str | None = None, base: str | None = None) -> Path:
    """The verl tree the overlay tool materialises for `recipe` on `base` (default: the recipe's default
    base): llm_rl/<recipe>/verl-<base>/ (git-ignored), or the overlay's own tree of it
    (llm_rl/<recipe>/verl-<base>-<overlay>/: the recipe's series plus the overlay's)."""
    spec = load_recipe(recipe, base)
    return (with_overlay(spec, overlay) if overlay else spec).default_target


PROFILES = ("npu", "cpu")
CPU_OVERLAY = "cpu"  # the overlay a CPU launch runs on top of the recipe's series


@dataclass(frozen=True)
class Launch:
    """Everything a launch of a recipe needs that depends on the recipe and its base, resolved once: the launchers,
    ray_start.sh and the installer read it (`python3 -m ascend_rl resolve`), the preflight is handed it. Its pins
    (tag, commit, sdist and its sha256) and series are its recipe's on the resolved base."""

    recipe: Recipe  # on the resolved base; with the overlay's series on top (the CPU overlay's for the cpu profile)
    base: str
    profile: str
    verl_dir: Path  # the tree the launch runs unless the user names another (VERL_DIR)
    overrides: tuple[str, ...]  # the base's, then (cpu profile) the base's CPU ones
    die: str | None
    cpu_env: tuple[tuple[str, str], ...] = ()  # (cpu profile) the base's environment for the CPU run
    overlay: str = ""  # the overlay series on top of the recipe's ("" for none)
    reward: Path | None = None  # the reward file verl loads by path (custom_reward_function.path)
    reward_function: str = ""  # and the function in it (custom_reward_function.name)

    @property
    def name(self) -> str:
        """The recipe's folder name (qwen2_5, deepseek_r1)."""
        return self.recipe.recipe

    @property
    def disposable(self) -> bool:
        """Whether the default tree is an overlay's own (llm_rl/<recipe>/verl-<base>-<overlay>/: nothing but the
        series, rebuilt when it no longer takes it); the recipe's own tree and a user's are never removed."""
        return bool(self.overlay)

    def pin(self) -> dict[str, str]:
        """The base's pin: its tag, commit (may be empty), source distribution and its sha256."""
        spec = self.recipe
        return {
            "tag": spec.tag,
            "commit": spec.commit,
            "sdist": spec.sdist,
            "sdist_sha256": spec.sdist_sha256,
        }

    def shell(self) -> str:
        """The launch as bash assignments for `eval` (every value quoted)."""

        def array(values) -> str:
            return "(" + " ".join(shlex.quote(v) for v in values) + ")"

        return "\n".join(
            [
                f"VERL_BASE={shlex.quote(self.base)}",
                f"RECIPE_TREE={shlex.quote(str(self.verl_dir))}",
                f"BASE_OVERRIDES={array(self.recipe.overrides)}",
                f"BASE_CPU_OVERRIDES={array(self.overrides[len(self.recipe.overrides) :])}",
                f"BASE_RANDOM_OVERRIDES={array(self.recipe.random_overrides)}",
                f"BASE_RANDOM_CHECKPOINT={int(self.recipe.random_checkpoint)}",
                f"BASE_CPU_ENV={array(f'{k}={v}' for k, v in self.cpu_env)}",
                f"RECIPE_DIE={shlex.quote(self.die or '')}",
                f"RECIPE_REWARD={shlex.quote(str(self.reward or ''))}",
                f"RECIPE_REWARD_FN={shlex.quote(self.reward_function)}",
                f"RECIPE_CONSTRAINTS={shlex.quote(str(REPO / self.recipe.constraints))}",
            ]
        )

    def as_json(self) -> dict:
        return {
            "recipe": self.recipe.recipe,
            "base": self.base,
            "default_base": self.recipe.default,
            "bases": list(self.recipe.bases),
            "profile": self.profile,
            "verl_dir": str(self.verl_dir),
            "overlay": self.overlay or None,
            "series": [
                str(p.relative_to(REPO)) if p.is_relative_to(REPO) else str(p) for p in self.recipe.series
            ],
            "pin": self.pin(),
            "overrides": list(self.overrides),
            "cpu_env": dict(self.cpu_env),
            "die": self.die,
            "reward": {"path": str(self.reward) if self.reward else None, "function": self.reward_function},
            "image": self.recipe.image,
            "constraints": self.recipe.constraints,
            "pending": dict(self.recipe.pending),
            "random_checkpoint": self.recipe.random_checkpoint,
        }


def resolve_launch(
    recipe: str, base: str | None = None, profile: str = "npu", overlay: str | None = None
) -> Launch:
    """The one resolution of (recipe, base, profile): an unknown recipe, base, profile or overlay is refused in one
    line (UsageError) the same way for every launcher. `overlay` names the series on top of the recipe's (default:
    the profile's, the CPU overlay for cpu and none for npu)."""
    if profile not in PROFILES:
        raise UsageError(f"profile must be one of {', '.join(PROFILES)}, not {profile!r}")
    spec = load_recipe(recipe, base or None)
    overrides = spec.overrides
    if overlay is None:
        overlay = CPU_OVERLAY if profile == "cpu" else ""
    if overlay:
        spec = with_overlay(spec, overlay)
    if profile == "cpu":
        overrides += spec.cpu_overrides
    env = spec.cpu_env if profile == "cpu" else ()
    return Launch(
        spec,
        spec.version,
        profile,
        spec.default_target,
        overrides,
        spec.die or None,
        env,
        overlay,
        REPO / spec.reward if spec.reward else None,
        spec.reward_function,
    )
