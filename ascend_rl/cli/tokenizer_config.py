"""The tokenizer_config command (ascend_rl.data.tokenizer_config): install the Qwen2.5 recipe's tokenizer_config.json into a downloaded model folder, or take it back out."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ascend_rl.data.tokenizer_config import DEFAULT_CONFIG, install, restore
from ascend_rl.data.util import run_cli


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Install the Qwen2.5 recipe's tokenizer_config.json into a model folder, keeping the "
        "original as tokenizer_config.json.orig.",
    )
    parser.add_argument("model_dir", type=Path, help="the downloaded model folder (holds config.json)")
    parser.add_argument(
        "--config",
        type=Path,
        default=DEFAULT_CONFIG,
        help="tokenizer config to install (default: the recipe's)",
    )
    parser.add_argument("--restore", action="store_true", help="put the original tokenizer files back")
    parser.add_argument("--force", action="store_true", help="install even if the model is not a qwen2 model")
    parser.add_argument("--dry-run", action="store_true", help="say what would change, change nothing")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.restore:
        restore(args.model_dir, dry_run=args.dry_run)
    else:
        install(args.model_dir, args.config, dry_run=args.dry_run, force=args.force)
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
