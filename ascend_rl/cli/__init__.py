"""The commands' own code: argument parsing, printing and exit codes over the library."""

from __future__ import annotations

import sys


def main() -> int:
    """The `ascend-rl` console command (pyproject's [project.scripts]): `python3 -m ascend_rl` by another name."""
    from ascend_rl.__main__ import main as dispatch

    return dispatch(sys.argv[1:])
