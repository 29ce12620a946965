"""Text inputs: files, stdin and TEXT arguments read as UTF-8 text, one text per line, with a
clear error for a binary or undecodable input, a missing file, or no text at all.

Every reader is bounded before it reads: at most `input_limit()` bytes (64 MiB by default; the
environment variable MULTIHEAD_MAX_INPUT_BYTES overrides it), read in chunks, so /dev/zero, an
endless pipe or a 50 GB file is one error at once instead of filling memory.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from typing import BinaryIO, TextIO

from .errors import UsageError

LIMIT_VARIABLE = "MULTIHEAD_MAX_INPUT_BYTES"
DEFAULT_LIMIT = 64 * 2**20  # 64 MiB: millions of sentences, far more than a command can use
CHUNK = 65536


def input_limit() -> int:
    """The most bytes one text input may hold."""
    raw = os.environ.get(LIMIT_VARIABLE)
    if raw is None:
        return DEFAULT_LIMIT
    try:
        limit = int(raw)
    except ValueError:
        limit = 0
    if limit < 1:
        raise UsageError(f"{LIMIT_VARIABLE} must be a positive number of bytes, got {raw!r}")
    return limit


def _too_large(what: str, limit: int) -> UsageError:
    return UsageError(
        f"{what} is larger than the {limit}-byte limit; give a smaller input, or raise the "
        f"limit with the environment variable {LIMIT_VARIABLE}"
    )


def _not_utf8(what: str, data: bytes, error: UnicodeDecodeError) -> UsageError:
    line = data[: error.start].count(b"\n") + 1
    return UsageError(
        f"{what} is not UTF-8 text: byte 0x{data[error.start]:02x} on line {line} cannot be "
        f"decoded; convert it (e.g. iconv -t utf-8) or give a text file"
    )


def _binary(what: str) -> UsageError:
    return UsageError(f"{what} looks like a binary file (it holds NUL bytes); give UTF-8 text")


def _read_bounded(stream: BinaryIO, what: str) -> bytes:
    """At most the limit's bytes of `stream`, in chunks; NUL bytes in the first chunk (a binary
    file, /dev/zero) stop it at once."""
    limit = input_limit()
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = stream.read(min(CHUNK, limit + 1 - size))
        if not chunk:
            break
        if size == 0 and b"\x00" in chunk:
            raise _binary(what)
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            raise _too_large(what, limit)
    return b"".join(chunks)


def _decode(data: bytes, what: str) -> str:
    if b"\x00" in data[:CHUNK]:
        raise _binary(what)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise _not_utf8(what, data, e) from None


def read_text_file(path: Path, option: str) -> str:
    what = f"{option} {str(path)!r}"
    if path.is_dir():
        raise UsageError(f"{what} is a directory; give a text file")
    try:
        fifo = stat.S_ISFIFO(path.stat().st_mode)
        # open(2) of a named pipe waits for a writer, forever if none comes: opened without
        # waiting, then read as usual (a pipe with no writer reads as empty at once)
        fd = os.open(path, os.O_RDONLY | (os.O_NONBLOCK if fifo else 0))
        if fifo:
            os.set_blocking(fd, True)
        with open(fd, "rb") as f:
            data = _read_bounded(f, what)
    except FileNotFoundError:
        raise UsageError(f"{what}: no such file") from None
    except OSError as e:
        raise UsageError(f"{what}: cannot read it ({e.strerror})") from None
    if fifo and not data:
        raise UsageError(f"{what} is a named pipe and nothing was written to it (no writer)")
    return _decode(data, what)


def read_stdin(stream: TextIO | None = None) -> str:
    stream = stream or sys.stdin
    buffer = getattr(stream, "buffer", None)
    if buffer is None:  # a text stream without bytes (tests pass io.StringIO)
        limit = input_limit()
        text = stream.read(limit + 1)
        if len(text.encode("utf-8", "surrogatepass")) > limit:
            raise _too_large("stdin", limit)
        return text
    return _decode(_read_bounded(buffer, "stdin"), "stdin")


def check_text_argument(text: str, what: str) -> str:
    """A command-line text as given; UsageError (the file readers' words) when it is not UTF-8.
    Python hands undecodable argv bytes over as lone surrogates (surrogateescape)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        try:
            data = text.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError as e:  # a surrogate no argv byte becomes (main(argv) callers)
            raise UsageError(
                f"{what} holds {text[e.start]!r} at index {e.start}, a lone surrogate, not text"
            ) from None
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise _not_utf8(what, data, e) from None
        raise UsageError(f"{what} holds characters that are not valid text") from None
    return text


def lines_of(text: str) -> list[str]:
    """The non-blank lines, as they are (one text per line)."""
    return [line for line in text.splitlines() if line.strip()]
