"""Running a recipe launcher as a user runs it, for the launcher and preflight tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def launcher_env(tmp_path: Path, verl_tree: Path, **extra: str) -> dict[str, str]:
    """This environment with the venv's python3 first (as activated), VERL_DIR and run folders under tmp_path."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.update(VERL_DIR=str(verl_tree), LOG_DIR=str(tmp_path / "run_log"), CKPT_DIR=str(tmp_path / "ckpt"))
    env.update(extra)
    return env


def run_launcher(script: Path, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """bash SCRIPT ARGS..., output captured."""
    return subprocess.run(["bash", str(script), *args], capture_output=True, text=True, env=env, timeout=300)
