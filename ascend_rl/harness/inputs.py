"""What the e2e runs, the fault runs and the demo train on: the tiny policy's shape and the cache of their inputs.

A run's *inputs* are <out>/model (a tiny checkpoint) and <out>/data (train and test parquet), stamped with the
settings that made them (<out>/inputs.json). They are built once per machine: the first run that needs a set
builds it into the download cache (<cache>/inputs/<key>/, the key a hash of the settings, of the code and files
that build them and of the torch and transformers versions) under a lock, and every run copies it from there. A
build killed part-way leaves only a temporary folder, which the next build removes; the cached set is renamed
into place whole, stamp included. The e2e runs, the fault runs and the demo with the same settings therefore
share one warm start, however many output folders and test workers there are.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from ascend_rl import locks
from ascend_rl.paths import REPO

# The tiny policy: head_dim 32 (vLLM's CPU attention takes 32, 64, ... 256), two layers.
MODEL_SHAPE = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_layers": 2,
    "num_heads": 4,
    "num_kv_heads": 2,
}

# What a set of inputs is made from besides its settings: a change to any of these builds a new set.
BUILT_FROM = (
    "ascend_rl/harness/inputs.py",
    "ascend_rl/tiny/qwen2.py",
    "ascend_rl/tiny/deepseek_v3.py",
    "ascend_rl/tiny/warm_start.py",
    "ascend_rl/tiny/problems.py",
    "ascend_rl/harness/lookup.py",
    "ascend_rl/data/prepare_math.py",
    "ascend_rl/data/util.py",
    "llm_rl/qwen2_5/demo/problems.jsonl",
    "llm_rl/qwen2_5/tokenizer_config.json",
)


def cache_key(want: dict, prefix: str) -> str:
    """The inputs' identity: their settings, the files that build them and the libraries that run the build."""
    from importlib import metadata

    digest = hashlib.sha256(json.dumps({"prefix": prefix, **want}, sort_keys=True).encode())
    for rel in BUILT_FROM:
        digest.update(rel.encode() + b"\0" + (REPO / rel).read_bytes())
    for dist in ("torch", "transformers"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            digest.update(f"{dist}=={metadata.version(dist)}".encode())
    return digest.hexdigest()[:16]


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive flock on path for the block: a second builder waits; the kernel lets go if the holder dies."""
    with locks.exclusive(path):
        yield


def shared_inputs(want: dict, build: Callable[[Path, Path], None], prefix: str) -> tuple[Path, bool]:
    """The machine's copy of these inputs (<cache>/inputs/<key>), built under a lock if absent; (its folder,
    whether this call built it)."""
    from ascend_rl.artifacts import cache_dir

    root = cache_dir() / "inputs"
    root.mkdir(parents=True, exist_ok=True)
    key = cache_key(want, prefix)
    final = root / key
    with _locked(root / f"{key}.lock"):
        if (final / "inputs.json").is_file():
            return final, False
        for stale in root.glob(f".{key}.*"):  # a build that was killed part-way
            shutil.rmtree(stale, ignore_errors=True)
        shutil.rmtree(final, ignore_errors=True)  # no stamp: never complete
        tmp = root / f".{key}.{os.getpid()}"
        tmp.mkdir()
        # minutes on two cores (the warm start): say what is coming and, at the end, how long it took
        print(f"{prefix}: inputs: building them into {final}, once for this machine", flush=True)
        start = time.monotonic()
        build(tmp / "model", tmp / "data")
        print(f"{prefix}: inputs: built in {time.monotonic() - start:.0f} s", flush=True)
        (tmp / "inputs.json").write_text(json.dumps(want) + "\n")
        os.replace(tmp, final)
        return final, True


def cached_inputs(
    out: Path,
    want: dict,
    build: Callable[[Path, Path], None],
    prefix: str,
    what: str = "tiny Qwen2, head_dim 32",
) -> tuple[Path, Path]:
    """out/model and out/data as build(model_dir, data_dir) makes them, reused while out/inputs.json equals want,
    else copied from the machine's cache (built there first when no run on this machine has built them yet)."""
    data_dir, model_dir = out / "data", out / "model"
    stamp = out / "inputs.json"
    have = json.loads(stamp.read_text()) if stamp.is_file() else None
    if have == want and (model_dir / "config.json").is_file() and (data_dir / "train.parquet").is_file():
        print(f"{prefix}: inputs: reusing {model_dir} and {data_dir}")
        return model_dir, data_dir
    for stale in (data_dir, model_dir, stamp):
        shutil.rmtree(stale, ignore_errors=True) if stale.is_dir() else stale.unlink(missing_ok=True)
    shared, built = shared_inputs(want, build, prefix)
    out.mkdir(parents=True, exist_ok=True)
    shutil.copytree(shared / "model", model_dir)
    shutil.copytree(shared / "data", data_dir)
    stamp.write_text(json.dumps(want) + "\n")  # last: a copy cut short has no stamp and is redone
    how = "built" if built else "reusing the machine's copy,"
    print(f"{prefix}: inputs: {how} {shared} ({what}) -> {model_dir}, {data_dir}")
    return model_dir, data_dir
