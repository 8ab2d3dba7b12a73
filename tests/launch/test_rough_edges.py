"""Rough edges a new user hit (issue 48, item 7), each pinned so it cannot come back: an impossible layout's memory
line, the simulated cluster's closed pipe and its purge after a plain down, and `ray start`'s NPU-detection traceback
and `ray stop` advice on a CPU node. Issue 61, item 6: a Hydra syntax error and an unknown launcher option named as
the user wrote them, the single-card launcher naming itself, plan_memory without its input, the dry run's download
said (and offline, where an sdist goes), node commands without this checkout's venv path, and the help texts.
(The overlay's status and messages: tests/overlay/test_overlay.py.)"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

from ascend_rl import ray_cluster
from ascend_rl.harness import sim_cluster as lib
from ascend_rl.paths import REPO, child_env
from cluster_support import needs_cluster
from launcher_env import LAUNCHERS, launcher_env, run_launcher

TOOL = [sys.executable, "-m", "ascend_rl", "sim_cluster"]


def test_an_impossible_layout_says_the_memory_is_not_planned_because_of_the_layout(tmp_path, verl_tree):
    # one node of 16 dies cannot hold TP4 x PP8: the layout line says so; the memory line used to be a ZeroDivisionError
    proc = run_launcher(LAUNCHERS[2], ["--dry-run"], launcher_env(tmp_path, verl_tree, NNODES="1"))
    assert proc.returncode == 1
    assert "ZeroDivisionError" not in proc.stdout + proc.stderr
    memory = [line.split() for line in proc.stdout.splitlines() if line.strip().startswith("memory ")]
    assert memory and memory[0][1] == "skipped", proc.stdout
    assert "not planned: the layout above does not fit" in proc.stdout
    assert len([ln for ln in proc.stderr.splitlines() if ln.startswith("preflight: error:")]) == 1


RAY_START_OUT = """\
Usage stats collection is disabled.
2026-12-06 04:50:00,000\tERROR npu.py:81 -- Failed to detect NPU type.
Traceback (most recent call last):
  File "/x/ray/_private/accelerators/npu.py", line 77, in get_current_node_accelerator_type
    import acl
ModuleNotFoundError: No module named 'acl'
Local node IP: 198.18.0.1
Ray runtime started.
  To terminate the Ray runtime, run
    ray stop
  To view the status of the cluster, use
    ray status
"""


def test_ray_starts_npu_noise_and_ray_stop_advice_are_not_shown():
    out = io.StringIO()
    lines = ray_cluster.RayStartOutput(out)
    for line in RAY_START_OUT.splitlines(keepends=True):
        lines.feed(line)
    lines.close()
    text = out.getvalue()
    assert "Traceback" not in text and "acl" not in text and "Failed to detect NPU type" not in text
    assert "\n    ray stop\n" not in text and "not `ray stop`" in text
    assert "Ray runtime started." in text and "ray status" in text
    # as Ray 2.x's `ray start` prints it into a pipe: its logger's prefix and colours
    out = io.StringIO()
    lines = ray_cluster.RayStartOutput(out)
    for line in [
        "2026-12-06 04:45:48,585\tINFO scripts.py:955 -- To terminate the Ray runtime, run\n",
        "2026-12-06 04:45:48,586\tINFO scripts.py:956 -- \x1b[1m  ray stop\x1b[22m\n",
        "2026-12-06 04:45:48,586\tINFO scripts.py:959 -- To view the status of the cluster, use\n",
    ]:
        lines.feed(line)
    lines.close()
    assert "ray stop\x1b" not in out.getvalue() and "not `ray stop`" in out.getvalue()
    assert "To view the status" in out.getvalue()
    # a block after the NPU line that is another error is passed on whole
    out = io.StringIO()
    lines = ray_cluster.RayStartOutput(out)
    for line in [
        "x -- Failed to detect NPU type.\n",
        "Traceback (most recent call last):\n",
        "OSError: boom\n",
    ]:
        lines.feed(line)
    lines.close()
    assert "OSError: boom" in out.getvalue() and "Failed to detect NPU type." in out.getvalue()


def test_a_failed_ray_start_does_not_advise_ray_stop(monkeypatch, capsys):
    from ascend_rl.cli import ray_cluster as cli

    monkeypatch.setattr(cli, "run_ray_start", lambda argv: 1)
    monkeypatch.setattr(cli, "ray_executable", lambda: "ray")
    assert cli.main(["start", "--head", "--ifname", "lo"]) == 1
    err = capsys.readouterr().err
    assert "ray start exited 1" in err and "not with `ray stop`" in err and "clears a stale node" not in err


def _name(tag: str) -> str:
    return f"t{os.getpid()}-{tag}"


@needs_cluster
def test_cluster_up_into_a_closed_pipe_ends_quietly(tmp_path):
    # `| true` closes the pipe before the first line (the race `| head -1` loses now and then, made certain)
    for reader in ("head -1", "true"):
        name = _name("pipe")
        try:
            proc = subprocess.run(
                [
                    "bash",
                    "-c",
                    f"{' '.join(TOOL)} up --nodes 2 --name {name} --root {tmp_path / name} | {reader}",
                ],
                capture_output=True,
                text=True,
                cwd=REPO,
                env={**child_env(), "PYTHONUNBUFFERED": "1"},
                timeout=120,
            )
            if reader == "head -1":
                assert proc.stdout.startswith(f"cluster {name} up: 2 nodes"), proc.stdout
            assert "Traceback" not in proc.stderr and "BrokenPipeError" not in proc.stderr, proc.stderr
            assert lib.state_file(name).exists()  # up leaves the cluster running, as without the pipe
        finally:
            subprocess.run([*TOOL, "down", "--name", name], cwd=REPO, env=child_env(), timeout=120)


@needs_cluster
def test_down_then_down_purge_removes_the_shared_folder_it_kept():
    name = _name("purge")
    run = lambda *a: subprocess.run(  # noqa: E731
        [*TOOL, *a], capture_output=True, text=True, cwd=REPO, env=child_env(), timeout=120
    )
    shared = lib.DEFAULT_ROOT / name / "shared"
    try:
        assert run("up", "--nodes", "1", "--name", name).returncode == 0
        (shared / "ckpt").mkdir(parents=True, exist_ok=True)
        down = run("down", "--name", name)
        assert down.returncode == 0 and f"shared folder kept: {shared}" in down.stdout, (
            down.stdout + down.stderr
        )
        assert f"down --purge --name {name} removes it" in down.stdout
        assert shared.is_dir()
        purge = run("down", "--purge", "--name", name)
        assert purge.returncode == 0, purge.stderr
        assert f"removed the shared folder it left, {shared}" in purge.stdout
        assert not (lib.DEFAULT_ROOT / name).exists()
        again = run("down", "--purge", "--name", name)  # nothing left: the old one line
        assert again.returncode != 0 and f"no cluster named {name}" in again.stderr
    finally:
        run("down", "--purge", "--name", name)
        if (lib.DEFAULT_ROOT / name).exists():
            import shutil

            shutil.rmtree(lib.DEFAULT_ROOT / name)
    assert not Path(lib.DEFAULT_ROOT / name).exists()


def test_a_shipped_model_config_names_a_repository_folder_by_its_path_there():
    from ascend_rl import memory_plan

    folder = REPO / "llm_rl" / "qwen2_5" / "model" / "Qwen2_5_1_5B_Instruct"
    if (folder / "config.json").is_file():
        import pytest

        pytest.skip("the model is downloaded here: its own config.json is read")
    _, source = memory_plan.model_config(str(folder))
    assert "(shipped table: llm_rl/qwen2_5/model/Qwen2_5_1_5B_Instruct has no config.json)" in source, source


def test_the_docs_quote_no_machines_folders():
    # sample output copied from a run here carried its checkout's path (/work/main/...): a reader's differs
    docs = [REPO / "README.md", *REPO.glob("llm_rl/*/README.md"), *REPO.glob("docs/*.md")]
    found = [
        f"{doc.relative_to(REPO)}:{n}"
        for doc in docs
        for n, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1)
        if any(mark in line for mark in ("/work/main", "/work/wt", "/root/.cache"))
    ]
    assert not found, found


# --- issue 61, item 6 ---------------------------------------------------------------------------------------------

QWEN, QWEN_SINGLE, DEEPSEEK = LAUNCHERS


def _errors(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.strip()]


def test_a_hydra_syntax_error_names_the_override_not_a_deleted_yaml(tmp_path, verl_tree):
    # the preflight composes against a patched copy in a scratch folder it has removed by the time the line is read
    proc = run_launcher(QWEN, ["--dry-run", "trainer.logger=[console"], launcher_env(tmp_path, verl_tree))
    errors = _errors(proc)
    assert proc.returncode != 0 and len(errors) == 1, proc.stdout[-2000:] + proc.stderr
    assert "trainer.logger=[console" in errors[0] and "not a valid Hydra override" in errors[0], errors[0]
    assert ".yaml" not in errors[0] and "preflight-" not in errors[0], errors[0]


def test_an_unknown_launcher_option_gets_did_you_mean_and_the_launcher_names_itself(tmp_path, verl_tree):
    env = launcher_env(tmp_path, verl_tree)
    for script in LAUNCHERS:
        proc = run_launcher(script, ["--dryrun"], env)
        errors = _errors(proc)
        assert proc.returncode == 2 and len(errors) == 1, (script.name, proc.stdout[-2000:] + proc.stderr)
        assert errors[0].startswith(f"{script.name}: unknown option '--dryrun'; did you mean --dry-run?"), (
            errors
        )
    # the single-card launcher's other usage errors name it too, not the four-card script it runs
    proc = run_launcher(QWEN_SINGLE, ["--base"], env)
    assert proc.returncode == 2 and _errors(proc) == [
        f"{QWEN_SINGLE.name}: --base needs a version (e.g. --base 0.7.1)"
    ]
    proc = run_launcher(QWEN_SINGLE, ["--colour"], env)
    assert proc.returncode == 2 and _errors(proc) == [
        f"{QWEN_SINGLE.name}: unknown option '--colour'; run with --help"
    ]


def _plan_memory(*argv: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ascend_rl", "plan_memory", *argv],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )


def test_plan_memory_without_a_launch_says_what_input_it_wants():
    for argv, stdin in (([], ""), (["--plan", "-"], "\n"), (["--json"], "")):
        proc = _plan_memory(*argv, stdin=stdin)
        errors = _errors(proc)
        assert proc.returncode == 2 and len(errors) == 1, proc.stderr
        assert "Expecting value" not in errors[0] and "no launch to plan" in errors[0], errors[0]
        assert "--dry-run --json" in errors[0] and "--plan FILE" in errors[0], errors[0]
    # overrides without the model: the key it wants, not "None has no config.json"
    proc = _plan_memory("--recipe", "qwen2_5", "--", "trainer.n_gpus_per_node=4")
    errors = _errors(proc)
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr
    assert "None" not in errors[0] and "actor_rollout_ref.model.path=" in errors[0], errors[0]
    assert "--model" in errors[0], errors[0]


def test_a_dry_run_says_it_downloaded_the_sdist_and_offline_how_to_provide_one(tmp_path, pristine_verl):
    # the pinned sdist from a local index (the real file, fetched by pip as from PyPI); the tree is absent
    from ascend_rl import artifacts, manifest

    sdist = manifest.load_recipe("qwen2_5", "0.6.0").sdist
    links = tmp_path / "links"
    links.mkdir()
    cached = artifacts.cache_dir() / sdist
    assert cached.is_file()  # the pristine_verl fixture fetched it
    (links / sdist).write_bytes(cached.read_bytes())
    cache = tmp_path / "cache"
    env = launcher_env(tmp_path, tmp_path / "no-tree", RECIPES_CACHE=str(cache))
    local = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(links), "PIP_NO_BUILD_ISOLATION": "0"}
    proc = run_launcher(QWEN, ["--dry-run"], {**env, **local})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert (cache / sdist).is_file()
    assert f"downloaded {sdist} into {cache}" in proc.stdout, proc.stdout
    again = run_launcher(
        QWEN, ["--dry-run"], {**env, **local}
    )  # cached now: nothing downloaded, nothing said
    assert again.returncode == 0 and "downloaded" not in again.stdout, again.stdout
    # offline: the one line says where to put the sdist
    offline = {"PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_RETRIES": "0", "PIP_TIMEOUT": "2"}
    empty = tmp_path / "empty-cache"
    proc = run_launcher(QWEN, ["--dry-run"], {**env, **offline, "RECIPES_CACHE": str(empty)})
    errors = _errors(proc)
    assert proc.returncode == 1 and len(errors) == 1, proc.stdout[-2000:] + proc.stderr
    assert "cannot reach the package index" in errors[0], errors[0]
    assert f"put {sdist} (sha256 " in errors[0] and f"into {empty} (RECIPES_CACHE)" in errors[0], errors[0]


def test_the_node_commands_do_not_carry_this_checkouts_venv_path(tmp_path, verl_tree):
    proc = run_launcher(DEEPSEEK, ["--dry-run"], launcher_env(tmp_path, verl_tree))
    assert proc.returncode == 0, proc.stderr[-3000:]
    nodes = [line for line in proc.stdout.splitlines() if line.startswith("node ")]
    assert len(nodes) == 17, proc.stdout[-3000:]
    python = str(Path(sys.executable).parent / "python3")
    assert python.startswith(str(REPO))  # this checkout's .venv runs the tests
    for line in nodes:
        assert str(REPO) not in line, line
        assert f"PYTHON={Path(python).relative_to(REPO)} " in line, line


def test_parquet2json_has_one_description():
    from ascend_rl.__main__ import TOOLS

    said = TOOLS["parquet2json"][1]
    proc = subprocess.run(
        [sys.executable, "-m", "ascend_rl", "parquet2json", "--help"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert said in " ".join(proc.stdout.split()), (said, proc.stdout)
    assert "math.json" in said


def test_overlay_help_names_every_status():
    from ascend_rl import overlay

    proc = subprocess.run(
        [sys.executable, "-m", "ascend_rl", "overlay", "--help"], capture_output=True, text=True, cwd=REPO
    )
    text = " ".join(proc.stdout.split())
    status = text[
        text.index(" status ") : text.index(" apply ")
    ]  # the status command's line, however wrapped
    for state in (overlay.APPLIED, overlay.APPLICABLE, overlay.CONFLICTING, overlay.EDITED, overlay.CARRIED):
        assert state in status, status
