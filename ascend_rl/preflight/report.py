"""The preflight's report: a Check is one line of it, PreflightError a check that stops the launch.

MACHINE_CHECKS are those a dry run reports as warnings; the helpers put an error on one line."""

from __future__ import annotations

import types
from dataclasses import dataclass
from pathlib import Path

# Checks that need the real machine's files or devices: a dry run reports them as warnings. "memory" (the per-die
# plan, ascend_rl/memory_plan.py) is one: a dry run shows the plan of a launch the die cannot hold, a launch stops.
MACHINE_CHECKS = ("reward", "model", "data", "npu", "cpu", "logger", "validate", "memory")


class PreflightError(Exception):
    """A check failed; the message is one line: what is wrong and what to do."""


@dataclass
class Check:
    """One line of the report."""

    name: str
    status: str  # ok | FAIL | warn | skipped
    detail: str


def dry_run_view(checks: list[Check]) -> list[Check]:
    """The checks as a dry run reports them: a failed machine check (MACHINE_CHECKS: what another machine may have)
    becomes a warning; every other failure still fails the dry run."""
    for c in checks:
        if c.status == "FAIL" and c.name in MACHINE_CHECKS:
            c.status, c.detail = "warn", f"{c.detail} (ignored in dry run)"
    return checks


def one_line(text: str) -> str:
    """An error's text on one line: its lines joined with "; ", their closing full stops dropped."""
    return "; ".join(part.strip().rstrip(".") for part in str(text).splitlines() if part.strip())


def as_list(value) -> list[str]:
    """A config value that is one path or several (data.train_files), as a list of strings."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value]


def load_file(path: Path, name: str):
    """Run a Python file as module `name` without writing its bytecode next to it (a dry run writes nothing)."""
    module = types.ModuleType(name)
    module.__file__ = str(path)
    exec(compile(path.read_bytes(), str(path), "exec"), module.__dict__)
    return module
