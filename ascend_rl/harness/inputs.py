"""What the e2e runs and the demo train on: the tiny policy's shape and the cache of their model and data.

A run's *inputs* are <out>/model (a tiny checkpoint) and <out>/data (train and test parquet), built once and
stamped with the settings that made them (<out>/inputs.json); a later run with the same settings reuses them.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

# The tiny policy: head_dim 32 (vLLM's CPU attention takes 32, 64, ... 256), two layers.
MODEL_SHAPE = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_layers": 2,
    "num_heads": 4,
    "num_kv_heads": 2,
}


def cached_inputs(
    out: Path,
    want: dict,
    build: Callable[[Path, Path], None],
    prefix: str,
    what: str = "tiny Qwen2, head_dim 32",
) -> tuple[Path, Path]:
    """out/model and out/data as build(model_dir, data_dir) makes them, reused while out/inputs.json equals want."""
    data_dir, model_dir = out / "data", out / "model"
    stamp = out / "inputs.json"
    have = json.loads(stamp.read_text()) if stamp.is_file() else None
    if have == want and (model_dir / "config.json").is_file() and (data_dir / "train.parquet").is_file():
        print(f"{prefix}: inputs: reusing {model_dir} and {data_dir}")
        return model_dir, data_dir
    for stale in (data_dir, model_dir, stamp):
        shutil.rmtree(stale, ignore_errors=True) if stale.is_dir() else stale.unlink(missing_ok=True)
    build(model_dir, data_dir)
    stamp.write_text(json.dumps(want) + "\n")
    print(f"{prefix}: inputs: {model_dir} ({what}), {data_dir} (prepare_math.py)")
    return model_dir, data_dir
