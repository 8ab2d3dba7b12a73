"""Run a command the way the harness measures a launch: its own process group, a wall-clock limit, peak memory.

A *measured run* starts the command in a session (and so a process group) of its own, writes its output to a
log file (each line also handed to `on_line` when given), samples the memory of the command and all its
descendants (Ray's GCS and raylet, the workers, vLLM's engine): their summed PSS, the real figure (a page shared
by n processes counts 1/n in each), and their summed RSS, which counts a shared page once per process and so
overstates; and, however it ends (exit, the timeout, an
exception, SIGTERM to this process), kills the whole group, so nothing it started outlives it. Only that
group goes: another run on the machine (a second `make e2e`, a user's Ray) is left alone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Measured:
    """How a measured run ended."""

    returncode: int
    wall_s: float
    peak_rss_gib: float  # summed over the command's process tree, sampled every half second
    timed_out: bool
    peak_pss_gib: float = 0.0  # the same, PSS: the memory the tree really holds


def pss_bytes(pid: int) -> int:
    """A process's proportional set size (/proc/<pid>/smaps_rollup), 0 when it cannot be read."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


class PeakMemory(threading.Thread):
    """Samples the summed RSS and PSS of a process and all its descendants until stopped."""

    def __init__(self, pid: int, every_s: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.pid, self.every_s, self.peak, self.peak_pss = pid, every_s, 0, 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        import psutil

        try:
            root = psutil.Process(self.pid)
        except psutil.Error:
            return
        while not self._stop_event.is_set():
            total = pss = 0
            try:
                procs = [root, *root.children(recursive=True)]
            except psutil.Error:
                procs = []
            for proc in procs:
                try:
                    total += proc.memory_info().rss
                except psutil.Error:
                    continue
                pss += pss_bytes(proc.pid)
            self.peak = max(self.peak, total)
            self.peak_pss = max(self.peak_pss, pss)
            self._stop_event.wait(self.every_s)

    def stop(self) -> float:
        """Stop sampling; the peak in GiB."""
        self._stop_event.set()
        self.join(timeout=5)
        return self.peak / 2**30


def kill_group(pgid: int) -> None:
    """SIGKILL every process left in group `pgid` (gone already: nothing to do)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


@contextlib.contextmanager
def exit_on_sigterm() -> Iterator[None]:
    """SIGTERM (a timeout, a cancelled CI job, kill) raises SystemExit while a run is in flight, so the run's
    cleanup reaps its process group: Python's default would exit at once and leave Ray's agents running
    (seen: dashboard and runtime-env agents still alive minutes after the driver was gone)."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread
        return

    def _exit(signum, _frame):
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, _exit)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_measured(
    cmd: list[str],
    log_path: Path,
    timeout_s: float,
    *,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    on_line: Callable[[str], None] | None = None,
) -> Measured:
    """Run cmd in a process group of its own, output (stdout and stderr) to log_path, each line also to on_line;
    the group is killed at timeout_s and whenever the run ends."""
    start = time.perf_counter()
    timed_out = threading.Event()
    with open(log_path, "w", encoding="utf-8") as log, exit_on_sigterm():
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            env=env,
            start_new_session=True,
            stdout=subprocess.PIPE if on_line else log,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
        )
        watch = timer = None
        try:  # from here on the group is reaped whatever stops the run (SIGTERM included)

            def expire() -> None:
                timed_out.set()
                kill_group(proc.pid)

            watch = PeakMemory(proc.pid)
            watch.start()
            timer = threading.Timer(timeout_s, expire)
            timer.daemon = True  # never keeps this process alive after the run
            timer.start()
            if on_line is not None:
                # The pipe stays open while any descendant holds it: once the command itself has exited, its
                # group goes, so a lingering child cannot keep the run waiting for the timeout.
                threading.Thread(target=lambda: (proc.wait(), kill_group(proc.pid)), daemon=True).start()
                for line in proc.stdout:
                    log.write(line)
                    on_line(line)
            rc = proc.wait()
        finally:
            if timer is not None:
                timer.cancel()
            peak = watch.stop() if watch is not None else 0.0
            kill_group(proc.pid)  # the session leader's pid is the group's id
            proc.wait()
    pss = watch.peak_pss / 2**30 if watch is not None else 0.0
    return Measured(rc, time.perf_counter() - start, peak, timed_out.is_set(), pss)
