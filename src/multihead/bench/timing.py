"""Side-by-side timing: contenders run round-robin in one process; we report medians.

These machines are noisy, so absolute times mean little; ratios between contenders measured
interleaved in the same run are what a benchmark should claim.
"""

from __future__ import annotations

import os
import platform
import random
import statistics
import time
from collections.abc import Callable

import torch


def _calls_per_sample(fn: Callable[[], object], min_time: float) -> int:
    """How many calls make one sample last at least `min_time` seconds (small shapes loop)."""
    start = time.perf_counter()
    fn()
    once = max(time.perf_counter() - start, 1e-7)
    return max(1, int(min_time / once))


def measure(
    contenders: dict[str, Callable[[], object]],
    *,
    repeats: int = 7,
    warmup: int = 2,
    min_time: float = 0.02,
) -> dict[str, float]:
    """Median seconds per call of each contender, sampled round-robin `repeats` times."""
    samples = measure_rounds(contenders, repeats=repeats, warmup=warmup, min_time=min_time)
    return {name: statistics.median(s) for name, s in samples.items()}


def measure_rounds(
    contenders: dict[str, Callable[[], object]],
    *,
    repeats: int = 7,
    warmup: int = 2,
    min_time: float = 0.02,
) -> dict[str, list[float]]:
    """Seconds per call of each contender in each of `repeats` rounds (every contender runs
    once per round, in a random order)."""
    for fn in contenders.values():
        for _ in range(warmup):
            fn()
    loops = {name: _calls_per_sample(fn, min_time) for name, fn in contenders.items()}
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    names = list(contenders)
    order_rng = random.Random(0)
    for _ in range(repeats):
        # A fresh random order each round: what runs just before a contender affects it (torch's
        # MHA leaves the allocator in a state that costs its successor ~10% at B=8, T=512), and a
        # rotation would keep the same neighbours. Seeded, so runs are repeatable.
        order = names[:]
        order_rng.shuffle(order)
        for name in order:
            fn, n = contenders[name], loops[name]
            start = time.perf_counter()
            for _ in range(n):
                fn()
            samples[name].append((time.perf_counter() - start) / n)
    return samples


def matmul_gflops(n: int = 1024, repeats: int = 5) -> float:
    """This machine's fp32 matmul throughput on an n x n x n product, GFLOP/s."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    seconds = measure({"mm": lambda: torch.mm(a, b)}, repeats=repeats)["mm"]
    return 2 * n**3 / seconds / 1e9


def environment() -> dict[str, str]:
    return {
        "torch": torch.__version__,
        "threads": str(torch.get_num_threads()),
        "device": "cpu",
        "cpu": platform.processor() or platform.machine(),
        "cores": str(os.cpu_count()),
        "python": platform.python_version(),
    }
