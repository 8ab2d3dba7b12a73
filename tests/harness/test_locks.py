"""ascend_rl/locks.py: the one flock helper: a second holder is refused (or waits), a killed holder lets go."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from ascend_rl import locks
from ascend_rl.paths import REPO

HOLD = "import sys, time\nfrom ascend_rl import locks\nwith locks.exclusive(sys.argv[1], write_pid=True):\n"
HOLD += "    print('held', flush=True)\n    time.sleep(60)\n"


def _holder(path):
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(path)], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_holder_is_refused_naming_the_first_and_a_killed_holder_lets_go(tmp_path):
    path = tmp_path / ".lock"
    proc = _holder(path)
    try:
        with pytest.raises(locks.Busy) as busy, locks.exclusive(path, wait=False):
            pass
        assert busy.value.holder == str(proc.pid)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    with locks.exclusive(path, wait=False, write_pid=True):
        assert path.read_text().strip() == str(os.getpid())


def test_a_waiter_gets_the_lock_when_the_holder_dies(tmp_path):
    path = tmp_path / ".lock"
    proc = _holder(path)
    mark = tmp_path / "killing"
    killer = subprocess.Popen(["sh", "-c", f"sleep 0.5; touch {mark}; kill -9 {proc.pid}"])
    with locks.exclusive(path):
        assert mark.exists(), "the lock came before the holder was killed"
        assert proc.wait(timeout=10) == -signal.SIGKILL
    assert killer.wait(timeout=10) == 0
