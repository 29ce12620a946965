"""Side-by-side timing: contenders run round-robin in one process; we report medians.

These machines are noisy, so absolute times mean little; ratios between contenders measured
interleaved in the same run are what a benchmark should claim. On CUDA, time is read from CUDA
events around the calls, with synchronisation (kernels run asynchronously: the wall clock
would see only their launches).
"""

from __future__ import annotations

import os
import platform
import random
import statistics
import time
from collections.abc import Callable

import torch

DTYPES = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
}


def resolve_dtype(name: str | torch.dtype) -> torch.dtype:
    """ "fp32" / "bf16" / "fp16" (or a torch.dtype) -> the dtype."""
    if isinstance(name, torch.dtype):
        return name
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"dtype must be one of fp32, bf16, fp16, got {name!r}") from None


def dtype_name(dtype: torch.dtype) -> str:
    return {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}.get(
        dtype, str(dtype)
    )


def resolve_device(name: str | torch.device) -> torch.device:
    """ "cpu", "cuda", "cuda:1" -> the device; refuses a CUDA device this machine lacks."""
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r}: CUDA is not available on this machine")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be cpu or cuda, got {name!r}")
    return device


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], calls: int, device: torch.device) -> float:
    """Seconds per call of `calls` back-to-back calls: wall time on CPU; on CUDA, CUDA events
    around the calls, after a synchronisation (queued work from before is not counted) and
    read after the end event completes (all of it is)."""
    if device.type != "cuda":
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - start) / calls
    torch.cuda.synchronize(device)
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) / 1e3 / calls


def _calls_per_sample(fn: Callable[[], object], min_time: float, device: torch.device) -> int:
    """How many calls make one sample last at least `min_time` seconds (small shapes loop)."""
    once = max(timed(fn, 1, device), 1e-7)
    return max(1, int(min_time / once))


def measure(
    contenders: dict[str, Callable[[], object]],
    *,
    repeats: int = 7,
    warmup: int = 2,
    min_time: float = 0.02,
    device: torch.device | str = "cpu",
) -> dict[str, float]:
    """Median seconds per call of each contender, sampled round-robin `repeats` times."""
    samples = measure_rounds(
        contenders, repeats=repeats, warmup=warmup, min_time=min_time, device=device
    )
    return {name: statistics.median(s) for name, s in samples.items()}


MAX_ROUNDS_FACTOR = 4  # (measure_rounds' budget: at most this many times the rounds asked)


def measure_rounds(
    contenders: dict[str, Callable[[], object]],
    *,
    repeats: int = 7,
    warmup: int = 2,
    min_time: float = 0.02,
    device: torch.device | str = "cpu",
    budget: float = 0.0,
) -> dict[str, list[float]]:
    """Seconds per call of each contender in each of `repeats` rounds (every contender runs
    once per round, in a random order). On CUDA, timed with CUDA events (see `timed`).

    `budget` (seconds, with warmup): where `repeats` rounds would take less, more rounds run,
    as many as the budget holds at the last warm-up round's pace, at most MAX_ROUNDS_FACTOR x
    `repeats`: a cheap row's median then stands on more rounds (beside a busy process one
    round of a short call can read twice another's), at little cost to the whole run."""
    device = torch.device(device)
    pace = 0.0  # seconds of the last warm-up round (every contender once)
    for _ in range(warmup):
        start = time.perf_counter()
        for fn in contenders.values():
            fn()
        synchronize(device)
        pace = time.perf_counter() - start
    loops = {name: _calls_per_sample(fn, min_time, device) for name, fn in contenders.items()}
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    names = list(contenders)
    order_rng = random.Random(0)
    if budget > 0 and pace > 0:
        repeats = max(repeats, min(MAX_ROUNDS_FACTOR * repeats, int(budget / pace)))
    for _ in range(repeats):
        # A fresh random order each round: what runs just before a contender affects it (torch's
        # MHA leaves the allocator in a state that costs its successor ~10% at B=8, T=512), and a
        # rotation would keep the same neighbours. Seeded, so runs are repeatable.
        order = names[:]
        order_rng.shuffle(order)
        for name in order:
            samples[name].append(timed(contenders[name], loops[name], device))
    return samples


def median_ratio(times: list[float], baselines: list[float]) -> float:
    """The median over rounds of time / baseline, each pair from the same round (of
    `measure_rounds`): the machine's load moves between rounds by more than the gaps a small
    ratio reads, and two samples of one round see the same load."""
    return statistics.median(t / b for t, b in zip(times, baselines, strict=True))


def matmul_gflops(
    n: int = 1024,
    repeats: int = 5,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> float:
    """This machine's matmul throughput on an n x n x n product, GFLOP/s."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    seconds = measure({"mm": lambda: torch.mm(a, b)}, repeats=repeats, device=device)["mm"]
    return 2 * n**3 / seconds / 1e9


def environment(device: torch.device | str = "cpu") -> dict[str, str]:
    device = torch.device(device)
    env = {
        "torch": torch.__version__,
        "threads": str(torch.get_num_threads()),
        "device": str(device),
    }
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["cuda"] = str(torch.version.cuda)
    env |= {
        "cpu": platform.processor() or platform.machine(),
        "cores": str(os.cpu_count()),
        "python": platform.python_version(),
    }
    return env
