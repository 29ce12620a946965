"""C sources compiled once per machine and loaded with ctypes (the quantized kernels, the
row-interval attention kernel).

Each source is compiled by the system C compiler (`$CC`, default `cc`) with `-march=native`,
so the compiler picks the widest vector path the machine has, and the shared object is cached
under ~/.cache/multihead (or $XDG_CACHE_HOME/multihead) by a hash of the source, the flags, the
machine type and the host name: a change of any of them builds a new one. Where nothing can be
built (no compiler, not Linux, MULTIHEAD_NO_KERNELS=1) `load` gives None and callers take
their torch path.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import subprocess
import tempfile
from pathlib import Path


def cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "multihead"


def load(name: str, source: str, flags: tuple[str, ...]) -> ctypes.CDLL | None:
    """The shared object of `source` built with `flags` (cached as `name`_<hash>.so), or None
    where it cannot be built or loaded."""
    if os.environ.get("MULTIHEAD_NO_KERNELS") == "1" or platform.system() != "Linux":
        return None
    key = hashlib.sha256(
        (source + " ".join(flags) + platform.machine() + platform.node()).encode()
    ).hexdigest()[:16]
    target = cache_dir() / f"{name}_{key}.so"
    try:
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory() as tmp:
                src = Path(tmp) / "k.c"
                src.write_text(source)
                out = Path(tmp) / "k.so"
                subprocess.run(
                    [os.environ.get("CC", "cc"), *flags, str(src), "-o", str(out)],
                    check=True,
                    capture_output=True,
                    timeout=120,
                )
                os.replace(out, target)  # atomic: a concurrent process sees all or nothing
        return ctypes.CDLL(str(target))
    except (OSError, subprocess.SubprocessError):
        return None
