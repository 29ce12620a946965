"""MultiHeadAttention over packed sequences (`lengths=`): tokens (N, C) of several sequences
one after another, each attending to itself only; nothing computed on padding, no mask built.

Shape legend: N packed tokens, C embed_dim, H heads, D head_dim, L one run's length.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..functional.call import default_scale
from ..functional.varlen import VarLen, varlen_dispatch
from ..hook_points import ModuleHooks
from .attend import WEIGHT_POINTS


def refuse_with_lengths(
    key, value, mask, key_mask, cache, positions, return_weights, structure
) -> None:
    unsupported = {
        **structure,
        "key": key,
        "value": value,
        "mask": mask,
        "key_mask": key_mask,
        "cache": cache,
        "positions": positions,
        "return_weights": return_weights or None,
    }
    given = [name for name, arg in unsupported.items() if arg is not None]
    if given:
        raise ValueError(
            f"{', '.join(given)} cannot be combined with lengths: packed sequences are "
            "self-attention in which each sequence attends to itself only"
        )


def forward_packed(
    self: Any, query: Tensor, packed: VarLen, causal: bool, hooks: ModuleHooks | None
) -> Tensor:
    """Packed self-attention of `self`, a MultiHeadAttention (typed Any: that module imports
    this one): query (N, C) -> (N, C). Positions restart at 0 in each
    sequence (RoPE rotates by them; a bias scheme biases each run by its own slots)."""
    if not isinstance(query, Tensor) or query.dim() != 2 or query.shape[1] != self.embed_dim:
        got = tuple(query.shape) if isinstance(query, Tensor) else type(query).__name__
        raise ValueError(
            f"with lengths, query must be packed tokens (N, {self.embed_dim}), got {got}"
        )
    if not self.packed:
        raise ValueError(
            f"lengths need self-attention (kdim == vdim == embed_dim), this module has "
            f"kdim={self.kdim}, vdim={self.vdim}, embed_dim={self.embed_dim}"
        )
    if hooks is not None and (hooks.observers or any(p in hooks for p in WEIGHT_POINTS)):
        raise ValueError(
            "attention weights (hook_pattern, hook_attn_scores, capture) need padded input "
            "(B, T) with a key_mask; packed sequences (lengths=) have no (T, T) pattern"
        )
    packed.check(query, "query")
    x = query[None]  # (1, N, C): the projections see one long row of tokens
    q, k, v = self._project(x, x, x, True)  # (1, heads, N, D)
    if hooks is not None:  # shown as (1, N, heads, D): one row of all packed tokens
        q, k, v = hooks.heads("hook_q", q), hooks.heads("hook_k", k), hooks.heads("hook_v", v)
    bias = None
    if self.position is not None:
        if self.position.uses_positions:
            q, k = self.position.rotate(q, k, packed.positions(query.device))
            if hooks is not None:
                q, k = hooks.heads("hook_rot_q", q), hooks.heads("hook_rot_k", k)
        scheme = self.position

        def bias(length: int) -> Tensor | None:  # (1, H, L, L) for one run
            slots = torch.arange(length, device=query.device)
            return scheme.bias(slots, slots)

    # (1, heads, N, D) -> (N, heads, D): views
    q, k, v = (t[0].transpose(0, 1) for t in (q, k, v))
    out = varlen_dispatch(
        q,
        k,
        v,
        packed,
        causal,
        default_scale(self.head_dim),
        self.dropout if self.training else 0.0,
        bias=bias,
    )
    # (N, H, Dv) -> (1, H, N, Dv): the padded layout of one row, for the shared output step
    return self._output(out.transpose(0, 1)[None], hooks)[0]
