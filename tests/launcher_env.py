"""Running a recipe launcher as a user runs it, for the launcher and preflight tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ascend_rl.paths import RECIPES

LAUNCHERS = [  # every recipe launcher a user runs
    RECIPES / "qwen2_5" / "run_qwen2_5_1_5b_single.sh",
    RECIPES / "qwen2_5" / "run_qwen2_5_1_5b.sh",
    RECIPES / "deepseek_r1" / "run_deepseek_r1_a3.sh",
]


def launcher_env(tmp_path: Path, verl_tree: Path, **extra: str) -> dict[str, str]:
    """This environment with the venv's python3 first (as activated), VERL_DIR and run folders under tmp_path,
    and VERL_BASE=0.6.0 (the fixtures' trees are verl 0.6.0; pass VERL_BASE=... for another base's tree)."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.update(VERL_DIR=str(verl_tree), LOG_DIR=str(tmp_path / "run_log"), CKPT_DIR=str(tmp_path / "ckpt"))
    env["VERL_BASE"] = "0.6.0"
    env.update(extra)
    return env


def run_launcher(script: Path, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """bash SCRIPT ARGS..., output captured."""
    return subprocess.run(["bash", str(script), *args], capture_output=True, text=True, env=env, timeout=300)


def dry_run_plan(proc: subprocess.CompletedProcess) -> dict:
    """The plan a launcher's `--dry-run --json` prints: one JSON object, stdout's only content."""
    import json

    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads(proc.stdout)


def exported_names(*scripts: Path) -> set[str]:
    """The variables these bash files export (`export NAME=...` lines)."""
    import re

    pattern = re.compile(r"^\s*export\s+([A-Za-z_][A-Za-z0-9_]*)=", re.MULTILINE)
    return {name for script in scripts for name in pattern.findall(script.read_text())}


def write_rows(path: Path, rows: int) -> Path:
    """A data file in the recipe's format (the columns verl's RLHFDataset and the reward read, as prepare_math writes
    them), `rows` rows: the preflight reads every file a launch names."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ascend_rl.data.util import make_row, row_schema

    path.parent.mkdir(parents=True, exist_ok=True)
    table = [
        make_row(data_source="math", problem=f"{i} + 1?", ground_truth=str(i + 1), split="x", index=i)
        for i in range(rows)
    ]
    pq.write_table(pa.Table.from_pylist(table, schema=row_schema()), path)
    return path
