"""Mask helpers. Inside multihead every mask is boolean with True = may attend (SDPA's convention).

Other conventions are converted here, once, at the edges:
- torch.nn.MultiheadAttention: boolean True = blocked  -> `from_torch_mha`
- Hugging Face: integer 1 = real token, 0 = padding   -> `from_hf_padding`

Shapes: attention masks broadcast to (B, H, Tq, Tk); key masks are (B, Tk), True = a real key.
"""

from __future__ import annotations

import numbers
from typing import Literal

import torch
from torch import Tensor

from ..value_checks import may_read

Align = Literal["bottom_right", "top_left"]


def _offset(tq: int, tk: int, align: str) -> int:
    """Position of query 0 among the keys; bottom-right puts the last query on the last key."""
    if align == "bottom_right":
        return tk - tq
    if align == "top_left":
        return 0
    raise ValueError(f"align must be 'bottom_right' or 'top_left', got {align!r}")


def _check_length(name: str, value: int) -> None:
    if isinstance(value, torch.SymInt):  # a traced size (export): non-negative by construction
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative int, got {value!r}")


def causal(tq: int, tk: int | None = None, *, align: Align = "bottom_right", device=None) -> Tensor:
    """(Tq, Tk) mask where query i may see keys 0 .. i + offset.

    `align="bottom_right"` (offset Tk - Tq) is what decoding with a KV cache needs;
    `align="top_left"` (offset 0) is torch SDPA's `is_causal`.
    """
    tk = tq if tk is None else tk
    _check_length("tq", tq)
    _check_length("tk", tk)
    return torch.ones(tq, tk, dtype=torch.bool, device=device).tril(_offset(tq, tk, align))


def sliding_window(
    tq: int,
    tk: int | None,
    window: int,
    *,
    causal: bool = True,
    align: Align = "bottom_right",
    device=None,
) -> Tensor:
    """(Tq, Tk) mask where query i sees only keys within `window` positions of its own.

    Causal: keys p-window+1 .. p (p = i + offset, the query's position); otherwise |p - j| < window.
    """
    tk = tq if tk is None else tk
    _check_length("tq", tq)
    _check_length("tk", tk)
    if isinstance(window, bool) or not isinstance(window, numbers.Integral) or window < 1:
        raise ValueError(f"window must be a positive int, got {window!r}")
    # (wider restricts nothing; capped, `dist < window` stays in int64; numpy ints too)
    window = min(int(window), tq + tk)
    pos = torch.arange(tq, device=device)[:, None] + _offset(tq, tk, align)  # (Tq, 1)
    keys = torch.arange(tk, device=device)[None, :]  # (1, Tk)
    dist = pos - keys
    if causal:
        return (dist >= 0) & (dist < window)
    return dist.abs() < window


def padding(lengths: Tensor | list[int], max_len: int | None = None) -> Tensor:
    """(B, T) key mask from per-row lengths, True = a real token (the first `lengths[b]`)."""
    lengths = torch.as_tensor(lengths)
    if lengths.dim() != 1 or lengths.is_floating_point() or lengths.dtype == torch.bool:
        raise TypeError(
            f"lengths must be a 1-D integer tensor or list, got shape {tuple(lengths.shape)} "
            f"and dtype {lengths.dtype}"
        )
    if lengths.numel() and int(lengths.min()) < 0:
        raise ValueError(f"lengths must be non-negative, got {lengths.tolist()}")
    longest = int(lengths.max()) if lengths.numel() else 0
    if max_len is None:
        max_len = longest
    elif max_len < longest:
        raise ValueError(f"max_len={max_len} is shorter than the longest length {longest}")
    return torch.arange(max_len, device=lengths.device)[None, :] < lengths[:, None]


def combine(*masks: Tensor | None) -> Tensor | None:
    """Logical AND of the masks that are not None (broadcasting); None when all are None."""
    out: Tensor | None = None
    for m in masks:
        if m is None:
            continue
        if m.dtype != torch.bool:
            raise TypeError(f"masks to combine must be boolean, got dtype {m.dtype}")
        out = m if out is None else out & m
    return out


def from_torch_mha(mask: Tensor) -> Tensor:
    """torch.nn.MultiheadAttention's boolean mask (True = blocked) -> True = may attend."""
    if mask.dtype != torch.bool:
        raise TypeError(
            f"from_torch_mha converts boolean masks; got dtype {mask.dtype} "
            "(torch's float masks are additive: pass them as bias=)"
        )
    return ~mask


def from_hf_padding(attention_mask: Tensor, *, always: bool = False) -> Tensor:
    """Hugging Face padding mask (B, T) of 1 = token, 0 = padding -> boolean key mask.

    Values other than 0 and 1 are refused where reading them is free (eager mode, CPU
    tensors), or on any device with `always` (one host read: once per `generate` call);
    elsewhere (GPU forward calls, torch.compile, torch.export) nonzero counts as a token, as in
    Hugging Face, and no host sync is made."""
    if attention_mask.dim() != 2:
        raise ValueError(
            f"attention_mask must have shape (B, T), got {tuple(attention_mask.shape)}"
        )
    if attention_mask.dtype == torch.bool:
        return attention_mask
    if may_read(attention_mask, always) and not bool(
        ((attention_mask == 0) | (attention_mask == 1)).all()
    ):
        raise ValueError("attention_mask must hold only 0 (padding) and 1 (token)")
    return attention_mask != 0


def to_bias(mask: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """Boolean mask -> additive bias: 0 where allowed, the dtype's finite minimum where not."""
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must be boolean, got dtype {mask.dtype}")
    bias = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return bias.masked_fill_(~mask, torch.finfo(dtype).min)
