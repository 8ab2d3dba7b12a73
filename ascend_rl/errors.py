"""The overlay's refusals: each carries its exit status and a one-line message saying what to do."""

from __future__ import annotations

EXIT_OK, EXIT_REFUSED, EXIT_USAGE = 0, 1, 2


class OverlayError(Exception):
    """A refusal with a one-line message saying what is wrong and what to do."""

    exit_code = EXIT_REFUSED


class UsageError(OverlayError):
    """The command line names something that does not exist."""

    exit_code = EXIT_USAGE
