#!/usr/bin/env python3
"""Turn DeepScaleR's deepscaler.json into verl's train.parquet and test.parquet, offline.

Input: the `deepscaler.json` of agentica-org/DeepScaleR-Preview-Dataset, a JSON list of objects with
problem, answer and solution. The ground truth is `answer`; rows without a problem or an answer are
skipped and counted. The test split is drawn with a fixed seed, so reruns give the same files.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ascend_rl.data.util import (
    FORMAT_SYSTEM_PROMPT,
    MATH_INSTRUCTION,
    DataError,
    add_prompt_options,
    last_boxed,
    load_json,
    make_row,
    prompt_settings,
    run_cli,
    write_or_report,
)

# Not a key of verl's default_compute_score: the recipe scores it with its custom MATH reward
# (custom_reward_function.path), which ignores data_source.
DATA_SOURCE = "agentica-org/DeepScaleR-Preview-Dataset"
REQUIRED_KEYS = ("problem", "answer")


@dataclass
class DeepScaleRStats:
    """What convert() did."""

    rows: int = 0
    skipped_no_problem: int = 0
    skipped_no_answer: int = 0
    train: int = 0
    test: int = 0
    outputs: dict[str, Path] = field(default_factory=dict)


def load_records(path: Path) -> list:
    """The JSON list in path, or DataError saying why it cannot be used."""
    if not path.is_file():
        raise DataError(
            f"{path} does not exist; download deepscaler.json from agentica-org/DeepScaleR-Preview-Dataset"
        )
    data = load_json(path, "deepscaler.json")
    if not isinstance(data, list):
        raise DataError(
            f"{path} holds a JSON {type(data).__name__}, not a list of problems; is it deepscaler.json?"
        )
    if not data:
        raise DataError(f"{path} holds an empty list; nothing to convert")
    if not any(isinstance(r, dict) and all(k in r for k in REQUIRED_KEYS) for r in data[:100]):
        raise DataError(
            f"{path}: no object with keys {', '.join(REQUIRED_KEYS)} in its first 100 entries; is it deepscaler.json?"
        )
    return data


def n_test_rows(total: int, test_size: float) -> int:
    """How many rows go to the test split: a fraction of total when below 1, else a row count."""
    if not math.isfinite(test_size) or test_size <= 0:
        raise DataError(f"--test-size must be a positive number, got {test_size}")
    if test_size >= 1 and test_size != int(test_size):
        raise DataError(f"--test-size {test_size} is neither a fraction below 1 nor a whole row count")
    n = max(round(total * test_size), 1) if test_size < 1 else int(test_size)
    if n >= total:
        raise DataError(
            f"--test-size {test_size} leaves no training rows out of {total}; choose a smaller one"
        )
    return n


def _text(value) -> str | None:
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        value = str(value)
    if not isinstance(value, str) or not value.strip():
        return None
    return value.strip()


def convert(
    json_path: str | Path,
    output_dir: str | Path,
    *,
    test_size: float = 0.1,
    seed: int = 42,
    instruction: str = MATH_INSTRUCTION,
    system_prompt: str | None = FORMAT_SYSTEM_PROMPT,
    data_source: str = DATA_SOURCE,
    dry_run: bool = False,
    log: Callable[[str], None] = print,
) -> DeepScaleRStats:
    """Convert deepscaler.json into output_dir/{train,test}.parquet."""
    json_path, output_dir = Path(json_path), Path(output_dir)
    records = load_records(json_path)
    stats = DeepScaleRStats(rows=len(records))
    log(f"read {json_path}: {len(records)} entries")

    kept: list[tuple[int, str, str]] = []
    for index, rec in enumerate(records):
        rec = rec if isinstance(rec, dict) else {}
        problem = _text(rec.get("problem"))
        answer = _text(rec.get("answer"))
        if problem is None:
            stats.skipped_no_problem += 1
            continue
        if answer is None:
            stats.skipped_no_answer += 1
            continue
        # An answer written as \boxed{x} becomes x: the reward compares against the bare answer.
        answer = last_boxed(answer) or answer
        kept.append((index, problem, answer))
    if len(kept) < 2:
        raise DataError(
            f"only {len(kept)} usable entries in {json_path}; need at least 2 for a train/test split"
        )

    n_test = n_test_rows(len(kept), test_size)
    order = list(range(len(kept)))
    random.Random(seed).shuffle(order)
    test_ids = set(order[:n_test])

    tables: dict[Path, list[dict]] = {output_dir / "train.parquet": [], output_dir / "test.parquet": []}
    for pos, (index, problem, answer) in enumerate(kept):
        split = "test" if pos in test_ids else "train"
        tables[output_dir / f"{split}.parquet"].append(
            make_row(
                data_source=data_source,
                problem=problem,
                ground_truth=answer,
                split=split,
                index=index,
                instruction=instruction,
                system_prompt=system_prompt,
            )
        )
    stats.train = len(tables[output_dir / "train.parquet"])
    stats.test = len(tables[output_dir / "test.parquet"])
    stats.outputs = {"train": output_dir / "train.parquet", "test": output_dir / "test.parquet"}
    log(
        f"{stats.rows} entries: {stats.train} train, {stats.test} test (seed {seed}), "
        f"{stats.skipped_no_problem} skipped without a problem, {stats.skipped_no_answer} skipped without an answer"
    )
    write_or_report(tables, dry_run, log)
    return stats


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Convert DeepScaleR's deepscaler.json into verl train.parquet/test.parquet (offline).",
    )
    parser.add_argument("--input", required=True, type=Path, help="path of deepscaler.json")
    parser.add_argument(
        "--output-dir", required=True, type=Path, help="where train.parquet and test.parquet are written"
    )
    parser.add_argument(
        "--test-size",
        type=float,
        default=0.1,
        help="test split: a fraction below 1 or a whole row count (default: %(default)s)",
    )
    parser.add_argument(
        "--seed", type=int, default=42, help="seed of the train/test shuffle (default: %(default)s)"
    )
    add_prompt_options(
        parser,
        data_source=DATA_SOURCE,
        system_prompt_default=True,
        system_prompt_why="DeepSeek-V3's chat template has no default system prompt",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    convert(
        args.input,
        args.output_dir,
        test_size=args.test_size,
        seed=args.seed,
        **prompt_settings(args),
    )
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
