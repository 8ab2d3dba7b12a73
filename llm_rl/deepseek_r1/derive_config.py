#!/usr/bin/env python3
"""Derive the DeepSeek-R1 recipe's model config.json from the downloaded DeepSeek-V3/R1 one.

The recipe trains BF16 weights without the multi-token-prediction layer, so the derived config drops
`quantization_config` (the FP8 block quantisation of the released checkpoint), sets
`num_nextn_predict_layers` to 0 and `torch_dtype` to bfloat16. `--num-layers` further cuts the depth for
the random-initialisation variant. Everything else is kept as downloaded, in the same key order.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

from ascend_rl.data.util import DataError, load_json, run_cli, write_json_atomic

MODEL_TYPES = ("deepseek_v3",)
_ABSENT = object()


def derive(config: dict, num_layers: int | None = None) -> dict:
    """The recipe's config from a DeepSeek-V3/R1 config (the input dict is left unchanged)."""
    if config.get("model_type") not in MODEL_TYPES:
        raise DataError(
            f"model_type is {config.get('model_type')!r}, not one of {', '.join(MODEL_TYPES)}; "
            "pass the config.json of DeepSeek-V3 or DeepSeek-R1"
        )
    out = dict(config)
    out.pop("quantization_config", None)
    out["num_nextn_predict_layers"] = 0
    out["torch_dtype"] = "bfloat16"
    if "dtype" in out:  # newer transformers write the dtype under this name
        out["dtype"] = "bfloat16"
    if num_layers is not None:
        total = config.get("num_hidden_layers")
        if not isinstance(total, int):
            raise DataError(
                "the input config has no integer num_hidden_layers; is it a DeepSeek-V3 config.json?"
            )
        if not 1 <= num_layers <= total:
            raise DataError(f"--num-layers must be between 1 and {total}, got {num_layers}")
        out["num_hidden_layers"] = num_layers
    return out


def changes(before: dict, after: dict) -> list[str]:
    """One line per top-level key that differs: '-' removed, '+' added, '~' changed."""
    lines = []
    for key in list(before) + [k for k in after if k not in before]:
        old, new = before.get(key, _ABSENT), after.get(key, _ABSENT)
        if old == new:
            continue
        if new is _ABSENT:
            lines.append(f"- {key}: {json.dumps(old)}")
        elif old is _ABSENT:
            lines.append(f"+ {key}: {json.dumps(new)}")
        else:
            lines.append(f"~ {key}: {json.dumps(old)} -> {json.dumps(new)}")
    return lines


def _config_path(path: str | Path) -> Path:
    folder = Path(path).is_dir() or str(path).endswith(("/", os.sep))
    return Path(path) / "config.json" if folder else Path(path)


def derive_file(
    input_path: str | Path,
    output_path: str | Path,
    *,
    num_layers: int | None = None,
    dry_run: bool = False,
    log: Callable[[str], None] = print,
) -> dict:
    """Read input_path (a config.json or the model folder), write the derived config to output_path."""
    src, dst = _config_path(input_path), _config_path(output_path)
    if not src.is_file():
        raise DataError(f"{src} does not exist; download the DeepSeek-V3 config.json first")
    if dst.resolve() == src.resolve():
        raise DataError(
            f"output {dst} is the input; write the derived config somewhere else (e.g. the BF16 model folder)"
        )
    config = load_json(src, "a model config.json")
    if not isinstance(config, dict):
        raise DataError(f"{src} holds a JSON {type(config).__name__}, not a model config")

    derived = derive(config, num_layers)
    diff = changes(config, derived)
    for line in diff or ["(no change: the input is already in the recipe's form)"]:
        log(line)
    if config.get("first_k_dense_replace", 0) >= derived.get("num_hidden_layers", 0):
        log(
            f"note: all {derived['num_hidden_layers']} layers are dense (first_k_dense_replace={config['first_k_dense_replace']})"
        )
    if dry_run:
        log(f"dry run: would write {dst}")
        return derived
    write_json_atomic(dst, derived)
    log(f"wrote {dst}")
    return derived


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Derive the DeepSeek-R1 recipe's config.json (BF16, no FP8 quantisation, no MTP) from the "
        "downloaded DeepSeek-V3/R1 config.json.",
    )
    parser.add_argument(
        "--input", required=True, type=Path, help="the downloaded config.json, or its model folder"
    )
    parser.add_argument(
        "--output", required=True, help="where to write the derived config.json (a file or a folder)"
    )
    parser.add_argument(
        "--num-layers", type=int, default=None, help="keep only this many layers (random-init variant)"
    )
    parser.add_argument("--dry-run", action="store_true", help="print the changes, write nothing")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    derive_file(args.input, args.output, num_layers=args.num_layers, dry_run=args.dry_run)
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
