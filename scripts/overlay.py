#!/usr/bin/env python3
"""Fetch a recipe's pinned verl tree and apply, check or revert its patch series.

    python scripts/overlay.py fetch  qwen2_5
    python scripts/overlay.py status qwen2_5 [--target DIR]
    python scripts/overlay.py apply  qwen2_5 [--target DIR] [--dry-run] [--force]
    python scripts/overlay.py revert qwen2_5 [--target DIR] [--dry-run] [--force]
    python scripts/overlay.py apply  qwen2_5 --with cpu    # the recipe's series, then patches/cpu/

An overlay (`--with NAME`, manifest patches/NAME/overlay.toml) is a series applied on top of a
recipe's, into a tree of its own (default llm_rl/<recipe>/verl-NAME/): the CPU series that tests
and the CPU launch profile need, never applied by a recipe launcher on an NPU host.

Exit status: 0 done, 1 refused or conflicting, 2 usage.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import artifacts  # noqa: E402
import patchset  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
RECIPES = REPO / "llm_rl"
OVERLAYS = REPO / "patches"
EXIT_OK, EXIT_REFUSED, EXIT_USAGE = 0, 1, 2
APPLIED, APPLICABLE, CONFLICTING = "applied", "applicable", "conflicting"


class OverlayError(Exception):
    """A refusal with a one-line message saying what is wrong and what to do."""

    exit_code = EXIT_REFUSED


class UsageError(OverlayError):
    """The command line names something that does not exist."""

    exit_code = EXIT_USAGE


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
        with open(manifest, "rb") as fh:
            data = tomllib.load(fh)
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
        with open(manifest, "rb") as fh:
            data = tomllib.load(fh)
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


def load_series(recipe: Recipe) -> list[patchset.Patch]:
    """Parse every patch of the series; a missing or corrupt one refuses the whole series."""
    patches = []
    for path in recipe.series:
        if not path.is_file():
            raise OverlayError(
                f"patch {path.relative_to(REPO)} named in the manifest of {recipe.name} is missing; restore it"
            )
        try:
            patches.append(patchset.parse(path))
        except patchset.PatchError as exc:
            raise OverlayError(f"{exc}; nothing was changed") from exc
    return patches


# --- the target tree ---------------------------------------------------------------------------


def resolve_target(recipe: Recipe, target: str | Path | None, force: bool = False) -> Path:
    """The folder holding `verl/`, checked to exist and to be the pinned version."""
    root = Path(target) if target is not None else recipe.default_target
    if not root.exists():
        if target is None:
            raise OverlayError(f"{root} does not exist; run: python scripts/overlay.py fetch {recipe.cli}")
        raise OverlayError(f"target {root} does not exist; pass the folder that contains {recipe.project}/")
    if not root.is_dir():
        raise OverlayError(f"target {root} is not a folder; pass the folder that contains {recipe.project}/")
    package = root / recipe.project
    if not package.is_dir():
        if (root / "version" / "version").is_file() and (root / "__init__.py").is_file():
            raise OverlayError(
                f"{root} is the {recipe.project} package itself; pass its parent folder as --target"
            )
        raise OverlayError(
            f"{root} holds no {recipe.project}/ package; pass a checkout, an unpacked sdist or a site-packages folder"
        )
    found = tree_version(root, recipe.project)
    if found != recipe.version and not force:
        raise OverlayError(
            f"{root} is {recipe.project} {found or 'of unknown version'}, the recipe pins {recipe.version}; "
            f"fetch the pinned tree or pass --force"
        )
    return root.resolve()


def tree_version(root: Path, project: str = "verl") -> str | None:
    """The version a verl tree declares in verl/version/version, or None."""
    try:
        return (root / project / "version" / "version").read_text().strip()
    except OSError:
        return None


class Tree:
    """An in-memory view of a folder: reads lazily, records writes, flushes them atomically."""

    def __init__(self, root: Path):
        self.root = root
        self._disk: dict[str, bytes | None] = {}
        self.now: dict[str, bytes | None] = {}

    def _path(self, rel: str) -> Path:
        full = self.root / rel
        # A symlink inside the tree could send a write outside it.
        real = full.resolve()
        if not real.is_relative_to(self.root.resolve()) or full.is_symlink():
            raise OverlayError(f"{rel} resolves outside {self.root} (symlink); refusing to patch through it")
        return full

    def _load(self, rel: str) -> None:
        if rel not in self._disk:
            full = self._path(rel)
            self._disk[rel] = full.read_bytes() if full.is_file() else None

    def get(self, rel: str) -> bytes | None:
        if rel not in self.now:
            self._load(rel)
            self.now[rel] = self._disk[rel]
        return self.now[rel]

    def set(self, rel: str, data: bytes | None) -> None:
        self.get(rel)
        self.now[rel] = data

    def snapshot(self) -> dict[str, bytes | None]:
        return dict(self.now)

    def restore(self, snap: dict[str, bytes | None]) -> None:
        for rel in snap:
            self._load(rel)
        self.now = dict(snap)

    def changes(self) -> dict[str, bytes | None]:
        return {rel: data for rel, data in self.now.items() if data != self._disk[rel]}

    def flush(self) -> list[str]:
        """Write every change; on any failure put back what was already written."""
        done: list[tuple[str, bytes | None]] = []
        made_dirs: list[Path] = []
        try:
            for rel, data in sorted(self.changes().items()):
                full = self._path(rel)
                if data is None:
                    full.unlink()
                    _prune_empty_dirs(full.parent, self.root)
                else:
                    made_dirs += _make_parents(full.parent)
                    mode = full.stat().st_mode & 0o7777 if full.exists() else 0o644
                    fd, tmp = tempfile.mkstemp(dir=full.parent, prefix=f".{full.name}.")
                    with os.fdopen(fd, "wb") as fh:
                        fh.write(data)
                    os.chmod(tmp, mode)
                    os.replace(tmp, full)
                done.append((rel, self._disk[rel]))
        except OSError as exc:
            for rel, old in reversed(done):
                full = self.root / rel
                if old is None:
                    full.unlink(missing_ok=True)
                else:
                    full.parent.mkdir(parents=True, exist_ok=True)
                    full.write_bytes(old)
            for d in reversed(made_dirs):
                _prune_empty_dirs(d, self.root)
            raise OverlayError(
                f"writing {exc.filename} failed ({exc.strerror}); the tree was put back as it was"
            ) from exc
        return [rel for rel, _ in done]


def _make_parents(folder: Path) -> list[Path]:
    made = []
    for parent in reversed([folder, *folder.parents]):
        if not parent.exists():
            parent.mkdir()
            made.append(parent)
    return made


def _prune_empty_dirs(folder: Path, root: Path) -> None:
    while folder != root and folder.is_relative_to(root) and folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()
        folder = folder.parent


# --- series logic --------------------------------------------------------------------------------


def _apply_patch(tree: Tree, patch: patchset.Patch) -> None:
    """Apply one patch to the in-memory tree or raise HunkConflict, leaving the tree unchanged."""
    staged = {fp.path: patchset.apply_file(fp, tree.get(fp.path)) for fp in patch.files}
    for rel, data in staged.items():
        tree.set(rel, data)


def _try(tree: Tree, patch: patchset.Patch) -> patchset.HunkConflict | None:
    snap = tree.snapshot()
    try:
        _apply_patch(tree, patch)
        return None
    except patchset.HunkConflict as exc:
        return exc
    finally:
        tree.restore(snap)


@dataclass
class PatchState:
    """Where one patch of the series stands on a tree."""

    patch: patchset.Patch
    state: str
    detail: str = ""


def plan(recipe: Recipe, root: Path) -> tuple[list[PatchState], Tree, Tree]:
    """Classify each patch; return the states, the tree with all applicable patches on, and the bare tree."""
    patches = load_series(recipe)
    # Walk back from the top: a patch counts as applied when it comes off cleanly
    # and would not go on again; peel it off to see the ones beneath it.
    base = Tree(root)
    applied: set[int] = set()
    ambiguous: set[int] = set()
    for idx in range(len(patches) - 1, -1, -1):
        patch = patches[idx]
        if _try(base, patch.reversed()) is None:
            if _try(base, patch) is None:
                ambiguous.add(idx)
            else:
                _apply_patch(base, patch.reversed())
                applied.add(idx)
    # Walk forward from the bare tree, putting each patch (back) on in series order.
    full = Tree(root)
    full.restore(base.snapshot())
    states = []
    for idx, patch in enumerate(patches):
        if idx in ambiguous:
            states.append(
                PatchState(
                    patch, CONFLICTING, "it applies both forward and in reverse; check the tree by hand"
                )
            )
            continue
        conflict = _try(full, patch)
        if conflict is None:
            _apply_patch(full, patch)
            states.append(PatchState(patch, APPLIED if idx in applied else APPLICABLE))
        else:
            states.append(PatchState(patch, CONFLICTING, str(conflict)))
    return states, full, base


def series_status(recipe: Recipe, target: str | Path | None = None, force: bool = False) -> list[PatchState]:
    """Each patch: applied, applicable or conflicting (with the file and hunk)."""
    root = resolve_target(recipe, target, force)
    states, _, _ = plan(recipe, root)
    return states


def apply_series(
    recipe: Recipe, target: str | Path | None = None, dry_run: bool = False, force: bool = False
) -> list[PatchState]:
    """Apply every patch not yet applied; all or nothing. Returns the states before applying."""
    root = resolve_target(recipe, target, force)
    states, full, _ = plan(recipe, root)
    bad = [s for s in states if s.state == CONFLICTING]
    if bad:
        raise OverlayError(f"{bad[0].patch.name} does not apply: {bad[0].detail}; nothing was changed")
    if not dry_run:
        full.flush()
    return states


def revert_series(
    recipe: Recipe, target: str | Path | None = None, dry_run: bool = False, force: bool = False
) -> list[PatchState]:
    """Take every applied patch back off, last first; all or nothing. Returns the states before."""
    root = resolve_target(recipe, target, force)
    states, _, base = plan(recipe, root)
    if not dry_run:
        base.flush()
    return states


# --- fetch -----------------------------------------------------------------------------------------


def fetch(
    recipe: Recipe, source: str = "auto", dest: Path | None = None, log: Callable[[str], None] = print
) -> Path:
    """Materialise the pinned tree at `dest` (default llm_rl/<recipe>/verl) from git or the sdist."""
    dest = Path(dest) if dest else recipe.default_target
    if dest.exists():
        found = tree_version(dest, recipe.project)
        if found != recipe.version:
            raise OverlayError(
                f"{dest} exists but holds {recipe.project} {found or 'of unknown version'}; move it away and fetch again"
            )
        log(f"{dest} already holds {recipe.project} {recipe.version}; nothing to fetch")
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    errors = []
    if source in ("auto", "git"):
        try:
            return _fetch_git(recipe, dest, log)
        except OverlayError as exc:
            if source == "git" or "commit" in str(exc):
                raise
            errors.append(str(exc))
            log(f"git clone failed ({exc}); falling back to the source distribution")
    try:
        archive = artifacts.verl_sdist(recipe.version, recipe.sdist_sha256)
    except artifacts.ChecksumError as exc:
        raise OverlayError(str(exc)) from exc
    except artifacts.DownloadError as exc:
        raise OverlayError(f"{exc}; or copy {recipe.sdist} into {artifacts.cache_dir()}") from exc
    log(f"verified {archive.name} sha256 {recipe.sdist_sha256[:12]}...; unpacking")
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=f".{dest.name}-") as tmp:
        unpacked = artifacts.unpack_sdist(archive, Path(tmp) / "tree")
        os.replace(unpacked, dest)
    log(f"fetched {recipe.project} {recipe.version} (source distribution) into {dest}")
    return dest


def _fetch_git(recipe: Recipe, dest: Path, log: Callable[[str], None]) -> Path:
    if shutil.which("git") is None:
        raise OverlayError("git is not installed")
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=f".{dest.name}-") as tmp:
        clone = Path(tmp) / "tree"
        cmd = ["git", "clone", "--quiet", "--depth", "1", "--branch", recipe.tag, recipe.git_url, str(clone)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        except subprocess.TimeoutExpired as exc:
            raise OverlayError(f"git clone of {recipe.git_url} timed out") from exc
        if proc.returncode != 0:
            lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
            raise OverlayError(lines[-1].strip() if lines else f"git exited {proc.returncode}")
        head = subprocess.run(["git", "-C", str(clone), "rev-parse", "HEAD"], capture_output=True, text=True)
        commit = head.stdout.strip()
        if commit != recipe.commit:
            raise OverlayError(
                f"tag {recipe.tag} of {recipe.git_url} is commit {commit}, the manifest pins {recipe.commit}; refusing"
            )
        os.replace(clone, dest)
    log(f"fetched {recipe.project} {recipe.tag} (commit {recipe.commit[:12]}) into {dest}")
    return dest


# --- command line ----------------------------------------------------------------------------------


def _print_states(states: list[PatchState], root: Path) -> None:
    for st in states:
        rel = st.patch.source.relative_to(REPO) if st.patch.source.is_relative_to(REPO) else st.patch.source
        line = f"  {st.state:<11} {rel}"
        print(line + (f"\n              {st.detail}" if st.detail else ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="overlay.py",
        description="Fetch a recipe's pinned verl tree and apply, check or revert its patch series.",
        epilog="Exit status: 0 done, 1 refused or conflicting, 2 usage.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p_fetch = sub.add_parser("fetch", help="materialise the pinned tree at llm_rl/<recipe>/verl/")
    p_fetch.add_argument(
        "--source",
        choices=("auto", "git", "sdist"),
        default="auto",
        help="git clone at the tag, the pip source distribution, or git then sdist (default)",
    )
    p_fetch.add_argument("--dest", help="fetch into this folder instead of llm_rl/<recipe>/verl/")
    p_fetch.add_argument("--dry-run", action="store_true", help="say what would be fetched, change nothing")
    for name, text in (
        ("status", "show each patch as applied / applicable / conflicting"),
        ("apply", "apply the series (atomic, idempotent)"),
        ("revert", "take the series back off, last patch first"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument("--target", help="a folder holding verl/ (checkout, unpacked sdist, site-packages)")
        p.add_argument("--force", action="store_true", help="accept a tree of another verl version")
        if name != "status":
            p.add_argument("--dry-run", action="store_true", help="check everything, change nothing")
    p_list = sub.add_parser("list", help="list the recipes and their series")
    p_list.set_defaults(recipe=None)
    for p in (p_fetch, *[sub.choices[n] for n in ("status", "apply", "revert")]):
        p.add_argument("recipe", help=f"recipe name ({', '.join(recipe_names())}) or folder")
        p.add_argument(
            "--with",
            dest="overlay",
            metavar="OVERLAY",
            help=f"also the series of patches/OVERLAY/ on top ({', '.join(overlay_names()) or 'none'}); "
            "default tree llm_rl/<recipe>/verl-OVERLAY/",
        )
    args = parser.parse_args(argv)
    try:
        return _run(args)
    except OverlayError as exc:
        print(f"overlay: error: {exc}", file=sys.stderr)
        return exc.exit_code


def _run(args: argparse.Namespace) -> int:
    if args.command == "list":
        for name in recipe_names():
            recipe = load_recipe(name)
            print(f"{name}: {recipe.project} {recipe.version}, {len(recipe.series)} patches")
        for name in overlay_names():
            print(f"--with {name}: patches/{name}/overlay.toml (on top of a recipe's series)")
        return EXIT_OK
    recipe = load_recipe(args.recipe)
    if args.overlay:
        recipe = with_overlay(recipe, args.overlay)
    if args.command == "fetch":
        dest = Path(args.dest) if args.dest else recipe.default_target
        if args.dry_run:
            state = f"exists ({tree_version(dest, recipe.project)})" if dest.exists() else "absent"
            print(f"would fetch {recipe.project} {recipe.version} ({args.source}) into {dest} [{state}]")
            return EXIT_OK
        fetch(recipe, args.source, dest)
        return EXIT_OK
    root = resolve_target(recipe, args.target, args.force)
    if args.command == "status":
        states, _, _ = plan(recipe, root)
        print(f"{recipe.name}: {len(states)} patches on {root} ({recipe.project} {tree_version(root)})")
        _print_states(states, root)
        return EXIT_REFUSED if any(s.state == CONFLICTING for s in states) else EXIT_OK
    dry = " (dry run: nothing written)" if args.dry_run else ""
    if args.command == "apply":
        states = apply_series(recipe, root, args.dry_run, args.force)
        todo = [s for s in states if s.state == APPLICABLE]
        if not todo:
            print(f"{recipe.name}: all {len(states)} patches already applied on {root}; nothing to do")
        else:
            for s in todo:
                print(f"  apply   {s.patch.name}")
            print(f"{recipe.name}: applied {len(todo)} of {len(states)} patches on {root}{dry}")
        return EXIT_OK
    states = revert_series(recipe, root, args.dry_run, args.force)
    done = [s for s in reversed(states) if s.state == APPLIED]
    if not done:
        print(f"{recipe.name}: no patch of the series is applied on {root}; nothing to revert")
    else:
        for s in done:
            print(f"  revert  {s.patch.name}")
        print(f"{recipe.name}: reverted {len(done)} of {len(states)} patches on {root}{dry}")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
