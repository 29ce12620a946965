"""Norms of queries and keys after their projections (q/k norm): per head (Qwen3, Gemma 3: one
RMSNorm of head_dim shared by every head) or over the whole projection (OLMo 2: one RMSNorm of
heads * head_dim, as transformers applies it before splitting heads).

Shapes: x (B, H, T, D) in and out.
"""

from __future__ import annotations

from torch import Tensor

from .norm import RMSNorm

QK_NORM_KINDS = ("head", "width")


class HeadNorm(RMSNorm):
    """RMSNorm of queries or keys (B, H, T, D): over D (`over="head"`, weight (D,)) or over
    H * D (`over="width"`, weight (H * D,)). Hook points as RMSNorm's (hook_scale,
    hook_normalized), seen as (B, H, T, D) or, over the width, (B, T, H * D)."""

    def __init__(
        self,
        over: str,
        heads: int,
        head_dim: int,
        eps: float = 1e-6,
        offset: float = 0.0,
        device=None,
        dtype=None,
    ) -> None:
        if over not in QK_NORM_KINDS:
            raise ValueError(f"unknown q/k norm {over!r}; choose 'head' or 'width'")
        width = head_dim if over == "head" else heads * head_dim
        super().__init__(width, eps, device, dtype, offset=offset)
        self.over = over

    def forward(self, x: Tensor) -> Tensor:
        if self.over == "head":
            return super().forward(x)
        B, H, T, D = x.shape
        flat = x.transpose(1, 2).reshape(B, T, H * D)  # (B, H, T, D) -> (B, T, H * D)
        return super().forward(flat).view(B, T, H, D).transpose(1, 2)  # -> (B, H, T, D)

    def extra_repr(self) -> str:
        return f"over={self.over}, " + super().extra_repr()
