"""Input checks of `MultiHeadAttention.forward`: where torch would fail obscurely (or not at all),
fail early with a message naming the argument and the shapes.

Checks read shapes, dtypes and devices only; the one value check (positions >= 0) runs in eager
mode on CPU tensors, where reading a value costs nothing, and never under tracing (see
`multihead.value_checks`).

Shapes: query (B, Tq, C) or unbatched (Tq, C); key (B, Tk, kdim); value (B, Tk, vdim);
key_mask (B, Tk); positions (Tq,) or (B, Tq).
"""

from __future__ import annotations

import numbers
from typing import NamedTuple

import torch
from torch import Tensor

from ..functional.mask_mod import MaskMod
from ..functional.structure import check_prefix_range
from ..value_checks import check_non_negative
from .quantized.linear import weight_like


class Inputs(NamedTuple):
    query: Tensor  # (B, Tq, C)
    key: Tensor | None  # (B, Tk, kdim); None: self-attention, or a filled cross cache
    value: Tensor | None  # (B, Tk, vdim)
    key_mask: Tensor | None  # (B, Tk), True = a real key
    self_attention: bool
    unbatched: bool


def _shape(t: object) -> object:
    return tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__


def check_tensor_input(name: str, t: object, width: int, weight: Tensor) -> None:
    """`t` is (B, T, width) or (T, width), floating, with the weights' dtype (or under autocast)
    and on their device."""
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() not in (2, 3) or t.shape[-1] != width:
        raise ValueError(
            f"{name} must have shape (B, T, {width}) or (T, {width}), got {tuple(t.shape)}"
        )
    if t.device != weight.device:
        raise ValueError(f"{name} is on {t.device} but the module's weights are on {weight.device}")
    if t.dtype != weight.dtype and not (
        t.is_floating_point() and torch.is_autocast_enabled(t.device.type)
    ):
        raise TypeError(
            f"{name} has dtype {t.dtype} but the module's weights are {weight.dtype}; convert "
            f"one of them (e.g. module.to({t.dtype})) or run under torch.autocast"
        )


def check_key_mask(key_mask: object, batch: int, keys: int, device: torch.device) -> Tensor:
    """A boolean (B, Tk) key mask on the inputs' device, True = a real key."""
    if not isinstance(key_mask, Tensor):
        raise TypeError(f"key_mask must be a torch.Tensor or None, got {type(key_mask).__name__}")
    if key_mask.dtype != torch.bool:
        raise TypeError(
            f"key_mask must be boolean (True = a real key), got dtype {key_mask.dtype}; "
            "convert a 1/0 padding mask with masks.from_hf_padding"
        )
    if tuple(key_mask.shape) != (batch, keys):
        raise ValueError(
            f"key_mask must have shape (B, Tk) = {(batch, keys)}, got {tuple(key_mask.shape)}"
        )
    if key_mask.device != device:
        raise ValueError(f"key_mask is on {key_mask.device} but the inputs are on {device}")
    return key_mask


def check_positions(
    positions: object, batch: int, length: int, device: torch.device, *, values: bool = True
) -> Tensor:
    """Integer positions (T,) or (B, T) for this call's T tokens, on the inputs' device, >= 0
    (the values read where that is free, unless `values=False`: a caller that checked them)."""
    if not isinstance(positions, Tensor):
        raise TypeError(f"positions must be a torch.Tensor or None, got {type(positions).__name__}")
    if positions.is_floating_point() or positions.is_complex() or positions.dtype == torch.bool:
        raise TypeError(f"positions must be an integer tensor, got dtype {positions.dtype}")
    # Rank first, then sizes: comparing tuples of different ranks elementwise would make a
    # tracer guard on unrelated sizes being equal (e.g. T != B under torch.export).
    shape = positions.shape
    if not (
        (len(shape) == 1 and shape[0] == length)
        or (len(shape) == 2 and shape[0] == batch and shape[1] == length)
    ):
        raise ValueError(
            f"positions must have shape (T,) = ({length},) or (B, T) = ({batch}, {length}) for "
            f"this call's {length} tokens, got {tuple(positions.shape)}"
        )
    if positions.device != device:
        raise ValueError(f"positions is on {positions.device} but the inputs are on {device}")
    if values:
        check_non_negative("positions", positions)
    return positions


def batch_inputs(
    module,
    query: Tensor,
    key: Tensor | None,
    value: Tensor | None,
    key_mask: Tensor | None,
    cross_cache: bool,
) -> Inputs:
    """Check the inputs of one padded call and bring them to batched form."""
    weight = weight_like(module.out_proj)
    check_tensor_input("query", query, module.embed_dim, weight)
    if value is not None and key is None:
        raise ValueError("value given without key: pass key (and value) for cross-attention")
    self_attention = not cross_cache and (
        key is None or (key is query and (value is None or value is query))
    )
    if self_attention:
        key = value = None
    elif key is not None:
        value = key if value is None else value
        check_tensor_input("key", key, module.kdim, weight)
        check_tensor_input("value", value, module.vdim, weight)
        if not query.dim() == key.dim() == value.dim():
            raise ValueError(
                f"query {_shape(query)}, key {_shape(key)} and value {_shape(value)} must all be "
                "batched (3-D) or all unbatched (2-D)"
            )
        if query.dim() == 3 and not query.shape[0] == key.shape[0] == value.shape[0]:
            raise ValueError(
                f"batch sizes differ: query {_shape(query)}, key {_shape(key)}, "
                f"value {_shape(value)}"
            )
        if key.shape[-2] != value.shape[-2]:
            raise ValueError(
                f"key {_shape(key)} and value {_shape(value)} must have the same length"
            )
    unbatched = query.dim() == 2
    if unbatched:  # (T, C) -> (1, T, C); a key mask (Tk,) -> (1, Tk)
        query = query[None]
        key = None if key is None else key[None]
        value = None if value is None else value[None]
        if isinstance(key_mask, Tensor) and key_mask.dim() == 1:
            key_mask = key_mask[None]
    return Inputs(query, key, value, key_mask, self_attention, unbatched)


def positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def narrowest(
    window: int | tuple[int, int] | None, cached: int | None
) -> int | tuple[int, int] | None:
    """The caller's window and a cache's together (each side the narrower of the two)."""
    if window is None or cached is None:
        return window if cached is None else cached
    if isinstance(window, numbers.Integral) and not isinstance(window, bool):
        return min(int(window), cached)  # (numpy ints too, as make_call takes them)
    if isinstance(window, (tuple, list)) and len(window) == 2:
        return (min(window[0], cached - 1), min(window[1], cached - 1))
    return window  # malformed: make_call names it


def structure_after_dropped_keys(
    documents: Tensor | None,
    prefix: int | Tensor | None,
    mask_mod: MaskMod | None,
    dropped: int,
    tk: int,
) -> tuple[Tensor | None, int | Tensor | None, MaskMod | None]:
    """documents, prefix and mask_mod of a call whose cache no longer holds its first
    `dropped` tokens (a window cache), moved from token positions (what the caller counts:
    documents (B, dropped + Tk) cover every token so far, a prefix of P tokens, mask_mod's
    q_idx / kv_idx) to positions among the Tk keys handed out (what attention counts).
    Ranges are checked here, against the tokens so far; dtypes and devices by make_call."""
    total = dropped + tk
    if isinstance(documents, Tensor) and documents.dim() == 2:
        if documents.shape[1] != total:
            raise ValueError(
                f"documents must cover every token so far: shape ({documents.shape[0]}, "
                f"{total}) ({dropped} earlier tokens the window cache dropped, {tk} keys), "
                f"got {tuple(documents.shape)}"
            )
        documents = documents[:, dropped:]
    if isinstance(prefix, int) and not isinstance(prefix, bool):
        check_prefix_range(prefix, total, f"{total} (the tokens so far)")
        prefix = max(prefix - dropped, 0)
    elif isinstance(prefix, Tensor) and not (
        prefix.is_floating_point() or prefix.dtype == torch.bool
    ):
        check_prefix_range(prefix, total, f"{total} (the tokens so far)")
        prefix = (prefix - dropped).clamp(min=0)
    if callable(mask_mod):
        user = mask_mod

        def shifted(b, h, q_idx, kv_idx):  # (positions among the keys -> token positions)
            return user(b, h, q_idx + dropped, kv_idx + dropped)

        mask_mod = shifted
    return documents, prefix, mask_mod


SLOTS_REFUSE_STRUCTURE = (
    "window=, documents=, prefix= and mask_mod= need keys in position order; this "
    "StaticKVCache keeps them in slots (give the cache its window= instead)"
)


def structure_args(window, documents, prefix, mask_mod, block_size) -> dict:
    """The structure arguments by name (for the paths that pass them on or refuse them)."""
    return {
        "window": window,
        "documents": documents,
        "prefix": prefix,
        "mask_mod": mask_mod,
        "block_size": block_size,
    }
