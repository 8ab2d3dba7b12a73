#!/usr/bin/env python3
"""Fetch a recipe's pinned verl tree and apply, check or revert its patch series.

    python scripts/overlay.py fetch  qwen2_5
    python scripts/overlay.py status qwen2_5 [--target DIR] [--wait SECONDS]
    python scripts/overlay.py apply  qwen2_5 [--target DIR] [--dry-run] [--force] [--wait SECONDS] [--fetch]
    python scripts/overlay.py revert qwen2_5 [--target DIR] [--dry-run] [--force] [--wait SECONDS]
    python scripts/overlay.py apply  qwen2_5 --with cpu    # the recipe's series, then patches/cpu/

Every command holds an advisory lock on the tree (ROOT/.overlay.lock; a second copy waits up to
--wait seconds, then refuses), and every write goes through a journal in the tree's root
(ROOT/.overlay-txn/): a command killed at any point, even by power loss, is finished by the next
apply or revert, and `status` reports it until then. See "crash-safe writes" below.

An overlay (`--with NAME`, manifest patches/NAME/overlay.toml) is a series applied on top of a
recipe's, into a tree of its own (default llm_rl/<recipe>/verl-NAME/): the CPU series that tests
and the CPU launch profile need, never applied by a recipe launcher on an NPU host.

Exit status: 0 done, 1 refused or conflicting, 2 usage.
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10 and older: say so in one line instead of a traceback
    sys.exit(
        f"overlay: error: Python {sys.version.split()[0]} ({sys.executable}) has no tomllib; "
        "the tool needs Python 3.11 or newer: run it with python3.11, or with .venv/bin/python (make setup)"
    )

sys.path.insert(0, str(Path(__file__).resolve().parent))

import artifacts  # noqa: E402
import patchdoc  # noqa: E402
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


def _inside(root: Path, rel: str) -> Path:
    """root/rel, refused when a symlink (or '..') would send a write outside root."""
    full = root / rel
    real = full.resolve()
    if not real.is_relative_to(root.resolve()) or full.is_symlink():
        raise OverlayError(f"{rel} resolves outside {root} (symlink); refusing to patch through it")
    return full


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


# --- crash-safe writes: one lock, one journal ------------------------------------------------------
#
# Every command that reads or writes a tree holds an advisory lock (flock) on ROOT/.overlay.lock,
# so two copies of the tool on one tree run one after the other. A write is a transaction:
#   1. prepare: ROOT/.overlay-txn.new/ gets the new content of every file (written with the
#      user's umask, or the mode of the file it replaces, and fsynced) and journal.json, which
#      names each file with the sha256 it has before and after;
#   2. commit: that folder is renamed to ROOT/.overlay-txn/ (then fsynced). Nothing in the tree
#      changed before this point, so a prepare folder found later is simply removed;
#   3. each staged file is renamed over its target (or the target removed), in journal order;
#   4. journal.json is removed, then the folder.
# A command that finds ROOT/.overlay-txn/ finishes steps 3-4 before doing anything else
# (each file is already new, or still old and renamed now), so a tree killed at any point
# ends up byte-identical to a clean run. Renames need no free space: a full disk can only
# fail step 1, which changes nothing.

LOCK_NAME = ".overlay.lock"
TXN_NAME = ".overlay-txn"
TXN_PREP = ".overlay-txn.new"
JOURNAL_NAME = "journal.json"
JOURNAL_FORMAT = 1
DEFAULT_WAIT = 120.0
# Test-only: die by SIGKILL right after the Nth file operation (stage, commit, replace, clean up),
# so tests can stop the real code path at every boundary of a write.
CRASH_ENV = "OVERLAY_TEST_CRASH_AFTER"


class _Steps:
    """Counts the file operations of one command; see CRASH_ENV."""

    def __init__(self) -> None:
        raw = os.environ.get(CRASH_ENV, "")
        self.crash_after = int(raw) if raw.isdigit() else None
        self.done = 0

    def __call__(self) -> None:
        self.done += 1
        if self.crash_after is not None and self.done >= self.crash_after:
            os.kill(os.getpid(), signal.SIGKILL)


@dataclass
class _Change:
    """One file to write: its content before and after (None: absent) and the mode to keep."""

    rel: str
    old: bytes | None
    new: bytes | None
    mode: int | None = None


def _sha(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()


def _read(path: Path) -> bytes | None:
    return path.read_bytes() if path.is_file() and not path.is_symlink() else None


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some filesystems cannot fsync a folder; the rename is still atomic
        pass
    finally:
        os.close(fd)


def _write_new(path: Path, data: bytes, mode: int | None) -> None:
    """Create `path` (it must not exist) with `data`, fsynced; `mode`, else what the umask gives."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb", closefd=False) as fh:
            fh.write(data)
        if mode is not None:
            os.fchmod(fd, mode)
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def tree_lock(
    root: Path, wait: float = DEFAULT_WAIT, required: bool = True, log: Callable[[str], None] | None = None
):
    """Hold the tree's advisory lock; wait up to `wait` seconds for another command to let go.

    With required=False (read-only commands) a tree where the lock file cannot be created is
    read without it: nobody with our rights can write there either.
    """
    log = log or _err
    path = root / LOCK_NAME
    deadline = time.monotonic() + max(wait, 0)
    told = False
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as exc:
            if not required and exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
                yield False
                return
            raise OverlayError(
                f"cannot create the lock file {path} ({exc.strerror}); is the tree writable?"
            ) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = _lock_holder(path)
            if time.monotonic() >= deadline:
                raise OverlayError(
                    f"another overlay command{holder} is working on {root} (waited {wait:g}s); "
                    f"let it finish, or pass a longer --wait"
                ) from None
            if not told:
                log(f"overlay: waiting for another overlay command{holder} on {root} ...")
                told = True
            time.sleep(0.05)
            continue
        # The previous holder removes the file as it lets go: hold the lock on the file that is there.
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        except OSError:  # only used to name the holder in messages
            pass
        yield True
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
        os.close(fd)


def _lock_holder(path: Path) -> str:
    try:
        pid = path.read_text().strip()
    except OSError:
        return ""
    return f" (pid {pid})" if pid.isdigit() else ""


def _commit(root: Path, changes: list[_Change], op: str, series: str, steps: _Steps) -> None:
    """Write `changes` as one transaction (see the section comment): all of them, or none."""
    if not changes:
        return
    prep, txn = root / TXN_PREP, root / TXN_NAME
    entries = []
    writing = str(prep)
    try:
        prep.mkdir()
        for index, ch in enumerate(changes):
            staged = None
            if ch.new is not None:
                staged, writing = str(index), ch.rel
                _write_new(prep / staged, ch.new, ch.mode)
                steps()
            entries.append({"path": ch.rel, "old": _sha(ch.old), "new": _sha(ch.new), "staged": staged})
        journal = {
            "format": JOURNAL_FORMAT,
            "op": op,
            "series": series,
            "pid": os.getpid(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "files": entries,
        }
        writing = str(prep / JOURNAL_NAME)
        _write_new(prep / JOURNAL_NAME, json.dumps(journal, indent=1).encode(), None)
        _fsync_dir(prep)
        steps()
        writing = str(txn)
        os.rename(prep, txn)
    except OSError as exc:
        shutil.rmtree(prep, ignore_errors=True)
        raise OverlayError(f"writing {writing} failed ({exc.strerror}); nothing was changed") from exc
    _fsync_dir(root)
    steps()
    done: list[_Change] = []
    try:
        for ch, entry in zip(changes, entries, strict=True):
            _put(root, txn, entry)
            done.append(ch)
            steps()
    except OSError as exc:
        _undo(root, txn, done, ch, exc, op)
    _finish(root, txn, steps)


def _put(root: Path, txn: Path, entry: dict) -> None:
    """Step 3 for one file: its staged content renamed over it, or the file removed."""
    target = _inside(root, entry["path"])
    if entry["staged"] is None:
        target.unlink(missing_ok=True)
        _prune_empty_dirs(target.parent, root)
        _fsync_dir(next(d for d in target.parents if d.exists()))
    else:
        made = _make_parents(target.parent)
        os.replace(txn / entry["staged"], target)
        # A new folder's own entry must reach the disk too, or a power loss could lose the file.
        for folder in [target.parent, *(d.parent for d in made)]:
            _fsync_dir(folder)


def _undo(root: Path, txn: Path, done: list[_Change], failed: _Change, exc: OSError, op: str) -> None:
    """A replace failed after the commit: put the files already replaced back, then raise."""
    try:
        # The failed one too: it may have failed after its file changed (pruning a folder).
        for index, ch in enumerate(reversed([*done, failed])):
            target = _inside(root, ch.rel)
            if _sha(_read(target)) == _sha(ch.old):
                continue
            if ch.old is None:
                target.unlink(missing_ok=True)
                _prune_empty_dirs(target.parent, root)
            else:
                undo = txn / f"undo-{index}"
                undo.unlink(missing_ok=True)
                _write_new(undo, ch.old, ch.mode)
                _make_parents(target.parent)
                os.replace(undo, target)
    except OSError as again:
        raise OverlayError(
            f"replacing {failed.rel} failed ({exc.strerror}) and putting {ch.rel} back failed too "
            f"({again.strerror}); fix that, then run any overlay command on {root}: it completes the {op}"
        ) from again
    shutil.rmtree(txn, ignore_errors=True)
    _fsync_dir(root)
    raise OverlayError(
        f"replacing {failed.rel} failed ({exc.strerror}); the tree was put back as it was"
    ) from exc


def _finish(root: Path, txn: Path, steps: _Steps) -> None:
    """Step 4: the journal goes first, so a folder without one is known to be done."""
    try:
        (txn / JOURNAL_NAME).unlink(missing_ok=True)
        _fsync_dir(txn)
        steps()
        shutil.rmtree(txn)
    except OSError as exc:
        raise OverlayError(
            f"every file is in place, but removing {txn} failed ({exc.strerror}); remove it by hand"
        ) from exc
    _fsync_dir(root)
    steps()


@dataclass
class Pending:
    """An interrupted write found in a tree's journal, and where each of its files stands."""

    journal: Path
    op: str
    series: str
    pid: int | None
    files: list[dict]
    todo: list[dict]  # still old: the next command renames their staged content into place
    foreign: list[str]  # neither old nor new: changed by hand since; recovery refuses
    view: dict[str, bytes | None]  # what the tree will hold once recovered (todo files only)

    def summary(self, refusing: bool = False) -> str:
        who = f" (pid {self.pid})" if self.pid else ""
        done = len(self.files) - len(self.todo) - len(self.foreign)
        text = (
            f"interrupted: an {self.op} of {self.series or 'a series'}{who} stopped after replacing "
            f"{done} of {len(self.files)} files; "
        )
        if self.foreign:
            verdict = "nothing was changed" if refusing else "the next apply or revert will refuse"
            return text + (
                f"{self.foreign[0]} has changed since, so {verdict}: "
                f"put it back, or check the tree by hand and remove {self.journal.parent}"
            )
        return text + f"the next apply or revert on this tree completes the {self.op} first"


def read_pending(root: Path) -> Pending | None:
    """The interrupted write recorded in root/.overlay-txn/, or None when there is none."""
    txn = root / TXN_NAME
    journal = txn / JOURNAL_NAME
    if not journal.is_file():
        return None
    try:
        data = json.loads(journal.read_bytes())
        if data.get("format") != JOURNAL_FORMAT:
            raise ValueError(f"format {data.get('format')!r}, this tool writes {JOURNAL_FORMAT}")
        files = list(data["files"])
        todo, foreign, view = [], [], {}
        for entry in files:
            rel = patchset.safe_relpath(entry["path"], journal)
            current = _sha(_read(_inside(root, rel)))
            if current == entry["new"]:
                continue
            if current != entry["old"]:
                foreign.append(rel)
                continue
            staged = None
            if entry["staged"] is not None:
                staged = (txn / str(entry["staged"])).read_bytes()
                if _sha(staged) != entry["new"]:
                    raise ValueError(f"staged content of {rel} does not match its sha256")
            todo.append(entry)
            view[rel] = staged
    except (OSError, ValueError, KeyError, TypeError, AttributeError, patchset.PatchError) as exc:
        raise OverlayError(
            f"{journal}: unreadable journal of an interrupted overlay command ({exc}); "
            f"check the tree against a fresh fetch, then remove {txn}"
        ) from exc
    pid = data.get("pid")
    return Pending(
        journal,
        str(data.get("op", "write")),
        str(data.get("series", "")),
        pid if isinstance(pid, int) else None,
        files,
        todo,
        foreign,
        view,
    )


def leftovers(root: Path) -> str:
    """A line naming what an interrupted command left behind that needs no recovery, or ''."""
    if (root / TXN_NAME / JOURNAL_NAME).is_file():
        return ""
    found = [str(root / name) for name in (TXN_PREP, TXN_NAME) if (root / name).exists()]
    if not found:
        return ""
    return f"leftovers of an interrupted overlay command, the tree itself consistent ({', '.join(found)})"


def recover(root: Path, steps: _Steps | None = None, log: Callable[[str], None] = print) -> Pending | None:
    """Finish a write that was interrupted on `root` (call with the lock held); None if there was none."""
    steps = steps or _Steps()
    prep, txn = root / TXN_PREP, root / TXN_NAME
    try:
        if prep.exists():  # never committed: no file of the tree was touched yet
            shutil.rmtree(prep)
            _fsync_dir(root)
        if not txn.exists():
            return None
        pending = read_pending(root)
        if pending is None:  # stopped while cleaning up: every file is already in place
            shutil.rmtree(txn)
            _fsync_dir(root)
            return None
        if pending.foreign:
            raise OverlayError(pending.summary(refusing=True))
        for entry in pending.todo:
            _put(root, txn, entry)
            steps()
        _finish(root, txn, steps)
    except OSError as exc:
        raise OverlayError(
            f"finishing an interrupted overlay command on {root} failed at {exc.filename or root} "
            f"({exc.strerror}); fix that and run the command again"
        ) from exc
    log(
        f"completed an interrupted {pending.op} of {pending.series or 'a series'} on {root} "
        f"({len(pending.todo)} of {len(pending.files)} files were left to replace)"
    )
    return pending


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


def plan(
    recipe: Recipe, root: Path, view: dict[str, bytes | None] | None = None
) -> tuple[list[PatchState], Tree, Tree]:
    """Classify each patch; return the states, the tree with all applicable patches on, and the bare tree."""
    patches = load_series(recipe)
    # Walk back from the top: a patch counts as applied when it comes off cleanly
    # and would not go on again; peel it off to see the ones beneath it.
    base = Tree(root, view)
    applied: set[int] = set()
    ambiguous: set[int] = set()
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
        else:
            stuck[idx] = off
    # Walk forward from the bare tree, putting each patch (back) on in series order.
    full = Tree(root, view)
    full.restore(base.snapshot())
    states = []
    for idx, patch in enumerate(patches):
        if idx in ambiguous:
            why = "it applies both forward and in reverse; check the tree by hand"
            states.append(PatchState(patch, CONFLICTING, why, why))
            continue
        conflict = _try(full, patch)
        if conflict is None:
            _apply_patch(full, patch)
            states.append(PatchState(patch, APPLIED if idx in applied else APPLICABLE))
        else:
            states.append(PatchState(patch, CONFLICTING, str(conflict), str(stuck.get(idx, conflict))))
    return states, full, base


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
        # topmost patch that does not come off, with the file and hunk where the tree differs.
        bad = [s for s in states if s.state == CONFLICTING]
        if bad and op == "apply":
            raise OverlayError(f"{bad[0].patch.name} does not apply: {bad[0].detail}; nothing was changed")
        if bad:
            raise OverlayError(
                f"{bad[-1].patch.name} does not come off: {bad[-1].off_detail}; "
                f"restore those lines as the patch has them, or fix the tree by hand; nothing was changed"
            )
        if not dry_run:
            (full if op == "apply" else base).flush(op, recipe.name, steps)
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
        if (dest / TXN_NAME).exists() or (dest / TXN_PREP).exists():
            with tree_lock(dest.resolve()):
                recover(dest.resolve(), log=log)
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


def _say(text: str, stream=None) -> None:
    """Print one line; a reader that went away (`status | head`) silences the rest, not the work."""
    stream = sys.stdout if stream is None else stream
    try:
        print(text, file=stream, flush=True)
    except BrokenPipeError:
        _silence(stream)


def _err(text: str) -> None:
    _say(text, sys.stderr)


def _silence(stream) -> None:
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, stream.fileno())
        os.close(null)
    except (OSError, ValueError):
        pass


def carried_series(recipe: Recipe, root: Path, wait: float = DEFAULT_WAIT) -> str | None:
    """When the tree carries another recipe's (or overlay's) series, a line saying which and what to do."""
    ours = set(recipe.series)
    best: tuple[int, Recipe, int] | None = None
    for name in recipe_names():
        for overlay in (None, *overlay_names()):
            try:
                other = load_recipe(name)
                other = with_overlay(other, overlay) if overlay else other
            except OverlayError:
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
        f"not only {recipe.cli}'s: revert it first (overlay.py revert {other.cli} --target {root}) "
        f"or give {recipe.cli} a tree of its own (overlay.py fetch {recipe.cli} --dest DIR)"
    )


def _print_states(states: list[PatchState], root: Path) -> None:
    for st in states:
        rel = st.patch.source.relative_to(REPO) if st.patch.source.is_relative_to(REPO) else st.patch.source
        ident = patchdoc.patch_id(st.patch.source) or "-"
        _say(f"  {st.state:<11} {ident:<12} {rel}")
        if st.detail:
            _say(f"              {st.detail}")


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
        return _run(args)
    except OverlayError as exc:
        _err(f"overlay: error: {exc}")
        return exc.exit_code
    except KeyboardInterrupt:
        _err(
            "overlay: interrupted; `status` says where the tree stands, "
            "and the next apply or revert finishes any write that was under way"
        )
        return 130
    except BrokenPipeError:  # argparse's help or usage text into a closed pipe
        _silence(sys.stdout)
        _silence(sys.stderr)
        return EXIT_REFUSED


def _parser() -> argparse.ArgumentParser:
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
        ("revert", "take the series back off, last patch first (atomic)"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument("--target", help="a folder holding verl/ (checkout, unpacked sdist, site-packages)")
        p.add_argument("--force", action="store_true", help="accept a tree of another verl version")
        p.add_argument(
            "--wait",
            type=float,
            default=DEFAULT_WAIT,
            metavar="SECONDS",
            help=f"how long to wait for another overlay command on the same tree (default {DEFAULT_WAIT:g})",
        )
        if name != "status":
            p.add_argument("--dry-run", action="store_true", help="check everything, change nothing")
    sub.choices["apply"].add_argument(
        "--fetch", action="store_true", help="without --target: fetch the recipe's tree first if it is absent"
    )
    p_list = sub.add_parser("list", help="list the recipes and overlays, or one recipe's series in order")
    p_list.add_argument("recipe", nargs="?", help="show this recipe's patches, in series order")
    p_list.add_argument("--with", dest="overlay", metavar="OVERLAY", help="with this overlay's series on top")
    for p in (p_fetch, *[sub.choices[n] for n in ("status", "apply", "revert")]):
        p.add_argument("recipe", help=f"recipe name ({', '.join(recipe_names())}) or folder")
        p.add_argument(
            "--with",
            dest="overlay",
            metavar="OVERLAY",
            help=f"also the series of patches/OVERLAY/ on top ({', '.join(overlay_names()) or 'none'}); "
            "default tree llm_rl/<recipe>/verl-OVERLAY/",
        )
    return parser


def _run(args: argparse.Namespace) -> int:
    if args.command == "list" and args.recipe:
        recipe = load_recipe(args.recipe)
        if args.overlay:
            recipe = with_overlay(recipe, args.overlay)
        _say(f"{recipe.name}: {recipe.project} {recipe.version}, {len(recipe.series)} patches, in order:")
        for patch in recipe.series:
            rel = patch.relative_to(REPO) if patch.is_relative_to(REPO) else patch
            _say(f"  {patchdoc.patch_id(patch) or '-':<12} {rel}")
        return EXIT_OK
    if args.command == "list":
        for name in recipe_names():
            recipe = load_recipe(name)
            _say(f"{name}: {recipe.project} {recipe.version}, {len(recipe.series)} patches")
        for name in overlay_names():
            _say(f"--with {name}: patches/{name}/overlay.toml (on top of a recipe's series)")
        return EXIT_OK
    recipe = load_recipe(args.recipe)
    if args.overlay:
        recipe = with_overlay(recipe, args.overlay)
    if args.command == "fetch":
        dest = Path(args.dest) if args.dest else recipe.default_target
        if args.dry_run:
            state = f"exists ({tree_version(dest, recipe.project)})" if dest.exists() else "absent"
            _say(f"would fetch {recipe.project} {recipe.version} ({args.source}) into {dest} [{state}]")
            return EXIT_OK
        fetch(recipe, args.source, dest, log=_say)
        return EXIT_OK
    if args.command == "apply" and args.fetch and args.target is None and not args.dry_run:
        fetch(recipe, "auto", recipe.default_target, log=_say)
    root = resolve_target(recipe, args.target, args.force)
    if args.command == "status":
        states, pending = inspect_tree(recipe, root, args.wait, _err)
        _say(f"{recipe.name}: {len(states)} patches on {root} ({recipe.project} {tree_version(root)})")
        if pending:
            _say(f"  {pending.summary()}; the states below are the tree's once it does")
        elif note := leftovers(root):
            _say(f"  {note}; the next apply or revert removes them")
        _print_states(states, root)
        if any(s.state == CONFLICTING for s in states) and (note := carried_series(recipe, root, args.wait)):
            _say(f"  {note}")
        return EXIT_REFUSED if pending or any(s.state == CONFLICTING for s in states) else EXIT_OK
    dry = " (dry run: nothing written)" if args.dry_run else ""
    if args.command == "apply":
        try:
            states = apply_series(recipe, root, args.dry_run, args.force, args.wait, _say)
        except OverlayError as exc:
            if " does not apply: " in str(exc) and (note := carried_series(recipe, root, args.wait)):
                raise OverlayError(f"{exc}; {note}") from exc
            raise
        todo = [s for s in states if s.state == APPLICABLE]
        if not todo:
            _say(f"{recipe.name}: all {len(states)} patches already applied on {root}; nothing to do")
        else:
            for s in todo:
                _say(f"  apply   {s.patch.name}")
            _say(f"{recipe.name}: applied {len(todo)} of {len(states)} patches on {root}{dry}")
        return EXIT_OK
    states = revert_series(recipe, root, args.dry_run, args.force, args.wait, _say)
    done = [s for s in reversed(states) if s.state == APPLIED]
    if not done:
        _say(f"{recipe.name}: no patch of the series is applied on {root}; nothing to revert")
    else:
        for s in done:
            _say(f"  revert  {s.patch.name}")
        _say(f"{recipe.name}: reverted {len(done)} of {len(states)} patches on {root}{dry}")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
