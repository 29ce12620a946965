"""Inputs and gradients shared by the structure and mask_mod tests: q/k/v of (B 2, H 3, D 8)
in fp64 with gradients, and the gradients of a fixed random weighting of an output."""

from __future__ import annotations

import torch

B, H, D = 2, 3, 8


def qkv(tq, tk, hkv=H, dtype=torch.float64):
    q = torch.randn(B, H, tq, D, dtype=dtype, requires_grad=True)
    k = torch.randn(B, hkv, tk, D, dtype=dtype, requires_grad=True)
    v = torch.randn(B, hkv, tk, D, dtype=dtype, requires_grad=True)
    return q, k, v


def grads(out, *inputs):
    g = torch.Generator().manual_seed(1)
    weight = torch.randn(out.shape, generator=g, dtype=torch.float64).to(out.dtype)
    return torch.autograd.grad((out * weight).sum(), inputs)
