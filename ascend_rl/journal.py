"""Crash-safe writes to a tree: one advisory lock, one journal (see the comment below for the protocol)."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ascend_rl import locks, patchset
from ascend_rl.errors import OverlayError


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


def _to_stderr(text: str) -> None:
    try:
        print(text, file=sys.stderr, flush=True)
    except BrokenPipeError:
        pass


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
    log = log or _to_stderr
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
        if not locks.try_flock(fd):
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
            f"interrupted: {'an' if self.op[:1] in 'aeiou' else 'a'} {self.op} of {self.series or 'a series'}{who} stopped after replacing "
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
