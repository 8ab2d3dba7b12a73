"""The DeepSeek launcher's node-by-node commands carry what decides the run (the base, the variant, the Python, the
socket interface, the node count and the user's folders), checked by running each printed line in its dry-run form
from a bare shell (no VERL_BASE, no VERL_DIR, no venv on PATH): what a user does who copies them onto the nodes."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from ascend_rl import manifest
from ascend_rl.paths import REPO
from ci_policy import artifact_error_in
from launcher_env import LAUNCHERS, dry_run_plan, launcher_env, run_launcher

DEEPSEEK = LAUNCHERS[2]
BARE = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8"}
LINE = re.compile(r"^node (\d+) \((head|worker)\)(, after all \d+ nodes joined)?:\s+(.*)$")


def _node_lines(stdout: str) -> list[tuple[str, list[str]]]:
    """(role, argv) of each printed node line: 'head', 'worker' or 'job'."""
    lines = []
    for text in stdout.splitlines():
        match = LINE.match(text)
        if match:
            role = "job" if match.group(3) else match.group(2)
            lines.append((role, shlex.split(match.group(4))))
    return lines


def _run_bare(argv: list[str], *more: str) -> subprocess.CompletedProcess:
    """A printed line run from the repository root in a bare shell, with more arguments (its dry-run form)."""
    return subprocess.run([*argv, *more], cwd=REPO, env=BARE, capture_output=True, text=True, timeout=300)


def _tree_0_7_1(base_tree) -> Path:
    from ascend_rl import overlay

    tree = base_tree("0.7.1")
    overlay.apply_series(manifest.load_recipe("deepseek_r1", "0.7.1"), tree)
    return tree


def test_the_printed_npu_node_commands_run_the_base_variant_python_and_interface_the_dry_run_checked(
    tmp_path, base_tree
):
    tree = _tree_0_7_1(base_tree)
    env = launcher_env(tmp_path, tree, SOCKET_IFNAME="lo")
    env.pop("VERL_BASE")
    args = ["--dry-run", "--base", "0.7.1", "--variant", "random", "trainer.total_epochs=2"]
    proc = run_launcher(DEEPSEEK, args, env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = _node_lines(proc.stdout)
    assert [role for role, _ in lines] == ["head"] + ["worker"] * 15 + ["job"], proc.stdout
    lines = [lines[0], lines[1], lines[-1]]  # the head, one worker (the others differ in nothing), the job
    python = str(Path(sys.executable).parent / "python3")
    # this checkout's venv by its path in the checkout (the lines run from the repository root): not this machine's
    named = Path(python).relative_to(REPO) if Path(python).is_relative_to(REPO) else python
    for _role, argv in lines:
        assert argv[0] == "env", argv
        assert {"VERL_BASE=0.7.1", f"PYTHON={named}", "SOCKET_IFNAME=lo", f"VERL_DIR={tree}"} <= set(argv), (
            argv
        )
    # each ray_start.sh line, run as printed (--dry-run added): that Python's Ray, the 0.7.1 tree, the interface
    for _role, argv in lines[:2]:
        node = _run_bare(argv, "--dry-run")
        assert node.returncode == 0, node.stdout + node.stderr
        assert f"Ray workers run {python} with verl 0.7.1 from {tree}" in node.stderr, node.stderr
        assert "GLOO_SOCKET_IFNAME=lo" in node.stdout
    # the job line, run as printed (--dry-run --json added): the base and the variant the dry run checked
    job = lines[2][1]
    assert job[-5:] == ["--variant", "random", "--base", "0.7.1", "trainer.total_epochs=2"], job
    plan = dry_run_plan(_run_bare(job, "--dry-run", "--json"))
    assert plan["verl"]["version"] == plan["verl"]["base"]["version"] == "0.7.1"
    assert plan["overrides"]["actor_rollout_ref.rollout.data_parallel_size"] == "128"  # the random variant's
    assert plan["overrides"]["trainer.nnodes"] == "16" and plan["overrides"]["trainer.total_epochs"] == "2"


def test_the_printed_cpu_node_commands_carry_the_base_and_the_python(tmp_path, base_tree):
    tree = _tree_0_7_1(base_tree)
    env = launcher_env(tmp_path, tree, NNODES="2", SOCKET_IFNAME="lo")
    env.pop("VERL_BASE")
    proc = run_launcher(DEEPSEEK, ["--cpu", "--base", "0.7.1", "--dry-run"], env)
    if proc.returncode != 0 and "megatron-core for the CPU profile cannot be installed" in proc.stderr:
        artifact_error_in("megatron-core for the CPU profile", proc.stderr)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = _node_lines(proc.stdout)
    assert [role for role, _ in lines] == ["head", "worker", "job"], proc.stdout
    for _role, argv in lines:
        assert {"VERL_BASE=0.7.1", "NNODES=2", "NPUS_PER_NODE=1", "SOCKET_IFNAME=lo"} <= set(argv), argv
    for _role, argv in lines[:2]:
        assert "--cpu" in argv
        node = _run_bare(argv, "--dry-run")
        assert node.returncode == 0, node.stdout + node.stderr
        assert f"with verl 0.7.1 from {tree}" in node.stderr, node.stderr
    assert lines[2][1][-3:] == ["--cpu", "--base", "0.7.1"]


def test_the_one_machine_cpu_command_carries_the_base(tmp_path, verl_tree):
    proc = run_launcher(DEEPSEEK, ["--cpu", "--dry-run"], launcher_env(tmp_path, verl_tree))
    if proc.returncode != 0 and "megatron-core for the CPU profile cannot be installed" in proc.stderr:
        artifact_error_in("megatron-core for the CPU profile", proc.stderr)
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert "VERL_BASE=0.6.0" in last and last.endswith("run_deepseek_r1_a3.sh --cpu --base 0.6.0"), last
