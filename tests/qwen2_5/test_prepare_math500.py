"""llm_rl/qwen2_5/prepare_math500.py: MATH-500 as the recipe's test parquet, from its own file or matched in a MATH test split."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from llm_rl.qwen2_5 import prepare_math500

REPO = Path(__file__).resolve().parents[2]
SUBSET = [
    {
        "problem": "What is $2+3$?",
        "solution": "Add: $\\boxed{5}$.",
        "answer": "5",
        "subject": "Prealgebra",
        "level": 1,
        "unique_id": "test/prealgebra/1.json",
    },
    {
        "problem": "Simplify  $\\frac{2}{4}$.\n",
        "solution": "$\\boxed{\\frac12}$",
        "answer": "\\frac{1}{2}",
        "subject": "Algebra",
        "level": 2,
        "unique_id": "test/algebra/7.json",
    },
    {
        "problem": "A problem the split lacks.",
        "solution": "$\\boxed{0}$",
        "answer": "0",
        "subject": "Geometry",
        "level": 5,
        "unique_id": "test/geometry/9.json",
    },
]


def _jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _split(root: Path) -> Path:
    """A MATH-lighteval test split holding the first two MATH-500 problems (spacing changed) and one other."""
    data = root / "data"
    data.mkdir(parents=True)
    table = pa.table(
        {
            "problem": ["What is $2+3$?", "Simplify $\\frac{2}{4}$.", "Not in MATH-500."],
            "level": ["Level 1", "Level 2", "Level 3"],
            "type": ["Prealgebra", "Algebra", "Number Theory"],
            "solution": ["So $2+3=\\boxed{5}$.", "We get $\\boxed{\\frac{1}{2}}$.", "$\\boxed{1}$"],
        }
    )
    pq.write_table(table, data / "test-00000-of-00001.parquet")
    return root


def test_the_published_file_becomes_recipe_rows(tmp_path):
    out = tmp_path / "math500" / "test.parquet"
    stats = prepare_math500.convert(_jsonl(tmp_path / "test.jsonl", SUBSET), out, log=lambda _: None)
    assert (stats.subset, stats.written, stats.unmatched) == (3, 3, [])
    rows = pq.read_table(out).to_pylist()
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["5", "\\frac{1}{2}", "0"]
    assert rows[1]["extra_info"] == {
        "split": "test",
        "index": 1,
        "level": "Level 2",
        "subject": "Algebra",
        "unique_id": "test/algebra/7.json",
    }
    assert rows[0]["prompt"][-1]["content"].startswith("What is $2+3$?")


def test_matching_in_a_math_split_counts_what_it_cannot_find(tmp_path):
    out = tmp_path / "test.parquet"
    said = []
    stats = prepare_math500.convert(
        _jsonl(tmp_path / "test.jsonl", SUBSET), out, match_in=_split(tmp_path / "lighteval"), log=said.append
    )
    assert stats.written == 2 and stats.unmatched == ["test/geometry/9.json"]
    assert any("1 of 3 MATH-500 problems not found" in s and "test/geometry/9.json" in s for s in said)
    rows = pq.read_table(out).to_pylist()
    # ground truth from the split's own solution, as prepare_math.py takes it for training
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["5", "\\frac{1}{2}"]
    assert [r["extra_info"]["unique_id"] for r in rows] == ["test/prealgebra/1.json", "test/algebra/7.json"]
    assert [r["extra_info"]["level"] for r in rows] == ["Level 1", "Level 2"]


def test_a_file_without_unique_ids_is_one_line(tmp_path):
    bad = _jsonl(tmp_path / "bad.jsonl", [{"problem": "p", "solution": "s"}])
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "llm_rl.qwen2_5.prepare_math500",
            "--math500",
            str(bad),
            "--output",
            str(tmp_path / "o.parquet"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1
    assert "lack unique_id" in proc.stderr and not (tmp_path / "o.parquet").exists()


def test_nothing_matched_writes_nothing(tmp_path):
    other = [{**SUBSET[2]}]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "llm_rl.qwen2_5.prepare_math500",
            "--math500",
            str(_jsonl(tmp_path / "t.jsonl", other)),
            "--match-in",
            str(_split(tmp_path / "lv")),
            "--output",
            str(tmp_path / "o.parquet"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1 and "matched 0 of 1" in proc.stderr and not (tmp_path / "o.parquet").exists()
