"""Running a recipe check (python3 -m llm_rl.<recipe>.check_*) under the e2e environment and reading the
result.json it writes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_check(python: Path, module: str, work: Path, *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
    """Run `python -m module --work work *extra`; fail with its output's tail when it wrote no result."""
    proc = subprocess.run(
        [str(python), "-m", module, "--work", str(work), *extra],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    path = work / "result.json"
    result = json.loads(path.read_text()) if path.is_file() else {}
    assert result, f"no result (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc, result
