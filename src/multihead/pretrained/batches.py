"""How `SentenceEncoder.encode` cuts its work into batches and spreads them over the CPU cores.

Batches are sized in tokens (texts packed without padding), so every matmul is large enough to
run near the CPU's peak however short the texts are.

On CPU the batches go to one single-threaded worker per intra-op thread, instead of every op
being split across all threads. Each op of a BERT layer is small (tens of microseconds to a few
milliseconds), and splitting it has a cost (fork/join, per-thread set-up in the attention kernel,
uneven tails): on the 2-core CPU this was measured, the same corpus took 7% less time this way,
with bit-identical results.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable, Sequence

import torch

# A batch of `encode(batch_size=b)` holds up to b * TOKENS_PER_TEXT tokens (at least one text):
# 2,048 by default, where the BERT matmuls measured fastest on CPU (from 64 to 8,192 rows).
TOKENS_PER_TEXT = 64


def token_batches(order: Sequence[int], lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Consecutive items of `order` in batches of at most `budget` tokens (a longer item alone)."""
    batches: list[list[int]] = []
    batch: list[int] = []
    tokens = 0
    for i in order:
        if batch and tokens + lengths[i] > budget:
            batches.append(batch)
            batch, tokens = [], 0
        batch.append(i)
        tokens += lengths[i]
    if batch:
        batches.append(batch)
    return batches


def _openmp() -> bool:
    """Whether torch's intra-op threads are OpenMP's, whose thread count each thread can change
    (the native backend ignores a change once parallel work has started)."""
    return "parallel backend: OpenMP" in torch.__config__.parallel_info()


def run_batches(
    work: Callable[[list[int]], None],
    batches: Sequence[list[int]],
    *,
    device: torch.device,
    progress: Callable[[], None] | None = None,
) -> None:
    """`work(batch)` for every batch, in inference mode.

    On CPU with N > 1 intra-op threads, N worker threads take batches in turn, each running its
    ops on one thread; torch's thread count is restored afterwards (while this runs, torch
    work from other threads of the process also sees one intra-op thread).
    """
    threads = torch.get_num_threads()
    workers = min(threads, len(batches))
    if device.type != "cpu" or workers < 2 or not _openmp():
        with torch.inference_mode():
            for batch in batches:
                work(batch)
                if progress is not None:
                    progress()
        return

    pending = iter(batches)
    lock = threading.Lock()
    errors: list[BaseException] = []

    def worker() -> None:
        torch.set_num_threads(1)
        try:
            with torch.inference_mode():
                while not errors:
                    with lock:
                        batch = next(pending, None)
                    if batch is None:
                        return
                    work(batch)
                    if progress is not None:
                        with lock:
                            progress()
        except BaseException as e:  # re-raised in the caller's thread
            errors.append(e)

    # Each worker runs in a copy of the caller's context: hooks, head gates and captures the
    # caller opened apply to its batches too (a plain thread would start with none).
    pool = [
        threading.Thread(target=contextvars.copy_context().run, args=(worker,), daemon=True)
        for _ in range(workers)
    ]
    try:
        for t in pool:
            t.start()
        for t in pool:
            t.join()
    except BaseException as e:  # Ctrl-C while waiting: the workers stop after their batch
        errors.append(e)
        raise
    finally:
        torch.set_num_threads(threads)
    if errors:
        raise errors[0]
