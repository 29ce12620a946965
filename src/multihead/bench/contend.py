"""A competing process for `multihead bench ... --contend`: matrix products on every core, so a
suite measures beside a busy process (another job, a second rank, a data-loader worker), as
well as on an idle machine.

The process is started and stopped by the suite (`busy_process`, a context manager). It stops
itself at its deadline, or as soon as the process that started it is gone, so a benchmark that
dies leaves nothing running. Run as `python -m multihead.bench.contend SECONDS`.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator

MAX_SECONDS = 3 * 3600  # the longest a competing process may run
SIZE = 512  # its matrices: ~0.3 GFLOP a product, a few ms on a core


def cores() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def describe() -> str:
    return f"beside a busy process ({cores()} threads of {SIZE}^3 matmuls)"


@contextlib.contextmanager
def busy_process(seconds: float = MAX_SECONDS) -> Iterator[subprocess.Popen]:
    """Run the competing process for the body of the `with` (at most `seconds`); it has
    started its work when the body begins."""
    seconds = min(float(seconds), MAX_SECONDS)
    proc = subprocess.Popen(
        [sys.executable, "-m", "multihead.bench.contend", str(seconds), str(os.getpid())],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    try:
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != b"busy":  # it imported torch and began
            raise RuntimeError(f"the competing process did not start (exit {proc.poll()})")
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - a stuck child
            proc.kill()
            proc.wait()


def _busy(seconds: float, parent: int) -> None:
    import torch

    torch.set_num_threads(cores())
    a, b = torch.randn(SIZE, SIZE), torch.randn(SIZE, SIZE)
    torch.mm(a, b)
    print("busy", flush=True)
    deadline = time.monotonic() + min(seconds, MAX_SECONDS)
    while time.monotonic() < deadline and os.getppid() == parent:
        for _ in range(10):
            torch.mm(a, b)


if __name__ == "__main__":
    _busy(float(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else os.getppid())
