"""The exit statuses every command uses, and the overlay's refusals: each carries its status and a one-line message
saying what to do."""

from __future__ import annotations

# One set for every command: 0 done; 1 refused, a check failed or problems were found; 2 a usage mistake.
EXIT_OK, EXIT_REFUSED, EXIT_USAGE = 0, 1, 2


class OverlayError(Exception):
    """A refusal with a one-line message saying what is wrong and what to do."""

    exit_code = EXIT_REFUSED


class UsageError(OverlayError):
    """The command line names something that does not exist."""

    exit_code = EXIT_USAGE
