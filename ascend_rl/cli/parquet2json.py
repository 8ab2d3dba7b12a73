"""The parquet2json command (ascend_rl.data.parquet2json): write OpenCompass's MATH `math.json` from MATH-lighteval parquet files (problem, level, type, solution)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ascend_rl.data.parquet2json import to_math_json
from ascend_rl.data.util import run_cli


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="MATH-lighteval parquet file(s) -> OpenCompass's math.json (keys <type>_<n>)",
    )
    parser.add_argument(
        "--input",
        required=True,
        nargs="+",
        type=Path,
        help="parquet file(s) with problem, level, type, solution",
    )
    parser.add_argument("--output", required=True, type=Path, help="the math.json to write")
    parser.add_argument("--dry-run", action="store_true", help="read and count, write nothing")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    to_math_json(args.input, args.output, dry_run=args.dry_run)
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
