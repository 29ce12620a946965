"""Files written whole or not at all: a temporary file in the same directory, renamed into place
(`os.replace`, atomic on POSIX and Windows), so a kill at any moment leaves the old file or the
new one, never a torn one. Every file the library and the CLI write goes through `write_atomic`
(reports, JSON, PNG, training checkpoints and summaries, embeddings)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO


def write_atomic(path: str | Path, write: Callable[[BinaryIO], object]) -> None:
    """Write through `write(file)` into a temporary file beside `path`, flush it to disk, then
    rename it into place. On any failure the temporary file is removed and the old `path` (if
    any) is left as it was; OSError propagates."""
    path = Path(path)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(temp, 0o666 & ~_umask())  # mkstemp makes it 0600; a new file's usual mode
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def write_text_atomic(path: str | Path, text: str) -> None:
    write_atomic(path, lambda f: f.write(text.encode("utf-8")))


def save_figure(fig: Any, target: str | Path | BinaryIO, **savefig: Any) -> None:
    """A matplotlib figure into `target`: a path is written atomically (the format from its
    suffix unless given); an open file (the CLI's own atomic writer) directly."""
    if not isinstance(target, (str, Path)):
        fig.savefig(target, **savefig)
        return
    fmt = savefig.pop("format", None) or Path(target).suffix.lstrip(".") or "png"
    write_atomic(target, lambda f: fig.savefig(f, format=fmt, **savefig))


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
