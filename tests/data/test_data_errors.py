"""The data tools as a user runs them: every predictable mistake is one line and exit 1, and files
they write get the user's umask (a team's shared storage must stay readable)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

# The data commands, as a user runs them (python3 -m ...), by the names the cases use.
COMMANDS = {
    "prepare_math.py": ["-m", "ascend_rl", "prepare_math"],
    "parquet2json.py": ["-m", "ascend_rl", "parquet2json"],
    "install_tokenizer_config.py": ["-m", "ascend_rl", "tokenizer_config"],
    "prepare_math500.py": ["-m", "llm_rl.qwen2_5.prepare_math500"],
    "prepare_deepscaler.py": ["-m", "llm_rl.deepseek_r1.prepare_deepscaler"],
    "derive_deepseek_config.py": ["-m", "llm_rl.deepseek_r1.derive_config"],
}


def _tool(name: str, args: list[str], cwd: Path, umask: int = 0o022) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *COMMANDS[name], *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=lambda: os.umask(umask),
    )


def _math_split(path: Path, problems, solutions, level="Level 1", kind="Algebra") -> None:
    n = len(problems)
    pq.write_table(
        pa.table({"problem": problems, "level": [level] * n, "type": [kind] * n, "solution": solutions}), path
    )


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """Inputs good and bad, and outputs in the way, all under one folder."""
    (tmp_path / "math").mkdir()
    for split in ("train", "test"):
        _math_split(tmp_path / "math" / f"{split}-0.parquet", ["1+1?", "2+2?"], ["\\boxed{2}", "\\boxed{4}"])
    (tmp_path / "ints").mkdir()
    for split in ("train", "test"):
        pq.write_table(
            pa.table({"problem": [1, 2], "level": [1, 2], "type": [3, 4], "solution": [5, 6]}),
            tmp_path / "ints" / f"{split}-0.parquet",
        )
    (tmp_path / "ds.json").write_text(
        json.dumps([{"problem": f"{i}+1", "answer": str(i + 1)} for i in range(10)])
    )
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (tmp_path / "a_file").write_text("keep me\n")
    (tmp_path / "out_dir" / "train.parquet").mkdir(parents=True)
    (tmp_path / "out_dir" / "test.parquet").write_text("keep me too\n")
    return tmp_path


CASES = {
    "integer columns (prepare_math)": (
        "prepare_math.py",
        ["--input-dir", "ints", "--output-dir", "o"],
        "column problem is int64",
    ),
    "integer columns (parquet2json)": (
        "parquet2json.py",
        ["--input", "ints/test-0.parquet", "--output", "o/math.json"],
        "column problem is int64",
    ),
    "output folder is a file": (
        "prepare_math.py",
        ["--input-dir", "math", "--output-dir", "a_file"],
        "a_file is a file, not a folder",
    ),
    "output file is a folder": (
        "prepare_math.py",
        ["--input-dir", "math", "--output-dir", "out_dir"],
        "out_dir/train.parquet is a folder, not a file",
    ),
    "json output is a folder": (
        "parquet2json.py",
        ["--input", "math/test-0.parquet", "--output", "out_dir"],
        "out_dir is a folder, not a file",
    ),
    "json output under a file": (
        "parquet2json.py",
        ["--input", "math/test-0.parquet", "--output", "a_file/math.json"],
        "a_file is a file, not a folder",
    ),
    # /proc refuses new entries even to root, so this is unwritable for every user.
    "unwritable output (parquet)": (
        "prepare_math.py",
        ["--input-dir", "math", "--output-dir", "/proc/1/recipes-out"],
        "cannot write /proc/1/recipes-out/train.parquet",
    ),
    "unwritable output (json)": (
        "parquet2json.py",
        ["--input", "math/test-0.parquet", "--output", "/proc/1/math.json"],
        "cannot write /proc/1/math.json",
    ),
    "test size nan": (
        "prepare_deepscaler.py",
        ["--input", "ds.json", "--output-dir", "o", "--test-size", "nan"],
        "--test-size must be a positive number, got nan",
    ),
    "test size inf": (
        "prepare_deepscaler.py",
        ["--input", "ds.json", "--output-dir", "o", "--test-size", "inf"],
        "--test-size must be a positive number, got inf",
    ),
    "deeply nested json (deepscaler)": (
        "prepare_deepscaler.py",
        ["--input", "deep.json", "--output-dir", "o"],
        "nests JSON too deeply",
    ),
    "deeply nested json (model config)": (
        "derive_deepseek_config.py",
        ["--input", "deep.json", "--output", "o/config.json"],
        "nests JSON too deeply",
    ),
    "deepscaler output under a file": (
        "prepare_deepscaler.py",
        ["--input", "ds.json", "--output-dir", "a_file/sub"],
        "a_file is a file, not a folder",
    ),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_mistake_is_one_line_and_exit_1_and_nothing_is_lost(work, case):
    tool, args, said = CASES[case]
    proc = _tool(tool, args, work)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert said in lines[0]
    assert (work / "a_file").read_text() == "keep me\n"
    assert (work / "out_dir" / "test.parquet").read_text() == "keep me too\n"
    assert not (work / "o").exists()
    assert not [p for p in work.rglob("*.tmp")]


@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o027, 0o640), (0o002, 0o664)])
def test_written_files_follow_the_umask(work, umask, mode):
    assert _tool("prepare_math.py", ["--input-dir", "math", "--output-dir", "o"], work, umask).returncode == 0
    assert (
        _tool(
            "parquet2json.py", ["--input", "math/test-0.parquet", "--output", "j/m.json"], work, umask
        ).returncode
        == 0
    )
    assert (
        _tool("prepare_deepscaler.py", ["--input", "ds.json", "--output-dir", "d"], work, umask).returncode
        == 0
    )
    (work / "v3.json").write_text(json.dumps({"model_type": "deepseek_v3", "num_hidden_layers": 4}))
    derived = _tool(
        "derive_deepseek_config.py", ["--input", "v3.json", "--output", "cfg/config.json"], work, umask
    )
    assert derived.returncode == 0, derived.stderr
    written = [work / "o" / "train.parquet", work / "o" / "test.parquet", work / "j" / "m.json"]
    written += [work / "cfg" / "config.json"]
    written += [work / "d" / "train.parquet", work / "d" / "test.parquet"]
    assert [(str(p), oct(stat.S_IMODE(p.stat().st_mode))) for p in written] == [
        (str(p), oct(mode)) for p in written
    ]


def test_python_without_pyarrow_is_told_which_python_to_use(work):
    """A fresh shell's python3 without the requirements: one line naming the interpreter to use."""
    blocked = (
        "import runpy, sys; sys.modules['pyarrow'] = None; "
        "sys.argv = ['prepare_math', '--input-dir', 'math', '--output-dir', 'o']; "
        "runpy.run_module('ascend_rl.cli.prepare_math', run_name='__main__')"
    )
    proc = subprocess.run([sys.executable, "-c", blocked], cwd=work, capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and "has no module 'pyarrow'" in proc.stderr
    assert "make setup" in proc.stderr and not (work / "o").exists()
