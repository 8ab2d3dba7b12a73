"""ds-0211 on verl 0.9.1: a trainer rank killed in a Megatron checkpoint save leaves no forked writer behind.

The driver (tests/deepseek_r1/ckpt_writers_091.py) is one gloo rank that saves through verl's save_dist_checkpointing
on a tree the overlay makes (the DeepSeek 0.9.1 series and the CPU overlay), with megatron-core 0.16.1 from its own
folder (artifacts.megatron_packages(python, "0.9.1")), in verl 0.9.1's e2e environment: full tier, as the environment
is. The shard files are FIFOs, so megatron-core's forked writers stay blocked in open() and the save never ends; the
test then SIGKILLs the rank. Synchronous save: the rank forks the writers (filesystem_async.py:266); async save
scheduled as MegatronCheckpointManager schedules it: the rank forks a TemporalAsyncCaller (async_utils.py:216), which
forks the writers. With ds-0211 every forked process is gone once the rank is reaped; the control, the same tree
without ds-0211 (its verl file as in the sdist, its module not installed), leaves them running. Unkilled, both saves
complete and load back bit-equal.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_writers_die_with_rank import alive  # running, a zombie counts as dead

from ascend_rl import artifacts, manifest
from ci_policy import get_artifact

REPO = Path(__file__).resolve().parents[2]
DRIVER = REPO / "tests" / "deepseek_r1" / "ckpt_writers_091.py"
MODULE = "verl/utils/megatron/writers_die_with_rank.py"
HOOKED = "verl/utils/megatron/dist_checkpointing.py"
pytestmark = [pytest.mark.slow, pytest.mark.full]


@pytest.fixture(scope="module")
def trees(e2e_python_091, pristine_base, tmp_path_factory):
    """{"patched": the DeepSeek 0.9.1 series + the CPU overlay, "control": the same without ds-0211}, and the env."""
    packages = get_artifact(
        "megatron-core / megatron-bridge (0.9.1)", artifacts.megatron_packages, e2e_python_091, "0.9.1"
    )
    root = tmp_path_factory.mktemp("ckptwriters091")
    patched = root / "patched"
    shutil.copytree(pristine_base("0.9.1"), patched, symlinks=True)
    apply = [sys.executable, "-m", "ascend_rl", "overlay", "apply", "deepseek_r1", "--base", "0.9.1"]
    proc = subprocess.run(
        [*apply, "--with", "cpu", "--target", str(patched)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (patched / MODULE).is_file() and "writers_die_with_rank.install()" in (
        patched / HOOKED
    ).read_text()
    control = root / "control"
    shutil.copytree(patched, control, symlinks=True)
    (control / MODULE).unlink()
    shutil.copyfile(pristine_base("0.9.1") / HOOKED, control / HOOKED)
    env = {k: v for k, v in os.environ.items() if not k.startswith("VERL_")}
    # the CPU platform the 0.9.1 CPU runs load (the CPU overlay is one per base): cpu-0017's shims take effect on it
    env.update(manifest.resolve_launch("qwen2_5", "0.9.1", profile="cpu").cpu_env)
    env.update(OMP_NUM_THREADS="1")
    return {"patched": patched, "control": control}, env, packages, root


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def children_map() -> dict[int, list[int]]:
    """Each live process's children, from /proc."""
    out: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        out.setdefault(ppid, []).append(int(entry.name))
    return out


def descendants(pid: int) -> list[int]:
    kids, out, todo = children_map(), [], [pid]
    while todo:
        for child in kids.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def cmdline(pid: int) -> bytes | None:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None


def forked(pid: int) -> list[int]:
    """The rank's descendants that are forks of it (its command line; not exec'd helpers such as the resource
    tracker)."""
    own = cmdline(pid)
    return [p for p in descendants(pid) if cmdline(p) == own]


def start(python: Path, tree: Path, env: dict, packages: Path, work: Path, mode: str, block: bool):
    work.mkdir(parents=True)
    run_env = dict(env, PYTHONPATH=os.pathsep.join([str(tree), str(packages)]))
    args = [str(python), str(DRIVER), "--ckpt", str(work / "ckpt"), "--out", str(work / "out.json")]
    args += ["--mode", mode, "--port", str(free_port())] + (["--block"] if block else [])
    log = open(work / "driver.log", "w")  # noqa: SIM115 (closed by the caller through proc.log)
    proc = subprocess.Popen(
        args, cwd=work, env=run_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    proc.log = log
    return proc


def report(work: Path) -> dict:
    path = work / "out.json"
    return json.loads(path.read_text()) if path.is_file() else {}


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("tree", ["patched", "control"])
def test_a_rank_killed_in_the_save_leaves_its_writers_only_without_ds_0211(e2e_python_091, trees, mode, tree):
    paths, env, packages, root = trees
    work = root / f"kill-{tree}-{mode}"
    proc = start(e2e_python_091, paths[tree], env, packages, work, mode, block=True)
    # writers blocked in the save: sync, the rank's own forks (2 buckets: thread_count 2); async, the caller + its
    want = 2 if mode == "sync" else 3
    writers: list[int] = []
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            ready = report(work).get("saving") and (mode == "sync" or report(work).get("scheduled"))
            writers = forked(proc.pid) if ready else []
            if len(writers) >= want:
                break
            time.sleep(0.5)
        log = (work / "driver.log").read_text(errors="replace")
        assert proc.poll() is None and len(writers) >= want, (writers, log[-3000:])
        assert report(work)["installed"] is (tree == "patched")
        if mode == "async":  # the caller's own forks: the writers are the rank's grandchildren
            assert any(p not in children_map().get(proc.pid, []) for p in writers), writers
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        if tree == "patched":
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and any(alive(p) for p in writers):
                time.sleep(0.2)
            assert not [p for p in writers if alive(p)], "forked writers outlived their rank"
        else:
            time.sleep(2)
            # blocked in open() on the FIFO for good: the writers outlive the rank
            assert all(alive(p) for p in writers), [p for p in writers if not alive(p)]
    finally:
        proc.log.close()
        for pid in [proc.pid, *writers]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait(timeout=60)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_an_unkilled_save_completes_and_loads_back_with_ds_0211(e2e_python_091, trees, mode):
    paths, env, packages, root = trees
    work = root / f"save-{mode}"
    proc = start(e2e_python_091, paths["patched"], env, packages, work, mode, block=False)
    try:
        rc = proc.wait(timeout=600)
    finally:
        proc.log.close()
    got = report(work)
    assert rc == 0, (work / "driver.log").read_text(errors="replace")[-3000:]
    assert got["installed"] is True and got["equal"] is True, got
    assert {"common.pt", "metadata.json", ".metadata", "__0_0.distcp"} <= set(got["saved"]), got
