"""Every /dev/shm name a run's Python processes create, appended to the run's record as it is made.

With RECIPES_SHM_RECORD=<file>, each process of the run (the driver, Ray's workers, vLLM's engine and its
workers: a sitecustomize imports this module in every one of them, the launchers' (shm_record/) or the
harness's (harness/hooks/)) appends one JSON line to <file> when it
creates a named POSIX shared-memory segment (multiprocessing.shared_memory: vLLM's message queues, verl's
weight buckets) or a named semaphore (multiprocessing's locks under the spawn start method, /dev/shm/sem.mp-*),
and one when it unlinks one. The names are written at creation, not at exit, because the processes that
leak them are the ones killed before they can clean up (Ray SIGKILLs an actor's children when the actor's
owner dies): ascend_rl/shm.py removes what a run recorded and nobody unlinked, by these names only.

Each line is one write() to a file opened with O_APPEND, well under PIPE_BUF, so lines from concurrent
processes never interleave. A failure to write is ignored: recording must never break the run it watches.
"""

import json
import os
import sys

_RECORD = os.environ.get("RECIPES_SHM_RECORD")
_STDLIB_MP = os.path.dirname(os.__file__) + os.sep + "multiprocessing" + os.sep


def append_json_line(path, record, mode=0o644) -> None:
    """One write with O_APPEND, so lines from many processes never interleave; a record that cannot be written is
    dropped (a hook must not end the run it watches). The harness's other hooks use it too (recipes_hook_util)."""
    line = (json.dumps(record, default=str) + "\n").encode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, mode)
    except OSError:
        return
    try:
        os.write(fd, line)
    except OSError:
        pass
    finally:
        os.close(fd)


def _start_time(pid):
    """The process's start time in clock ticks (/proc/<pid>/stat field 22): a pid with another start time is
    another process (pids are reused)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return int(fh.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _caller():
    """file:line of the first frame outside multiprocessing and this module: who asked for the name."""
    frame = sys._getframe(1)
    while frame is not None:
        path = frame.f_code.co_filename
        if not path.startswith(_STDLIB_MP) and path != __file__:
            return f"{path}:{frame.f_lineno}"
        frame = frame.f_back
    return None


def _write(event):
    pid = os.getpid()
    event.update(pid=pid, start=_start_time(pid))
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            event["cmd"] = fh.read().replace(b"\0", b" ").decode(errors="replace").strip()[:120]
    except OSError:
        pass
    append_json_line(_RECORD, event)


def _install():
    from multiprocessing import shared_memory, synchronize

    shm_init, shm_unlink = shared_memory.SharedMemory.__init__, shared_memory.SharedMemory.unlink
    sem_init, sem_cleanup = synchronize.SemLock.__init__, synchronize.SemLock._cleanup

    def init(self, *args, **kwargs):
        shm_init(self, *args, **kwargs)
        if kwargs.get("create", args[1] if len(args) > 1 else False):
            _write({"event": "create", "kind": "shm", "name": self.name, "size": self.size, "by": _caller()})

    def unlink(self):
        shm_unlink(self)
        _write({"event": "unlink", "kind": "shm", "name": self.name})

    def sem(self, *args, **kwargs):
        sem_init(self, *args, **kwargs)
        name = self._semlock.name  # None when it was unlinked at once (the fork start method)
        if name:
            _write({"event": "create", "kind": "sem", "name": "sem." + name.lstrip("/"), "by": _caller()})

    def cleanup(name):
        sem_cleanup(name)
        _write({"event": "unlink", "kind": "sem", "name": "sem." + name.lstrip("/")})

    shared_memory.SharedMemory.__init__, shared_memory.SharedMemory.unlink = init, unlink
    synchronize.SemLock.__init__, synchronize.SemLock._cleanup = sem, staticmethod(cleanup)


if _RECORD:
    try:
        _install()
    except ImportError:  # no _posixshmem or _multiprocessing in this Python: nothing it could create
        pass
