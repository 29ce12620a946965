"""`attention()`: the one pure function every multihead module calls.

Shapes: q (B, H, Tq, D), k (B, Hkv, Tk, D), v (B, Hkv, Tk, Dv) -> (B, H, Tq, Dv)
[, weights (B, H, Tq, Tk)].
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..hook_points import FUNCTION, hooks_for
from .backends import (
    SDPA_BACKEND,
    available_backends,
    get_backend,
    select_backend,
)
from .backends.eager import eager_attention
from .backends.registry import _PLAIN_ORDER as _plain_order
from .backends.sdpa import NAN_QUIRK_KEYS, sdpa_plain
from .backends.sdpa import _is_compiling as sdpa_is_compiling
from .backends.sdpa import _sdpa as sdpa_kernel
from .call import AttentionCall, dense_call, make_call
from .mask_mod import MaskMod


def dispatch(call: AttentionCall, backend: str = "auto") -> tuple[Tensor, Tensor | None]:
    """Run a validated `AttentionCall` (see `make_call`) on `backend`: every attention in
    multihead passes here (a module's plain call through `dispatch_plain`, which runs the
    kernel call this would choose). A backend that cannot read structure gets the dense
    mask."""
    chosen = select_backend(call, backend)
    if call.structure is None or chosen.structured:
        return chosen.run(call)
    return chosen.run(dense_call(call))


def dispatch_plain(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    causal: bool,
    dropout_p: float,
    mask: Tensor | None = None,
    window: int | None = None,
) -> Tensor:
    """`dispatch(make_call(q, k, v, mask=mask, causal=causal, dropout_p=dropout_p,
    window=window, qkv_checked=True))`'s output, for a caller that shaped q, k, v itself and
    checked `causal` and `dropout_p` (a module's plain path). Where `auto` would hand the call
    to the built-in sdpa backend as one kernel call (no mask or window, the sdpa backend
    registered and asked first, no empty length, causality the kernel's own), that call runs
    without building the `AttentionCall`: the same kernel, arguments and result (measured on
    `multihead bench attention`'s small calls, 201-round medians of per-round ratios: decode
    step 1.15x-1.17x -> 1.13x-1.14x of the floor, eval 1.12x-1.14x -> 1.09x-1.11x)."""
    # (the registry's list read here: first_plain_backend() is one call more per step)
    if mask is None and window is None and _plain_order and _plain_order[0] is SDPA_BACKEND:
        tq, tk, d = q.shape[2], k.shape[2], q.shape[3]
        # The common call (a decode step, whose one query sees every key; a call without
        # causality), as `sdpa_plain` runs it, written out: at small shapes each Python call
        # costs ~1% of the call (more than it takes alone: run between kernels, Python runs
        # with cold caches). No causal flag or dropout (no keywords; grouped heads: one), no
        # NaN correction where sdpa_plain makes none (the key count read only in eager mode
        # on CPU: compiled, it would be a guard).
        if (
            dropout_p == 0.0
            and (tq == 1 or not causal)
            and d > 0
            and tq != 0
            and tk != 0
            and (not q.is_cpu or (not sdpa_is_compiling() and tk >= NAN_QUIRK_KEYS))
        ):
            if q.shape[1] == k.shape[1]:
                return sdpa_kernel(q, k, v, scale=d**-0.5)
            return sdpa_kernel(q, k, v, scale=d**-0.5, enable_gqa=True)  # (B, Hkv, ...)
        out = sdpa_plain(q, k, v, causal, dropout_p)
        if out is not None:
            return out
    call = make_call(
        q, k, v, mask=mask, causal=causal, dropout_p=dropout_p, window=window, qkv_checked=True
    )
    return dispatch(call)[0]


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: Tensor | None = None,
    bias: Tensor | None = None,
    causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
    return_weights: bool = False,
    backend: str = "auto",
    window: int | tuple[int, int] | None = None,
    documents: Tensor | None = None,
    prefix: int | Tensor | None = None,
    mask_mod: MaskMod | None = None,
    block_size: int | tuple[int, int] | None = None,
    softcap: float | None = None,
    sinks: Tensor | None = None,
):
    """Scaled dot-product attention over heads, with grouped-query support.

    Args:
        q: queries `(B, H, Tq, D)`.
        k: keys `(B, Hkv, Tk, D)`; `Hkv` must divide `H` (query head h reads kv head
            `h // (H // Hkv)`, as torch's `enable_gqa`).
        v: values `(B, Hkv, Tk, Dv)`.
        mask: boolean, **True = may attend**, broadcastable to `(B, H, Tq, Tk)`.
        bias: float, added to the scores (ALiBi, relative positions), same broadcasting.
            `-inf` entries block keys like the mask does.
        causal: query i may see keys `0 .. i + Tk - Tq` (aligned bottom-right, as decoding
            with a KV cache needs). Combines with `mask` and `bias`.
        scale: multiplies `q @ k^T`; defaults to `1 / sqrt(D)`.
        softcap: logit soft-capping (Gemma 2): the scaled scores s become
            `tanh(s / softcap) * softcap`, before `bias` and the mask are applied.
        sinks: `(H,)` per-head sink logits (gpt-oss): each row's softmax gets one more column,
            the head's sink logit (not scaled or capped), whose probability is dropped; it
            takes mass from the keys and contributes no value. Weights then sum to less
            than 1; a row with no allowed key is still zeros.
        dropout_p: dropout on the attention probabilities (apply it only in training).
        return_weights: also return the weights `(B, H, Tq, Tk)` (after dropout, as torch does);
            this runs the eager backend.
        backend: a registered backend name, or "auto" for the fastest that can run the call.
        window: an int W: query at position p sees keys within W positions (p - W + 1 .. p with
            causal, as `masks.sliding_window`); or a (left, right) pair: keys p - left ..
            p + right.
        documents: `(B, Tk)` integer document ids: a query sees only keys of its own document
            (causally inside it when causal). Queries are the last Tq positions.
        prefix: an int P or a `(B,)` integer tensor (needs causal): prefix-LM, the first P
            positions see each other both ways.
        mask_mod: a function `mask_mod(b, h, q_idx, kv_idx)` -> boolean tensor (True = may
            attend), as FlexAttention's: called with broadcastable integer index tensors;
            `h` is the query head, `q_idx` the query's position among the keys
            (i + Tk - Tq, bottom-right; i itself when Tq == Tk). See `functional.mask_mod`.
        block_size: the tile (an int, or a (queries, keys) pair; default 128) the tiled
            backend evaluates mask_mod on and classifies by (all False: skipped; all True: no
            mask); it must divide Tq and Tk. Only with mask_mod.
        Window, documents, prefix and mask_mod reach the backends as structure, not as a
        (Tq, Tk) mask: the tiled backend computes only the tiles with an allowed pair (see
        `functional.structure`); they combine with mask, bias, causal and grouped-query heads.

    A query row that may attend to nothing returns zeros (output, weights and gradients).

    Returns:
        the output `(B, H, Tq, Dv)`, or `(output, weights)` when `return_weights=True`.
    """
    call = make_call(
        q,
        k,
        v,
        mask=mask,
        bias=bias,
        causal=causal,
        scale=scale,
        dropout_p=dropout_p,
        return_weights=return_weights,
        window=window,
        documents=documents,
        prefix=prefix,
        mask_mod=mask_mod,
        block_size=block_size,
        softcap=softcap,
        sinks=sinks,
    )
    out, weights = dispatch(call, backend)
    hooks = hooks_for(FUNCTION)  # only `capture()` without a model observes bare calls
    if hooks is not None:
        with torch.no_grad():
            side = dense_call(call)._replace(dropout_p=0.0, return_weights=True)
            _, pattern = eager_attention(side)
        assert pattern is not None
        hooks.observe(call, pattern)
    if return_weights:
        return out, weights
    return out


@dataclass(frozen=True)
class Explanation:
    """Which backend `attention()` would run for some inputs, and why the others would not."""

    chosen: str
    reasons: dict[str, list[str]]  # backend name -> reasons it cannot run (empty: it can)
    # backends that can run the call but that auto passes over for it (their cost rule)
    not_preferred: tuple[str, ...] = ()

    def __str__(self) -> str:
        lines = [f"backend: {self.chosen}"]
        for name, why in self.reasons.items():
            if name == self.chosen:
                continue
            can = "can run (lower priority)"
            if name in self.not_preferred:
                can = "can run, but auto does not pick it for this call (its cost rule)"
            lines.append(f"  {name}: " + ("; ".join(why) if why else can))
        return "\n".join(lines)


def explain(q: Tensor, k: Tensor, v: Tensor, **kwargs) -> Explanation:
    """Tell which backend `attention(q, k, v, **kwargs)` would run, and why the others would not."""
    backend = kwargs.pop("backend", "auto")
    known = {"mask", "bias", "causal", "scale", "dropout_p", "return_weights"}
    known |= {"window", "documents", "prefix", "mask_mod", "block_size", "softcap", "sinks"}
    unknown = set(kwargs) - known
    if unknown:
        raise TypeError(f"explain() got unexpected keyword arguments: {sorted(unknown)}")
    call = make_call(q, k, v, **kwargs)
    reasons = {name: get_backend(name).why_not(call) for name in available_backends()}
    passed = tuple(
        name
        for name in available_backends()
        if (rule := get_backend(name).prefer) is not None and not rule(call)
    )
    return Explanation(select_backend(call, backend).name, reasons, passed)
