"""One error style for every command: a `UsageError` names the argument and what is wrong with
it; `main` prints it as one line, `multihead: error: ...`, on stderr and exits with code 2.
Anything else that goes wrong is a bug and keeps its traceback."""

from __future__ import annotations

import sys

EXIT_USAGE = 2


class UsageError(Exception):
    """A mistake in how a command was called (an argument, a file, a model directory)."""


def print_error(error: UsageError) -> int:
    """Print `error` as one line on stderr; the exit code to return."""
    message = " ".join(str(error).split())  # one line, whatever the message held
    if sys.stderr.isatty():
        print("\r\033[K", end="", file=sys.stderr)  # clear a progress status line
    print(f"multihead: error: {message}", file=sys.stderr)
    return EXIT_USAGE
