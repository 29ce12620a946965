"""Per-head attention inputs, TransformerLens' `use_attn_in` / `use_split_qkv_input`: computed only
when one of their hook points is hooked, so the plain path pays nothing.

hook_attn_in (B, T, H, C): the block's input (resid_pre) repeated for each query head;
hook_q_input (B, T, H, C): what each query head reads (default: attn_in);
hook_k_input, hook_v_input (B, T, Hkv, C): what each key/value head reads (default: attn_in of
the first query head of each group, which is resid_pre; with as many kv heads as query heads,
attn_in itself).
Each input goes through the block's norm (pre-norm blocks: ln1, whose hooks then see per-head
shapes (B, T, H, 1) / (B, T, H, C), as in TransformerLens; once for the unpatched inputs, once
more per patched one) and its own head's weights: q[..., h, :] = ln1(q_input[..., h, :])
@ W_Q[h] + b_Q[h]. A patch of one head's input so changes that head only. The q, k, v so made
reach the attention at its hook_q / hook_k / hook_v, ahead of any hook there, and attention runs
as usual from there (RoPE, caches, masks).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor

from ..hook_points import ModuleHooks, replacing

SPLIT_INPUT_POINTS = ("hook_attn_in", "hook_q_input", "hook_k_input", "hook_v_input")


def wants_split_inputs(hooks: ModuleHooks) -> bool:
    return any(p in hooks for p in SPLIT_INPUT_POINTS)


@contextmanager
def split_inputs(block: Any, x: Tensor, hooks: ModuleHooks) -> Iterator[None]:
    """Serve the per-head input points of `block` for its input x (B, T, C); inside the
    block, `block.attn(x, ...)` attends with the q, k, v made from them."""
    if x.dim() != 3:
        raise ValueError(
            "hook_attn_in / hook_q_input / hook_k_input / hook_v_input need padded input "
            f"(B, T, C); got {tuple(x.shape)}"
        )
    a = block.attn
    B, T, C = x.shape
    H, Hkv = a.num_heads, a.num_kv_heads
    # (B, T, C) -> (B, T, H, C); a copy, so a hook writing into it leaves resid_pre alone
    attn_in = hooks("hook_attn_in", x[:, :, None].expand(B, T, H, C).clone())
    q_in = hooks("hook_q_input", attn_in)
    kv_in = attn_in[:, :, :: H // Hkv]  # (B, T, Hkv, C)
    k_in = hooks("hook_k_input", kv_in)
    v_in = hooks("hook_v_input", kv_in)

    def norm(t: Tensor) -> Tensor:
        return block.norm1(t) if block.norm_first and block.norm1 is not None else t

    # Normalise each distinct input once: unpatched, all three are attn_in (or its kv rows),
    # so ln1's hooks fire once, as (B, T, H, ...) per head; a patched input is normalised alone.
    normed_in = norm(attn_in) if (q_in is attn_in or k_in is kv_in or v_in is kv_in) else None
    normed_q = normed_in if q_in is attn_in else norm(q_in)
    normed_k = normed_in[:, :, :: H // Hkv] if k_in is kv_in else norm(k_in)  # type: ignore[index]
    normed_v = normed_in[:, :, :: H // Hkv] if v_in is kv_in else norm(v_in)  # type: ignore[index]

    def project(normed: Tensor, W: Tensor, b: Tensor) -> Tensor:
        return torch.einsum("bthc,hcd->bthd", normed, W) + b  # (B, T, heads, D)

    values = {
        "hook_q": project(normed_q, a.W_Q, a.b_Q),  # type: ignore[arg-type]
        "hook_k": project(normed_k, a._W_K, a._b_K),
        "hook_v": project(normed_v, a._W_V, a._b_V),
    }
    with replacing(a, values):
        yield
