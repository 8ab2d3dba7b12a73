#!/usr/bin/env python3
"""Turn MATH-500 into the recipe's test parquet, offline, for ascend_rl/evaluate.py.

MATH-500 is the 500-problem subset of the MATH test split that the recipe's results table is read on
(the file HuggingFaceH4/MATH-500 publishes as test.jsonl: problem, solution, answer, subject, level,
unique_id). Two ways:

  --math500 test.jsonl                        its rows as they are (ground truth: its `answer`)
  --math500 test.jsonl --match-in <MATH test> the same 500 problems taken from a MATH test split you
                                              already have (MATH-lighteval's test parquet, or a folder
                                              holding it), matched by problem text; ground truth: the last
                                              \\boxed{} of that split's solution, as prepare_math.py takes it.
                                              Problems not found in the split are counted and named.

The rows keep level, subject and unique_id in extra_info, so evaluate.py breaks accuracy down by them.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ascend_rl.data.prepare_math import read_columns
from ascend_rl.data.util import (
    MATH_INSTRUCTION,
    DataError,
    add_prompt_options,
    last_boxed,
    make_row,
    prompt_settings,
    run_cli,
    write_or_report,
)

DATA_SOURCE = "HuggingFaceH4/MATH-500"
MATH500_FIELDS = ("problem", "unique_id")


@dataclass
class Stats:
    """What convert() did."""

    subset: int = 0
    written: int = 0
    unmatched: list[str] = field(default_factory=list)
    no_answer: list[str] = field(default_factory=list)
    output: Path | None = None


def normalise(problem: str) -> str:
    """Problem text compared across copies of MATH: whitespace runs collapsed, ends stripped."""
    return re.sub(r"\s+", " ", problem).strip()


def level_name(level) -> str | None:
    """MATH-500's level (an int) written as MATH-lighteval writes it ("Level 3")."""
    if level is None or level == "":
        return None
    text = str(level).strip()
    return text if text.lower().startswith("level") else f"Level {text}"


def read_math500(path: Path) -> list[dict]:
    """The rows of MATH-500's test.jsonl (or a parquet/JSON copy of it), or DataError."""
    if not path.is_file():
        raise DataError(
            f"{path} does not exist; download MATH-500's test.jsonl once (HuggingFaceH4/MATH-500)"
        )
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        rows = pq.read_table(path).to_pylist()
    else:
        text = path.read_text(encoding="utf-8")
        try:
            rows = (
                json.loads(text)
                if text.lstrip().startswith("[")
                else [json.loads(x) for x in text.splitlines() if x.strip()]
            )
        except json.JSONDecodeError as exc:
            raise DataError(
                f"{path} is not JSON Lines ({exc.msg} at line {exc.lineno}); is it MATH-500's test.jsonl?"
            ) from exc
    if not rows or not all(isinstance(r, dict) for r in rows):
        raise DataError(f"{path} holds no MATH-500 rows (one JSON object per line)")
    missing = [f for f in MATH500_FIELDS if f not in rows[0]]
    if missing:
        raise DataError(
            f"{path} rows lack {', '.join(missing)} (have {', '.join(rows[0])}); is it MATH-500's test.jsonl?"
        )
    return rows


def split_files(source: Path) -> list[Path]:
    """The MATH test split's parquet files: source itself, or test*.parquet in it or in its data/."""
    if source.is_file():
        return [source]
    for base in (source, source / "data"):
        found = sorted(base.glob("test*.parquet"))
        if found:
            return found
    raise DataError(
        f"no test*.parquet in {source} or {source / 'data'}; pass the MATH test split (e.g. MATH-lighteval)"
    )


def convert(
    math500: str | Path,
    output: str | Path,
    *,
    match_in: str | Path | None = None,
    instruction: str = MATH_INSTRUCTION,
    system_prompt: str | None = None,
    data_source: str = DATA_SOURCE,
    dry_run: bool = False,
    log: Callable[[str], None] = print,
) -> Stats:
    """Write MATH-500 (its own rows, or the same problems from match_in's split) as one parquet."""
    subset = read_math500(Path(math500))
    stats = Stats(subset=len(subset), output=Path(output))
    split: dict[str, dict] = {}
    if match_in is not None:
        for path in split_files(Path(match_in)):
            cols = read_columns(path, ("problem", "solution"))
            have = read_columns(path, ("level", "type")) if _has(path, ("level", "type")) else {}
            for i, (problem, solution) in enumerate(zip(cols["problem"], cols["solution"], strict=True)):
                entry = {"solution": solution, "level": None, "type": None}
                if have:
                    entry.update(level=have["level"][i], type=have["type"][i])
                split.setdefault(normalise(str(problem or "")), entry)
        log(f"read {len(split)} problems of the MATH test split in {match_in}")
    rows = []
    for i, item in enumerate(subset):
        uid = str(item.get("unique_id"))
        problem = str(item["problem"])
        level, subject = level_name(item.get("level")), item.get("subject")
        if match_in is not None:
            found = split.get(normalise(problem))
            if found is None:
                stats.unmatched.append(uid)
                continue
            truth = last_boxed(found["solution"])
            level = found["level"] or level
            subject = found["type"] or subject
        else:
            truth = item.get("answer") or last_boxed(item.get("solution"))
        if not truth:
            stats.no_answer.append(uid)
            continue
        rows.append(
            make_row(
                data_source=data_source,
                problem=problem,
                ground_truth=str(truth),
                split="test",
                index=i,
                instruction=instruction,
                system_prompt=system_prompt,
                level=level,
                subject=str(subject) if subject is not None else None,
                unique_id=uid,
            )
        )
    stats.written = len(rows)
    if stats.unmatched:
        shown = ", ".join(stats.unmatched[:5]) + (" ..." if len(stats.unmatched) > 5 else "")
        log(f"{len(stats.unmatched)} of {stats.subset} MATH-500 problems not found in {match_in}: {shown}")
    if stats.no_answer:
        log(f"{len(stats.no_answer)} problems skipped without an answer: {', '.join(stats.no_answer[:5])}")
    if not rows:
        raise DataError(
            f"no MATH-500 problem could be written (matched 0 of {stats.subset}); nothing written"
        )
    log(f"MATH-500: {stats.subset} problems, {stats.written} written, {len(stats.unmatched)} unmatched")
    write_or_report({Path(output): rows}, dry_run, log)
    return stats


def _has(path: Path, columns: tuple[str, ...]) -> bool:
    import pyarrow.parquet as pq

    return all(c in pq.read_schema(path).names for c in columns)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Turn MATH-500 into the recipe's test parquet (offline), for ascend_rl/evaluate.py.",
        epilog="python3 -m llm_rl.qwen2_5.prepare_math500 --math500 ~/datasets/MATH-500/test.jsonl "
        "--output llm_rl/qwen2_5/data/math500/test.parquet",
    )
    parser.add_argument(
        "--math500", required=True, type=Path, help="MATH-500's test.jsonl (the 500 unique_ids)"
    )
    parser.add_argument(
        "--match-in",
        type=Path,
        help="a MATH test split (parquet file or folder) to take the 500 problems from",
    )
    parser.add_argument(
        "--output", required=True, type=Path, help="the parquet to write (e.g. .../math500/test.parquet)"
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
        args.math500,
        args.output,
        match_in=args.match_in,
        **prompt_settings(args),
    )
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
