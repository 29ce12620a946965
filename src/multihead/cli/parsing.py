"""Argument parsing shared by the commands: a parser whose mistakes become `UsageError`, and
argument types that check numbers as they are read."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import NoReturn

from .errors import UsageError


class Parser(argparse.ArgumentParser):
    """argparse, but a mistake raises `UsageError` (one line, exit code 2) instead of printing
    the usage block and exiting."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see: {self.prog} --help)")


def int_at_least(low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            what = "a positive integer" if low == 1 else f"an integer >= {low}"
            raise argparse.ArgumentTypeError(f"expected {what}, got {value}")
        return value

    parse.__name__ = "integer"  # how argparse names the type in its own messages
    return parse


positive_int = int_at_least(1)
non_negative_int = int_at_least(0)


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity where the OS tells it, else all)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # (not on macOS / Windows)
        return os.cpu_count() or 1


def thread_count(text: str) -> int:
    """--threads: 1 .. the usable CPUs. More gains nothing on one process, and far more
    crashes torch (`torch.set_num_threads(99999)` ends the process with a segfault)."""
    value = positive_int(text)
    cpus = usable_cpus()
    if value > cpus:
        raise argparse.ArgumentTypeError(f"expected at most {cpus} (the CPUs here), got {value}")
    return value


thread_count.__name__ = "integer"
