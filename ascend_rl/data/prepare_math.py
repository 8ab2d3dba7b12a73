"""Turn local MATH-lighteval parquet files into verl's train.parquet and test.parquet, offline.

Input: a directory with train-*.parquet and test-*.parquet (columns problem, level, type, solution),
either directly or under data/ as in `hf download DigitalLearningGmbH/MATH-lighteval --repo-type dataset`.
The ground truth of each row is the last \\boxed{} of its solution; rows without one are skipped and counted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ascend_rl.data.util import (
    MATH_INSTRUCTION,
    DataError,
    last_boxed,
    make_row,
    write_or_report,
)

# default_compute_score in verl 0.6.0 maps this name to its MATH scorer, so the data also scores
# without the recipe's custom reward.
DATA_SOURCE = "DigitalLearningGmbH/MATH-lighteval"
SPLITS = ("train", "test")
REQUIRED_COLUMNS = ("problem", "solution")
# Carried into extra_info (level, subject) when the files have them, for ascend_rl/evaluate.py's breakdown.
OPTIONAL_COLUMNS = ("level", "type")


@dataclass
class SplitStats:
    """Row counts of one split."""

    files: int = 0
    rows: int = 0
    written: int = 0
    no_boxed: int = 0
    empty_problem: int = 0


@dataclass
class Stats:
    """What convert() did, per split."""

    splits: dict[str, SplitStats] = field(default_factory=dict)
    outputs: dict[str, Path] = field(default_factory=dict)


def find_split_files(input_dir: Path) -> tuple[Path, dict[str, list[Path]]]:
    """The directory holding the parquet files and the files of each split."""
    if not input_dir.is_dir():
        raise DataError(
            f"{input_dir} is not a directory; pass the folder the MATH-lighteval parquet files are in"
        )
    for base in (input_dir, input_dir / "data"):
        found = {split: sorted(base.glob(f"{split}*.parquet")) for split in SPLITS}
        if any(found.values()):
            missing = [s for s in SPLITS if not found[s]]
            if missing:
                raise DataError(
                    f"no {missing[0]}*.parquet next to the other split in {base}; download both splits"
                )
            return base, found
    raise DataError(
        f"no train*.parquet / test*.parquet in {input_dir} or {input_dir / 'data'}; "
        "download DigitalLearningGmbH/MATH-lighteval there first"
    )


def _is_text(arrow_type) -> bool:
    import pyarrow as pa

    return (
        pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type) or pa.types.is_null(arrow_type)
    )


def present_columns(path: Path, columns: tuple[str, ...]) -> tuple[str, ...]:
    """Those of columns that path's schema has (an unreadable file is reported by read_columns)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        names = pq.read_schema(path).names
    except (pa.ArrowException, OSError):
        return ()
    return tuple(c for c in columns if c in names)


def read_columns(path: Path, columns: tuple[str, ...]) -> dict[str, list]:
    """The named columns of one parquet file as Python lists, or DataError naming what is wrong."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        schema = pq.read_schema(path)
        missing = [c for c in columns if c not in schema.names]
        if missing:
            raise DataError(
                f"{path} lacks column(s) {', '.join(missing)} (has {', '.join(schema.names)}); "
                "is this the MATH-lighteval dataset?"
            )
        not_text = [
            f"{c} is {schema.field(c).type}"
            for c in columns
            if c in REQUIRED_COLUMNS and not _is_text(schema.field(c).type)
        ]
        if not_text:
            raise DataError(
                f"{path}: column {', '.join(not_text)}, not text; MATH-lighteval's columns are strings, "
                "is this the right file?"
            )
        table = pq.read_table(path, columns=list(columns))
    except (pa.ArrowException, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DataError(
            f"cannot read {path} ({first}); the file is damaged or incomplete, download it again"
        ) from exc
    return {c: table.column(c).to_pylist() for c in columns}


def convert(
    input_dir: str | Path,
    output_dir: str | Path,
    *,
    instruction: str = MATH_INSTRUCTION,
    system_prompt: str | None = None,
    data_source: str = DATA_SOURCE,
    dry_run: bool = False,
    log: Callable[[str], None] = print,
) -> Stats:
    """Convert the MATH-lighteval parquet files in input_dir into output_dir/{train,test}.parquet."""
    input_dir, output_dir = Path(input_dir), Path(output_dir)
    base, files = find_split_files(input_dir)
    if output_dir.resolve() == base.resolve():
        raise DataError(f"output directory {output_dir} holds the input files; choose another --output-dir")

    stats = Stats()
    tables: dict[Path, list[dict]] = {}
    for split in SPLITS:
        st = stats.splits[split] = SplitStats(files=len(files[split]))
        rows: list[dict] = []
        for path in files[split]:
            cols = read_columns(path, REQUIRED_COLUMNS + present_columns(path, OPTIONAL_COLUMNS))
            log(f"read {path}: {len(cols['problem'])} rows")
            n = len(cols["problem"])
            levels, kinds = cols.get("level", [None] * n), cols.get("type", [None] * n)
            for problem, solution, level, kind in zip(
                cols["problem"], cols["solution"], levels, kinds, strict=True
            ):
                index = st.rows
                st.rows += 1
                if not problem or not str(problem).strip():
                    st.empty_problem += 1
                    continue
                answer = last_boxed(solution)
                if answer is None:
                    st.no_boxed += 1
                    continue
                rows.append(
                    make_row(
                        data_source=data_source,
                        problem=str(problem),
                        ground_truth=answer,
                        split=split,
                        index=index,
                        instruction=instruction,
                        system_prompt=system_prompt,
                        level=str(level) if level is not None else None,
                        subject=str(kind) if kind is not None else None,
                    )
                )
        st.written = len(rows)
        if not rows:
            raise DataError(f"no {split} row has a \\boxed{{}} answer in its solution; nothing written")
        out = output_dir / f"{split}.parquet"
        tables[out] = rows
        stats.outputs[split] = out

    for split, st in stats.splits.items():
        log(
            f"{split}: {st.rows} rows, {st.written} kept, {st.no_boxed} skipped without \\boxed{{}}, "
            f"{st.empty_problem} skipped with an empty problem"
        )
    write_or_report(tables, dry_run, log)
    return stats
