"""writers_die_with_rank (the module ds-0011, ds-0111 and ds-0211 install) on its own, no verl: a process that called
install() and is SIGKILLed takes its forks with it, two levels deep as megatron-core's async save forks (a caller that
forks the writers); the control, the same process without install(), leaves them running. An exec'd child
(subprocess) is not affected, as the module says. The same on verl 0.9.1's real save: test_ckpt_writers_091.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

RANK = r"""
import json, multiprocessing as mp, os, subprocess, sys, time
sys.path.insert(0, sys.argv[1])
from llm_rl.deepseek_r1.verl_modules import writers_die_with_rank as hook
if sys.argv[2] == "install":
    hook.install()
    hook.install()  # idempotent: one hook
ctx = mp.get_context("fork")

def writer():
    while True:
        time.sleep(60)

def caller(pids):
    procs = [ctx.Process(target=writer) for _ in range(2)]
    for p in procs:
        p.start()
    pids.put([p.pid for p in procs])
    writer()

pids = ctx.Queue()
c = ctx.Process(target=caller, args=(pids,))
c.start()
bare = os.fork()
if bare == 0:
    writer()
execd = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
out = {"forks": [c.pid, bare, *pids.get(timeout=60)], "execd": execd.pid, "installed": hook.installed()}
with open(sys.argv[3] + ".tmp", "w") as f:
    json.dump(out, f)
os.replace(sys.argv[3] + ".tmp", sys.argv[3])
while True:
    time.sleep(60)
"""


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.parametrize("install", [True, False])
def test_forks_die_with_the_killed_rank_only_when_installed(tmp_path, install):
    out = tmp_path / "pids.json"
    rank = subprocess.Popen(
        [sys.executable, "-c", RANK, str(REPO), "install" if install else "no", str(out)],
        start_new_session=True,
    )
    got: dict = {}
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and rank.poll() is None and not out.is_file():
            time.sleep(0.1)
        got = json.loads(out.read_text())
        assert got["installed"] is install and len(got["forks"]) == 4
        assert all(alive(p) for p in [*got["forks"], got["execd"]])
        os.kill(rank.pid, signal.SIGKILL)
        rank.wait(timeout=60)
        if install:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and any(alive(p) for p in got["forks"]):
                time.sleep(0.1)
            assert not [p for p in got["forks"] if alive(p)]
        else:
            time.sleep(1)
            assert all(alive(p) for p in got["forks"])  # each sleeps for good: orphans
        assert alive(got["execd"])  # fork-then-exec runs no at-fork hook
    finally:
        for pid in [rank.pid, *got.get("forks", []), *([got["execd"]] if "execd" in got else [])]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        rank.wait(timeout=60)
