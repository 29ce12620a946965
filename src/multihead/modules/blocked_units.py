"""The blocked q, k, v projection's products (`blocked_projection`) as units on the tiled
backend's workers (`functional.backends.tile_threads`), for a call beside a busy process.

Why: each product of the projection is otherwise a parallel region of torch's threads, which
ends when every thread has done its static share; beside a busy process one of them is often
descheduled and the region waits for it. Cut into units of rows (forward: a block's rows, a
part at a time; backward: the input gradient's rows, and each block's weight-gradient rows,
half at a time), each a single-threaded product on a worker, a descheduled worker holds up
only its own unit. Measured at (1024, 512) inputs, width 512, 2 threads, forward + backward,
medians of 15 in one process: beside a busy process 80-84 ms on the workers against 151-192
ms as batched products and 104-144 ms as the one plain F.linear; on free cores 35.6 ms
against 30.7 (the regions start at once there, so the workers run only beside a busy
process: `blocked_projection._way`).

Every unit writes its own rows of the output or gradients; the results equal the products'
up to the rounding of their row split (fp32: ~1e-5 of the largest value).

Shapes: x (N, C); weight (sum(widths), C); out a flat buffer whose block i is (N, widths[i]);
grad the same; gx (N, C), gw like weight, gb (sum(widths),).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable

import torch
from torch import Tensor

from ..functional.backends.tile_threads import run


def parts(count: int, wanted: int) -> list[slice]:
    """`wanted` runs of 0 .. count - 1 of about equal length (fewer where count is smaller)."""
    n = max(1, min(wanted, count))
    return [slice(a, b) for a, b in itertools.pairwise([count * p // n for p in range(n + 1)])]


def split_blocks(flat: Tensor, N: int, widths) -> list[Tensor]:
    """The (N, w) blocks of a flat buffer, as views."""
    blocks, start = [], 0
    for w in widths:
        blocks.append(flat[start : start + N * w].view(N, w))
        start += N * w
    return blocks


def _blocks(flat: Tensor, N: int, widths) -> list[tuple[int, Tensor]]:
    """(first weight row, (N, w) block view) of each block of a flat buffer."""
    rows = itertools.accumulate(widths[:-1], initial=0)
    return list(zip(rows, split_blocks(flat, N, widths), strict=True))


def forward_units(x, weight, bias, widths, out: Tensor, threads: int) -> None:
    """Fill out (the flat buffer) block by block, a part of its rows a unit."""
    N = x.shape[0]
    units: list[Callable[[], object]] = []
    for row, block in _blocks(out, N, widths):
        w = block.shape[1]
        W = weight[row : row + w].t()
        for r in parts(N, -(-2 * threads // len(widths))):  # ~2 units a worker in all
            if bias is None:
                units.append(functools.partial(torch.mm, x[r], W, out=block[r]))
            else:
                b = bias[row : row + w]
                units.append(functools.partial(torch.addmm, b, x[r], W, out=block[r]))
    run(units, threads)


def backward_units(x, weight, grad: Tensor, widths, gx, gw, gb, threads: int) -> None:
    """Fill gx (dx = sum over blocks of g_i W_i, a part of its rows a unit), gw (block i's
    rows: g_i^T x, half of them a unit) and gb (their column sums), those not None."""
    N = x.shape[0]
    blocks = _blocks(grad, N, widths)

    def input_rows(r: slice) -> None:
        for i, (row, g) in enumerate(blocks):
            W = weight[row : row + g.shape[1]]
            if i == 0:
                torch.mm(g[r], W, out=gx[r])
            else:
                gx[r].addmm_(g[r], W)

    def weight_rows(row: int, g: Tensor, h: slice) -> None:
        rows = slice(row + h.start, row + h.stop)
        if gw is not None:
            torch.mm(g[:, h].t(), x, out=gw[rows])
        if gb is not None:
            torch.sum(g[:, h], dim=0, out=gb[rows])

    units: list[Callable[[], None]] = []
    if gx is not None:
        units += [functools.partial(input_rows, r) for r in parts(N, 2 * threads)]
    if gw is not None or gb is not None:
        units += [
            functools.partial(weight_rows, row, g, h)
            for row, g in blocks
            for h in parts(g.shape[1], 2)
        ]
    run(units, threads)
