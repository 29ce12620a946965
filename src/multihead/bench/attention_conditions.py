"""`multihead bench attention --mask KIND --conditions 1,default,contend`: the structured
attention table, the small calls and the dense module rows, each row with its target and
whether it holds, measured under each condition in turn:

- `1`, or any thread count N: torch with N intra-op threads, machine as it is;
- `default`: the process's thread count (torch's default, or --threads);
- `contend`: the default threads beside a competing process that keeps every core busy
  (`bench/contend.py`, started and stopped here).

Targets (issue 41): structured function 2x of its ideal (3x beside the busy process), module
1.2x of its projection-aware ideal, the small calls (eval, decode step) 1.15x of the floor,
and the dense module (MultiHeadAttention against fused linear + SDPA + linear, the
`multihead bench attention` rows) at most DENSE_TARGET of its floor: no regression of the
dense paths. Each condition's header states the load average before and after it.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
from collections.abc import Callable

import torch

from ..table import format_table
from . import attention_small, attention_structure, contend
from .attention import contenders
from .timing import measure_rounds, median_ratio

CONDITIONS = ("1", "default", "contend")
DENSE_TARGET = 1.10  # mh / floor of the dense module (docs/performance.md: 1.00x-1.09x)
DENSE_SHAPES = [(1, 4096, 512, 8), (8, 512, 512, 8)]  # (B, T, E, H)
QUICK_DENSE_SHAPES = [(1, 1024, 512, 8)]
QUICK_SMALL_ROUNDS = 21


def parse(text: str, cpus: int) -> tuple[str, ...]:
    """ "1,default,contend" -> ("1", "default", "contend"); a thread count is 1 .. cpus."""
    items = tuple(item.strip() for item in text.split(","))
    for item in items:
        if item in ("default", "contend"):
            continue
        if not item.isdigit() or not 1 <= int(item) <= cpus:
            raise ValueError(
                f"--conditions takes a comma-separated list of thread counts (1 .. {cpus}), "
                f"'default' and 'contend', got {item!r} in {text!r}"
            )
    return items


def describe(condition: str, default: int) -> str:
    if condition == "contend":
        return f"default threads ({default}) {contend.describe()}"
    if condition == "default":
        return f"default threads ({default}), no competing process"
    return f"{condition} thread{'s' if condition != '1' else ''}, no competing process"


def dense_rows(shapes: list[tuple[int, int, int, int]], repeats: int) -> list[list[str]]:
    """MultiHeadAttention against the floor (train = forward + backward; eval), median of the
    per-round ratios, with the target."""
    body = []
    for shape in shapes:
        for mode in ("train", "eval"):
            B, T, E, H = shape
            fns = contenders(B, T, E, H, train=mode == "train")
            picked = {"mh": fns["mh"], "floor": fns["floor"]}
            rounds = measure_rounds(picked, repeats=repeats, warmup=1, min_time=0.0)
            ratio = median_ratio(rounds["mh"], rounds["floor"])
            mh, floor = (statistics.median(rounds[k]) * 1e3 for k in ("mh", "floor"))
            name = f"dense module B,T,E,H={','.join(map(str, shape))} {mode}"
            body.append(_row(name, f"{mh:.1f} ms", f"{floor:.1f} ms", ratio, DENSE_TARGET))
    return body


def small_rows(rounds: int) -> list[list[str]]:
    return [
        _row(name, f"{mh * 1e6:.0f} us", f"{floor * 1e6:.0f} us", ratio, attention_small.TARGET)
        for name, mh, floor, ratio in attention_small.rows(rounds)
    ]


def _row(name: str, mh: str, floor: str, ratio: float, target: float) -> list[str]:
    cell = f"{ratio:.2f}x"
    return [name, mh, floor, cell, f"{target:.2f}x", attention_structure.holds(cell, target)]


def _load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def run(
    kinds: tuple[str, ...],
    conditions: tuple[str, ...],
    *,
    quick: bool = False,
    repeats: int = 3,
    emit: Callable[[str], None] = print,
) -> int:
    """Measure and emit each condition's tables; return how many rows missed their target.
    The thread count is the caller's again afterwards."""
    default = torch.get_num_threads()
    small = QUICK_SMALL_ROUNDS if quick else attention_small.ROUNDS
    missed = 0
    summary = []
    try:
        for condition in conditions:
            threads = int(condition) if condition.isdigit() else default
            torch.set_num_threads(threads)
            before = _load()
            busy = contend.busy_process() if condition == "contend" else contextlib.nullcontext()
            with busy:
                print(f"  condition: {describe(condition, default)}", file=sys.stderr, flush=True)
                contended = condition == "contend"
                body = attention_structure.rows(
                    kinds, quick=quick, repeats=repeats, contended=contended
                )
                other = dense_rows(QUICK_DENSE_SHAPES if quick else DENSE_SHAPES, repeats)
                other += small_rows(small)
            headers = ["call", "mh", "floor", "mh/floor", "target", "holds"]
            table = attention_structure.report(body, contended=contended)
            text = (
                f"== condition: {describe(condition, default)}; load average (1/5/15 min) "
                f"{before} before, {_load()} after\n{table}\n\n"
                f"dense module ({repeats} rounds) and small calls ({small} rounds): "
                "mh/floor = median of per-round ratios\n" + format_table(headers, other)
            )
            misses = sum(row[-1] != "yes" for row in body + other)
            missed += misses
            summary.append(f"{describe(condition, default)}: {misses} row(s) over target")
            emit(text + "\n")
    finally:
        torch.set_num_threads(default)
    emit("summary: " + "; ".join(summary))
    return missed
