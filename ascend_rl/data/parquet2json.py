"""Write OpenCompass's MATH `math.json` from MATH-lighteval parquet files (problem, level, type, solution).

The output is one JSON object keyed `<type>_<n>` (n counts from 1 within each type, in file order), each
value {problem, level, type, solution}: the layout OpenCompass's MATHDataset reads for `math_gen_*`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ascend_rl.data.prepare_math import read_columns
from ascend_rl.data.util import DataError, write_json_atomic

COLUMNS = ("problem", "level", "type", "solution")


@dataclass
class JsonStats:
    """What to_math_json() did."""

    rows: int = 0
    per_type: dict[str, int] = field(default_factory=dict)
    # OpenCompass takes the reference from the last "\boxed{...}" of the solution; these rows have none.
    no_boxed_reference: int = 0


def to_math_json(
    inputs: Sequence[str | Path],
    output: str | Path,
    *,
    dry_run: bool = False,
    log: Callable[[str], None] = print,
) -> JsonStats:
    """Convert the parquet files to one OpenCompass math.json at output."""
    output = Path(output)
    paths = [Path(p) for p in inputs]
    if not paths:
        raise DataError("no input parquet file given; pass e.g. data/test-00000-of-00001.parquet")
    for path in paths:
        if path.is_dir():
            raise DataError(
                f"{path} is a directory; pass the parquet file(s), e.g. {path}/test-00000-of-00001.parquet"
            )
        if not path.is_file():
            raise DataError(f"{path} does not exist; download MATH-lighteval or fix the path")
        if path.resolve() == output.resolve():
            raise DataError(f"output {output} is also an input; choose another --output")

    stats = JsonStats()
    result: dict[str, dict] = {}
    for path in paths:
        cols = read_columns(path, COLUMNS)
        log(f"read {path}: {len(cols['problem'])} rows")
        for problem, level, kind, solution in zip(*(cols[c] for c in COLUMNS), strict=True):
            kind = str(kind)
            n = stats.per_type.get(kind, 0) + 1
            stats.per_type[kind] = n
            result[f"{kind}_{n}"] = {"problem": problem, "level": level, "type": kind, "solution": solution}
            stats.rows += 1
            if "\\boxed{" not in (solution or ""):
                stats.no_boxed_reference += 1

    types = ", ".join(f"{k} {v}" for k, v in sorted(stats.per_type.items()))
    log(f"{stats.rows} problems ({types}); {stats.no_boxed_reference} without a \\boxed{{}} reference")
    if dry_run:
        log(f"dry run: would write {output}")
        return stats
    write_json_atomic(output, result, ensure_ascii=False)
    log(f"wrote {output}")
    return stats
