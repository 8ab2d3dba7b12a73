"""Shared pieces of the data-preparation scripts: answer extraction, verl rows, atomic parquet writes."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

# The recipe's answer format. llm_rl/qwen2_5/tokenizer_config.json renders exactly this text as the
# default system prompt (tests/data/test_chat_template.py holds the two together); the DeepSeek data embeds
# it as an explicit system message because DeepSeek-V3's own chat template has no default one.
FORMAT_SYSTEM_PROMPT = (
    "You are a helpful assistant who solves math problems. Reason step by step, numbering the steps "
    "(Step 1:, Step 2:, ...), then give the final answer. Put the reasoning inside <think> </think> "
    "tags and the final answer inside <answer> </answer> tags, with a newline after each opening tag "
    "and before each closing tag, and write the final answer in \\boxed{}. Write nothing before <think> "
    "or after </answer>. Use exactly this format:\n"
    "<think>\n"
    "Step 1: ...\n"
    "Step 2: ...\n"
    "</think>\n"
    "<answer>\n"
    "\\boxed{...}\n"
    "</answer>"
)

# Appended to every problem; the same wording verl's own MATH example uses, so the user turn reads
# naturally with or without the system prompt above.
MATH_INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."

_BOX_COMMANDS = ("\\boxed", "\\fbox")


class DataError(Exception):
    """A predictable problem with the input, reported to the user as one line."""


def last_boxed(text: str | None) -> str | None:
    """The content of the last well-formed \\boxed{...} / \\fbox{...} / \\boxed x in text, or None."""
    if not text:
        return None
    starts = sorted(
        (i for cmd in _BOX_COMMANDS for i in _find_all(text, cmd) if not _continues_name(text, i + len(cmd))),
        reverse=True,
    )
    for start in starts:
        cmd = next(c for c in _BOX_COMMANDS if text.startswith(c, start))
        content = _box_content(text, start + len(cmd))
        if content:
            return content
    return None


def _find_all(text: str, needle: str) -> Iterable[int]:
    i = text.find(needle)
    while i != -1:
        yield i
        i = text.find(needle, i + 1)


def _continues_name(text: str, i: int) -> bool:
    # "\boxedfoo" is another macro, not \boxed.
    return i < len(text) and text[i].isalpha()


def _box_content(text: str, i: int) -> str | None:
    """Parse the argument that starts at text[i]: a balanced {group} or, after spaces, one bare token."""
    j = i
    while j < len(text) and text[j] in " \t":
        j += 1
    if j < len(text) and text[j] == "{":
        depth = 0
        k = j
        while k < len(text):
            ch = text[k]
            if ch == "\\":
                k += 2  # an escaped character (\{, \}, \\) never opens or closes a group
                continue
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    return text[j + 1 : k].strip() or None
            k += 1
        return None  # unbalanced
    if j == i:
        return None  # "\boxed" followed by neither a group nor a space
    k = j
    while k < len(text) and not text[k].isspace() and text[k] != "$":
        k += 1
    return text[j:k].strip() or None


def build_messages(
    problem: str, instruction: str = MATH_INSTRUCTION, system_prompt: str | None = None
) -> list[dict]:
    """Chat messages for one problem: an optional system message and the user turn."""
    user = f"{problem.strip()}\n\n{instruction}" if instruction else problem.strip()
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    messages.append({"role": "user", "content": user})
    return messages


def make_row(
    *,
    data_source: str,
    problem: str,
    ground_truth: str,
    split: str,
    index: int,
    instruction: str = MATH_INSTRUCTION,
    system_prompt: str | None = None,
    level: str | None = None,
    subject: str | None = None,
    unique_id: str | None = None,
) -> dict:
    """One verl RL row (the schema verl's RLHFDataset and reward manager read); level, subject and
    unique_id (MATH-500's) ride in extra_info for ascend_rl/evaluate.py's breakdown."""
    return {
        "data_source": data_source,
        "prompt": build_messages(problem, instruction, system_prompt),
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": {
            "split": split,
            "index": int(index),
            "level": level,
            "subject": subject,
            "unique_id": unique_id,
        },
    }


def row_schema():
    """The arrow schema of make_row's rows, fixed so every output file has the same column types."""
    import pyarrow as pa

    return pa.schema(
        [
            ("data_source", pa.string()),
            ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
            ("ability", pa.string()),
            ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
            (
                "extra_info",
                pa.struct(
                    [
                        ("split", pa.string()),
                        ("index", pa.int64()),
                        ("level", pa.string()),
                        ("subject", pa.string()),
                        ("unique_id", pa.string()),
                    ]
                ),
            ),
        ]
    )


def file_mode() -> int:
    """The mode a new file gets under the process's umask (0644 under umask 022)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # no /proc: read the umask by setting it, then put it back at once
    os.umask(mask)
    return 0o666 & ~mask


def check_destination(path: Path) -> None:
    """Refuse, before anything is written, an output that is a folder or lies under a file."""
    if path.is_dir():
        raise DataError(f"{path} is a folder, not a file; remove it or choose another output path")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise DataError(f"{parent} is a file, not a folder; choose another output path")
            break


def _temp_beside(path: Path) -> str:
    """A new temporary file next to path, with the mode the umask gives (mkstemp's own is 0600)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, file_mode())
    finally:
        os.close(fd)
    return tmp


def _write_failed(path: Path, exc: OSError) -> DataError:
    why = exc.strerror or type(exc).__name__
    return DataError(f"cannot write {path} ({why}); choose a writable output path; nothing was replaced")


def write_parquet_atomic(tables: Mapping[Path, list[dict]]) -> None:
    """Write each row list to its path; every file is written to a temporary first, then all are renamed."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for path in tables:
        check_destination(path)
    pending: list[tuple[str, Path]] = []
    current = None
    try:
        for path, rows in tables.items():
            current = path
            tmp = _temp_beside(path)
            pending.append((tmp, path))
            pq.write_table(pa.Table.from_pylist(rows, schema=row_schema()), tmp)
        for tmp, path in pending:
            current = path
            os.replace(tmp, path)
    except OSError as exc:
        raise _write_failed(current, exc) from exc
    finally:
        for tmp, _ in pending:
            if os.path.exists(tmp):
                os.unlink(tmp)


def write_json_atomic(path: Path, obj, *, ensure_ascii: bool = True) -> None:
    """Write obj as indented JSON through a temporary file in the same folder, then rename it into place."""
    check_destination(path)
    tmp = None
    try:
        tmp = _temp_beside(path)
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(obj, fh, ensure_ascii=ensure_ascii, indent=2)
            fh.write("\n")
        os.replace(tmp, path)
    except OSError as exc:
        raise _write_failed(path, exc) from exc
    finally:
        if tmp and os.path.exists(tmp):
            os.unlink(tmp)


def load_json(path: Path, what: str):
    """The JSON value in path, or DataError naming why it cannot be read (what: the file's role)."""
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except UnicodeDecodeError as exc:
        raise DataError(f"{path} is not UTF-8 text ({exc.reason}); is it {what}?") from exc
    except json.JSONDecodeError as exc:
        raise DataError(
            f"{path} is not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno}); "
            "the download is damaged or incomplete, fetch it again"
        ) from exc
    except RecursionError as exc:
        raise DataError(f"{path} nests JSON too deeply to read; is it {what}?") from exc
    except OSError as exc:
        raise DataError(f"cannot read {path} ({exc.strerror or type(exc).__name__})") from exc


def add_prompt_options(
    parser, *, data_source: str, system_prompt_default: bool, system_prompt_why: str
) -> None:
    """The prompt and output options both data scripts share: --instruction, --system-prompt, --data-source, --dry-run."""
    parser.add_argument(
        "--instruction",
        default=MATH_INSTRUCTION,
        help="text appended to each problem in the user turn ('' for none; default: %(default)r)",
    )
    parser.add_argument(
        "--system-prompt",
        action=argparse.BooleanOptionalAction,
        default=system_prompt_default,
        help=f"embed the recipe's answer-format instruction as an explicit system message "
        f"(default: {'on' if system_prompt_default else 'off'}, because {system_prompt_why})",
    )
    parser.add_argument(
        "--data-source", default=data_source, help="value of the data_source column (default: %(default)s)"
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="read and convert, print the summary, write nothing"
    )


def prompt_settings(args: argparse.Namespace) -> dict:
    """add_prompt_options' values as the keyword arguments every data script's convert() takes."""
    return {
        "instruction": args.instruction,
        "system_prompt": FORMAT_SYSTEM_PROMPT if args.system_prompt else None,
        "data_source": args.data_source,
        "dry_run": args.dry_run,
    }


def write_or_report(tables: Mapping[Path, list[dict]], dry_run: bool, log) -> None:
    """Write every table atomically, or in a dry run only say what would be written."""
    names = ", ".join(str(p) for p in tables)
    if dry_run:
        log(f"dry run: would write {names}")
    else:
        write_parquet_atomic(tables)
        log(f"wrote {names}")


def run_cli(main_fn, argv: list[str] | None = None) -> int:
    """Run a script's main, turning DataError into one line on stderr and exit status 1."""
    try:
        return main_fn(argv)
    except DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except ModuleNotFoundError as exc:
        print(
            f"error: {sys.executable} has no module {exc.name!r}; run with the Python that has the "
            "repository's requirements (.venv/bin/python after `make setup`, or pip install -r requirements.txt)",
            file=sys.stderr,
        )
        return 1
    except KeyboardInterrupt:
        print("error: interrupted; nothing was replaced", file=sys.stderr)
        return 1
