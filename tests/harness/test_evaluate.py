"""ascend_rl/evaluate.py: its report arithmetic, its one-line refusals, and (e2e environment) a real vLLM run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ascend_rl import evaluate
from ascend_rl.data.util import make_row, write_parquet_atomic
from tiny_tokenizer import build_tokenizer_dir

REPO = Path(__file__).resolve().parents[2]
EVALUATE = "ascend_rl.cli.evaluate"


def _run(*args: str, python: str = sys.executable, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [python, "-m", EVALUATE, *args], capture_output=True, text=True, timeout=timeout, cwd=REPO
    )


def _test_parquet(path: Path, rows: list[tuple[str, str, str, str]]) -> Path:
    """rows: (problem, ground truth, level, subject), as prepare_math.py writes them."""
    table = [
        make_row(data_source="t", problem=p, ground_truth=g, split="test", index=i, level=lv, subject=s)
        for i, (p, g, lv, s) in enumerate(rows)
    ]
    write_parquet_atomic({path: table})
    return path


def _problem(level: str | None, subject: str | None, correct: list[bool]) -> evaluate.Problem:
    p = evaluate.Problem(
        index=0, messages=[{"role": "user", "content": "q"}], ground_truth="1", level=level, subject=subject
    )
    for ok in correct:
        p.answers.append(
            {
                "response": "r",
                "response_tokens": 10,
                "truncated": False,
                "score": float(ok),
                "accuracy": 0.7 * ok,
                "format": 0.2 * ok,
                "cot": 0.1 * ok,
                "correct": ok,
                "timed_out": False,
            }
        )
    return p


def test_pass_at_k_is_the_unbiased_estimator():
    assert evaluate.pass_at_k(4, 0, 1) == 0.0
    assert evaluate.pass_at_k(4, 4, 1) == 1.0
    assert evaluate.pass_at_k(4, 1, 1) == pytest.approx(0.25)
    # one right of four: the chance that two drawn without replacement include it, 1 - C(3,2)/C(4,2)
    assert evaluate.pass_at_k(4, 1, 2) == pytest.approx(0.5)
    assert evaluate.pass_at_k(4, 3, 2) == 1.0


def test_summary_breaks_accuracy_down_by_level_and_subject():
    problems = [
        _problem("Level 1", "Algebra", [True, True]),
        _problem("Level 1", "Geometry", [False, True]),
        _problem("Level 5", "Algebra", [False, False]),
    ]
    report = evaluate.summarise(problems, 2)
    assert report["overall"]["problems"] == 3
    assert report["overall"]["mean@2"] == pytest.approx(0.5)
    assert report["overall"]["pass@2"] == pytest.approx(2 / 3)
    assert report["by_level"]["Level 1"]["mean@2"] == pytest.approx(0.75)
    assert report["by_level"]["Level 5"]["mean@2"] == 0.0
    assert report["by_subject"]["Algebra"] == {"problems": 2, "mean@2": 0.5, "pass@1": 0.5, "pass@2": 0.5}
    assert report["reward"]["score"] == pytest.approx(0.5)
    assert report["response_tokens"]["mean"] == 10
    text = evaluate.table(report, "m")
    assert "Level 5" in text and "Geometry" in text and "50.00" in text


def test_help_and_usage_errors():
    proc = _run("--help", timeout=60)
    assert proc.returncode == 0 and "--model" in proc.stdout and "pass@k" in proc.stdout
    proc = _run("--model", "m", "--data", "d", "--n", "4", "--temperature", "0", timeout=60)
    assert proc.returncode == 2 and "identical greedy answers" in proc.stderr


def test_a_missing_model_is_one_line(tmp_path):
    data = _test_parquet(tmp_path / "test.parquet", [("What is $1+1$?", "2", "Level 1", "Algebra")])
    proc = _run("--model", str(tmp_path / "nowhere"), "--data", str(data), timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and "does not exist" in proc.stderr, proc.stderr


def test_a_folder_that_is_neither_model_nor_checkpoint_is_one_line(tmp_path):
    data = _test_parquet(tmp_path / "test.parquet", [("What is $1+1$?", "2", "Level 1", "Algebra")])
    (tmp_path / "empty").mkdir()
    proc = _run("--model", str(tmp_path / "empty"), "--data", str(data), timeout=60)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1
    assert "neither a Hugging Face folder" in proc.stderr


def test_a_parquet_without_the_recipe_columns_is_one_line(tmp_path):
    bad = tmp_path / "raw.parquet"
    pq.write_table(pa.table({"problem": ["What is 1+1?"], "solution": ["\\boxed{2}"]}), bad)
    proc = _run("--model", str(tmp_path), "--data", str(bad), timeout=60)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert "lacks column(s) prompt, reward_model" in proc.stderr


def test_a_tokenizer_without_chat_template_is_one_line(tmp_path):
    model = build_tokenizer_dir(tmp_path / "model")
    config = json.loads((model / "tokenizer_config.json").read_text())
    config.pop("chat_template")
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    (model / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    data = _test_parquet(tmp_path / "test.parquet", [("What is $1+1$?", "2", "Level 1", "Algebra")])
    proc = _run("--model", str(model), "--data", str(data), timeout=120)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert "has no chat template" in proc.stderr and "ascend_rl tokenizer_config" in proc.stderr


def test_prompts_longer_than_the_models_context_are_one_line(tmp_path):
    """Before any engine starts: vLLM would refuse the context with a page of pydantic traceback."""
    model = build_tokenizer_dir(tmp_path / "model")
    (model / "config.json").write_text(json.dumps({"model_type": "qwen2", "max_position_embeddings": 256}))
    data = _test_parquet(tmp_path / "test.parquet", [("What is $1+1$?", "2", "Level 1", "Algebra")])
    proc = _run("--model", str(model), "--data", str(data), "--max-tokens", "1024", timeout=120)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert "max_position_embeddings (256)" in proc.stderr and "pass --max-tokens" in proc.stderr


# --- the real thing: vLLM's CPU build on the tiny model (a verl checkpoint: tests/harness/test_demo_learn.py) ----


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory, e2e_python) -> Path:
    """A tiny Qwen2 (vLLM's CPU attention needs head_dim 32) with the recipe's tokenizer, briefly warm-started."""
    out = tmp_path_factory.mktemp("eval-model") / "model"
    script = (
        "from ascend_rl.harness import inputs; from ascend_rl.tiny import qwen2; "
        f"qwen2.bundled_checkpoint(__import__('pathlib').Path({str(out)!r}), 1, 30, "
        "qwen2.TinyShape(**inputs.MODEL_SHAPE), log=lambda m: None)"
    )
    subprocess.run([str(e2e_python), "-c", script], cwd=REPO, check=True, timeout=900)
    return out


@pytest.mark.slow
@pytest.mark.ci
def test_vllm_answers_are_all_scored_and_reported(tiny_model, e2e_python, tmp_path):
    rows = [
        (f"Compute ${a} + {b}$.", str(a + b), f"Level {1 + a % 2}", "Prealgebra")
        for a in range(1, 9)
        for b in (1, 2)
    ]
    data = _test_parquet(tmp_path / "test.parquet", rows)
    out, answers = tmp_path / "report.json", tmp_path / "answers.jsonl"
    proc = _run(
        "--model",
        str(tiny_model),
        "--data",
        str(data),
        "--out",
        str(out),
        "--answers",
        str(answers),
        "--n",
        "3",
        "--temperature",
        "1.0",
        "--max-tokens",
        "32",
        python=str(e2e_python),
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["overall"]["problems"] == 16 and report["answers"] == 48
    assert set(report["by_level"]) == {"Level 1", "Level 2"} and set(report["by_subject"]) == {"Prealgebra"}
    assert {"mean@3", "pass@1", "pass@2", "pass@3"} <= set(report["overall"])
    assert 0 < report["response_tokens"]["mean"] <= 32
    lines = [json.loads(line) for line in answers.read_text().splitlines()]
    assert len(lines) == 16 and all(len(p["answers"]) == 3 for p in lines)
    assert all(isinstance(a["score"], float) and "correct" in a for p in lines for a in p["answers"])
    assert "load" in proc.stdout and "problems/s" in proc.stdout


@pytest.mark.slow
@pytest.mark.ci
def test_sampling_a_batch_large_enough_for_chunked_prefill(tiny_model, e2e_python, tmp_path):
    """64 problems x 8 answers: vLLM's CPU build splits the prefill, and a per-request seed then failed with
    `RuntimeError: CPU Generator does not use offset` (the engine's seed alone is used on CPU)."""
    rows = [
        (f"Compute ${a} + {b}$.", str(a + b), "Level 1", "Prealgebra") for a in range(1, 33) for b in (1, 2)
    ]
    data = _test_parquet(tmp_path / "test.parquet", rows)
    out = tmp_path / "report.json"
    args = ("--model", str(tiny_model), "--data", str(data), "--n", "8", "--max-tokens", "16")
    proc = _run(*args, "--out", str(out), python=str(e2e_python), timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(out.read_text())["answers"] == 512
