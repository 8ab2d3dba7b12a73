"""Compare the installed Ascend stack with a verl base's constraints file; exit 1 on any drift.

Run after scripts/install_npu_stack.sh (it ends with this check): a later `pip install`
that silently replaced a pinned version (transformers, torch, ...) shows up here
before a training run does. Local version labels are ignored (torch 2.8.0+cpu is 2.8.0).

Each verl base of a recipe may pin a stack of its own: its table in recipe.toml names the file
(`constraints = "constraints-0.9.1.txt"`), and `--recipe R --base B` checks that file; a base
without one uses constraints.txt. Without --base the default base's file is checked: the recipe's
default_base, or with no --recipe the default base every recipe shares.

Terms: a *recipe extra* is a pinned package that only some recipes install; a recipe lists
its own under `[stack] extras` in llm_rl/<recipe>/recipe.toml (the DeepSeek recipe's Megatron
stack). Without --recipe only the shared pins are checked; with it, the shared pins and that
recipe's extras. A *git source* is a pinned package that is not on PyPI and is installed from a
git commit, recorded in constraints.txt as `# git-source: NAME URL COMMIT`; for it the commit
the installed copy was built from must match as well as the version.
"""

from __future__ import annotations

import json
import re
import subprocess
from importlib import metadata
from pathlib import Path
from urllib.parse import unquote, urlparse

from ascend_rl import manifest
from ascend_rl.errors import UsageError
from ascend_rl.paths import RECIPES, REPO

GIT_SOURCE = "git-source:"


def _norm(name: str) -> str:
    return name.lower().replace("_", "-")


def read_pins(constraints: Path) -> list[tuple[str, str]]:
    """The (name, version) pairs of every `name==version` line, in file order."""
    pins = []
    for raw in constraints.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if "==" in line:
            name, version = (part.strip() for part in line.split("==", 1))
            pins.append((name, version))
    return pins


def read_git_sources(constraints: Path) -> dict[str, tuple[str, str]]:
    """Normalised name -> (git URL, commit) from the `# git-source: NAME URL COMMIT` lines."""
    sources = {}
    for number, raw in enumerate(constraints.read_text().splitlines(), 1):
        text = raw.strip().lstrip("#").strip()
        if not text.startswith(GIT_SOURCE):
            continue
        fields = text[len(GIT_SOURCE) :].split()
        if len(fields) != 3 or len(fields[2]) != 40:
            raise ValueError(f"{constraints}:{number}: want '# {GIT_SOURCE} NAME URL COMMIT' (40-hex commit)")
        sources[_norm(fields[0])] = (fields[1], fields[2].lower())
    return sources


def pinned_extras(recipe: str, constraints: Path, extras: dict[str, list[str]] | None = None) -> list[str]:
    """`recipe`'s extras this constraints file pins (by version or git source), in recipe.toml's order: what the
    installer installs for it on that stack. An extra one stack does not pin (Megatron-Bridge, 0.9.1's engine's
    bridge, on the 0.6.0 / 0.7.1 stack) is not installed there, rather than installed at whatever PyPI has."""
    names = {_norm(n) for n, _ in read_pins(constraints)} | set(read_git_sources(constraints))
    return [n for n in (recipe_extras() if extras is None else extras).get(recipe, []) if _norm(n) in names]


def constrained_names(constraints: Path) -> set[str]:
    """Normalised names of every package a constraints file constrains: its pins and its bounds (`numpy>=2`)."""
    names = set()
    for raw in constraints.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        match = re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*(?:===|==|~=|!=|<=|>=|<|>)", line)
        if match:
            names.add(_norm(match.group(1)))
    return names


def requirements_under_pins(requirements: Path, constraints: Path) -> list[str]:
    """A requirements file's lines, each requirement on a package the constraints file pins or bounds reduced to
    its bare name, so that the constraint (pip -c) decides its version instead of the file's own range; the others
    as they are.
    For a git-source package's own requirements (MindSpeed's requirements.txt asks numpy<=1.26.0, which
    constraints-0.9.1.txt's stack cannot take: its comment there)."""
    pinned = constrained_names(constraints)
    out = []
    for raw in requirements.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", line)
        if name and _norm(name.group(0)) in pinned and not line.startswith("-"):
            out.append(name.group(0))
        else:
            out.append(line)
    return out


def recipe_extras(recipes: Path = RECIPES) -> dict[str, list[str]]:
    """Recipe name -> the packages its recipe.toml lists under [stack] extras (empty when none)."""
    return {
        name: list(data.get("stack", {}).get("extras", []))
        for name, data in manifest.recipe_manifests(recipes).items()
    }


def base_constraints(recipe: str, base: str | None = None) -> Path:
    """The constraints file of `recipe` on `base` (default: its default base): the base table's `constraints`
    in its recipe.toml (a path from the repository root), else constraints.txt. UsageError for an unknown
    recipe or base."""
    return REPO / manifest.load_recipe(recipe, base).constraints


def default_constraints() -> Path:
    """The constraints file of the default base: the one every recipe's default_base names (recipe.toml).
    UsageError when the recipes' default bases pin different stacks (then --recipe picks one)."""
    files = {name: manifest.load_recipe(name).constraints for name in manifest.recipe_names()}
    if len(set(files.values())) != 1:
        said = ", ".join(f"{name}: {path}" for name, path in files.items()) or "no recipe"
        raise UsageError(f"the recipes' default bases pin different stacks ({said}); name one with --recipe")
    return REPO / next(iter(files.values()))


def stacks() -> dict[str, list[str]]:
    """Constraints file (relative to the repository root) -> the verl bases it serves across the recipes, oldest
    first, each default base marked '(the default base)': what `stack --help` names."""
    served: dict[str, set[str]] = {}
    defaults = set()
    for name in manifest.recipe_names():
        for recipe in manifest.recipe_bases(name):
            served.setdefault(recipe.constraints, set()).add(recipe.version)
            if recipe.version == recipe.default:
                defaults.add(recipe.version)
    key = lambda v: tuple(int(p) if p.isdigit() else 0 for p in v.split("."))  # noqa: E731
    return {
        path: [f"{v} (the default base)" if v in defaults else v for v in sorted(bases, key=key)]
        for path, bases in sorted(served.items(), key=lambda item: [key(v) for v in item[1]], reverse=True)
    }


def select_pins(
    pins: list[tuple[str, str]], recipe: str | None, extras: dict[str, list[str]]
) -> tuple[list[tuple[str, str]], list[str]]:
    """(pins to check, names skipped): the shared pins, plus `recipe`'s extras when given."""
    every_extra = {_norm(n) for names in extras.values() for n in names}
    mine = {_norm(n) for n in extras.get(recipe, [])} if recipe else set()
    keep, skipped = [], []
    for name, version in pins:
        if _norm(name) in every_extra and _norm(name) not in mine:
            skipped.append(name)
        else:
            keep.append((name, version))
    return keep, skipped


def installed_version(name: str) -> str | None:
    """The installed distribution's version, or None when it is not installed."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def installed_commit(name: str) -> str | None:
    """The git commit an installed distribution was built from, or None when it cannot be told.

    pip records where it installed from (PEP 610 direct_url.json): `vcs_info.commit_id` for
    `pip install git+URL@REV`; only the folder for `pip install -e DIR`, whose HEAD is then read.
    """
    try:
        text = metadata.distribution(name).read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        return None
    if not text:
        return None
    record = json.loads(text)
    commit = record.get("vcs_info", {}).get("commit_id")
    if commit:
        return commit.lower()
    url = urlparse(record.get("url", ""))
    if url.scheme != "file":
        return None
    try:
        proc = subprocess.run(
            ["git", "-C", unquote(url.path), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip().lower() if proc.returncode == 0 else None


def matches(installed: str, pinned: str) -> bool:
    """True when `installed` is `pinned`, ignoring a local label on either side (+cpu)."""
    return installed.split("+", 1)[0] == pinned.split("+", 1)[0]


def check(
    pins: list[tuple[str, str]], sources: dict[str, tuple[str, str]] | None = None
) -> list[tuple[str, str, str, str]]:
    """(name, pinned, installed, status) rows; status is ok, DRIFT, MISSING, COMMIT or NO-COMMIT.

    COMMIT: a git source installed from another commit; NO-COMMIT: installed without a record
    of its commit (copied in, or from a wheel), so the pin cannot be confirmed.
    """
    sources = sources or {}
    rows = []
    for name, pinned in pins:
        got = installed_version(name)
        source = sources.get(_norm(name))
        shown = f"{pinned}@{source[1][:12]}" if source else pinned
        if got is None:
            rows.append((name, shown, "-", "MISSING"))
            continue
        status = "ok" if matches(got, pinned) else "DRIFT"
        if source:
            commit = installed_commit(name)
            got = f"{got}@{commit[:12] if commit else '?'}"
            if status == "ok" and commit is None:
                status = "NO-COMMIT"
            elif status == "ok" and commit != source[1]:
                status = "COMMIT"
        rows.append((name, shown, got, status))
    return rows
