"""Argument parsing shared by the commands: a parser whose mistakes become `UsageError`, and
argument types that check numbers as they are read."""

from __future__ import annotations

import argparse
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
