"""The dry run reads the data as verl will (issue 61, item 2): every train and validation file is opened, every
page read, and the columns verl's RLHFDataset and the reward read must be there; a file verl cannot train on, and a
model or data path named for the launch that is not there, fail the dry run in one line, as they fail a launch.
Only the folders a launcher defaulted to (MODEL_DIR / DATA_DIR unset) may be absent in a dry run."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from omegaconf import OmegaConf

from ascend_rl.data.util import row_schema
from ascend_rl.paths import RECIPES
from ascend_rl.preflight import check_data, check_model
from launcher_env import launcher_env, run_launcher
from launcher_env import write_rows as _write

QWEN = RECIPES / "qwen2_5" / "run_qwen2_5_1_5b_single.sh"
DEEPSEEK = RECIPES / "deepseek_r1" / "run_deepseek_r1_a3.sh"


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.fixture
def data(tmp_path) -> Path:
    """DATA_DIR with a good train.parquet (600 rows) and test.parquet (10 rows)."""
    _write(tmp_path / "data" / "train.parquet", 600)
    _write(tmp_path / "data" / "test.parquet", 10)
    return tmp_path / "data"


@pytest.fixture
def model(tmp_path) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]}')
    return folder


def _refused(proc: subprocess.CompletedProcess) -> str:
    """The one error line of a refused dry run (exit 1, no command printed)."""
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stdout + proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if "error" in ln]
    assert len(errors) == 1, proc.stderr
    assert "command (" not in proc.stdout
    return errors[0]


def _qwen_dry_run(tmp_path, verl_tree, data: Path, model: Path) -> subprocess.CompletedProcess:
    env = launcher_env(tmp_path, verl_tree, MODEL_DIR=str(model), DATA_DIR=str(data), LOGGER="console")
    return run_launcher(QWEN, ["--dry-run"], env)


def _break(data: Path, how: str) -> Path:
    """Spoil one file of a good DATA_DIR as a user meets it; the file spoilt."""
    if how == "wrong columns":  # 600 rows of another data set's format
        for name, rows in (("train.parquet", 600), ("test.parquet", 10)):
            pq.write_table(pa.table({"question": ["1 + 1?"] * rows, "answer": ["2"] * rows}), data / name)
        return data / "train.parquet"
    if how == "truncated val":
        _truncate(data / "test.parquet")
        return data / "test.parquet"
    if how == "empty train":
        (data / "train.parquet").write_bytes(b"")
        return data / "train.parquet"
    assert how == "truncated train"
    _truncate(data / "train.parquet")
    return data / "train.parquet"


SAID = {
    "wrong columns": "lacks the column(s) verl reads: prompt (",
    "truncated val": "is not a readable parquet file",
    "empty train": "is empty (0 bytes)",
    "truncated train": "is not a readable parquet file",
}


def test_good_data_passes_the_dry_run_with_its_plan(tmp_path, verl_tree, data, model):
    proc = _qwen_dry_run(tmp_path, verl_tree, data, model)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "600 train rows = 2 steps/epoch at batch 256" in proc.stdout


@pytest.mark.parametrize("how", list(SAID))
def test_data_verl_cannot_train_on_fails_the_dry_run_in_one_line(tmp_path, verl_tree, data, model, how):
    spoilt = _break(data, how)
    line = _refused(_qwen_dry_run(tmp_path, verl_tree, data, model))
    assert f"{spoilt} {SAID[how]}" in line, line
    if how == "wrong columns":
        assert "reward_model (" in line and "data_source (" in line and "it has question, answer" in line


def test_a_model_path_that_is_not_there_fails_the_dry_run(tmp_path, verl_tree, data):
    gone = tmp_path / "DeepSeek-R1-bf16"
    env = launcher_env(tmp_path, verl_tree, MODEL_DIR=str(gone), DATA_DIR=str(data), LOGGER="console")
    line = _refused(run_launcher(DEEPSEEK, ["--dry-run"], env))
    assert f"{gone} does not exist" in line and "MODEL_DIR" in line


# The checks themselves, on the config a launch composes (the keys they read), as a dry run reports them.


def _cfg(train: list[Path], val: list[Path], model: Path | None = None, **data_keys):
    return OmegaConf.create(
        {
            "data": {
                "train_files": [str(p) for p in train],
                "val_files": [str(p) for p in val],
                "train_batch_size": 4,
                **data_keys,
            },
            "actor_rollout_ref": {"model": {"path": str(model or "/nonexistent")}},
            "trainer": {"total_epochs": 1},
        }
    )


def _dry(check):
    """The check as a dry run reports it (a machine check's failure is a warning there)."""
    from ascend_rl.preflight.report import dry_run_view

    return dry_run_view([check])[0]


def test_every_file_of_a_list_is_read_and_an_empty_one_fails(tmp_path):
    good = [_write(tmp_path / f"part{i}.parquet", 4) for i in range(2)]
    ok = _dry(check_data(_cfg(good, good)))
    assert ok.status == "ok" and "8 train rows = 2 steps/epoch" in ok.detail
    empty = tmp_path / "val2.parquet"
    pq.write_table(pa.Table.from_pylist([], schema=row_schema()), empty)
    failed = _dry(check_data(_cfg(good, [good[0], empty])))
    assert failed.status == "FAIL" and failed.detail.startswith(f"{empty} has no rows")


def test_the_columns_follow_the_data_keys_and_the_reward_needs_a_ground_truth(tmp_path):
    rows = [{"question": [{"role": "user", "content": "1 + 1?"}], "source": "m", "data_source": "m"}] * 4
    plain = tmp_path / "plain.parquet"
    pq.write_table(pa.Table.from_pylist([{**r, "reward_model": {"ground_truth": "2"}} for r in rows]), plain)
    assert (
        _dry(check_data(_cfg([plain], [plain], prompt_key="question", reward_fn_key="source"))).status == "ok"
    )
    wrong = _dry(check_data(_cfg([plain], [plain])))  # the default prompt_key, prompt, is not there
    assert wrong.status == "FAIL" and f"{plain} lacks the column(s) verl reads: prompt (" in wrong.detail
    no_truth = tmp_path / "no_truth.parquet"
    pq.write_table(pa.Table.from_pylist([{**r, "reward_model": {"style": "rule"}} for r in rows]), no_truth)
    failed = _dry(check_data(_cfg([no_truth], [plain], prompt_key="question")))
    assert (
        failed.status == "FAIL"
        and "column reward_model is struct<style: string>, not a struct with a" in (failed.detail)
    )
    text = tmp_path / "text.parquet"
    pq.write_table(
        pa.Table.from_pylist(
            [{**r, "prompt": "1 + 1?", "reward_model": {"ground_truth": "2"}} for r in rows]
        ),
        text,
    )
    failed = _dry(check_data(_cfg([text], [text])))
    assert failed.status == "FAIL" and "column prompt is string, not a list of chat messages" in failed.detail


def test_only_the_folders_a_launcher_defaulted_to_may_be_absent_in_a_dry_run(tmp_path, model):
    default = tmp_path / "recipe" / "data"
    files = [default / "train.parquet"], [default / "test.parquet"]
    warned = _dry(check_data(_cfg(*files), absent_ok=[str(default)]))
    assert warned.status == "warn" and warned.detail.endswith("(ignored in dry run)")
    assert _dry(check_data(_cfg(*files))).status == "FAIL"  # named, not there
    assert (
        _dry(check_model(_cfg([], [], tmp_path / "gone"), absent_ok=[str(tmp_path / "gone")])).status
        == "warn"
    )
    failed = _dry(check_model(_cfg([], [], tmp_path / "gone")))
    assert failed.status == "FAIL" and failed.detail.startswith(f"{tmp_path / 'gone'} does not exist")
    empty = tmp_path / "empty_model"
    empty.mkdir()  # there, without its config: a launch fails, the dry run too, named or not
    assert _dry(check_model(_cfg([], [], empty), absent_ok=[str(empty)])).status == "FAIL"
    assert _dry(check_model(_cfg([], [], model))).status == "ok"
