"""tests/durations.py: the per-tier record of where the test time goes (issue 61: CI over its budget, unseen)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def _pytest(tmp_path, env: dict, *args: str) -> subprocess.CompletedProcess:
    """pytest on the given suite with tests/durations.py loaded, as run_tests.sh's pytest has it."""
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "durations", *args],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(TESTS)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def test_a_run_writes_each_files_seconds_the_longest_first(tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_slow.py").write_text(
        "import time\n\ndef test_a():\n    time.sleep(0.6)\n\ndef test_b():\n    pass\n"
    )
    (suite / "test_quick.py").write_text("def test_c():\n    pass\n")
    out = tmp_path / "durations" / "ci.tsv"
    _pytest(
        tmp_path, {**os.environ, "RECIPES_DURATIONS_OUT": str(out)}, "-m", "not full", "-n", "2", str(suite)
    )
    lines = out.read_text().splitlines()
    assert lines[0].startswith("# tier ci: 3 tests in 2 files; pytest wall "), lines
    assert "on 2 worker(s)" in lines[0] and lines[1].startswith("# measured ") and "cores" in lines[1], lines
    assert "load average over the last 15 minutes at the end" in lines[1], lines
    rows = [line.split("\t") for line in lines[3:]]
    assert [(Path(r[2]).name, r[1]) for r in rows] == [("test_slow.py", "2"), ("test_quick.py", "1")], rows
    assert float(rows[0][0]) >= 0.6 > float(rows[1][0]), rows


def test_nothing_is_written_without_the_variable(tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_one.py").write_text("def test_a():\n    pass\n")
    _pytest(tmp_path, {k: v for k, v in os.environ.items() if k != "RECIPES_DURATIONS_OUT"}, str(suite))
    assert sorted(p.name for p in tmp_path.rglob("*.tsv")) == []


def test_make_test_and_make_test_full_each_keep_a_record():
    script = (TESTS.parent / "scripts" / "run_tests.sh").read_text()
    assert "RECIPES_DURATIONS_OUT=${RECIPES_DURATIONS_OUT-tests/durations/$tier.tsv}" in script
