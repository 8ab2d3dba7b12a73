"""make e2e's runs leave nothing behind when they are stopped: SIGTERM (timeout, a cancelled CI job, kill) to
the harness (ascend_rl/harness/launch.py, through ascend_rl/harness/runner.py) while a launcher runs takes the
launcher's whole process group with it, as Ray's agents would otherwise outlive it. A stand-in launcher (bash, a
child in its group that never exits) keeps it fast."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# launch() with a stand-in launcher: quick, but the harness asks every test that launches for its tier
pytestmark = pytest.mark.ci


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_sigterm_during_a_run_reaps_the_launchers_process_group(tmp_path):
    pidfile = tmp_path / "child.pid"
    launcher = tmp_path / "launcher.sh"
    # like Ray's agents: a child that ignores the end of its parent and of its stdout
    launcher.write_text(f"trap '' HUP PIPE\nsleep 600 &\necho $! > {pidfile}\necho started\nwait\n")
    driver = textwrap.dedent(
        f"""
        from pathlib import Path
        from ascend_rl.harness import launch
        launch.launch(
            "sync", Path({str(launcher)!r}), [], Path({str(tmp_path / "out")!r}), Path("model"), Path("data"),
            timeout_s=600,
        )
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", driver], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while not pidfile.is_file() or not pidfile.read_text().strip():
        assert time.monotonic() < deadline and proc.poll() is None, proc.stdout.read().decode()
        time.sleep(0.1)
    child = int(pidfile.read_text())
    assert _alive(child)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child), "the launcher's child outlived e2e.py"
