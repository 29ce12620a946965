"""Output files: the format follows the suffix unless --format says otherwise, the path is
checked for writability before any slow work, and a file is written whole or not at all (a
temporary file beside it, renamed into place)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import BinaryIO

from .. import atomic
from .errors import UsageError


def output_format(
    path: Path | None, fmt: str | None, formats: Sequence[str], *, default: str, option="-o"
) -> str:
    """The format to write: --format if given (the suffix, if any, must agree), else the
    suffix of `path`, else `default` when there is no path."""
    known = ", ".join(f".{f}" for f in formats)
    if fmt is not None and fmt not in formats:
        raise UsageError(f"--format {fmt!r} is not one of {', '.join(formats)}")
    if path is None:
        return fmt or default
    if path.is_dir():
        raise UsageError(f"{option} {str(path)!r} is a directory; give a file name")
    suffix = path.suffix.lower().removeprefix(".")
    if fmt is None:
        if suffix in formats:
            return suffix
        if not suffix:
            raise UsageError(
                f"{option} {str(path)!r} has no suffix to tell the format; end it in {known} "
                f"or give --format"
            )
        raise UsageError(
            f"{option} {str(path)!r}: unknown suffix .{suffix}; use {known} or give --format"
        )
    if suffix and suffix != fmt:
        raise UsageError(
            f"{option} {str(path)!r} ends in .{suffix} but --format is {fmt}; "
            f"name it {path.stem}.{fmt} or drop one of them"
        )
    return fmt


def check_writable(path: Path, option: str = "-o") -> Path:
    """Fail now, before the slow work, if `path` cannot be written: its directory must exist and
    take a new file (tried for real: permission bits say little to root or on /proc)."""
    name = str(path)
    if path.is_dir():
        raise UsageError(f"{option} {name!r} is a directory; give a file name")
    directory = path.parent
    if not directory.exists():
        raise UsageError(f"{option} {name!r}: directory {str(directory)!r} does not exist")
    if not directory.is_dir():
        raise UsageError(f"{option} {name!r}: {str(directory)!r} is not a directory")
    if path.exists() and not os.access(path, os.W_OK):
        raise UsageError(f"{option} {name!r}: the file exists and is read-only")
    try:
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".multihead-", delete=True):
            pass
    except OSError as e:
        raise UsageError(f"{option} {name!r}: cannot write there ({e.strerror})") from None
    return path


def write_atomic(path: Path, write: Callable[[BinaryIO], object], option: str = "-o") -> None:
    """`multihead.atomic.write_atomic`, its OSError as one usage error naming the option."""
    try:
        atomic.write_atomic(path, write)
    except OSError as e:
        raise UsageError(f"{option} {str(path)!r}: writing failed ({e.strerror or e})") from None
