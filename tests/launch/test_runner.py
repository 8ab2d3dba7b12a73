"""ascend_rl/harness/runner.py: a measured run ends with its whole process group, reports a timeout as one, and
counts the memory of the command's descendants, not only its own."""

from __future__ import annotations

import os
import sys
import time

from ascend_rl.harness import runner


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _gone(pid: int, within_s: float = 10) -> bool:
    deadline = time.monotonic() + within_s
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _alive(pid)


def test_exit_status_log_lines_and_the_left_behind_child_is_reaped(tmp_path):
    pidfile = tmp_path / "child.pid"
    # a child that ignores its parent's end (like Ray's agents) and outlives the command
    script = f"trap '' HUP PIPE\nsleep 600 &\necho $! > {pidfile}\necho one\necho two >&2\nexit 3\n"
    lines: list[str] = []
    done = runner.run_measured(["bash", "-c", script], tmp_path / "log", 60, on_line=lines.append)
    assert done.returncode == 3 and not done.timed_out
    assert sorted(lines) == ["one\n", "two\n"]  # stdout and stderr, both through the callback
    assert sorted((tmp_path / "log").read_text().splitlines()) == ["one", "two"]
    assert _gone(int(pidfile.read_text())), "the command's child outlived the run"


def test_timeout_kills_the_group_and_says_so(tmp_path):
    pidfile = tmp_path / "child.pid"
    script = f"sleep 600 &\necho $! > {pidfile}\nwait\n"
    start = time.monotonic()
    done = runner.run_measured(["bash", "-c", script], tmp_path / "log", 1)
    assert done.timed_out and done.returncode != 0
    assert 1 <= done.wall_s < 30 and time.monotonic() - start < 30
    assert _gone(int(pidfile.read_text()))


def test_peak_memory_counts_the_descendants(tmp_path):
    # the command itself is a small bash; its grandchild holds 400 MiB for two seconds
    hold = "b = bytearray(400 * 2**20); import time; time.sleep(2)"
    cmd = ["bash", "-c", f'{sys.executable} -c "{hold}"; true']
    done = runner.run_measured(cmd, tmp_path / "log", 60)
    assert done.returncode == 0 and not done.timed_out
    assert done.peak_rss_gib >= 0.35, done
    assert done.peak_pss_gib >= 0.35, done  # the grandchild's pages are its own: PSS counts them whole


def test_peak_pss_counts_a_shared_page_once(tmp_path):
    """Two processes map one 400 MiB shared segment: summed RSS counts it twice, PSS once."""
    hold = (
        "import mmap, os, time\n"
        "n = 400 * 2**20; m = mmap.mmap(-1, n)\n"
        "for i in range(0, n, 2**20): m[i:i + 2**20] = b'x' * 2**20\n"
        "pid = os.fork()\n"
        "sum(m[i] for i in range(0, n, 4096))  # both processes map every page\n"
        "time.sleep(2)\n"
        "os.waitpid(pid, 0) if pid else None\n"
    )
    done = runner.run_measured([sys.executable, "-c", hold], tmp_path / "log", 60)
    assert done.returncode == 0, (tmp_path / "log").read_text()
    assert done.peak_rss_gib >= 0.75, done
    assert 0.35 <= done.peak_pss_gib <= 0.55, done
