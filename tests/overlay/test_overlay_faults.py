"""The overlay tool under faults, on the DeepSeek series over the real verl 0.6.0 sdist: killed at
every file boundary and at random moments, run twice at once, refused on a local edit, a full disk,
a closed pipe. Every outcome is checked byte for byte against a clean apply or the pristine tree. Every command
names --base 0.6.0 (the recipe's default base is 0.9.1: on a 0.6.0 tree it would say so in a line of its own, and
fetch would fetch 0.9.1)."""

from __future__ import annotations

import json
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_overlay import PROTOCOL, cli, make_patch, make_recipe, tree_hash

from ascend_rl import journal, overlay
from ascend_rl.cli import overlay as overlay_cli

DEEPSEEK = overlay.load_recipe("deepseek_r1", "0.6.0")
DS = ("deepseek_r1", "--base", "0.6.0")  # the recipe and its base on every command line
SERIES = overlay.load_series(DEEPSEEK)
TOUCHED = sorted({fp.path for patch in SERIES for fp in patch.files})
CONTROL = (journal.LOCK_NAME, journal.TXN_NAME, journal.TXN_PREP)


@pytest.fixture(scope="module")
def refs(pristine_verl, patched_verl) -> dict[str, Path]:
    """The pristine tree and a clean apply of the DeepSeek series (shared: read only)."""
    return {"pristine": pristine_verl, "patched": patched_verl("deepseek_r1")}


@pytest.fixture(scope="module")
def hashes(refs) -> dict[str, dict[str, str]]:
    return {name: tree_hash(root) for name, root in refs.items()}


def reset(tree: Path, reference: Path) -> None:
    """Make `tree` equal to `reference` again, touching only what the series and the tool touch."""
    for name in CONTROL:
        path = tree / name
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    for rel in TOUCHED:
        src, dst = reference / rel, tree / rel
        if src.is_file():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
        else:
            dst.unlink(missing_ok=True)


def run_dying(args: list, crash_after: int) -> int | None:
    """overlay_cli.main(args) in a forked child that SIGKILLs itself after its Nth file operation.

    None when it was killed, else its exit status (it finished in fewer operations).
    """
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = 99
        try:
            os.environ[journal.CRASH_ENV] = str(crash_after)
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 1)
            os.dup2(null, 2)
            code = overlay_cli.main([str(a) for a in args])
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        assert os.WTERMSIG(status) == signal.SIGKILL
        return None
    return os.WEXITSTATUS(status)


def each_file_is_old_or_new(tree: Path, refs: dict[str, Path]) -> None:
    for rel in TOUCHED:
        now = (tree / rel).read_bytes() if (tree / rel).is_file() else None
        sides = [(ref / rel).read_bytes() if (ref / rel).is_file() else None for ref in refs.values()]
        assert now in sides, f"{rel} is neither pristine nor patched"


def status_of(tree: Path, capsys) -> tuple[int, str]:
    capsys.readouterr()
    code = overlay_cli.main(["status", *DS, "--target", str(tree)])
    return code, capsys.readouterr().out


def check_killed_then_recovered(tree, refs, hashes, start, capsys, verb_for) -> int:
    """Kill `start`'s verb after each file operation in turn; after each, status must report and
    change nothing, and the next verb must end byte-identical to its clean result."""
    first = "apply" if start == "pristine" else "revert"
    n = 0
    while True:
        n += 1
        reset(tree, refs[start])
        code = run_dying([first, *DS, "--target", tree], n)
        if code is not None:  # ran out of operations to stop after: it finished by itself
            assert code == 0
            assert tree_hash(tree) == hashes["patched" if first == "apply" else "pristine"]
            return n
        each_file_is_old_or_new(tree, refs)
        before = tree_hash(tree)
        before.pop(journal.LOCK_NAME)  # the dead command's lock file: the next holder removes it
        code, out = status_of(tree, capsys)
        assert tree_hash(tree) == before, f"status changed the tree after a kill at step {n}"
        if (tree / journal.TXN_NAME / journal.JOURNAL_NAME).exists():
            assert code == 1, (n, out)
            article = "an" if first == "apply" else "a"
            assert f"interrupted: {article} {first} of deepseek_r1 on verl 0.6.0 (pid " in out, (n, out)
            assert f"completes the {first} first" in out
        elif (tree / journal.TXN_PREP).exists():  # killed before the commit: nothing changed yet
            assert before.keys() - hashes[start].keys() == {
                k for k in before if k.startswith(journal.TXN_PREP)
            }
            assert code == 0 and "leftovers of an interrupted overlay command" in out, out
        elif (tree / journal.TXN_NAME).exists():  # killed while removing the spent journal
            assert code == 0 and "leftovers of an interrupted overlay command" in out, out
        verb = verb_for(n)
        assert overlay_cli.main([verb, *DS, "--target", str(tree)]) == 0, n
        want = "patched" if verb == "apply" else "pristine"
        assert tree_hash(tree) == hashes[want], f"kill at step {n}, then {verb}: not a clean {want} tree"


def test_apply_killed_at_every_file_boundary(verl_tree, refs, hashes, capsys):
    steps = check_killed_then_recovered(
        verl_tree, refs, hashes, "pristine", capsys, lambda n: ("apply", "revert")[n % 2]
    )
    # Each file is staged, then renamed into place: at least two stops per file were tried.
    # Each file is at least one boundary (a file the series added is removed in one operation,
    # a changed one is staged, then renamed into place).
    assert steps > len(TOUCHED)


@pytest.mark.slow
def test_revert_killed_at_every_file_boundary(verl_tree, refs, hashes, capsys):
    steps = check_killed_then_recovered(
        verl_tree, refs, hashes, "patched", capsys, lambda n: ("revert", "apply")[n % 2]
    )
    # Each file is at least one boundary (a file the series added is removed in one operation,
    # a changed one is staged, then renamed into place).
    assert steps > len(TOUCHED)


def test_recovery_killed_at_every_file_boundary(verl_tree, refs, hashes):
    """A kill while finishing an interrupted apply is finished by the command after it."""
    staged_and_committed = len(TOUCHED) + 2
    m = 0
    while True:
        m += 1
        reset(verl_tree, refs["pristine"])
        assert run_dying(["apply", *DS, "--target", verl_tree], staged_and_committed + 3) is None
        assert (verl_tree / journal.TXN_NAME).is_dir()
        code = run_dying(["apply", *DS, "--target", verl_tree], m)
        if code is not None:  # the recovery and the (empty) apply after it ran to the end
            assert code == 0 and tree_hash(verl_tree) == hashes["patched"]
            break
        each_file_is_old_or_new(verl_tree, refs)
        verb = ("apply", "revert")[m % 2]
        assert overlay_cli.main([verb, *DS, "--target", str(verl_tree)]) == 0
        want = "patched" if verb == "apply" else "pristine"
        assert tree_hash(verl_tree) == hashes[want], f"recovery killed at step {m}, then {verb}"
    # 3 files were in place: the rest, then the journal and its folder, each a place to stop.
    assert m == len(TOUCHED) - 3 + 2 + 1


def test_killed_apply_keeps_file_modes(verl_tree, refs):
    """Staged files carry the mode of the file they replace, new files the user's umask."""
    existing, new = "verl/workers/fsdp_workers.py", "verl/utils/explicit_offload.py"
    assert (refs["pristine"] / existing).is_file() and not (refs["pristine"] / new).exists()
    (verl_tree / existing).chmod(0o750)
    old_umask = os.umask(0o027)
    try:
        assert run_dying(["apply", *DS, "--target", verl_tree], len(TOUCHED) + 3) is None
    finally:
        os.umask(old_umask)
    assert overlay_cli.main(["apply", *DS, "--target", str(verl_tree)]) == 0
    assert (verl_tree / existing).read_bytes() == (refs["patched"] / existing).read_bytes()
    assert (verl_tree / existing).stat().st_mode & 0o7777 == 0o750
    assert (verl_tree / new).stat().st_mode & 0o7777 == 0o640


def umask_cli(mask: int, *args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ascend_rl", "overlay", *map(str, args)],
        capture_output=True,
        text=True,
        preexec_fn=lambda: os.umask(mask),
        timeout=600,
    )


@pytest.mark.parametrize("mask", [0o022, 0o002, 0o077])
def test_modes_follow_the_umask_and_survive_replacement(verl_tree, mask):
    existing, new = "verl/workers/fsdp_workers.py", "verl/utils/explicit_offload.py"
    (verl_tree / existing).chmod(0o755)
    assert umask_cli(mask, "apply", *DS, "--target", verl_tree).returncode == 0
    assert (verl_tree / new).stat().st_mode & 0o7777 == 0o666 & ~mask
    assert (verl_tree / existing).stat().st_mode & 0o7777 == 0o755
    assert umask_cli(mask, "revert", *DS, "--target", verl_tree).returncode == 0
    assert (verl_tree / existing).stat().st_mode & 0o7777 == 0o755


def test_changed_file_after_a_kill_is_refused_not_overwritten(verl_tree, refs):
    assert run_dying(["apply", *DS, "--target", verl_tree], len(TOUCHED) + 3) is None
    pending = journal.read_pending(verl_tree)
    assert pending is not None and pending.todo
    victim = pending.todo[-1]["path"]
    (verl_tree / victim).write_text("edited by hand after the kill\n")
    before = tree_hash(verl_tree)
    before.pop(journal.LOCK_NAME)
    for verb in ("apply", "revert"):
        proc = cli(verb, *DS, "--target", verl_tree)
        assert proc.returncode == 1, proc.stdout
        err = proc.stderr.strip().splitlines()
        assert len(err) == 1 and victim in err[0] and str(verl_tree / journal.TXN_NAME) in err[0], err
        assert tree_hash(verl_tree) == before
    status = cli("status", *DS, "--target", verl_tree)
    assert status.returncode == 1 and victim in status.stdout and "will refuse" in status.stdout


def test_fetch_onto_an_interrupted_tree_finishes_it(verl_tree, hashes):
    assert run_dying(["apply", *DS, "--target", verl_tree], len(TOUCHED) + 5) is None
    proc = cli("fetch", *DS, "--dest", verl_tree)
    assert proc.returncode == 0, proc.stderr
    assert "completed an interrupted apply" in proc.stdout and "nothing to fetch" in proc.stdout
    assert tree_hash(verl_tree) == hashes["patched"]


def test_dry_run_on_an_interrupted_tree_changes_nothing(verl_tree, hashes):
    assert run_dying(["apply", *DS, "--target", verl_tree], len(TOUCHED) + 6) is None
    before = tree_hash(verl_tree)
    before.pop(journal.LOCK_NAME)
    proc = cli("revert", *DS, "--target", verl_tree, "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "a real run completes the apply first" in proc.stdout
    assert f"reverted {len(SERIES)} of {len(SERIES)}" in proc.stdout
    assert tree_hash(verl_tree) == before
    applied = cli("apply", *DS, "--target", verl_tree, "--dry-run")
    assert applied.returncode == 0 and "nothing to do" in applied.stdout
    assert tree_hash(verl_tree) == before


# --- killed from outside -------------------------------------------------------------------------


def popen(*args) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "ascend_rl", "overlay", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.slow
@pytest.mark.parametrize("verb", ["apply", "revert"])
def test_killed_from_outside_at_random_moments(verl_tree, refs, hashes, verb):
    """SIGKILL at a random moment (some while files are being replaced): the next command heals it."""
    start = "pristine" if verb == "apply" else "patched"
    rng = random.Random(13)
    reset(verl_tree, refs[start])
    clock = time.monotonic()
    assert cli(verb, *DS, "--target", verl_tree).returncode == 0
    span = time.monotonic() - clock  # only to spread the kills over a run; nothing asserts on it
    for attempt in range(12):
        reset(verl_tree, refs[start])
        proc = popen(verb, *DS, "--target", verl_tree)
        # Anywhere in the run; while files are staged; while they are renamed into place.
        mode = attempt % 3
        if mode:
            marker = verl_tree / (journal.TXN_PREP, journal.TXN_NAME)[mode - 1]
            while proc.poll() is None and not marker.exists():
                time.sleep(0.0005)
        time.sleep(rng.uniform(0, (span, 0.03, 0.005)[mode]))
        proc.kill()
        proc.communicate()
        each_file_is_old_or_new(verl_tree, refs)
        after = ("apply", "revert")[attempt % 4 // 2]
        assert cli(after, *DS, "--target", verl_tree).returncode == 0
        want = "patched" if after == "apply" else "pristine"
        assert tree_hash(verl_tree) == hashes[want], f"attempt {attempt}: {verb} killed, then {after}"


# --- a second copy of the tool ---------------------------------------------------------------------


def test_two_reverts_at_once_are_serialized(verl_tree, refs, hashes):
    for _ in range(3):
        reset(verl_tree, refs["patched"])
        procs = [popen("revert", *DS, "--target", verl_tree) for _ in range(2)]
        outs = [p.communicate() for p in procs]
        assert [p.returncode for p in procs] == [0, 0], outs
        said = [out for out, _ in outs]
        assert sum(f"reverted {len(SERIES)} of {len(SERIES)}" in out for out in said) == 1, said
        assert sum("nothing to revert" in out for out in said) == 1, said
        assert tree_hash(verl_tree) == hashes["pristine"]


def test_apply_and_revert_at_once_end_in_one_clean_tree(verl_tree, refs, hashes):
    for _ in range(3):
        reset(verl_tree, refs["pristine"])
        procs = [popen(verb, *DS, "--target", verl_tree) for verb in ("apply", "revert", "apply")]
        outs = [p.communicate() for p in procs]
        assert [p.returncode for p in procs] == [0, 0, 0], outs
        assert tree_hash(verl_tree) in (hashes["pristine"], hashes["patched"])


def test_two_fetches_at_once_leave_one_pinned_tree(tmp_path, hashes):
    dest = tmp_path / "fetched"
    procs = [popen("fetch", *DS, "--source", "sdist", "--dest", dest) for _ in range(2)]
    outs = [p.communicate() for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert sum("nothing to fetch" in out for out, _ in outs) == 1, outs
    assert tree_hash(dest) == hashes["pristine"]
    assert [p.name for p in tmp_path.iterdir()] == ["fetched"], "no half-unpacked tree left beside it"


def test_a_held_lock_makes_the_second_command_wait(verl_tree, refs, hashes):
    reset(verl_tree, refs["patched"])
    with journal.tree_lock(verl_tree.resolve(), wait=0):
        proc = popen("revert", *DS, "--target", verl_tree, "--wait", "300")
        line = proc.stderr.readline()
        assert "waiting for another overlay command" in line and f"pid {os.getpid()}" in line, line
        assert proc.poll() is None
        held = tree_hash(verl_tree)
        assert held.pop(journal.LOCK_NAME) and held == hashes["patched"], "the waiting revert wrote"
    out, err = proc.communicate()
    assert proc.returncode == 0, err
    assert f"reverted {len(SERIES)} of {len(SERIES)}" in out
    assert tree_hash(verl_tree) == hashes["pristine"]


@pytest.mark.parametrize("wait", ["0", "0.2"])
def test_a_held_lock_refuses_after_the_wait_in_one_line(verl_tree, refs, wait):
    reset(verl_tree, refs["patched"])
    with journal.tree_lock(verl_tree.resolve(), wait=0):
        before = tree_hash(verl_tree)
        proc = cli("revert", *DS, "--target", verl_tree, "--wait", wait)
        assert tree_hash(verl_tree) == before
    assert proc.returncode == 1
    err = proc.stderr.strip().splitlines()
    assert "another overlay command" in err[-1] and f"pid {os.getpid()}" in err[-1] and "--wait" in err[-1]
    assert len(err) == (1 if wait == "0" else 2), err
    assert not (verl_tree / journal.LOCK_NAME).exists()


# --- revert is all or nothing -----------------------------------------------------------------------


def line_owned_by_one_patch(patched: Path) -> tuple[overlay.patchset.Patch, str, int, bytes]:
    """A line a later patch adds to a file no other patch touches, unique there: (patch, file, hunk, line)."""
    owners: dict[str, int] = {}
    for patch in SERIES:
        for fp in patch.files:
            owners[fp.path] = owners.get(fp.path, 0) + 1
    for patch in SERIES[len(SERIES) // 2 :]:
        for fp in patch.files:
            if owners[fp.path] != 1 or fp.old_path is None:
                continue
            text = (patched / fp.path).read_bytes()
            for index, hunk in enumerate(fp.hunks, start=1):
                for line in hunk.new:
                    if line not in hunk.old and line.strip() and text.count(line) == 1:
                        return patch, fp.path, index, line
    raise AssertionError("no later patch adds a line to a file of its own")


def test_revert_with_a_local_edit_in_a_patched_line_changes_nothing(verl_tree, refs):
    patch, rel, hunk, line = line_owned_by_one_patch(refs["patched"])
    reset(verl_tree, refs["patched"])
    text = (verl_tree / rel).read_bytes()
    (verl_tree / rel).write_bytes(text.replace(line, line.rstrip(b"\r\n") + b"  # local edit\n"))
    before = tree_hash(verl_tree)
    for extra in ([], ["--dry-run"]):
        proc = cli("revert", *DS, "--target", verl_tree, *extra)
        assert proc.returncode == 1, proc.stdout
        err = proc.stderr.strip().splitlines()
        assert len(err) == 1, err
        assert patch.name in err[0] and rel in err[0] and f"hunk #{hunk} (@@" in err[0], err
        assert "nothing was changed" in err[0]
        assert "reverted" not in proc.stdout
        assert tree_hash(verl_tree) == before
    # Put the line back and the revert goes through, all of it.
    (verl_tree / rel).write_bytes(text)
    assert cli("revert", *DS, "--target", verl_tree).returncode == 0


def test_revert_keeps_a_local_edit_outside_every_patch(verl_tree, refs, hashes):
    reset(verl_tree, refs["patched"])
    with open(verl_tree / "verl/__init__.py", "a") as fh:
        fh.write("# local edit, no patch touches this file\n")
    proc = cli("revert", *DS, "--target", verl_tree)
    assert proc.returncode == 0 and f"reverted {len(SERIES)} of {len(SERIES)}" in proc.stdout
    now = tree_hash(verl_tree)
    assert now.pop("verl/__init__.py") != hashes["pristine"]["verl/__init__.py"]
    assert now == {k: v for k, v in hashes["pristine"].items() if k != "verl/__init__.py"}


# --- small faults ---------------------------------------------------------------------------------------


def test_full_file_limit_refuses_with_the_file_and_leaves_nothing(verl_tree, refs):
    """RLIMIT_FSIZE makes writing the largest patched file fail (EFBIG), as a full disk would."""
    largest = max(TOUCHED, key=lambda rel: (refs["patched"] / rel).stat().st_size)
    limit = (refs["patched"] / largest).stat().st_size - 1

    def small_files():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    before = tree_hash(verl_tree)
    proc = subprocess.run(
        [sys.executable, "-m", "ascend_rl", "overlay", "apply", *DS, "--target", str(verl_tree)],
        capture_output=True,
        text=True,
        preexec_fn=small_files,
        timeout=600,
    )
    assert proc.returncode == 1
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and f"writing {largest} failed (File too large)" in err[0], err
    assert "nothing was changed" in err[0] and "None" not in err[0]
    assert tree_hash(verl_tree) == before, "no file changed and no temp file left"


def test_failure_after_the_commit_puts_the_tree_back(tmp_path, verl_tree, pristine_verl):
    """A file the series creates where a folder stands fails at its rename: the files already
    replaced are put back and nothing of the tool is left in the tree."""
    patch = make_patch(
        pristine_verl,
        tmp_path,
        "0001-collide",
        {
            PROTOCOL: ("import numpy as np\n", "import numpy as np  # patched\n"),
            "verl/zz_collision.py": "X = 1\n",
        },
    )
    (verl_tree / "verl/zz_collision.py").mkdir()
    (verl_tree / "verl/zz_collision.py/keep.txt").write_text("a folder where the patch wants a file\n")
    before = tree_hash(verl_tree)
    proc = cli("apply", make_recipe(tmp_path, [patch]), "--target", verl_tree)
    assert proc.returncode == 1
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and "replacing verl/zz_collision.py failed" in err[0] and "put back" in err[0], err
    assert tree_hash(verl_tree) == before


def test_closed_stdout_is_a_clean_exit_and_the_work_is_done(verl_tree, hashes):
    for args, code in ((["status"], 0), (["apply"], 0), (["status"], 0)):
        read, write = os.pipe()
        os.close(read)  # nobody will read: the first line written fails with EPIPE
        proc = subprocess.run(
            [sys.executable, "-m", "ascend_rl", "overlay", *args, *DS, "--target", str(verl_tree)],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=600,
        )
        os.close(write)
        assert proc.returncode == code and proc.stderr == "", (args, proc.stderr)
    assert tree_hash(verl_tree) == hashes["patched"]


def test_wrapper_parses_options_before_any_fetch(tmp_path, verl_tree):
    recipe = make_recipe(tmp_path, [], git_url="file:///nonexistent/verl.git")
    offline = {
        **os.environ,
        "PYTHON": sys.executable,
        "RECIPES_CACHE": str(tmp_path / "empty-cache"),
        "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
        "PIP_RETRIES": "0",
        "PIP_TIMEOUT": "2",
    }
    script = overlay.REPO / "scripts" / "apply_patches.sh"

    def run(*args):
        return subprocess.run(
            ["bash", str(script), *map(str, args)], capture_output=True, text=True, env=offline
        )

    fetching = ("git clone", "source distribution", "fetched", "check the network")
    bogus = run(recipe, "--bogus")
    assert bogus.returncode == 2 and "unrecognized arguments: --bogus" in bogus.stderr
    assert not any(word in bogus.stdout + bogus.stderr for word in fetching), bogus
    joined = run(recipe, f"--target={verl_tree}")
    assert joined.returncode == 0 and "nothing to do" in joined.stdout, joined.stderr
    assert not any(word in joined.stdout + joined.stderr for word in fetching), joined
    assert not (recipe / "verl").exists() and not (tmp_path / "empty-cache").exists()


# A real full disk: a small tmpfs in a private mount namespace, filled to within a few pages.
FULL_DISK = r"""
import hashlib, json, os, shutil, subprocess, sys
from pathlib import Path
tool, pristine, mnt = sys.argv[1:4]
tree = Path(mnt) / "tree"
shutil.copytree(pristine, tree, symlinks=True)
def hashes():
    return {str(p.relative_to(tree)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(tree.rglob("*")) if p.is_file()}
filler = Path(mnt) / "filler"
with open(filler, "wb") as fh:
    try:
        while True:
            fh.write(b"x" * 65536)
            fh.flush()
    except OSError:
        pass
os.truncate(filler, max(filler.stat().st_size - 16 * 4096, 0))
apply = [sys.executable, "-m", tool, "apply", "deepseek_r1", "--base", "0.6.0", "--target", str(tree)]
full = subprocess.run(apply, capture_output=True, text=True)
out = {"rc": full.returncode, "err": full.stderr, "after_full": hashes()}
filler.unlink()
again = subprocess.run(apply, capture_output=True, text=True)
out.update(rc_again=again.returncode, err_again=again.stderr, after_again=hashes())
print(json.dumps(out))
"""


def test_full_disk_changes_nothing_and_names_the_file(tmp_path, refs, hashes):
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare(1) for a private tmpfs")
    mnt = tmp_path / "small-disk"
    mnt.mkdir()
    script = (
        f"mount -t tmpfs -o size=16m tmpfs {mnt} && exec {sys.executable} -c "
        f'"$0" ascend_rl.cli.overlay {refs["pristine"]} {mnt}'
    )
    proc = subprocess.run(
        ["unshare", "-rm", "sh", "-c", script, FULL_DISK], capture_output=True, text=True, timeout=600
    )
    if proc.returncode != 0 and not proc.stdout:
        pytest.skip(f"no private tmpfs here: {proc.stderr.strip().splitlines()[-1:]}")
    out = json.loads(proc.stdout)
    assert out["rc"] == 1
    err = out["err"].strip().splitlines()
    assert len(err) == 1 and "(No space left on device); nothing was changed" in err[0], err
    named = err[0].split("writing ", 1)[1].split(" failed", 1)[0]
    assert named in TOUCHED, err
    assert out["after_full"] == hashes["pristine"], "a full disk must leave the tree and no temp file"
    assert out["rc_again"] == 0, out["err_again"]
    assert out["after_again"] == hashes["patched"]
