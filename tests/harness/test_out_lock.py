"""Two e2e commands on one --out: the second is refused in one line while the first holds the folder, and a
holder killed with SIGKILL leaves the folder free (flock is released by the kernel)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from ascend_rl.paths import REPO

HOLD = (
    "import sys, time; from pathlib import Path; from ascend_rl.harness.launch import out_lock\n"
    "with out_lock(Path(sys.argv[1])):\n"
    "    print('held', flush=True); time.sleep(600)\n"
)


def _e2e(out) -> subprocess.CompletedProcess:
    # this venv has no vLLM: past the lock, e2e stops at its interpreter check, before any run starts
    return subprocess.run(
        [sys.executable, "-m", "ascend_rl", "e2e", "--runs", "sync", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_second_e2e_on_the_same_out_is_refused_until_the_first_dies(tmp_path):
    out = tmp_path / "e2e_out"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(out)], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        refused = _e2e(out)
        assert refused.returncode == 1
        lines = refused.stderr.strip().splitlines()
        assert lines == [
            f"e2e: error: another e2e command (pid {holder.pid}) is using {out}; let it finish, or pass another --out"
        ]
        assert sorted(p.name for p in out.iterdir()) == [".lock"]  # nothing of the holder's folder touched
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
    time.sleep(0.1)
    after = _e2e(out)
    assert "is using" not in after.stderr
    assert after.returncode == 1 and "has no vLLM CPU build" in after.stderr
