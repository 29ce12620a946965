"""A prefix-LM call (one int prefix P, causal, nothing else) as three large kernel calls instead
of a plan of tiles.

Queries before P see exactly the keys before P (both ways); queries from P on see every key up
to their own (plain causality). So:

    rows :P   x keys :P    one call without causality
    rows P:   x keys P:    one causal call (square: the kernel's top-left causality is right)
    rows P:   x keys :P    one call without causality, merged into the rows above by log-sum-exp

Every pair computed is allowed, and each call is long enough for torch's kernel to run at its
large-call rate (small causal tiles cost it up to 4x per pair). The backward pass runs the three
kernel backwards from the global out and lse; the keys before P gather gradients from two.

Shapes: q (B, H, T, D), k / v (B, Hkv, T, D / Dv) (the kernel reads grouped heads itself);
out (B, H, T, Dv), lse (B, H, T).
"""

from __future__ import annotations

from torch import Tensor

from .tile_kernel import run_backward, run_forward, serves_alone


def prefix_plan(structure, causal: bool, mask, bias, q: Tensor, k: Tensor) -> int | None:
    """P, when a call is causal with an int prefix and nothing else (no window, documents,
    mask_mod, mask or bias), square, on the kernel's dtypes; else None."""
    if not causal or not serves_alone("prefix", structure, mask, bias, q, k):
        return None
    return structure.prefix if isinstance(structure.prefix, int) else None


def prefix_forward(q, k, v, prefix: int, scale: float, out: Tensor, lse: Tensor) -> None:
    """Write every row of out (B, H, T, Dv) and lse (B, H, T)."""
    T, P = q.shape[2], prefix
    if P > 0:  # the prefix: both ways among itself
        out[:, :, :P], lse[:, :, :P] = run_forward(q, k, v, 0, P, 0, False, scale)
    if P < T:  # the rest: causal, and every key of the prefix
        out[:, :, P:], lse[:, :, P:] = run_forward(q, k, v, P, T, 0, True, scale)


def prefix_backward(q, k, v, grad_out, out, lse, prefix: int, scale: float, dq, dk, dv) -> None:
    """Write dq (B, H, T, D), dk, dv (B, Hkv, T, D) in full (they may start uninitialised)."""
    T, P = q.shape[2], prefix
    out = out.to(q.dtype)
    if P > 0:
        run_backward(q, k, v, grad_out, out, lse, 0, P, 0, False, scale, dq, dk, dv)
    if P < T:  # adds to the prefix keys' gradients, written above
        run_backward(q, k, v, grad_out, out, lse, P, T, 0, True, scale, dq, dk, dv)
