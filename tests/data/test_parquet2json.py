"""ascend_rl/data/parquet2json.py: MATH-lighteval parquet to OpenCompass's math.json."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ascend_rl.cli import parquet2json as parquet2json_cli
from ascend_rl.data import parquet2json
from ascend_rl.data.util import last_boxed, run_cli


def write(path: Path, rows: list[tuple[str, str, str, str]]) -> Path:
    cols = list(zip(*rows, strict=True))
    pq.write_table(pa.table(dict(zip(parquet2json.COLUMNS, map(list, cols), strict=True))), path)
    return path


ROWS_A = [
    ("p1", "Level 1", "Algebra", "so $\\boxed{1}$"),
    ("p2", "Level 3", "Geometry", "area $\\boxed{\\pi r^2}$"),
    ("p3", "Level 2", "Algebra", "answer $\\fbox{3}$"),
]
ROWS_B = [("p4", "Level 5", "Algebra", "$\\boxed{4}$")]


def test_keys_count_per_type_across_files(tmp_path):
    out = tmp_path / "eval" / "math.json"
    stats = parquet2json.to_math_json(
        [write(tmp_path / "a.parquet", ROWS_A), write(tmp_path / "b.parquet", ROWS_B)],
        out,
        log=lambda _: None,
    )
    data = json.loads(out.read_text(encoding="utf-8"))
    assert list(data) == ["Algebra_1", "Geometry_1", "Algebra_2", "Algebra_3"]
    assert data["Geometry_1"] == {
        "problem": "p2",
        "level": "Level 3",
        "type": "Geometry",
        "solution": "area $\\boxed{\\pi r^2}$",
    }
    assert data["Algebra_3"]["problem"] == "p4"
    assert stats.per_type == {"Algebra": 3, "Geometry": 1}
    # OpenCompass takes each reference from the solution's last \boxed{...}; the \fbox row has none.
    assert stats.no_boxed_reference == 1
    assert [last_boxed(v["solution"]) for v in data.values()] == ["1", "\\pi r^2", "3", "4"]


def test_dry_run_writes_nothing(tmp_path, capsys):
    src = write(tmp_path / "a.parquet", ROWS_A)
    assert (
        run_cli(
            parquet2json_cli.main, ["--input", str(src), "--output", str(tmp_path / "math.json"), "--dry-run"]
        )
        == 0
    )
    assert not (tmp_path / "math.json").exists()
    assert "3 problems (Algebra 2, Geometry 1)" in capsys.readouterr().out


@pytest.mark.parametrize("case", ["missing", "directory", "columns", "truncated"])
def test_bad_input_is_one_line(tmp_path, capsys, case):
    src = tmp_path / "in.parquet"
    if case == "directory":
        src = tmp_path
    elif case == "columns":
        pq.write_table(pa.table({"problem": ["p"], "solution": ["s"]}), src)
    elif case == "truncated":
        data = write(src, ROWS_A).read_bytes()
        src.write_bytes(data[:-20])
    out = tmp_path / "math.json"
    assert run_cli(parquet2json_cli.main, ["--input", str(src), "--output", str(out)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err
    assert {
        "missing": "does not exist",
        "directory": "is a directory",
        "columns": "lacks column(s) level, type",
        "truncated": "damaged or incomplete",
    }[case] in err
    assert not out.exists()
