"""Exact attention over a sequence sharded across the ranks of a process group (ring attention,
Liu et al. 2023): keys and values travel round the ring while each rank attends its own queries
to the block it holds; partial results merge by their log-sum-exp. The backward pass runs a
second ring from the saved log-sum-exp, and each key block's gradients travel with it back to
the rank that owns it.

Shape legend: B batch, H query heads, Hkv key/value heads, T_r this rank's positions (T/P in a
contiguous layout), D head width, Dv value width. q (B, H, T_r, D), k (B, Hkv, T_r, D),
v (B, Hkv, T_r, Dv), key_mask (B, T_r) -> out (B, H, T_r, Dv); lse (B, H, T_r).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from ..functional.dropout_mask import dropout_keep_mask
from ..functional.first_order import first_order
from ..functional.tiles import NEG_INF, accumulation_dtype, merge_into, tile_backward, tile_forward
from .checks import BiasFn, RingSetup, check_bias, prepare
from .ring import GRADS_TAG, KEYS_TAG, Transfer
from .schedule import TilePair, tile_pairs


def ring_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    group: dist.ProcessGroup | None = None,
    causal: bool = False,
    key_mask: Tensor | None = None,
    scale: float | None = None,
    dropout_p: float = 0.0,
    dropout_seed: int | None = None,
    layout: str = "contiguous",
    bias_fn: BiasFn | None = None,
    block_size: int = 512,
    window: int | tuple[int, int] | None = None,
    documents: Tensor | None = None,
    timeout: float = 300.0,
) -> Tensor:
    """This rank's chunk of `multihead.functional.attention()` over the whole sharded sequence.

    Every rank of `group` (None: the default group) calls this with its own chunk of the sequence
    (see `shard_sequence`): q `(B, H, T_r, D)`, k `(B, Hkv, T_r, D)`, v `(B, Hkv, T_r, Dv)`, where
    `Hkv` divides `H` (grouped-query attention). A rank holds at most two other ranks' key /
    value blocks at a time (the one it works on and the one arriving) and never a `T x T`
    tensor: per-rank memory is O(T / P) plus one tile's scores.

    Args:
        causal: query at global position i sees keys 0 .. i (attention()'s alignment for
            Tq == Tk). Tiles whose keys all follow their queries are skipped.
        key_mask: `(B, T_r)`, True = a real key, for this rank's own keys.
        scale: multiplies q @ k^T; defaults to 1 / sqrt(D).
        dropout_p: dropout on the attention probabilities (use only in training); needs
            `dropout_seed`, an int equal on every rank. Entry (b, h, i, j) of the global
            probabilities is dropped as `dropout_keep_mask(seed, p, B, H, arange(T), arange(T))`
            says: the same mask for any world size, layout or block size.
        layout: "contiguous" (rank r holds positions r*T/P .. (r+1)*T/P - 1; any positive
            lengths per rank) or "zigzag" (pieces r and 2P-1-r of 2P: balanced causal work).
        bias_fn: optional `bias_fn(q_index (tq,), k_index (tk,)) -> bias` broadcastable to
            `(B, H, tq, tk)`, from GLOBAL positions (ALiBi, relative biases); added to the
            scores, -inf blocks. Called per tile in both passes; its output must not require grad.
        block_size: queries and keys per computed tile (bounds the scratch memory).
        window: a sliding window over GLOBAL positions, as `attention(window=)`: an int W
            (keys within W positions; i - W + 1 .. i with causal) or (left, right). Tiles
            wholly outside it are skipped.
        documents: `(B, T_r)` integer document ids of this rank's positions (as
            `attention(documents=)`): they travel round the ring with the keys, and a query
            attends only within its document. (prefix= has no ring form yet: a prefix-LM
            mask needs no travelling data, pass it as `bias_fn` returning -inf.)
        timeout: seconds the ranks wait for each other to agree on the inputs (a rank that
            failed elsewhere and stays alive then ends the others with TimeoutError).

    Every rank must take part in the backward pass as well when gradients are needed. A query
    row that may attend to nothing returns zeros (output and gradients).

    Returns:
        this rank's output `(B, H, T_r, Dv)`, in q's dtype (accumulated in fp32 or fp64).
    """
    setup = prepare(
        q, k, v, key_mask, group=group, causal=causal, scale=scale, dropout_p=dropout_p,
        dropout_seed=dropout_seed, layout=layout, bias_fn=bias_fn, block_size=block_size,
        window=window, documents=documents,
        timeout=timeout,
    )  # fmt: skip
    if documents is not None:
        # (validated integer ids) one dtype on every rank: each rank sizes its receive buffer
        # by its own ids' dtype, so int32 ids meeting int64 ones aborted gloo on one rank and
        # read half-filled buffers as ids on the other
        documents = documents.long()
    return _RingAttention.apply(q, k, v, key_mask, documents, setup)


def _block(k: Tensor, v: Tensor, key_mask: Tensor | None, documents: Tensor | None) -> list[Tensor]:
    """What travels round the ring: keys, values, their padding mask and document ids."""
    return [k, v] + [t for t in (key_mask, documents) if t is not None]


def _outside_window(setup: RingSetup, pair: TilePair) -> bool:
    """Whether the window excludes every (query, key) pair of a tile (global positions)."""
    if setup.window is None:
        return False
    left, right = setup.window
    qt, kt = pair.queries, pair.keys
    return kt.start + kt.length - 1 < qt.start - left or kt.start > qt.start + qt.length - 1 + right


def _empty_block(like: list[Tensor], length: int) -> list[Tensor]:
    """Receive buffers for a block of `length` positions (dim 2 of k / v, dim 1 of the mask)."""
    out = []
    for t in like:
        shape = list(t.shape)
        shape[2 if t.dim() == 4 else 1] = length
        out.append(torch.empty(shape, dtype=t.dtype, device=t.device))
    return out


def _tile_inputs(
    setup: RingSetup, q: Tensor, block: list[Tensor], pair: TilePair, docs: Tensor | None
):
    """q, k, v slices of one tile and what masks it: allowed, bias and the dropout keep mask.
    `docs`: this rank's own document ids (B, T_r), for the tile's queries."""
    qt, kt = pair.queries, pair.keys
    B, H, device = q.shape[0], q.shape[1], q.device
    q_t = q[:, :, qt.offset : qt.offset + qt.length]
    k_t = block[0][:, :, kt.offset : kt.offset + kt.length]
    v_t = block[1][:, :, kt.offset : kt.offset + kt.length]
    q_index = torch.arange(qt.start, qt.start + qt.length, device=device)  # global positions
    k_index = torch.arange(kt.start, kt.start + kt.length, device=device)
    allowed = None
    keys = slice(kt.offset, kt.offset + kt.length)
    if len(block) == 4 or (len(block) == 3 and not setup.documents):  # (B, tk) -> (B, 1, 1, tk)
        allowed = block[2][:, None, None, keys]
    if pair.diagonal:
        below = k_index[None, :] <= q_index[:, None]  # (tq, tk)
        allowed = below if allowed is None else allowed & below
    if setup.window is not None:
        left, right = setup.window
        dist_ = k_index[None, :] - q_index[:, None]  # (tq, tk): key minus query position
        near = (dist_ >= -left) & (dist_ <= right)
        allowed = near if allowed is None else allowed & near
    if setup.documents:
        assert docs is not None
        q_docs = docs[:, qt.offset : qt.offset + qt.length]  # (B, tq)
        same = (q_docs[:, :, None] == block[-1][:, None, keys])[:, None]  # (B, 1, tq, tk)
        allowed = same if allowed is None else allowed & same
    bias = None
    if setup.bias_fn is not None:
        target = (B, H, qt.length, kt.length)
        bias = check_bias(setup.bias_fn(q_index, k_index), target, device)
    keep = None
    if setup.dropout_p > 0.0:
        keep = dropout_keep_mask(setup.dropout_seed, setup.dropout_p, B, H, q_index, k_index)
    masks = dict(
        scale=setup.scale, allowed=allowed, bias=bias, keep=keep, dropout_p=setup.dropout_p
    )
    return q_t, k_t, v_t, masks


def _forward_ring(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    key_mask: Tensor | None,
    docs: Tensor | None,
    setup: RingSetup,
) -> tuple[Tensor, Tensor]:
    ring, segments = setup.ring, setup.segments
    mine = segments[ring.rank]
    B, H, T, _ = q.shape
    acc = accumulation_dtype(q.dtype)
    out = torch.zeros(B, H, T, v.shape[3], dtype=acc, device=q.device)
    lse = torch.full((B, H, T), NEG_INF, dtype=acc, device=q.device)
    block = _block(k, v, key_mask, docs)
    for step in range(ring.size):
        transfer = None
        if step + 1 < ring.size:  # start the next block's transfer, then compute on this one
            incoming = segments[ring.source(step + 1)]
            buffers = _empty_block(block, sum(s.length for s in incoming))
            transfer = ring.shift(block, buffers, KEYS_TAG)
        pairs = tile_pairs(mine, segments[ring.source(step)], causal=setup.causal,
                           block_size=setup.block_size)  # fmt: skip
        _attend_block(setup, q, block, pairs, out, lse, docs)
        if transfer is not None:
            block = transfer.wait()
    return out.to(q.dtype), lse


def _attend_block(
    setup: RingSetup,
    q: Tensor,
    block: list[Tensor],
    pairs: list[TilePair],
    out: Tensor,
    lse: Tensor,
    docs: Tensor | None,
) -> None:
    """Fold attention to one held block into (out, lse), in place. (A function of its own so
    that no tile view of the block outlives it: the block is freed as soon as the next arrives.)"""
    for pair in pairs:
        if _outside_window(setup, pair):
            continue
        q_t, k_t, v_t, masks = _tile_inputs(setup, q, block, pair, docs)
        o, l = tile_forward(q_t, k_t, v_t, **masks)
        rows = slice(pair.queries.offset, pair.queries.offset + pair.queries.length)
        merge_into(out[:, :, rows], lse[:, :, rows], o, l)


def _block_grads(
    setup: RingSetup,
    q: Tensor,
    block: list[Tensor],
    pairs: list[TilePair],
    grad_out: Tensor,
    lse: Tensor,
    delta: Tensor,
    dq: Tensor,
    dk: Tensor,
    dv: Tensor,
    docs: Tensor | None,
) -> None:
    """Add one held block's share of the gradients to dq, and its keys' to (dk, dv), in place."""
    for pair in pairs:
        if _outside_window(setup, pair):
            continue
        q_t, k_t, v_t, masks = _tile_inputs(setup, q, block, pair, docs)
        rows = slice(pair.queries.offset, pair.queries.offset + pair.queries.length)
        cols = slice(pair.keys.offset, pair.keys.offset + pair.keys.length)
        dq_t, dk_t, dv_t = tile_backward(
            q_t, k_t, v_t, grad_out[:, :, rows], lse[:, :, rows], delta[:, :, rows], **masks
        )
        dq[:, :, rows] += dq_t
        dk[:, :, cols] += dk_t
        dv[:, :, cols] += dv_t


def _add_arrived(dk: Tensor, dv: Tensor, transfer: Transfer) -> None:
    """Add the accumulators arriving from the ranks before this one (and let them go)."""
    earlier_dk, earlier_dv = transfer.wait()
    dk += earlier_dk
    dv += earlier_dv


def _backward_ring(
    grad_out: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    key_mask: Tensor | None,
    docs: Tensor | None,
    out: Tensor,
    lse: Tensor,
    setup: RingSetup,
) -> tuple[Tensor, Tensor, Tensor]:
    ring, segments = setup.ring, setup.segments
    mine = segments[ring.rank]
    acc = accumulation_dtype(q.dtype)
    B, Hkv = k.shape[0], k.shape[1]
    D, Dv = k.shape[3], v.shape[3]
    delta = (grad_out.to(acc) * out.to(acc)).sum(dim=-1)  # (B, H, T_r): rowsum(dO * O)
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    block = _block(k, v, key_mask, docs)
    grads_in = None  # the accumulators of the block this rank holds, arriving from rank - 1

    def zeros(length: int, width: int) -> Tensor:
        return torch.zeros(B, Hkv, length, width, dtype=acc, device=q.device)

    def empty(length: int, width: int) -> Tensor:
        return torch.empty(B, Hkv, length, width, dtype=acc, device=q.device)

    for step in range(ring.size):
        transfer = None
        if step + 1 < ring.size:
            incoming = segments[ring.source(step + 1)]
            buffers = _empty_block(block, sum(s.length for s in incoming))
            transfer = ring.shift(block, buffers, KEYS_TAG)
        theirs = segments[ring.source(step)]
        held = sum(s.length for s in theirs)
        # This rank's contributions to the held block's dk / dv, computed while the
        # accumulators from the ranks before it are still on their way.
        dk, dv = zeros(held, D), zeros(held, Dv)
        pairs = tile_pairs(mine, theirs, causal=setup.causal, block_size=setup.block_size)
        _block_grads(setup, q, block, pairs, grad_out, lse, delta, dq, dk, dv, docs)
        if grads_in is not None:
            _add_arrived(dk, dv, grads_in)
        if ring.size > 1:
            # Pass the accumulators on; after the last step they reach the block's owner.
            following = sum(s.length for s in segments[ring.source(step + 1)])
            grads_in = ring.shift([dk, dv], [empty(following, D), empty(following, Dv)], GRADS_TAG)
        if transfer is not None:
            block = transfer.wait()
    if grads_in is not None:
        dk, dv = grads_in.wait()
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, key_mask, docs, setup):
        out, lse = _forward_ring(q, k, v, key_mask, docs, setup)
        ctx.save_for_backward(q, k, v, key_mask, docs, out, lse)
        ctx.setup = setup
        return out

    @staticmethod
    @first_order("ring attention")
    def backward(ctx, grad_out):
        q, k, v, key_mask, docs, out, lse = ctx.saved_tensors
        dq, dk, dv = _backward_ring(grad_out, q, k, v, key_mask, docs, out, lse, ctx.setup)
        return dq, dk, dv, None, None, None
