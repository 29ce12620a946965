"""A GGUF tensor's stored bytes through a memory map of just its range, and a guard against
the file changing while it is read.

Each tensor is mapped on its own and unmapped once packed: the file's pages count as resident
memory only while their tensor is in flight (a whole-file map would add the file's size to the
peak). The model keeps no reference to the file afterwards, so a file replaced or rewritten
after loading changes nothing. What is detectable while loading: a change of size or
modification time between opening the file and mapping any tensor (checked before each map)
raises GGUFError naming the file and the tensor; a file truncated *during* one tensor's copy
would fault inside the map (SIGBUS), which no check can catch: copy files before rewriting
them in place.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from contextlib import contextmanager, suppress

import numpy as np

from .reader import GGUFError, GGUFFile, GGUFTensor


def file_stamp(path: os.PathLike | str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns


@contextmanager
def mapped_bytes(
    file: GGUFFile, tensor: GGUFTensor, stamp: tuple[int, int]
) -> Iterator[np.ndarray]:
    """The tensor's bytes as a read-only uint8 array over a map of its range (valid inside the
    `with` only)."""
    try:
        now = file_stamp(file.path)
    except OSError as e:
        raise GGUFError(f"{str(file.path)!r}: cannot read tensor {tensor.name!r}: {e}") from None
    if now != stamp:
        raise GGUFError(
            f"{str(file.path)!r} changed while loading (size or modification time differs "
            f"before tensor {tensor.name!r}, type {tensor.qtype.name}); load it again"
        )
    start = tensor.offset - tensor.offset % mmap.ALLOCATIONGRANULARITY
    length = tensor.offset + tensor.nbytes - start
    if tensor.nbytes == 0:
        yield np.empty(0, dtype=np.uint8)
        return
    with open(file.path, "rb") as f:
        m = mmap.mmap(f.fileno(), length, access=mmap.ACCESS_READ, offset=start)
    view = np.frombuffer(m, dtype=np.uint8, count=tensor.nbytes, offset=tensor.offset - start)
    try:
        yield view
    finally:
        del view
        with suppress(BufferError):  # a caller's view still holds it: unmapped when that goes
            m.close()
