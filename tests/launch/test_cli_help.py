"""Every command in the repository answers --help: exit 0 and a usage line, from the light .venv (no vLLM, no
accelerator), so a user can read what a command does before setting anything up."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ascend_rl.__main__ import RECIPE_TOOLS, TOOLS
from ascend_rl.paths import REPO

# (what the test id says, the command line after the interpreter)
COMMANDS = (
    [(f"ascend_rl {name}", ["-m", "ascend_rl", name]) for name in TOOLS]
    + [(module, ["-m", module]) for module in RECIPE_TOOLS]
    + [("llm_rl/qwen2_5/new_math_reward.py", [str(REPO / "llm_rl" / "qwen2_5" / "new_math_reward.py")])]
)


def test_the_commands_are_found():
    names = {name for name, _ in COMMANDS}
    want = {"ascend_rl overlay", "ascend_rl e2e", "ascend_rl evaluate", "llm_rl.qwen2_5.prepare_math500"}
    assert want | {"llm_rl/qwen2_5/new_math_reward.py"} <= names, names
    proc = subprocess.run(
        [sys.executable, "-m", "ascend_rl", "--help"], capture_output=True, text=True, cwd=REPO
    )
    assert proc.returncode == 0 and all(f"  {name} " in proc.stdout for name in TOOLS), proc.stdout


@pytest.mark.parametrize("argv", [argv for _, argv in COMMANDS], ids=[name for name, _ in COMMANDS])
def test_help_exits_0_with_usage(argv):
    proc = subprocess.run([sys.executable, *argv, "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("usage:"), proc.stdout[:500]


def test_a_removed_command_says_what_to_run_instead():
    out = subprocess.run(
        [sys.executable, "-m", "ascend_rl", "demo_inprocess"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().count("\n") == 0 and "make demo" in out.stderr


@pytest.mark.parametrize(
    ("old", "new"), [("check_stack", "stack"), ("check_imports", "compat"), ("cluster", "sim_cluster")]
)
def test_an_old_command_name_still_runs_after_a_one_line_notice(old, new):
    out = subprocess.run(
        [sys.executable, "-m", "ascend_rl", old, "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stderr.strip() == f"ascend_rl: '{old}' is now '{new}' (its module's name); running it"
    assert f"python3 -m ascend_rl {new}" in out.stdout


def test_every_command_is_named_after_its_module():
    for name, (module, _) in TOOLS.items():
        assert module.rsplit(".", 1)[1] == name, f"command {name} runs {module}"
