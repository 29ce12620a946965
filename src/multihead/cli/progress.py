"""Progress on stderr, only when stderr is a terminal: a status line for a step of unknown
length (loading a model), tqdm bars for loops. Nothing is printed into pipes or logs."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any, TypeVar

T = TypeVar("T")


class Progress:
    def __init__(self, enabled: bool | None = None) -> None:
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self._status = False

    def status(self, text: str) -> None:
        """Show `text` until the next status, bar or `done()`."""
        if self.enabled:
            print(f"\r\033[K{text}", end="", file=sys.stderr, flush=True)
            self._status = True

    def done(self) -> None:
        if self._status:
            print("\r\033[K", end="", file=sys.stderr, flush=True)
            self._status = False

    def loop(self, items: Iterable[T], desc: str, total: int) -> Iterable[T]:
        """`items` with a bar (vanishing when the loop ends)."""
        if not self.enabled:
            return items
        self.done()
        from tqdm import tqdm

        return tqdm(items, desc=desc, total=total, leave=False, file=sys.stderr)

    def __call__(self, items: Iterable[Any], desc: str, total: int) -> Iterable[Any]:
        return self.loop(items, desc, total)
