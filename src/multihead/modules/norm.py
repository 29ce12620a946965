"""Normalisation layers: RMSNorm (Zhang & Sennrich 2019) beside torch's LayerNorm."""

from __future__ import annotations

import torch
from torch import Tensor, nn


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight, computed in fp32 and cast back."""

    def __init__(self, dim: int, eps: float = 1e-6, device=None, dtype=None) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, device=device, dtype=dtype))

    def forward(self, x: Tensor) -> Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return h.to(x.dtype) * self.weight


def make_norm(kind: str, dim: int, eps: float, **factory) -> nn.Module:
    if kind == "layernorm":
        return nn.LayerNorm(dim, eps=eps, **factory)
    if kind == "rmsnorm":
        return RMSNorm(dim, eps=eps, **factory)
    raise ValueError(f"unknown norm {kind!r}; choose 'layernorm' or 'rmsnorm'")
