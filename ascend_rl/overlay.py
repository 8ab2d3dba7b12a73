"""A recipe's patch series on a verl tree: plan, apply, revert and status, atomic and idempotent; fetching
the pinned tree (git at the tag, or the sha256-checked sdist).

Every operation holds the tree's lock and writes through its journal (ascend_rl/journal.py), so one
killed at any point is finished by the next apply or revert. An overlay (patches/NAME/overlay.toml) is
a series applied on top of a recipe's, into a tree of its own (llm_rl/<recipe>/verl-NAME/). The command
around this is ascend_rl/cli/overlay.py (`python3 -m ascend_rl overlay --help`).
"""

from __future__ import annotations

import csv
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ascend_rl import artifacts, diagnose, locks, patchset, trees
from ascend_rl.errors import OverlayError, UsageError
from ascend_rl.journal import (
    DEFAULT_WAIT,
    TXN_NAME,
    TXN_PREP,
    Pending,
    _Change,
    _commit,
    _inside,
    _prune_empty_dirs,
    _Steps,
    leftovers,
    read_pending,
    recover,
    tree_lock,
)
from ascend_rl.manifest import Recipe, load_recipe, overlay_names, recipe_bases, recipe_names, with_overlay
from ascend_rl.paths import RECIPES, REPO

APPLIED, APPLICABLE, CONFLICTING = "applied", "applicable", "conflicting"
EDITED, CARRIED = "edited", "carried"  # applied then edited by hand; a fix the tree already has
BLOCKED = (CONFLICTING, EDITED, CARRIED)  # a patch in one of these stops an apply or a revert


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
    """The folder holding `verl/`, checked to exist and to be the recipe's base (by its version file;
    a tree of another version is named by what it is, from patches/trees.toml, and refused)."""
    root = Path(target) if target is not None else recipe.default_target
    if not root.exists():
        if target is None:
            raise OverlayError(f"{root} does not exist; run: python -m ascend_rl overlay fetch {recipe.cli}")
        raise OverlayError(f"target {root} does not exist; pass the folder that contains {recipe.project}/")
    if not root.is_dir():
        raise OverlayError(f"target {root} is not a folder; pass the folder that contains {recipe.project}/")
    package = root / recipe.project
    if not package.is_dir():
        if (root / "version" / "version").is_file() and (root / "__init__.py").is_file():
            raise OverlayError(
                f"{root} is the {recipe.project} package itself; pass its parent folder as --target"
            )
        if (left := find_leftovers(recipe, root.resolve())) is not None:
            raise OverlayError(left.line(recipe))
        raise OverlayError(
            f"{root} holds no {recipe.project}/ package; pass a checkout, an unpacked sdist or a site-packages folder"
        )
    found = tree_version(root, recipe.project)
    if found != recipe.version and not force:
        # the package was uninstalled, the modules the series added not
        if found is None and (left := find_leftovers(recipe, root.resolve())) is not None:
            raise OverlayError(left.line(recipe))
        raise OverlayError(wrong_tree(recipe, root, found))
    return root.resolve()


def wrong_tree(recipe: Recipe, root: Path, found: str | None) -> str:
    """One line: what the tree at `root` is (by version and content) and what to do with it."""
    what = f"{recipe.project} {found or 'of unknown version'}"
    match = trees.identify(trees.disk_reader(root), found)
    if match is not None and match.exact:
        what = match.tree.label
    elif match is not None:
        what += f" (like {match.tree.label} in {match.same} of {match.total} files the series touch)"
    others = [b for b in recipe.bases if b != recipe.version]
    if found in others:
        return (
            f"{root} is {what}, a base of {recipe.name}, which is on {recipe.version} here: "
            f"pass --base {found} (launchers: VERL_BASE={found})"
        )
    if match is not None and not match.tree.base and match.same >= 0.75 * match.total:
        return f"{root} is {what}; " + match.tree.advice.format(recipe=recipe.recipe)
    bases = ", ".join(recipe.bases or (recipe.version,))
    return (
        f"{root} is {what}, not a base of {recipe.name} (its bases: {bases}); fetch one "
        f"(python -m ascend_rl overlay fetch {recipe.recipe} --base {recipe.version}) or pass --force "
        f"to try the {recipe.version} series on it (`status --force` shows patch by patch what it carries)"
    )


def installed_note(root: Path, project: str = "verl") -> str | None:
    """For a pip-installed tree (a site-packages folder, or one with the project's .dist-info): a line
    saying that reinstalling the package replaces the patched files."""
    if root.name.endswith("-packages") or any(root.glob(f"{project}-*.dist-info")):
        return (
            f"{root} holds a pip-installed {project}: reinstalling {project} (or a package that pulls it in) "
            f"drops the patches but leaves the modules they added, which `overlay clean` then removes; "
            f"run `overlay status` after any pip install there"
        )
    return None


def pip_advice(recipe: Recipe, root: Path, states: list[PatchState]) -> None:
    """On a pip-installed tree, a blocked patch's next step is a reinstall of the package, not a fetch (a
    site-packages folder is not fetched): rewritten in place."""
    if installed_note(root, recipe.project) is None:
        return
    pin = f"{recipe.project}=={recipe.version}"
    for st in states:
        if st.state in BLOCKED and "overlay fetch" in st.next_step:
            st.next_step = (
                f"a pip-installed tree: reinstall {recipe.project} (pip install --force-reinstall --no-deps {pin}), "
                f"then `overlay status` again"
            )


# --- what an earlier apply left behind -------------------------------------------------------------
#
# pip uninstalls (and reinstalls) by its RECORD: the files the series changed are replaced, the modules it added
# (`Installs:`) are not pip's and stay. Those are recognised by path and content: a file where a series of this
# repository installs one, byte for byte what it installs there, in a tree whose package is gone or, with those
# files set aside, takes the series whole (every patch applicable: the package is as released). Only such files
# are removed (`overlay clean`), with their bytecode; a file at such a path with other content is kept and named.


def _sha256(data: bytes | None) -> str:
    return hashlib.sha256(data or b"").hexdigest()


_INSTALLED: dict[str, set[str]] | None = None


def installed_by_series() -> dict[str, set[str]]:
    """Each file a series of this repository adds to a tree (every recipe on every base, with and without each
    overlay), with the sha256 of every content it puts there."""
    global _INSTALLED
    if _INSTALLED is not None:
        return _INSTALLED
    paths: set[Path] = set()
    for name in recipe_names():
        for recipe in recipe_bases(name):
            paths.update(recipe.series)
            for extra in overlay_names():
                try:
                    paths.update(with_overlay(recipe, extra).series)
                except (OverlayError, UsageError):
                    continue
    known: dict[str, set[str]] = {}
    for path in sorted(paths):
        try:
            patch = patchset.parse(path)
        except patchset.PatchError:
            continue  # refused, naming it, by the command that loads its series
        for fp in patch.files:
            if fp.old_path is None:
                known.setdefault(fp.path, set()).add(_sha256(patchset.apply_file(fp, None)))
    _INSTALLED = known
    return known


def pip_owned(root: Path, project: str = "verl") -> set[str]:
    """The paths pip's RECORDs in `root` list for the project (its files; never an overlay's leftover)."""
    owned: set[str] = set()
    for record in root.glob(f"{project}-*.dist-info/RECORD"):
        try:
            rows = list(csv.reader(record.read_text(errors="replace").splitlines()))
        except (OSError, csv.Error):
            continue
        owned.update(row[0].strip() for row in rows if row)
    return owned


@dataclass
class Leftovers:
    """The modules an earlier apply added that are left in a tree whose package was uninstalled or reinstalled."""

    root: Path
    project: str
    absent: bool  # the package is gone (uninstalled); else it is as released (reinstalled)
    files: list[str]  # byte for byte what a series installs there: `overlay clean` removes them
    caches: list[str]  # their bytecode (__pycache__), removed with them
    kept: list[str]  # at such a path but with other content: never removed

    def line(self, recipe: Recipe) -> str:
        """One line: what is left, what removes it and what comes next."""
        n, files = len(self.files), self.files
        shown = ", ".join(files[:3]) + (f" and {n - 3} more" if n > 3 else "")
        if self.absent:
            what = (
                f"{self.root} holds no {self.project}, only {n} modules an earlier `overlay apply` installed, "
                f"left when {self.project} was uninstalled"
            )
            then = f"then install {self.project} ({self.project}=={recipe.version}) and apply"
        else:
            what = (
                f"{n} modules an earlier `overlay apply` installed are left in a reinstalled {self.project}"
            )
            then = "then apply"
        kept = (
            f"; {len(self.kept)} more at such paths hold other content ({self.kept[0]}): check and move them away"
            if self.kept
            else ""
        )
        return (
            f"{what} ({shown}): `python3 -m ascend_rl overlay clean {recipe.cli} --target {self.root}` removes "
            f"them (--dry-run lists them), {then}{kept}"
        )


def find_leftovers(
    recipe: Recipe, root: Path, view: dict[str, bytes | None] | None = None
) -> Leftovers | None:
    """The modules an earlier apply added that the tree at `root` still holds while its package is gone, or as
    released once they are set aside; None when there are none, or an interrupted write is pending (its journal
    decides first). Call with the lock held, or read-only."""
    if view is not None or (root / TXN_NAME).exists() or (root / TXN_PREP).exists():
        return None
    owned = pip_owned(root, recipe.project)
    ours: list[str] = []
    kept: list[str] = []
    for rel, shas in sorted(installed_by_series().items()):
        full = root / rel
        if rel in owned or full.is_symlink() or not full.is_file() or not full.resolve().is_relative_to(root):
            continue
        (ours if _sha256(full.read_bytes()) in shas else kept).append(rel)
    if not ours:
        return None
    caches = sorted(
        cached.relative_to(root).as_posix()
        for rel in ours
        if rel.endswith(".py")
        for cached in (root / rel).parent.glob(f"__pycache__/{Path(rel).stem}.*.pyc")
        if cached.is_file() and not cached.is_symlink()
    )
    aside = {*ours, *kept, *caches}
    package = root / recipe.project
    rest = package.is_dir() and any(
        p.relative_to(root).as_posix() not in aside for p in package.rglob("*") if not p.is_dir()
    )
    absent = not rest and not installed_versions(root, recipe.project)
    if not absent:
        if tree_version(root, recipe.project) != recipe.version:
            return None
        states = plan(recipe, root, dict.fromkeys([*ours, *kept]))[0]
        if any(st.state != APPLICABLE for st in states):
            return None
    return Leftovers(root, recipe.project, absent, ours, caches, kept)


def leftovers_of(recipe: Recipe, root: Path, wait: float = DEFAULT_WAIT) -> Leftovers | None:
    """find_leftovers under the tree's lock (read-only: a tree that cannot be locked is read without it)."""
    with tree_lock(root, wait, required=False):
        return find_leftovers(recipe, root)


def clean_leftovers(
    recipe: Recipe,
    target: str | Path | None = None,
    dry_run: bool = False,
    wait: float = DEFAULT_WAIT,
    log: Callable[[str], None] = print,
) -> Leftovers | None:
    """Remove the modules an earlier apply left in a tree whose package was uninstalled or reinstalled (and their
    bytecode), through the journal; None when there are none. Nothing else is removed."""
    root = Path(target) if target is not None else recipe.default_target
    if not root.is_dir():
        raise OverlayError(f"target {root} is not a folder; pass the folder that contains {recipe.project}/")
    root = root.resolve()
    with tree_lock(root, wait, required=not dry_run):
        if _begin(root, dry_run, _Steps(), log) is not None:
            return None  # an interrupted write is finished first; what it leaves is looked at then
        found = find_leftovers(recipe, root)
        version = tree_version(root, recipe.project)
        if found is None and version != recipe.version and (root / recipe.project).is_dir():
            paths = installed_by_series()
            if any(
                p.relative_to(root).as_posix() not in paths
                for p in (root / recipe.project).rglob("*")
                if not p.is_dir() and p.parent.name != "__pycache__"
            ):
                raise OverlayError(wrong_tree(recipe, root, version))
        if found is None:
            return None
        if not dry_run:
            for rel in found.caches:  # first: a kill before the journal leaves the modules to name them again
                cached = _inside(root, rel)
                cached.unlink(missing_ok=True)
                _prune_empty_dirs(cached.parent, root)
            tree = Tree(root)
            for rel in found.files:
                tree.set(rel, None)
            tree.flush("clean", f"the leftovers of {recipe.name}")
    return found


def tree_version(root: Path, project: str = "verl") -> str | None:
    """The version a verl tree declares in verl/version/version, or None."""
    try:
        return (root / project / "version" / "version").read_text().strip()
    except OSError:
        return None


def installed_versions(root: Path, project: str = "verl") -> list[str]:
    """The versions pip's records in `root` give the project (its `<project>-VERSION.dist-info` folders)."""
    prefix, suffix = f"{project}-", ".dist-info"
    return sorted(p.name[len(prefix) : -len(suffix)] for p in root.glob(f"{prefix}*{suffix}") if p.is_dir())


def place(recipe: Recipe, target: str | Path) -> tuple[str | None, str]:
    """Which base of the recipe the tree at `target` is, for a command given no --base: (version, the
    line that says so) when its version file names another base of the recipe (and, in a pip-installed
    tree, pip's record agrees); (None, "") when the recipe's base stands (the tree is on it, or is no
    base, which resolve_target refuses). A pip-installed tree whose version is ambiguous is refused."""
    root = Path(target)
    found = tree_version(root, recipe.project)
    if found is None or found == recipe.version or found not in recipe.bases:
        return None, ""
    recorded = installed_versions(root, recipe.project)
    if recorded and recorded != [found]:
        records = ", ".join(f"{recipe.project}-{v}.dist-info" for v in recorded)
        raise OverlayError(
            f"{root} reads {recipe.project} {found} ({recipe.project}/version/version) but pip's records there "
            f"say {records}: reinstall {recipe.project}, or pass --base to say which series to use"
        )
    how = " (pip-installed)" if recorded else ""
    return found, f"the tree is {recipe.project} {found}{how}, a base of {recipe.recipe}: using its series"


class Tree:
    """An in-memory view of a folder: reads lazily, records writes, commits them crash-safely.

    `view` overrides what the disk holds for some files (what an interrupted command's
    journal will put there), so a dry run or `status` can plan on the tree as it will be.
    """

    def __init__(self, root: Path, view: dict[str, bytes | None] | None = None):
        self.root = root
        self.view = view or {}
        self._disk: dict[str, bytes | None] = {}
        self.now: dict[str, bytes | None] = {}

    def _path(self, rel: str) -> Path:
        return _inside(self.root, rel)

    def _load(self, rel: str) -> None:
        if rel not in self._disk:
            full = self._path(rel)
            if rel in self.view:
                self._disk[rel] = self.view[rel]
            else:
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

    def flush(self, op: str = "apply", series: str = "", steps: _Steps | None = None) -> list[str]:
        """Write every change through a journal (see `_commit`); returns the paths changed."""
        if self.view:
            raise RuntimeError("a Tree planned on a journal's view cannot be flushed; recover first")
        changes = []
        for rel, data in sorted(self.changes().items()):
            full = self._path(rel)
            mode = full.stat().st_mode & 0o7777 if full.is_file() else None
            changes.append(_Change(rel, self._disk[rel], data, mode))
        _commit(self.root, changes, op, series, steps or _Steps())
        return [ch.rel for ch in changes]


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
    detail: str = ""  # why it does not go on (conflicting)
    off_detail: str = ""  # why it does not come off (conflicting): the file and hunk a revert names
    lines: list[str] | None = None  # the lines the patch expects against those found (unified view)
    next_step: str = ""

    def refusal(self, verb: str) -> str:
        """One line: why this patch stops an apply or revert, and what to do."""
        if self.state == EDITED:
            return f"{self.patch.name} was applied, then edited: {self.detail}; {self.next_step}"
        if self.state == CARRIED:
            return f"{self.patch.name} is not needed: {self.detail}; {self.next_step}"
        where = self.detail if verb == "apply" else self.off_detail
        return f"{self.patch.name} does not {'apply' if verb == 'apply' else 'come off'}: {where}"


def plan(
    recipe: Recipe, root: Path, view: dict[str, bytes | None] | None = None
) -> tuple[list[PatchState], Tree, Tree]:
    """Classify each patch; return the states, the tree with all applicable patches on, and the bare tree."""
    patches = load_series(recipe)
    own_base = tree_version(root, recipe.project) == recipe.version
    # Walk back from the top: a patch counts as applied when it comes off cleanly
    # and would not go on again; peel it off to see the ones beneath it. On the series'
    # own base, a patch that comes off only once the regions it changed are read as it
    # has them was applied, then edited by hand: it is peeled too, keeping the edits to
    # its context lines, so a patch beneath whose lines were edited is named as well.
    base = Tree(root, view)
    applied: set[int] = set()
    ambiguous: set[int] = set()
    edited: dict[int, diagnose.Tolerated] = {}
    stuck: dict[int, patchset.HunkConflict] = {}
    for idx in range(len(patches) - 1, -1, -1):
        patch = patches[idx]
        off = _try(base, patch.reversed())
        if off is None:
            if _try(base, patch) is None:
                ambiguous.add(idx)
            else:
                _apply_patch(base, patch.reversed())
                applied.add(idx)
            continue
        stuck[idx] = off
        if own_base and (taken := diagnose.tolerate(patch.reversed(), base.get)) is not None:
            for rel, data in taken.contents.items():
                base.set(rel, data)
            edited[idx] = taken
    # Walk forward from the bare tree, putting each patch (back) on in series order.
    full = Tree(root, view)
    full.restore(base.snapshot())
    states = []
    for idx, patch in enumerate(patches):
        if idx in ambiguous:
            why = "it applies both forward and in reverse; check the tree by hand"
            states.append(PatchState(patch, CONFLICTING, why, why))
            continue
        if idx in edited:
            found = diagnose.edited(patch, edited[idx])
            states.append(PatchState(patch, EDITED, found.where, found.where, found.lines, found.next_step))
            again = diagnose.tolerate(patch, full.get, check=False)  # as on the tree, for the ones above
            for rel, data in (again.contents if again else {}).items():
                full.set(rel, data)
            continue
        conflict = _try(full, patch)
        if conflict is None:
            _apply_patch(full, patch)
            states.append(PatchState(patch, APPLIED if idx in applied else APPLICABLE))
            continue
        state = PatchState(patch, CONFLICTING, str(conflict), str(stuck.get(idx, conflict)))
        found = diagnose.diagnose(patch, full.get, upstream_evidence(recipe, root, patch), own_base)
        state.lines, state.next_step = found.lines, found.next_step
        state.detail = found.where
        if found.kind == diagnose.CARRIED:
            state.state = CARRIED
        states.append(state)
    return states, full, base


def upstream_evidence(recipe: Recipe, root: Path, patch: patchset.Patch) -> str:
    """When the tree is another base of the recipe and that base retired this patch: the evidence."""
    ident = patchset.patch_id(patch.source)
    found = tree_version(root, recipe.project)
    if not ident or found == recipe.version or found not in recipe.bases:
        return ""
    try:
        other = load_recipe(recipe.recipe, found)
    except OverlayError:
        return ""
    return other.retired.get(ident, "")


def _begin(
    root: Path, dry_run: bool, steps: _Steps, log: Callable[[str], None]
) -> dict[str, bytes | None] | None:
    """With the lock held: finish an interrupted write, or (dry run) the view of the tree once finished."""
    if not dry_run:
        recover(root, steps, log)
        return None
    if note := leftovers(root):
        log(f"{note}; a real run removes them")
    pending = read_pending(root)
    if pending is None:
        return None
    if pending.foreign:
        raise OverlayError(pending.summary(refusing=True))
    log(pending.summary().replace("the next apply or revert on this tree", "a real run"))
    return pending.view


def inspect_tree(
    recipe: Recipe, root: Path, wait: float = DEFAULT_WAIT, log: Callable[[str], None] | None = None
) -> tuple[list[PatchState], Pending | None]:
    """The states of the series on the tree as it will be once any interrupted write is finished."""
    with tree_lock(root, wait, required=False, log=log):
        pending = read_pending(root)
        states, _, _ = plan(recipe, root, pending.view if pending else None)
    return states, pending


def content_note(recipe: Recipe, root: Path, wait: float = DEFAULT_WAIT) -> str | None:
    """When the tree reads the base's version but, with the series peeled off, its files differ from that
    release's (patches/trees.toml): a line saying how many and which first (a checkout between releases, or
    local edits). None when they match or the base is not recorded."""
    known = {t.key: t for t in trees.load_known()}.get(recipe.version)
    if known is None or tree_version(root, recipe.project) != recipe.version:
        return None
    with tree_lock(root, wait, required=False):
        pending = read_pending(root)
        _, _, bare = plan(recipe, root, pending.view if pending else None)
    touched = sorted({fp.path for path in recipe.series for fp in patchset.parse(path).files})
    match = trees.compare(known, bare.get, touched)
    if match.exact or not match.total:
        return None
    return (
        f"with the series taken off, {len(match.differing)} of the {match.total} files it touches differ from "
        f"{known.label} (first: {match.differing[0]}): local edits or a checkout between releases"
    )


def series_status(
    recipe: Recipe, target: str | Path | None = None, force: bool = False, wait: float = DEFAULT_WAIT
) -> list[PatchState]:
    """Each patch: applied, applicable or conflicting (with the file and hunk)."""
    root = resolve_target(recipe, target, force)
    return inspect_tree(recipe, root, wait)[0]


def apply_series(
    recipe: Recipe,
    target: str | Path | None = None,
    dry_run: bool = False,
    force: bool = False,
    wait: float = DEFAULT_WAIT,
    log: Callable[[str], None] = print,
) -> list[PatchState]:
    """Apply every patch not yet applied; all or nothing. Returns the states before applying."""
    return _change_series("apply", recipe, target, dry_run, force, wait, log)


def revert_series(
    recipe: Recipe,
    target: str | Path | None = None,
    dry_run: bool = False,
    force: bool = False,
    wait: float = DEFAULT_WAIT,
    log: Callable[[str], None] = print,
) -> list[PatchState]:
    """Take every applied patch back off, last first; all or nothing. Returns the states before."""
    return _change_series("revert", recipe, target, dry_run, force, wait, log)


def _change_series(
    op: str,
    recipe: Recipe,
    target: str | Path | None,
    dry_run: bool,
    force: bool,
    wait: float,
    log: Callable[[str], None],
) -> list[PatchState]:
    root = resolve_target(recipe, target, force)
    steps = _Steps()
    with tree_lock(root, wait, required=not dry_run):
        view = _begin(root, dry_run, steps, log)
        states, full, base = plan(recipe, root, view)
        # Every patch must go on (or come off) before one byte changes. A revert names the
        # topmost patch that does not come off, with the file and hunk where the tree differs;
        # first, a series stacked on this one (another recipe's, an overlay's) that it would
        # leave on a base without the patches beneath it, or that keeps a patch from coming off.
        bad = [s for s in states if s.state in BLOCKED]
        if bad and (left := find_leftovers(recipe, root, view)) is not None:
            raise OverlayError(f"{left.line(recipe)}; nothing was changed")
        if (
            op == "revert"
            and all(s.state == CONFLICTING for s in bad)
            and (above := series_on_top(recipe, root, states, view))
        ):
            raise OverlayError(f"{above}; nothing was changed")
        if bad and op == "apply":
            see = ""
            if bad[0].state == CONFLICTING:  # the others' lines say what to do; this one where to look
                status = f"python3 -m ascend_rl overlay status {command_name(recipe)} --target {root}"
                see = f" ({status} shows each patch's state)"
            raise OverlayError(f"{bad[0].refusal('apply')}; nothing was changed{see}")
        if bad:
            tail = (
                ""
                if bad[-1].state != CONFLICTING
                else ("; restore those lines as the patch has them, or fix the tree by hand")
            )
            raise OverlayError(f"{bad[-1].refusal('revert')}{tail}; nothing was changed")
        if not dry_run:
            label = f"{recipe.name} on {recipe.project} {recipe.version}"  # the journal knows the base
            (full if op == "apply" else base).flush(op, label, steps)
    return states


@dataclass
class Prepared:
    """What `prepare` did to a tree: how the tree came to be there, and what the apply said (its closing line last)."""

    how: str  # "" (the tree was there), "fetched" or "rebuilt"
    said: list[str]


def prepare(
    recipe: Recipe, target: Path, *, disposable: bool = False, log: Callable[[str], None] = print
) -> Prepared:
    """A launch's tree made ready, as `overlay apply --fetch` makes it: the pinned tree fetched into `target` when it
    holds no package, then the series applied (a no-op when applied); what fetch and apply say is returned, not
    logged. A `disposable` tree (an overlay's own: nothing but the series) that no longer takes the series (a patch
    changed since it was built) is removed and built again, said through `log`, under a lock beside it so two
    launches do not rebuild it at once; any other tree is the user's: the refusal is raised, nothing is removed.
    OverlayError names the step that refused as the overlay command that does it."""
    if not disposable:
        return _prepare(recipe, target)
    target.parent.mkdir(parents=True, exist_ok=True)
    with locks.exclusive(target.parent / f".{target.name}.lock"):
        try:
            return _prepare(recipe, target)
        except OverlayError as exc:
            if not (target / recipe.project / "__init__.py").is_file():
                raise
            log(f"{target} does not take the series any more ({exc}); rebuilding it")
            shutil.rmtree(target)
            return _prepare(recipe, target, "rebuilt")


def _prepare(recipe: Recipe, target: Path, how: str = "fetched") -> Prepared:
    named = f"{recipe.name.replace('+', ' --with ')} --base {recipe.version}"
    said: list[str] = []
    fetched = ""
    if not (target / recipe.project / "__init__.py").is_file():
        try:
            fetch(recipe, "auto", target, log=said.append)
        except OverlayError as exc:
            raise OverlayError(f"overlay fetch {named} on {target} failed: overlay: error: {exc}") from exc
        fetched = how
    try:
        root = resolve_target(recipe, target)
        states = apply_checked(recipe, root, log=said.append)
    except OverlayError as exc:
        raise OverlayError(f"overlay apply {named} on {target} failed: overlay: error: {exc}") from exc
    return Prepared(fetched, said + apply_summary(recipe, root, states))


# --- fetch -----------------------------------------------------------------------------------------


def materialise(
    recipe: Recipe, dest: Path, *, patched: bool = True, log: Callable[[str], None] = print
) -> Path:
    """A fresh, throw-away tree at `dest` (replaced if present): the pinned sdist (sha256-checked) unpacked,
    with the recipe's series applied unless patched=False. artifacts.DownloadError when it cannot be had."""
    sdist = artifacts.verl_sdist(recipe.version, recipe.sdist_sha256)
    shutil.rmtree(dest, ignore_errors=True)
    artifacts.unpack_sdist(sdist, dest)
    if patched:
        apply_series(recipe, dest, log=log)
    return dest


def fetch(
    recipe: Recipe, source: str = "auto", dest: Path | None = None, log: Callable[[str], None] = print
) -> Path:
    """Materialise the pinned tree at `dest` (default llm_rl/<recipe>/verl) from git or the sdist."""
    dest = Path(dest) if dest else recipe.default_target
    if dest.exists():
        found = tree_version(dest, recipe.project)
        if found != recipe.version:
            raise OverlayError(
                f"{dest} exists; {wrong_tree(recipe, dest, found)}; or move it away and fetch again"
            )
        if (dest / TXN_NAME).exists() or (dest / TXN_PREP).exists():
            with tree_lock(dest.resolve()):
                recover(dest.resolve(), log=log)
        log(f"{dest} already holds {recipe.project} {recipe.version}; nothing to fetch")
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    errors = []
    if source == "git" and not recipe.commit:
        raise OverlayError(
            f"base {recipe.version} of {recipe.name} pins no commit (only the sdist's sha256); "
            f"fetch it with --source sdist"
        )
    if source in ("auto", "git") and recipe.commit:
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
        if not _settle(unpacked, dest, recipe, log):
            return dest
    log(f"fetched {recipe.project} {recipe.version} (source distribution) into {dest}")
    return dest


def _settle(tree: Path, dest: Path, recipe: Recipe, log: Callable[[str], None]) -> bool:
    """Move a fetched tree to `dest`; False when another fetch put the pinned tree there first."""
    try:
        os.replace(tree, dest)
        return True
    except OSError as exc:
        if tree_version(dest, recipe.project) != recipe.version:
            raise OverlayError(
                f"moving the fetched tree to {dest} failed ({exc.strerror}); nothing was fetched"
            ) from exc
    log(
        f"{dest} was fetched by another command meanwhile ({recipe.project} {recipe.version}); nothing to fetch"
    )
    return False


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
        if not _settle(clone, dest, recipe, log):
            return dest
    log(f"fetched {recipe.project} {recipe.tag} (commit {recipe.commit[:12]}) into {dest}")
    return dest


# --- command line ----------------------------------------------------------------------------------


def command_name(recipe: Recipe) -> str:
    """How the overlay command names `recipe`: its name for a recipe under llm_rl/ ("qwen2_5 --base 0.6.0"), else
    its folder, which the command takes as well."""
    if (RECIPES / recipe.recipe).resolve() == recipe.folder:
        return recipe.cli
    return recipe.cli.replace(recipe.name.split("+", 1)[0], str(recipe.folder), 1)


def series_on_top(
    recipe: Recipe, root: Path, states: list[PatchState], view: dict[str, bytes | None] | None = None
) -> str | None:
    """When the tree carries another recipe's (or overlay's) series on this base that shares applied
    patches with this one and has patches of its own on: a line naming it (a revert of this series
    would leave those on a base without the patches they were written over). Call with the lock held."""
    ours = set(recipe.series)
    reverting = {s.patch.source for s in states if s.state == APPLIED}
    best: tuple[tuple[int, float], Recipe, list[str]] | None = None
    for name in recipe_names():
        for extra in (None, *overlay_names()):
            try:
                other = load_recipe(name, recipe.version)
                other = with_overlay(other, extra) if extra else other
            except (OverlayError, UsageError):
                continue
            if other.name == recipe.name or not reverting & set(other.series) or set(other.series) <= ours:
                continue
            try:
                theirs = plan(other, root, view)[0]
            except OverlayError:
                continue
            carried = [s.patch.source for s in theirs if s.state in (APPLIED, EDITED)]
            on = [patchset.patch_id(p) or p.name for p in carried if p not in ours]
            # the series with most patches of its own on; of those, the one the tree carries most of
            rank = (len(on), len(carried) / len(other.series))
            if on and (best is None or rank > best[0]):
                best = (rank, other, on)
    if best is None:
        return None
    _, other, on = best
    shown = ", ".join(on[:3]) + (f" and {len(on) - 3} more" if len(on) > 3 else "")
    return (
        f"this tree carries {other.name}'s series on top of {recipe.name}'s: {len(on)} patches of its own "
        f"({shown}) sit on the patches the two share, and reverting {recipe.name} would leave them on a base "
        f"without those; revert {other.name} instead (python3 -m ascend_rl overlay revert {other.cli} "
        f"--target {root})"
    )


def carried_series(recipe: Recipe, root: Path, wait: float = DEFAULT_WAIT) -> str | None:
    """When the tree carries another recipe's (or overlay's) series, a line saying which and what to do."""
    ours = set(recipe.series)
    best: tuple[int, Recipe, int] | None = None
    for name in recipe_names():
        for overlay in (None, *overlay_names()):
            try:
                other = load_recipe(name, recipe.version)
                other = with_overlay(other, overlay) if overlay else other
            except (OverlayError, UsageError):
                continue
            if other.name == recipe.name or other.version != recipe.version:
                continue
            try:
                states = inspect_tree(other, root, wait)[0]
            except OverlayError:
                continue
            foreign = sum(1 for s in states if s.state == APPLIED and s.patch.source not in ours)
            applied = sum(1 for s in states if s.state == APPLIED)
            if foreign and (best is None or (foreign, applied) > (best[0], best[2])):
                best = (foreign, other, applied)
    if best is None:
        return None
    _, other, applied = best
    return (
        f"this tree carries recipe {other.cli}'s series ({applied} of {len(other.series)} patches applied), "
        f"not only {recipe.cli}'s: revert it first (python3 -m ascend_rl overlay revert {other.cli} --target {root}) "
        f"or give {recipe.cli} a tree of its own (python3 -m ascend_rl overlay fetch {recipe.cli} --dest DIR)"
    )


def apply_checked(
    recipe: Recipe,
    root: Path,
    dry_run: bool = False,
    force: bool = False,
    wait: float = DEFAULT_WAIT,
    log: Callable[[str], None] = print,
) -> list[PatchState]:
    """apply_series, and when a patch does not apply, the refusal says which series the tree carries."""
    try:
        return apply_series(recipe, root, dry_run, force, wait, log)
    except OverlayError as exc:
        if " does not apply: " in str(exc) and (note := carried_series(recipe, root, wait)):
            raise OverlayError(f"{exc}; {note}") from exc
        raise


def apply_summary(recipe: Recipe, root: Path, states: list[PatchState], dry_run: bool = False) -> list[str]:
    """What an apply did: one line a patch applied now, then a closing line."""
    todo = [s for s in states if s.state == APPLICABLE]
    if not todo:
        return [f"{recipe.name}: all {len(states)} patches already applied on {root}; nothing to do"]
    return _summary("apply  ", "applied", recipe, root, states, todo, dry_run)


def revert_summary(recipe: Recipe, root: Path, states: list[PatchState], dry_run: bool = False) -> list[str]:
    """What a revert did: one line a patch taken off, then a closing line."""
    done = [s for s in reversed(states) if s.state == APPLIED]
    if not done:
        return [f"{recipe.name}: no patch of the series is applied on {root}; nothing to revert"]
    return _summary("revert ", "reverted", recipe, root, states, done, dry_run)


def _summary(verb, did, recipe, root, states, changed, dry_run) -> list[str]:
    dry = " (dry run: nothing written)" if dry_run else ""
    did = f"would have {did}" if dry_run else did
    lines = [f"  {verb} {s.patch.name}" for s in changed]
    return lines + [f"{recipe.name}: {did} {len(changed)} of {len(states)} patches on {root}{dry}"]
