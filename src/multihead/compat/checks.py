"""Input checks of the drop-in: the inputs torch.nn.MultiheadAttention rejects, rejected with a
ValueError/TypeError that names the argument and the shapes (torch raises AssertionError or a
RuntimeError from deep inside).

Layouts: batched `(B, L, E)` with batch_first, else `(L, B, E)`; unbatched `(L, E)`.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _shape(t: Tensor) -> tuple[int, ...]:
    return tuple(t.shape)


def _check_mask_dtype(name: str, mask: object) -> None:
    if mask is None:
        return
    if not isinstance(mask, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or None, got {type(mask).__name__}")
    if mask.dtype != torch.bool and not mask.is_floating_point():
        raise TypeError(
            f"{name} must be bool (True = blocked) or floating point (added), got {mask.dtype}"
        )


def check_types(
    query: object,
    key: object,
    value: object,
    key_padding_mask: object,
    attn_mask: object,
) -> None:
    """Tensors where torch wants tensors; masks boolean or floating point."""
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.is_nested:
            raise TypeError(
                f"{name} is a NestedTensor, which the drop-in does not take: pad it "
                "(torch.nested.to_padded_tensor) and pass key_padding_mask"
            )
    _check_mask_dtype("key_padding_mask", key_padding_mask)
    _check_mask_dtype("attn_mask", attn_mask)


def check_forward(
    module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    key_padding_mask: Tensor | None,
    attn_mask: Tensor | None,
    *,
    mask_required: bool,
    mask_used: bool,
) -> bool:
    """Validate shapes like torch's `_mha_shape_check` and friends; returns whether the inputs
    are batched. `mask_required`: torch's standard path needs `attn_mask` with `is_causal`.
    `mask_used`: torch applies `attn_mask` (it checks only its rank when it trusts the causal
    hint instead, except for an unbatched 3-D mask)."""
    if query.dim() not in (2, 3):
        raise ValueError(
            f"query must be unbatched 2-D (L, E) or batched 3-D, got shape {_shape(query)}"
        )
    batched = query.dim() == 3
    if key.dim() != query.dim() or value.dim() != query.dim():
        raise ValueError(
            f"query {_shape(query)}, key {_shape(key)} and value {_shape(value)} must all be "
            f"{query.dim()}-D"
        )
    E, H = module.embed_dim, module.num_heads
    if query.shape[-1] != E:
        raise ValueError(f"query {_shape(query)} must have embed_dim={E} as its last dimension")
    if key.shape[-1] != module.kdim:
        raise ValueError(f"key {_shape(key)} must have kdim={module.kdim} as its last dimension")
    if value.shape[-1] != module.vdim:
        raise ValueError(
            f"value {_shape(value)} must have vdim={module.vdim} as its last dimension"
        )
    if key.shape[:-1] != value.shape[:-1]:
        raise ValueError(
            f"key {_shape(key)} and value {_shape(value)} must agree in batch and sequence length"
        )
    seq = 1 if batched and module.batch_first else 0
    L, S = query.shape[seq], key.shape[seq]
    B = query.shape[1 - seq] if batched else 1
    if batched and key.shape[1 - seq] != B:
        raise ValueError(f"batch sizes of query {_shape(query)} and key {_shape(key)} differ")
    if key_padding_mask is not None:
        want = (B, S) if batched else (S,)
        if _shape(key_padding_mask) != want:
            raise ValueError(
                f"key_padding_mask must have shape {want} (batch, source length), "
                f"got {_shape(key_padding_mask)}"
            )
    if attn_mask is not None and attn_mask.dim() not in (2, 3):
        raise ValueError(f"attn_mask must be 2-D or 3-D, got shape {_shape(attn_mask)}")
    if attn_mask is not None and (mask_used or (not batched and attn_mask.dim() == 3)):
        allowed = [(L, S), (B * H, L, S) if batched else (H, L, S)]
        if _shape(attn_mask) not in allowed:
            raise ValueError(
                f"attn_mask must have shape {allowed[0]} or {allowed[1]} "
                f"(num_heads={H}), got {_shape(attn_mask)}"
            )
    if mask_required and attn_mask is None:
        raise ValueError(
            "is_causal=True is a hint that attn_mask is causal, so attn_mask is required "
            "(as in torch); nn.Transformer.generate_square_subsequent_mask makes one"
        )
    return batched
