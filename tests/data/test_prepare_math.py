"""ascend_rl/data/prepare_math.py: MATH-lighteval parquet to verl parquet, loaded back through verl's RLHFDataset."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ascend_rl.cli import prepare_math as prepare_math_cli
from ascend_rl.data import prepare_math
from ascend_rl.data.util import MATH_INSTRUCTION, last_boxed, run_cli
from tiny_tokenizer import load_tokenizer

REPO = Path(__file__).resolve().parents[2]

# (problem, solution, expected ground truth or None when the row must be skipped)
TRAIN = [
    ("What is $2+3$?", "We add: $2+3=\\boxed{5}$.", "5"),
    ("Simplify $\\frac{2}{4}$.", "Divide: $\\boxed{\\frac{1}{2}}$.", "\\frac{1}{2}"),
    ("List the roots.", "First $\\boxed{0}$ is wrong; the set is $\\boxed{\\{1, 2\\}}$.", "\\{1, 2\\}"),
    ("Describe the shape.", "It is a circle, no numeric answer given.", None),
    ("Evaluate $3^2$.", "So the answer is $\\fbox{9}$.", "9"),
    ("Pick a digit.", "The digit is $\\boxed 7$.", "7"),
    ("", "Stray solution $\\boxed{1}$.", None),
]
TEST = [("Compute $1+1$.", "Clearly $\\boxed{2}$.", "2")]


def write_math_parquet(path: Path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.table(
        {
            "problem": [r[0] for r in rows],
            "level": ["Level 1"] * len(rows),
            "type": ["Algebra"] * len(rows),
            "solution": [r[1] for r in rows],
        }
    )
    pq.write_table(table, path)


@pytest.fixture
def math_dir(tmp_path) -> Path:
    """A folder laid out like the hub download: data/train-*.parquet and data/test-*.parquet."""
    root = tmp_path / "MATH-lighteval"
    write_math_parquet(root / "data" / "train-00000-of-00001.parquet", TRAIN)
    write_math_parquet(root / "data" / "test-00000-of-00001.parquet", TEST)
    return root


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("$\\boxed{42}$", "42"),
        ("$\\boxed{\\frac{\\sqrt{3}}{2}}$", "\\frac{\\sqrt{3}}{2}"),
        ("a $\\boxed{1}$ then b $\\boxed{2}$", "2"),
        ("$\\boxed{\\{a\\}}$", "\\{a\\}"),
        ("$\\boxed {x+1}$", "x+1"),
        ("$\\boxed 5$.", "5"),
        ("so \\boxed 12 apples", "12"),
        ("$\\fbox{3}$", "3"),
        ("last one unbalanced $\\boxed{4}$ and $\\boxed{5$", "4"),
        ("\\boxedfoo{3}", None),
        ("$\\boxed{}$", None),
        ("no box here", None),
        (None, None),
    ],
)
def test_last_boxed(text, expected):
    assert last_boxed(text) == expected


def test_convert_writes_verl_rows(math_dir, tmp_path):
    out = tmp_path / "out"
    stats = prepare_math.convert(math_dir, out, log=lambda _: None)

    train = stats.splits["train"]
    assert (train.rows, train.written, train.no_boxed, train.empty_problem) == (7, 5, 1, 1)
    assert stats.splits["test"].written == 1

    table = pq.read_table(out / "train.parquet")
    assert table.column_names == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    rows = table.to_pylist()
    kept = [(i, r) for i, r in enumerate(TRAIN) if r[2] is not None]
    assert [row["reward_model"] for row in rows] == [{"style": "rule", "ground_truth": r[2]} for _, r in kept]
    assert [row["extra_info"] for row in rows] == [
        {"split": "train", "index": i, "level": "Level 1", "subject": "Algebra", "unique_id": None}
        for i, _ in kept
    ]
    assert rows[0]["prompt"] == [{"role": "user", "content": f"What is $2+3$?\n\n{MATH_INSTRUCTION}"}]
    assert {row["data_source"] for row in rows} == {"DigitalLearningGmbH/MATH-lighteval"}
    assert {row["ability"] for row in rows} == {"math"}
    test_rows = pq.read_table(out / "test.parquet").to_pylist()
    assert test_rows[0]["extra_info"] == {
        "split": "test",
        "index": 0,
        "level": "Level 1",
        "subject": "Algebra",
        "unique_id": None,
    }


def test_output_loads_in_verl_rlhf_dataset(math_dir, tmp_path, monkeypatch):
    import datasets
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-datasets")

    out = tmp_path / "out"
    prepare_math.convert(math_dir, out, log=lambda _: None)
    tokenizer = load_tokenizer(tmp_path / "tokenizer")
    config = OmegaConf.create(
        {
            "prompt_key": "prompt",
            "max_prompt_length": 1024,
            "filter_overlong_prompts": True,
            "filter_overlong_prompts_workers": 1,
            "truncation": "error",
            "return_raw_chat": True,
            "cache_dir": str(tmp_path / "verl-cache"),
        }
    )
    dataset = RLHFDataset(str(out / "train.parquet"), tokenizer, config)
    assert len(dataset) == 5

    item = dataset[1]
    ids = item["input_ids"][item["attention_mask"].bool()].tolist()
    expected_prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": f"Simplify $\\frac{{2}}{{4}}$.\n\n{MATH_INSTRUCTION}"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert tokenizer.decode(ids) == expected_prompt
    assert expected_prompt.startswith("<|im_start|>system\nYou are a helpful assistant")
    assert expected_prompt.endswith("<|im_start|>assistant\n")
    assert item["input_ids"].shape[0] == 1024 and item["input_ids"][0].item() == tokenizer.pad_token_id
    assert item["reward_model"]["ground_truth"] == "\\frac{1}{2}"
    assert item["index"] == 1
    assert item["raw_prompt"][0]["role"] == "user"


def run_main(argv) -> int:
    return run_cli(prepare_math_cli.main, [str(a) for a in argv])


def test_dry_run_writes_nothing(math_dir, tmp_path, capsys):
    out = tmp_path / "out"
    assert run_main(["--input-dir", math_dir, "--output-dir", out, "--dry-run"]) == 0
    assert not out.exists()
    assert (
        "train: 7 rows, 5 kept, 1 skipped without \\boxed{}, 1 skipped with an empty problem"
        in capsys.readouterr().out
    )


def test_top_level_layout_and_system_prompt_flag(tmp_path):
    root = tmp_path / "flat"
    write_math_parquet(root / "train-a.parquet", TRAIN[:2])
    write_math_parquet(root / "train-b.parquet", TRAIN[2:3])
    write_math_parquet(root / "test.parquet", TEST)
    stats = prepare_math.convert(root, tmp_path / "out", system_prompt="SYS", log=lambda _: None)
    assert stats.splits["train"].files == 2 and stats.splits["train"].written == 3
    rows = pq.read_table(tmp_path / "out" / "train.parquet").to_pylist()
    assert rows[2]["extra_info"]["index"] == 2  # counted across both files
    assert rows[0]["prompt"][0] == {"role": "system", "content": "SYS"}


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err
    return err


@pytest.mark.parametrize(
    ("layout", "message"),
    [
        ("missing", "is not a directory"),
        ("empty", "no train*.parquet / test*.parquet"),
        ("no_test", "no test*.parquet"),
        ("bad_columns", "lacks column(s) solution"),
        ("truncated", "damaged or incomplete"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, layout, message):
    src = tmp_path / "src"
    if layout != "missing":
        src.mkdir()
    if layout in ("no_test", "bad_columns", "truncated"):
        write_math_parquet(src / "train-0.parquet", TRAIN)
    if layout in ("bad_columns", "truncated"):
        write_math_parquet(src / "test-0.parquet", TEST)
    if layout == "bad_columns":
        pq.write_table(pa.table({"problem": ["p"], "answer": ["1"]}), src / "test-0.parquet")
    if layout == "truncated":
        data = (src / "test-0.parquet").read_bytes()
        (src / "test-0.parquet").write_bytes(data[: len(data) // 2])
    out = tmp_path / "out"
    out.mkdir()
    (out / "train.parquet").write_bytes(b"previous run")

    assert run_main(["--input-dir", src, "--output-dir", out]) == 1
    assert message in _one_error_line(capsys)
    assert sorted(p.name for p in out.iterdir()) == ["train.parquet"]
    assert (out / "train.parquet").read_bytes() == b"previous run"


def test_refuses_to_write_into_the_input_folder(math_dir, capsys):
    assert run_main(["--input-dir", math_dir, "--output-dir", math_dir / "data"]) == 1
    assert "holds the input files" in _one_error_line(capsys)


def test_command_line(math_dir, tmp_path):
    script = ["-m", "ascend_rl", "prepare_math"]
    help_run = subprocess.run([sys.executable, *script, "--help"], capture_output=True, text=True, check=True)
    assert "--input-dir" in help_run.stdout and "--dry-run" in help_run.stdout
    out = tmp_path / "cli-out"
    run = subprocess.run(
        [sys.executable, *script, "--input-dir", math_dir, "--output-dir", out],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    assert "wrote" in run.stdout
    assert pq.read_table(out / "train.parquet").num_rows == 5
