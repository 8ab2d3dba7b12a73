"""The one advisory-lock helper: an exclusive flock on a file for a block; the kernel lets go when the holder dies.

A killed holder (kill -9 included) never leaves the lock held, so no clean-up is needed after a crash. The lock
file stays in place (removing it would let a waiter lock a file no one else can see); its content, when asked
for, is the holder's pid, only to name it in messages. The overlay's tree lock (journal.tree_lock) is the one
that also removes its file as it lets go and waits with a deadline; it takes the lock with try_flock.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class Busy(Exception):
    """Another process holds the lock (wait=False); `holder` is what it wrote into the file ('' if nothing)."""

    def __init__(self, path: Path, holder: str):
        self.path, self.holder = path, holder
        super().__init__(f"{path} is held by {'pid ' + holder if holder else 'another process'}")


def try_flock(fd: int) -> bool:
    """Take an exclusive flock on an open file without waiting; False when another process holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


@contextmanager
def exclusive(path: str | Path, *, wait: bool = True, write_pid: bool = False) -> Iterator[int]:
    """Hold an exclusive flock on `path` (created if absent) for the block and yield its descriptor.

    wait=False raises Busy at once when another process holds it; write_pid=True writes this process's pid into
    the file once it is held, so a refused waiter can name the holder."""
    path = Path(path)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        if wait:
            fcntl.flock(fd, fcntl.LOCK_EX)
        elif not try_flock(fd):
            holder = path.read_text(encoding="utf-8", errors="replace").strip()
            raise Busy(path, holder)
        if write_pid:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        yield fd
    finally:
        os.close(fd)
