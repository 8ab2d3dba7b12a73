"""Every command in the repository answers --help: exit 0 and a usage line, from the light .venv (no vLLM, no
accelerator), so a user can read what a script does before setting anything up."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
COMMANDS = sorted(
    p
    for p in [*REPO.glob("scripts/*.py"), *REPO.glob("llm_rl/*/*.py")]
    if "argparse" in (text := p.read_text(encoding="utf-8")) and '__name__ == "__main__"' in text
)


def test_the_commands_are_found():
    names = {p.name for p in COMMANDS}
    assert {"overlay.py", "e2e.py", "evaluate.py", "prepare_math500.py", "new_math_reward.py"} <= names, names


@pytest.mark.parametrize("script", COMMANDS, ids=lambda p: str(p.relative_to(REPO)))
def test_help_exits_0_with_usage(script):
    proc = subprocess.run(
        [sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("usage:"), proc.stdout[:500]
