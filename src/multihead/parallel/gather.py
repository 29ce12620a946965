"""Reassemble a sharded sequence on every rank (for outputs, logits, checks): a collective.

Shapes: x (..., T_r, ...) along `dim` on each rank -> (..., T, ...) on every rank.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from .checks import check_group
from .layout import unshard_sequence


def gather_sequence(
    x: Tensor, *, dim: int, layout: str = "contiguous", group: dist.ProcessGroup | None = None
) -> Tensor:
    """Every rank's chunk of a sequence (along `dim`, in `layout`), joined in global order.

    Chunks may differ in length along `dim` (they are padded for the all-gather and trimmed);
    every other dimension must match. Not differentiable: use it for outputs and checks.
    """
    ring = check_group(group)
    if not isinstance(x, Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if isinstance(dim, bool) or not isinstance(dim, int) or not -x.dim() <= dim < x.dim():
        raise ValueError(
            f"dim must be an int in [{-x.dim()}, {x.dim()}) for x of shape "
            f"{tuple(x.shape)}, got {dim!r}"
        )
    dim %= x.dim()
    # (one host sync: every rank's length along dim)
    length = torch.tensor([x.shape[dim]], dtype=torch.long, device=x.device)
    lengths = [torch.empty_like(length) for _ in range(ring.size)]
    dist.all_gather(lengths, length, group=ring.group)
    sizes = [int(n) for n in torch.cat(lengths).tolist()]
    longest = max(sizes)
    pad_shape = list(x.shape)
    pad_shape[dim] = longest - x.shape[dim]
    padded = torch.cat([x, x.new_zeros(pad_shape)], dim=dim).contiguous()
    chunks = [torch.empty_like(padded) for _ in range(ring.size)]
    dist.all_gather(chunks, padded, group=ring.group)
    trimmed = [c.narrow(dim, 0, n) for c, n in zip(chunks, sizes, strict=True)]
    return unshard_sequence(trimmed, dim=dim, layout=layout)
