"""TransformerBlock: attention and feed-forward, each in a residual branch with a norm.

post-norm (BERT):  x = norm1(x + drop(attn(x)));  x = norm2(x + drop(ffn(x)))
pre-norm (GPT-2):  x = x + drop(attn(norm1(x)));  x = x + drop(ffn(norm2(x)))

Shapes: (B, T, C) in and out.
"""

from __future__ import annotations

from torch import Tensor, nn

from .attention import MultiHeadAttention
from .feedforward import FeedForward


class TransformerBlock(nn.Module):
    def __init__(
        self,
        dim: int,
        num_heads: int,
        ffn_dim: int,
        *,
        norm_first: bool = False,
        norm_eps: float = 1e-5,
        activation: str = "gelu",
        bias: bool = True,
        dropout: float = 0.0,
        attn_dropout: float = 0.0,
        causal: bool = False,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.norm_first = norm_first
        self.attn = MultiHeadAttention(
            dim, num_heads, bias=bias, dropout=attn_dropout, causal=causal, **factory
        )
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps, **factory)
        self.ffn = FeedForward(dim, ffn_dim, activation_name=activation, bias=bias, **factory)
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps, **factory)
        self.dropout = nn.Dropout(dropout)

    def forward(
        self,
        x: Tensor,
        *,
        mask: Tensor | None = None,
        key_mask: Tensor | None = None,
        return_weights: bool = False,
    ):
        """x (B, T, C) -> (B, T, C) [, attention weights (B, H, T, T)]."""
        weights = None
        h = self.norm1(x) if self.norm_first else x
        a = self.attn(h, mask=mask, key_mask=key_mask, return_weights=return_weights)
        if return_weights:
            a, weights = a
        if self.norm_first:
            x = x + self.dropout(a)
            x = x + self.dropout(self.ffn(self.norm2(x)))
        else:
            x = self.norm1(_residual(self.dropout(a), x))
            x = self.norm2(_residual(self.dropout(self.ffn(x)), x))
        return (x, weights) if return_weights else x


def _residual(branch: Tensor, x: Tensor) -> Tensor:
    """branch + x; in place into the branch's fresh output when autograd does not need it
    (inference), which saves allocating and page-faulting a new (B, T, C) buffer."""
    if branch.requires_grad or x.requires_grad:
        return branch + x
    return branch.add_(x)
