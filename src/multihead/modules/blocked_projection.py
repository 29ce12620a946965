"""A packed (q | k | v) projection stored in blocks: q, k and v each a whole (B, T, w) block of
one buffer, instead of column ranges of one (B, T, W) matrix.

Why: the tiled backend's fast paths read q, k and v a head at a time, rows of D elements; in a
(B, T, W) projection those rows are W apart (6 KB at width 512 with 8 heads), in a block w
apart (2 KB). Measured, a causal window of 256 at T 4096, one thread: the band's forward
40.9 -> 36.4 ms, its backward 87.6 -> 83.5 ms, while the three matmuls cost what the one did
(forward + backward 142.7 -> 140.1 ms). The tiled backend writes the gradients of the
blocks straight into one buffer, as it does for column views (`tile_packed.packed_views`).

Used by `MultiHeadAttention` for structured self-attention on CPU without a cache or a
position scheme, where the tiled backend runs (`blocked_projection_serves`); every other call
keeps the one matmul.

Shapes: x (N, C) rows (N = B T); weight (sum(widths), C) with the rows of each block in
order; the output a flat buffer of N * sum(widths) elements: block i is (N, widths[i]) at
offset N * (widths[0] + .. + widths[i - 1]).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..functional.backends.tile_threads import cores_free, workers
from ..functional.backends.tiled import MIN_PAIRS
from ..functional.first_order import first_order
from .blocked_units import backward_units, forward_units, split_blocks
from .projections import _plain

DTYPES = (torch.float32, torch.float64)


def blocked_projection_serves(layer: nn.Module, x: Tensor) -> bool:
    """Whether a self-attention call on x (B, T, C) projects in blocks: a plain packed
    nn.Linear (no hooks or other forward), fp32 / fp64 on CPU, eager, no autocast, and long
    enough for the tiled backend (T x T pairs at least its MIN_PAIRS)."""
    return (
        # (first: traced code never reads the length, which would guard a symbolic size)
        not torch.compiler.is_compiling()
        and x.device.type == "cpu"
        and x.dtype in DTYPES
        and x.shape[1] * x.shape[1] >= MIN_PAIRS
        and _plain(layer)
        and layer.weight.dtype == x.dtype
        and layer.weight.device == x.device
        and not torch.is_autocast_enabled("cpu")
    )


def blocked_projection(
    x: Tensor, weight: Tensor, bias: Tensor | None, widths: tuple[int, ...]
) -> list[Tensor]:
    """x (B, T, C) -> one (B, T, w) tensor per entry of `widths`, each a whole block of one
    flat buffer (its `_base`); equal to F.linear(x, weight, bias).split(widths, -1)."""
    B, T, C = x.shape
    flat = _Blocked.apply(x.reshape(B * T, C), weight, bias, widths)
    return [b.view(B, T, w) for b, w in zip(split_blocks(flat, B * T, widths), widths, strict=True)]


class _Blocked(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, widths):
        N = x.shape[0]
        out = x.new_empty(N * sum(widths))
        ctx.save_for_backward(x, weight)
        ctx.widths, ctx.has_bias = widths, bias is not None
        way, threads = _way(widths, x, weight, bias)
        if way == "units":  # beside a busy process: units of rows on the workers
            forward_units(x, weight, bias, widths, out, threads)
            return out
        if way == "batched":  # one batched product: one parallel region, not one per block
            n, w = len(widths), widths[0]
            w3 = weight.unflatten(0, (n, w)).transpose(1, 2)  # (n, C, w)
            x3 = x.expand(n, *x.shape)  # (n, N, C), a view
            if bias is None:
                torch.bmm(x3, w3, out=out.view(n, N, w))
            else:
                torch.baddbmm(bias.view(n, 1, w), x3, w3, out=out.view(n, N, w))
            return out
        row = 0
        for w, block in zip(widths, split_blocks(out, N, widths), strict=True):
            if bias is None:
                torch.mm(x, weight[row : row + w].t(), out=block)
            else:
                torch.addmm(bias[row : row + w], x, weight[row : row + w].t(), out=block)
            row += w
        return out

    @staticmethod
    @first_order("the blocked q, k, v projection")  # (its out= matmuls are not recorded)
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        widths = ctx.widths
        want_x, want_w, want_b = ctx.needs_input_grad[:3]
        N = x.shape[0]
        grad = grad.contiguous()
        gx = gw = gb = None
        way, threads = _way(widths, x, weight, grad)
        if way == "units":  # beside a busy process: units of rows on the workers
            gx = x.new_empty(x.shape) if want_x else None
            gw = weight.new_empty(weight.shape) if want_w else None
            gb = weight.new_empty(weight.shape[0]) if want_b and ctx.has_bias else None
            backward_units(x, weight, grad, widths, gx, gw, gb, threads)
            return gx, gw, gb, None
        batched = way == "batched"
        if want_w:
            gw = weight.new_empty(weight.shape)  # (contiguous: the batched product's out)
        if gw is not None and batched:  # one product for all blocks: one region, not three
            n, w = len(widths), widths[0]
            g3 = grad.view(n, N, w).transpose(1, 2)  # (n, w, N)
            torch.bmm(g3, x.expand(n, *x.shape), out=gw.view(n, w, -1))
        if want_b and ctx.has_bias:
            gb = weight.new_empty(weight.shape[0])
        if gb is not None and batched:  # every block's column sums in one reduction
            n, w = len(widths), widths[0]
            torch.sum(grad.view(n, N, w), dim=1, out=gb.view(n, w))
        row = 0
        for w, g in zip(widths, split_blocks(grad, N, widths), strict=True):
            rows = slice(row, row + w)
            if want_x:  # dx = sum over blocks of g_i W_i
                gx = g @ weight[rows] if gx is None else gx.addmm_(g, weight[rows])
            if gw is not None and not batched:
                torch.mm(g.t(), x, out=gw[rows])
            if gb is not None and not batched:
                torch.sum(g, dim=0, out=gb[rows])
            row += w
        return gx, gw, gb, None


def _way(widths, *tensors: Tensor | None) -> tuple[str, int]:
    """How a call's products run, from one probe of the machine (`tile_threads.cores_free`),
    with the workers they take:
    - ("units", n): beside a busy process (the cores not free) with more than one thread,
      where the tiled backend's workers may run (`tile_threads.workers`: no grad mode,
      torch function or dispatch mode, subclass): units of rows on n workers
      (`blocked_units`), no parallel region that waits for a descheduled thread;
    - ("batched", 0): equal blocks (`_equal`) as one batched product (bmm), one parallel
      region, with one thread, where the threads share the blocks evenly, or beside a busy
      process where the products cannot go to the workers;
    - ("blocks", 0): one product per block (each a region of all threads): unequal blocks,
      or free cores whose threads cannot share the blocks evenly.
    The batched product deals whole blocks to the threads: three blocks on two threads leave
    one idle for a third of it. Measured at width 512, (T, 512) inputs, in one process,
    medians of 15: 2 threads, idle: batched 1.31-1.34x the per-block products' time (T 1024:
    10.8 vs 8.1 ms forward, 11.1 vs 8.4 ms weight gradient; T 4096: 45.4 vs 34.5, 44.1 vs
    34.4), which equal one plain (T, 1536) product; beside a busy process the per-block
    products wait on three regions: 1.1-1.8x the batched product's time (T 1024: 47.6 vs
    31.5, 47.2 vs 26.6; T 4096: 97.8 vs 88.0, 100.0 vs 80.0); 1 thread: the same."""
    threads = torch.get_num_threads()
    free = threads <= 1 or cores_free(threads)
    if not free:
        n = workers(*tensors)
        if n > 1:
            return "units", n
    if _equal(widths) and (threads <= 1 or len(widths) % threads == 0 or not free):
        return "batched", 0
    return "blocks", 0


def _equal(widths) -> bool:
    """Whether every block has the same width (q, k, v without grouped-query heads): the
    blocks may then run as one batched product."""
    return len(widths) > 1 and all(w == widths[0] for w in widths)
