"""What a run leaves in /dev/shm: recorded by name as its processes create it, removed by those names once nobody
uses them (ascend_rl/shm.py, the hook ascend_rl/shm_record/recipes_shm_record.py, launch()).

The unit tests make real POSIX segments and semaphores in child processes that die the way a killed run's do
(SIGKILL to their whole process group, multiprocessing's resource tracker included); each test removes what
it made. The run-level test (make test-full) runs verl 0.7.1 through its launcher, whose vLLM engine is what
left the psm_* segments, and compares /dev/shm before and after, also after a run killed with its harness; the
run that ends by itself shuts its engine down (shared-0013), and the engine's processes unlink their own queues.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from multiprocessing import resource_tracker, shared_memory
from pathlib import Path

import pytest

from ascend_rl import shm
from ascend_rl.paths import HOOK_PATH

REPO = Path(__file__).resolve().parents[2]

# A child that makes what the hook records, then dies with its process group (its resource tracker too, as
# Ray's kill of the vLLM server's children takes the tracker): one segment unlinked, one left, a spawn lock left.
LEAKER = textwrap.dedent(
    """
    import json, multiprocessing, os, signal
    from multiprocessing import shared_memory
    gone = shared_memory.SharedMemory(create=True, size=4096)
    gone.close()
    gone.unlink()
    left = shared_memory.SharedMemory(create=True, size=8192)
    lock = multiprocessing.get_context("spawn").Lock()
    print(json.dumps({"gone": gone.name, "left": left.name, "sem": "sem." + lock._semlock.name.lstrip("/")}), flush=True)
    os.killpg(0, signal.SIGKILL)
    """
)


def _leak(record: Path) -> dict:
    """Run LEAKER with the hook recording into `record`; the names it printed."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, HOOK_PATH)), shm.ENV: str(record)}
    proc = subprocess.run(
        [sys.executable, "-c", LEAKER],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        start_new_session=True,  # its own group: the kill takes it and its tracker, never pytest
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    return json.loads(proc.stdout)


def _unlink_all(*names: str) -> None:
    for name in names:
        (shm.SHM / name).unlink(missing_ok=True)


def test_the_hook_records_what_a_killed_process_created_and_left(tmp_path):
    record = tmp_path / "shm.jsonl"
    names = _leak(record)
    try:
        events = [json.loads(line) for line in record.read_text().splitlines()]
        created = {e["name"]: e for e in events if e["event"] == "create"}
        assert set(created) == {names["gone"], names["left"], names["sem"]}
        assert created[names["left"]]["size"] == 8192 and created[names["left"]]["kind"] == "shm"
        assert created[names["sem"]]["kind"] == "sem"
        assert created[names["left"]]["by"].startswith("<string>:"), "the creating line names the caller"
        # the hook records, it never cleans: the kill left the segment and the semaphore
        assert (shm.SHM / names["left"]).exists() and (shm.SHM / names["sem"]).exists()
        assert not (shm.SHM / names["gone"]).exists()
        assert set(shm.read_record(record)) == {names["left"], names["sem"]}, "unlinked names are not left"
    finally:
        _unlink_all(names["left"], names["sem"])


def test_cleanup_removes_a_dead_runs_leftovers_by_its_record_only(tmp_path):
    record = tmp_path / "run" / "shm.jsonl"
    record.parent.mkdir()
    names = _leak(record)
    bystander = shared_memory.SharedMemory(create=True, size=4096)  # in /dev/shm, in no record: never touched
    try:
        bystander.close()  # nobody maps it now; only the record decides
        done = shm.clean_out(tmp_path)
        assert sorted(done.removed) == sorted([names["left"], names["sem"]]) and not done.kept
        assert not (shm.SHM / names["left"]).exists() and not (shm.SHM / names["sem"]).exists()
        assert (shm.SHM / bystander.name).exists()
        # the removals are recorded: a second cleanup has nothing to do
        assert shm.read_record(record) == {}
        assert shm.clean_out(tmp_path) == shm.Cleanup()
    finally:
        bystander.unlink()
        _unlink_all(names["left"], names["sem"])


def test_an_entry_a_live_process_maps_is_kept(tmp_path):
    record = tmp_path / "shm.jsonl"
    names = _leak(record)
    reader = shared_memory.SharedMemory(name=names["left"])  # a live process (this one) maps it
    # Python 3.11 tracks an attachment as if it had created the segment: the unlink is not this process's
    resource_tracker.unregister(reader._name, "shared_memory")
    try:
        assert names["left"] in shm.in_use()
        done = shm.remove_leftovers(record)
        assert done.kept == {names["left"]: "in use by a live process"}
        assert done.removed == [names["sem"]]
        assert (shm.SHM / names["left"]).exists()
        reader.close()
        assert shm.remove_leftovers(record).removed == [names["left"]]
    finally:
        reader.close()
        _unlink_all(names["left"], names["sem"])


def test_an_entry_whose_creator_still_runs_is_kept(tmp_path):
    mine = shared_memory.SharedMemory(create=True, size=4096)
    mine.close()  # unmapped, but its creator (this process) is alive and may still use the name
    record = tmp_path / "shm.jsonl"
    pid = os.getpid()
    event = {"event": "create", "kind": "shm", "name": mine.name, "pid": pid, "start": shm.start_time(pid)}
    record.write_text(json.dumps(event) + "\n")
    try:
        done = shm.remove_leftovers(record)
        assert done.kept == {mine.name: f"its creator (pid {pid}) is still running"} and not done.removed
        assert (shm.SHM / mine.name).exists()
        # the same pid with another start time is another process: the creator has ended
        record.write_text(json.dumps({**event, "start": event["start"] - 1}) + "\n")
        assert shm.remove_leftovers(record).removed == [mine.name]
    finally:
        if (shm.SHM / mine.name).exists():
            mine.unlink()
        else:
            resource_tracker.unregister(mine._name, "shared_memory")


def test_a_recorded_name_that_is_a_path_is_never_followed(tmp_path):
    """The cleanup acts only on plain names inside the shm folder (here a stand-in folder)."""
    shm_dir, outside = tmp_path / "shm", tmp_path / "precious"
    shm_dir.mkdir()
    outside.write_text("keep")
    (shm_dir / "psm_dead").write_text("")
    (shm_dir / "psm_unrecorded").write_text("")
    lines = [
        {"event": "create", "name": "../precious", "pid": 1 << 30},
        {"event": "create", "name": "psm_dead", "pid": 1 << 30},
        {"event": "create", "name": ".", "pid": 1 << 30},
    ]
    record = tmp_path / "shm.jsonl"
    record.write_text("".join(json.dumps(e) + "\n" for e in lines) + '{"event": "create", "na')  # cut short
    done = shm.remove_leftovers(record, shm_dir)
    assert done.removed == ["psm_dead"]
    assert outside.read_text() == "keep" and (shm_dir / "psm_unrecorded").exists()


# --- launch() with a stand-in launcher --------------------------------------------------------------------

# A launcher whose "engine" makes a segment and a lock and is killed with its group before it can unlink them.
STANDIN = """python - <<'EOF'
import multiprocessing, os, signal
from multiprocessing import shared_memory
segment = shared_memory.SharedMemory(create=True, size=4096)
lock = multiprocessing.get_context("spawn").Lock()
print("made", segment.name, flush=True)
os.killpg(0, signal.SIGKILL)
EOF
"""


@pytest.mark.ci  # it calls launch(), which asks every test that launches for its tier
def test_launch_removes_what_its_run_left_and_what_an_earlier_killed_run_left(tmp_path, capsys):
    from ascend_rl.harness.launch import HarnessError, launch

    out = tmp_path / "out"
    launcher = tmp_path / "launcher.sh"
    launcher.write_text(STANDIN)
    # an earlier run in this folder, killed together with its harness: its record and leftovers remain
    (out / "earlier").mkdir(parents=True)
    earlier = _leak(out / "earlier" / "shm.jsonl")
    made = []
    try:
        assert (shm.SHM / earlier["left"]).exists()
        with pytest.raises(HarnessError):
            launch("run", launcher, [], out, tmp_path / "model", tmp_path / "data", timeout_s=60)
        said = capsys.readouterr().out
        made = sorted(_created(out / "run" / "shm.jsonl"))
        assert len(made) == 2, "the stand-in's segment and lock, recorded through the launcher's PYTHONPATH"
        assert not any((shm.SHM / name).exists() for name in made), said
        assert not (shm.SHM / earlier["left"]).exists() and not (shm.SHM / earlier["sem"]).exists(), said
        first, second = (line for line in said.splitlines() if "/dev/shm" in line)
        assert first.startswith("e2e: run: removed 2 /dev/shm entries earlier runs left"), said
        assert earlier["left"] in first and earlier["sem"] in first, said
        assert second.startswith("e2e: run: removed 2 /dev/shm entries the run left"), said
    finally:
        _unlink_all(*made, *earlier.values())


# --- a verl 0.7.1 run through its launcher ----------------------------------------------------------------


def _listing() -> dict[str, int]:
    """/dev/shm now: name -> size."""
    found = {}
    for entry in os.scandir(shm.SHM):
        try:
            found[entry.name] = entry.stat(follow_symlinks=False).st_size
        except FileNotFoundError:
            continue
    return found


class RunWatcher(threading.Thread):
    """Every second, the /dev/shm names the run's processes map (those whose environment carries `needle`),
    seen from outside: what the hook must have recorded, whatever created it."""

    def __init__(self, needle: str) -> None:
        super().__init__(daemon=True)
        self.needle, self.seen, self.stop = needle.encode(), set(), threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            for pid in _processes(self.needle):
                try:
                    maps = Path(f"/proc/{pid}/maps").read_bytes()
                except OSError:
                    continue
                for line in maps.splitlines():
                    at = line.find(b"/dev/shm/")
                    if at != -1 and not line.endswith(b" (deleted)"):  # Ray's object store unlinks its files
                        self.seen.add(line[at + 9 :].decode(errors="replace"))
            self.stop.wait(1.0)


def _processes(needle: bytes) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if needle in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def _created(record: Path) -> set[str]:
    """Every name the record says the run created (unlinked since or not)."""
    lines = record.read_text().splitlines() if record.is_file() else []
    return {e["name"] for e in map(json.loads, lines) if e["event"] == "create"}


def _events(record: Path) -> list[dict]:
    """The record's events, in order (a line cut short by a killed writer is skipped)."""
    events = []
    for line in record.read_text().splitlines() if record.is_file() else []:
        try:
            events.append(json.loads(line))
        except ValueError:
            continue
    return events


def _engine_queues_unlinked_by_creator(record: Path) -> tuple[dict[str, dict], dict[str, dict]]:
    """vLLM's message queues in the record (the segments shm_broadcast.py made: the EngineCore's broadcast queue and
    each worker's response queue), split into those an unlink event of their creating process (the same pid)
    follows, and the rest."""
    created: dict[str, dict] = {}
    unlinked_by_creator: set[str] = set()
    for event in _events(record):
        if event["event"] == "create" and "shm_broadcast.py" in (event.get("by") or ""):
            created[event["name"]] = event
        elif event["event"] == "unlink" and event["name"] in created:
            if event.get("pid") == created[event["name"]]["pid"]:
                unlinked_by_creator.add(event["name"])
    by_creator = {name: e for name, e in created.items() if name in unlinked_by_creator}
    rest = {name: e for name, e in created.items() if name not in unlinked_by_creator}
    return by_creator, rest


def _e2e(python: Path, out: Path, **popen) -> subprocess.Popen:
    cmd = [str(python), "-m", "ascend_rl", "e2e", "--out", str(out), "--runs", "v071", "--steps", "1"]
    return subprocess.Popen(
        cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **popen
    )


@pytest.mark.full
def test_a_0_7_1_run_leaves_dev_shm_as_it_found_it_also_after_a_killed_one(e2e_python, tmp_path):
    """First a run killed with its harness once vLLM's engine has made its queues (its leftovers stay: nothing of
    it survives to clean up), then a whole one-step run in the same folder: it removes the killed run's
    leftovers before it starts, and its vLLM engine, shut down when training ends (shared-0013), unlinks its own
    queues. /dev/shm before and after: nothing the runs made or mapped is left; the entries the runs' processes
    were seen to map are all in their records."""
    out = tmp_path / "shm_out"
    record = out / "v071" / "shm.jsonl"
    before = _listing()

    # 1. killed with its harness while its engine is up
    killed = _e2e(e2e_python, out, start_new_session=True)
    watcher = RunWatcher(str(record))
    watcher.start()
    deadline = time.monotonic() + 900
    while not any(e.get("size", 0) >= 100 << 20 for e in shm.read_record(record).values()):
        assert killed.poll() is None and time.monotonic() < deadline, killed.stdout.read()
        time.sleep(1)
    time.sleep(2)  # the watcher's next look
    watcher.stop.set()
    watcher.join()
    os.killpg(killed.pid, signal.SIGKILL)  # the harness
    for pid in _processes(str(record).encode()):  # the run (its own process group, and Ray's helpers)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    killed.wait(timeout=60)
    killed_left, killed_made = shm.read_record(record), _created(record)
    deadline = time.monotonic() + 30
    while _processes(str(record).encode()) and time.monotonic() < deadline:
        time.sleep(0.5)
    left_now = {name for name in killed_left if (shm.SHM / name).exists()}
    assert left_now, "the killed run left nothing to clean up: the test would prove nothing"
    assert watcher.seen - set(before) <= killed_made, "the run mapped names its record lacks"

    # 2. a whole run in the same folder
    run = _e2e(e2e_python, out)
    watcher = RunWatcher(str(record))
    watcher.start()
    stdout, _ = run.communicate(timeout=1500)
    watcher.stop.set()
    watcher.join()
    after = _listing()
    # one step cannot move the policy far enough for e2e's weight-sync check (exit 1): the run itself is the point
    summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").is_file() else {}
    assert summary.get("runs", {}).get("v071", {}).get("steps_done") == [1], stdout[-3000:]
    assert "earlier runs left" in stdout, stdout[-3000:]
    assert not any((shm.SHM / name).exists() for name in left_now), (
        "the killed run's leftovers are still there"
    )
    made = _created(record)
    new = {name: size for name, size in after.items() if name not in before}
    mine = {name: size for name, size in new.items() if name in made | watcher.seen | killed_made}
    assert not mine, f"the runs left {mine} in /dev/shm"
    assert watcher.seen - set(before) <= made, "the run mapped names its record lacks"

    # the run that ended by itself shut its vLLM engine down (shared-0013): each of the engine's queues was unlinked
    # by the process that made it, and the harness's cleanup had none of them left to remove
    by_creator, rest = _engine_queues_unlinked_by_creator(record)
    assert by_creator and not rest, f"engine queues not unlinked by their creators: {rest}; {stdout[-3000:]}"
    removed = [line for line in stdout.splitlines() if "/dev/shm entries the run left" in line]
    assert not any(name in line for line in removed for name in by_creator), removed


SHM_RECORD_SITE = REPO / "ascend_rl" / "shm_record"


def test_a_launch_frees_what_a_killed_earlier_launch_left_on_this_node(tmp_path):
    """The launchers' own record (issue 48, item 6): a process of a run started by a launcher (ascend_rl/shm_record/
    on PYTHONPATH, RECIPES_SHM_RECORD with {host}) records each name as it makes it, into this node's folder; killed
    with its group, it leaves them; the next launch's `python3 -m ascend_rl shm clean` removes them by name,
    says how much it freed, and deletes the record it has nothing left of."""
    import socket

    records = tmp_path / "records"
    env = {
        **os.environ,
        "PYTHONPATH": str(SHM_RECORD_SITE),
        shm.ENV: str(records / "{host}" / "run_1.jsonl"),
    }
    proc = subprocess.run(
        [sys.executable, "-c", LEAKER],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        start_new_session=True,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    names = json.loads(proc.stdout)
    record = records / socket.gethostname() / "run_1.jsonl"
    bystander = shared_memory.SharedMemory(create=True, size=4096)  # in no record: never touched
    try:
        bystander.close()
        assert set(shm.read_record(record)) == {names["left"], names["sem"]}
        assert (shm.SHM / names["left"]).exists()
        clean = subprocess.run(
            [sys.executable, "-m", "ascend_rl", "shm", "clean", "--records", str(records)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert clean.returncode == 0, clean.stderr
        assert clean.stdout.startswith(
            "shm: freed 8 KiB of /dev/shm: 2 entries an earlier run of these launchers"
        ), clean.stdout
        assert names["left"] in clean.stdout and names["sem"] in clean.stdout
        assert not (shm.SHM / names["left"]).exists() and not (shm.SHM / names["sem"]).exists()
        assert (shm.SHM / bystander.name).exists()
        assert not record.exists()  # nothing of it left: the record goes too
        again = subprocess.run(
            [sys.executable, "-m", "ascend_rl", "shm", "clean", "--records", str(records)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert again.returncode == 0 and again.stdout == ""
    finally:
        bystander.unlink()
        _unlink_all(names["left"], names["sem"])


def test_the_launch_record_runs_the_sitecustomize_it_shadows(tmp_path):
    # a folder with its own sitecustomize after ours on the path (a distribution's, the test hooks'): it still runs
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['SHADOWED_RAN'] = '1'\n")
    env = {
        **os.environ,
        "PYTHONPATH": f"{SHM_RECORD_SITE}{os.pathsep}{other}",
        shm.ENV: str(tmp_path / "r.jsonl"),
    }
    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.environ.get('SHADOWED_RAN'))"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.stdout.strip() == "1", proc.stdout + proc.stderr


@pytest.mark.full
def test_a_launcher_run_killed_on_0_7_1_then_resumed_leaves_dev_shm_as_it_was(e2e_python, tmp_path):
    """Issue 48, item 6, as a user meets it: the Qwen launcher run directly (no harness cleaning up after it) on
    verl 0.7.1, SIGKILLed once its first checkpoint is being written (vLLM's engine queues made), then the same
    launch again, which resumes. The second launch removes what the first left (by its own record) and says how
    much it freed; when it has ended, /dev/shm holds nothing either run made."""
    import socket

    before = set(_listing())
    out = tmp_path / "out"
    prep = subprocess.run(
        [
            str(e2e_python),
            "-c",
            "import sys; from pathlib import Path; from ascend_rl.harness.e2e import prepare_inputs; "
            "print(*prepare_inputs(Path(sys.argv[1]), 300), sep='\\n')",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert prep.returncode == 0, prep.stderr[-2000:]
    model, data = prep.stdout.strip().splitlines()[-2:]
    records = tmp_path / "records"
    env = {
        **os.environ,
        "PATH": f"{Path(e2e_python).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHON": str(e2e_python),
        "VERL_BASE": "0.7.1",
        "MODEL_DIR": model,
        "DATA_DIR": data,
        "LOG_DIR": str(out / "log"),
        "CKPT_DIR": str(out / "ckpt"),
        "RUN_NAME": "shm_kill",
        "RECIPES_SHM_RECORDS": str(records),
        "PYTHONUNBUFFERED": "1",
    }
    env.pop(shm.ENV, None)  # the launcher records the run itself, as for a user
    argv = ["bash", str(REPO / "llm_rl" / "qwen2_5" / "run_qwen2_5_1_5b_single.sh"), "--cpu"]
    argv += ["trainer.total_training_steps=2", "trainer.save_freq=1", "trainer.resume_mode=auto"]
    node = records / socket.gethostname()

    killed = subprocess.Popen(
        argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True
    )
    step1 = out / "ckpt" / "shm_kill" / "global_step_1"
    deadline = time.monotonic() + 1200
    while not (step1.exists() or step1.with_name("global_step_1.partial").exists()):
        assert killed.poll() is None and time.monotonic() < deadline, (
            "the first run ended before its first save"
        )
        time.sleep(0.5)
    os.killpg(killed.pid, signal.SIGKILL)
    for pid in _processes(str(records).encode()):  # Ray's processes outside the launcher's group
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    killed.wait(timeout=60)
    deadline = time.monotonic() + 30
    while _processes(str(records).encode()) and time.monotonic() < deadline:
        time.sleep(0.5)
    made = set().union(*(_created(r) for r in node.glob("*.jsonl")))
    left = {name for r in node.glob("*.jsonl") for name in shm.read_record(r) if (shm.SHM / name).exists()}
    assert left, "the killed run left nothing in /dev/shm: the test would prove nothing"

    resumed = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    freed = [line for line in resumed.stdout.splitlines() if line.startswith("shm: freed ")]
    assert len(freed) == 1 and all(name in freed[0] for name in left), resumed.stdout[-3000:]
    # it resumed: verl 0.7.1 names the checkpoint it found (seen: "Found checkpoint: %s .../global_step_1")
    found = [line for line in resumed.stdout.splitlines() if "Found checkpoint" in line]
    assert found and found[0].endswith("global_step_1"), resumed.stdout[-3000:]
    made |= set().union(*(_created(r) for r in node.glob("*.jsonl")))
    new = set(_listing()) - before
    assert not new & made, f"the runs left {sorted(new & made)} in /dev/shm"
    assert not any((shm.SHM / name).exists() for name in left)
