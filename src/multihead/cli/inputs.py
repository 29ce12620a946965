"""Text inputs: files and stdin read as UTF-8 text, one text per line, with a clear error for a
binary or undecodable file, a missing file, or no text at all."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

from .errors import UsageError


def _decode(data: bytes, what: str) -> str:
    if b"\x00" in data[:65536]:
        raise UsageError(f"{what} looks like a binary file (it holds NUL bytes); give UTF-8 text")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise UsageError(
            f"{what} is not UTF-8 text: byte 0x{data[e.start]:02x} on line {line} cannot be "
            f"decoded; convert it (e.g. iconv -t utf-8) or give a text file"
        ) from None


def read_text_file(path: Path, option: str) -> str:
    what = f"{option} {str(path)!r}"
    if path.is_dir():
        raise UsageError(f"{what} is a directory; give a text file")
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise UsageError(f"{what}: no such file") from None
    except OSError as e:
        raise UsageError(f"{what}: cannot read it ({e.strerror})") from None
    return _decode(data, what)


def read_stdin(stream: TextIO | None = None) -> str:
    stream = stream or sys.stdin
    buffer = getattr(stream, "buffer", None)
    if buffer is None:  # a text stream without bytes (tests pass io.StringIO)
        return stream.read()
    return _decode(buffer.read(), "stdin")


def lines_of(text: str) -> list[str]:
    """The non-blank lines, as they are (one text per line)."""
    return [line for line in text.splitlines() if line.strip()]
