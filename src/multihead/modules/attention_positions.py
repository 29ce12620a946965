"""Where a MultiHeadAttention call's positions come in: rotating queries and keys (RoPE) and
the additive bias of a bias scheme (ALiBi, relative), over the slots a KV cache places keys in.

Shape legend: B batch, H heads, T this call's tokens, D head_dim.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..hook_points import ModuleHooks
from ..positional.scheme import PositionScheme
from .attention_inputs import Inputs, check_positions
from .cache import KeySet, KVCache


def rotate_by_position(
    scheme: PositionScheme | None,
    q: Tensor,
    k: Tensor,
    x: Inputs,
    cache: KVCache | None,
    positions: Tensor | None,
    hooks: ModuleHooks | None,
) -> tuple[Tensor, Tensor]:
    """Rotate this call's queries and keys by their positions (when the scheme does)."""
    if scheme is None or not scheme.uses_positions:
        if positions is not None:
            what = "no position scheme" if scheme is None else type(scheme).__name__
            raise ValueError(
                f"positions were given but this attention has {what}, which does not use "
                "them (RoPE does)"
            )
        return q, k
    if not x.self_attention:
        raise ValueError(
            f"{type(scheme).__name__} applies to self-attention; this call attends to other keys"
        )
    B, _, T, _ = q.shape
    if positions is None:  # after the cached tokens, or from 0
        positions = (
            torch.arange(T, device=q.device) if cache is None else cache.next_positions(T, q.device)
        )
    else:
        positions = check_positions(positions, B, T, q.device)
    q, k = scheme.rotate(q, k, positions)
    if hooks is not None:
        q, k = hooks.heads("hook_rot_q", q), hooks.heads("hook_rot_k", k)
    return q, k


def position_bias(scheme: PositionScheme, tq: int, keys: KeySet) -> Tensor | None:
    """The position scheme's additive bias over (query slots, key slots), if it has one."""
    device = keys.k.device
    q_index = torch.arange(tq, device=device) + keys.first_slot
    k_index = keys.key_slots
    if k_index is None:
        k_index = torch.arange(keys.k.shape[2], device=device)
    return scheme.bias(q_index, k_index)
