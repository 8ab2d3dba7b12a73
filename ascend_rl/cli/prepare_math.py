"""The prepare_math command (ascend_rl.data.prepare_math): turn local MATH-lighteval parquet files into verl's train.parquet and test.parquet, offline."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ascend_rl.data.prepare_math import DATA_SOURCE, convert
from ascend_rl.data.util import (
    add_prompt_options,
    prompt_settings,
    run_cli,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Convert local MATH-lighteval parquet files into verl train.parquet/test.parquet (offline).",
    )
    parser.add_argument(
        "--input-dir",
        required=True,
        type=Path,
        help="folder with train-*.parquet and test-*.parquet (or data/ below it)",
    )
    parser.add_argument(
        "--output-dir", required=True, type=Path, help="where train.parquet and test.parquet are written"
    )
    add_prompt_options(
        parser,
        data_source=DATA_SOURCE,
        system_prompt_default=False,
        system_prompt_why="the Qwen recipe's chat template supplies it",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    convert(
        args.input_dir,
        args.output_dir,
        **prompt_settings(args),
    )
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
