#!/usr/bin/env python3
"""Write a random-initialised Hugging Face checkpoint of a model's config.json once (--variant random on verl 0.9.1).

The launcher's --variant random on a verl base whose engine always loads a checkpoint (verl 0.9.1 has no
load_weight=False): the actor, the reference and the rollout all load this one checkpoint, so the reference starts
from the actor's weights.

The checkpoint goes to <out>/random-<model_type>-<key>, where key hashes the config, the seed and this writer's
format: the same inputs find the same folder, which a second call reuses without writing. It is written into a
temporary folder beside it and renamed into place once complete (a stamp file last), so a writer killed half-way
leaves only a `.random-*.tmp-*` folder that no launch loads (the next writer on the same host removes it when its
writer is dead), and two writers at once end with one folder: the second rename loses and reuses the first's.

The tensors are the ones the model's Hugging Face class saves (its state dict on the meta device, in the on-disk
layout under transformers 5, e.g. DeepSeek-V3's routed experts one by one), each drawn from its own generator seeded
by (seed, name): normal(0, initializer_range) for weights, ones for norm weights, zeros for biases but the MoE
router's e_score_correction_bias, normal(0, 0.1). They are written shard by shard (at most --shard-gib in memory),
in the config's dtype, with every other file of the model folder (tokenizer, generation config) copied beside them. A full DeepSeek-R1 config is 671B parameters: about 1.3 TB in
bfloat16; a shallower one: derive_config --num-layers.

    python3 -m llm_rl.deepseek_r1.random_checkpoint --config MODEL_DIR --out ROOT [--seed N] [--dry-run]

prints the checkpoint's folder on stdout (--dry-run: the folder it would use, writing nothing); a bad input ends
with one line on stderr and exit status 1.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import socket
import sys
from collections.abc import Callable
from pathlib import Path

from ascend_rl.data.util import DataError, load_json, run_cli

STAMP = (
    ".random-checkpoint.json"  # written last, inside the temporary folder: a folder without it is never used
)
FORMAT = 1  # bump when the tensors written for the same config and seed change
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".safetensors.index.json", ".bin.index.json")
ROUTER_BIAS_STD = 0.1  # the tiny maker's (ascend_rl/tiny/deepseek_v3.py, build_model)
DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


def read_config(model_dir: Path) -> dict:
    """The model folder's config.json as a dict, or DataError in one line saying what is wrong."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise DataError(f"{path} does not exist; put the model's config.json (and tokenizer) in {model_dir}")
    config = load_json(path, "a model config.json")
    if not isinstance(config, dict):
        raise DataError(f"{path} holds a JSON {type(config).__name__}, not a model config")
    if not isinstance(config.get("model_type"), str):
        raise DataError(f"{path} has no model_type; is it a Hugging Face config.json?")
    if "quantization_config" in config:
        raise DataError(
            f"{path} has a quantization_config (the released FP8 checkpoint's); write the recipe's BF16 config "
            "first: python3 -m llm_rl.deepseek_r1.derive_config --input <download> --output <MODEL_DIR>"
        )
    dtype = config.get("torch_dtype", config.get("dtype", "bfloat16"))
    if dtype not in DTYPES:
        raise DataError(
            f"{path} asks for dtype {dtype!r}; a random checkpoint is written in one of {', '.join(DTYPES)}"
        )
    return config


def checkpoint_dir(model_dir: Path, out_root: Path, seed: int) -> Path:
    """Where the random checkpoint of model_dir's config and seed lives (or will)."""
    config = read_config(model_dir)
    key = hashlib.sha256(json.dumps([FORMAT, seed, config], sort_keys=True).encode()).hexdigest()[:12]
    return Path(out_root).absolute() / f"random-{config['model_type']}-{key}"


def is_complete(folder: Path) -> bool:
    """Whether folder is a random checkpoint a writer finished (its stamp is there)."""
    return (Path(folder) / STAMP).is_file()


def tensor_specs(config: dict) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every tensor the model's Hugging Face class saves, in its order, from config alone."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        hf_config = AutoConfig.for_model(**config)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(hf_config)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DataError(
            f"transformers cannot build a {config['model_type']} model from this config: {first}"
        ) from exc
    state = model.state_dict()
    try:  # transformers 5 keeps some tensors fused in memory (DeepSeek-V3's experts): the layout on disk
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:
        pass
    else:
        state = revert_weight_conversion(model, state)
    if config.get("tie_word_embeddings") and "lm_head.weight" in state:
        state = {k: v for k, v in state.items() if k != "lm_head.weight"}
    return [(name, tuple(t.shape)) for name, t in state.items()]


def draw(name: str, shape: tuple[int, ...], seed: int, std: float, dtype):
    """The tensor `name` of the checkpoint: its own generator, so it does not depend on shards or order."""
    import torch

    gen = torch.Generator().manual_seed(
        int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "big")
    )
    if name.endswith("e_score_correction_bias"):
        # drawn, not zero (transformers starts it at zero): a weight sync that drops it then changes the routing, as
        # with the tiny maker's random_router_bias
        std = ROUTER_BIAS_STD
    elif name.endswith("bias"):
        return torch.zeros(shape, dtype=dtype)
    elif len(shape) == 1 and "norm" in name:
        return torch.ones(shape, dtype=dtype)
    return torch.empty(shape, dtype=torch.float32).normal_(0.0, std, generator=gen).to(dtype)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _remove_dead_writers(out_root: Path, name: str) -> None:
    """Temporary folders of writers on this host that have died (a kill -9 leaves one); never a live one's."""
    host = socket.gethostname()
    for tmp in out_root.glob(f".{name}.tmp-{host}-*"):
        pid = tmp.name.rsplit("-", 1)[1]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(tmp, ignore_errors=True)


def write(
    model_dir: Path,
    out_root: Path,
    seed: int = 1,
    shard_bytes: int = 4 << 30,
    log: Callable[[str], None] = lambda line: print(line, file=sys.stderr),
) -> Path:
    """The random checkpoint of model_dir's config: reused when complete, else written once and renamed into place."""
    import torch
    from safetensors.torch import save_file

    model_dir, out_root = Path(model_dir), Path(out_root)
    final = checkpoint_dir(model_dir, out_root, seed)
    if is_complete(final):
        log(f"random checkpoint: reusing {final}")
        return final
    config = read_config(model_dir)
    dtype = getattr(torch, DTYPES[config.get("torch_dtype", config.get("dtype", "bfloat16"))])
    std = float(config.get("initializer_range", 0.02))
    specs = tensor_specs(config)
    try:
        out_root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DataError(
            f"cannot create {out_root} ({exc.strerror}); set RANDOM_MODEL_DIR to a writable folder"
        ) from exc
    _remove_dead_writers(out_root, final.name)
    tmp = out_root / f".{final.name}.tmp-{socket.gethostname()}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        # shards planned from the shapes first, so every file has its final name when it is written
        itemsize = torch.empty((), dtype=dtype).element_size()
        shards: list[list[tuple[str, tuple[int, ...]]]] = [[]]
        size = 0
        for name, shape in specs:
            nbytes = itemsize * int(torch.Size(shape).numel())
            if shards[-1] and size + nbytes > shard_bytes:
                shards.append([])
                size = 0
            shards[-1].append((name, shape))
            size += nbytes
        total = sum(itemsize * int(torch.Size(s).numel()) for _, s in specs)
        log(f"random checkpoint: writing {len(specs)} tensors ({total / 2**20:,.1f} MiB) to {final}, once")
        weight_map = {}
        mode = 0o666 & ~_umask()
        for i, shard in enumerate(shards, 1):
            fname = (
                "model.safetensors" if len(shards) == 1 else f"model-{i:05d}-of-{len(shards):05d}.safetensors"
            )
            save_file(
                {n: draw(n, s, seed, std, dtype) for n, s in shard},
                str(tmp / fname),
                metadata={"format": "pt"},
            )
            os.chmod(tmp / fname, mode)  # safetensors writes 0600: the user's umask, as every other file here
            weight_map.update({n: fname for n, _ in shard})
            log(f"random checkpoint: shard {i} of {len(shards)} written")
        if len(shards) > 1:
            index = {"metadata": {"total_size": total}, "weight_map": weight_map}
            (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
        for item in sorted(model_dir.iterdir()):  # config, tokenizer, generation config: not weights
            if item.is_file() and not item.name.endswith(WEIGHT_SUFFIXES) and item.name != STAMP:
                shutil.copy2(item, tmp / item.name)
        for item in tmp.iterdir():
            with open(item, "rb") as fh:
                os.fsync(fh.fileno())
        stamp = {
            "format": FORMAT,
            "seed": seed,
            "config": str(model_dir / "config.json"),
            "tensors": len(specs),
        }
        (tmp / STAMP).write_text(json.dumps(stamp, indent=2) + "\n")
        try:
            os.rename(tmp, final)
        except OSError:
            if not is_complete(final):  # not a writer that finished first: something in the way
                raise DataError(
                    f"{final} exists and is not a finished random checkpoint; remove it"
                ) from None
            log(f"random checkpoint: another writer finished {final} first; using it")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Write a random-initialised Hugging Face checkpoint of a model's config.json once (reused "
        "after); print its folder.",
    )
    parser.add_argument("--config", required=True, type=Path, help="the model folder holding config.json")
    parser.add_argument(
        "--out", required=True, type=Path, help="the folder the random checkpoints live under"
    )
    parser.add_argument("--seed", type=int, default=1, help="the weights' seed (default 1)")
    parser.add_argument("--shard-gib", type=float, default=4.0, help="largest shard file, in GiB (default 4)")
    parser.add_argument("--dry-run", action="store_true", help="print the folder it would use; write nothing")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.shard_gib <= 0:
        raise DataError(f"--shard-gib must be positive, got {args.shard_gib}")
    if args.dry_run and not (args.config / "config.json").exists():
        # nothing to hash yet: the launch's own model check names the missing config.json
        print(
            f"random checkpoint: {args.config} has no config.json yet; a launch writes one from it",
            file=sys.stderr,
        )
        print(args.config)
        return 0
    if args.dry_run:
        folder = checkpoint_dir(args.config, args.out, args.seed)
        state = "complete, reused" if is_complete(folder) else "not written yet: a launch writes it"
        print(f"random checkpoint: {folder} ({state})", file=sys.stderr)
    else:
        folder = write(args.config, args.out, args.seed, int(args.shard_gib * 2**30))
    print(folder)
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
