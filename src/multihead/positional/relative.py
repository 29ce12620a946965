"""Bucketed relative position bias (T5, Raffel et al. 2020; MPNet): one learned scalar per
(distance bucket, head), added to the attention scores.

Distances up to `num_buckets / 4` (bidirectional) each get a bucket of their own; longer ones
share logarithmically wider buckets up to `max_distance`, beyond which all share the last.
Bidirectional: keys before and after the query use separate halves of the table.

Layers that share one table (MPNet: one table for the whole encoder) each hold a
`SharedPosition` view of it: the table is registered once, by the model that owns it, so it
appears once in `state_dict()` and `parameters()`.

Shapes: weight (num_buckets, H), as Hugging Face's `relative_attention_bias` Embedding;
q_index (Tq,), k_index (Tk,); bias (1, H, Tq, Tk).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .scheme import PositionScheme


def relative_position_bucket(
    relative: Tensor, *, num_buckets: int = 32, max_distance: int = 128, bidirectional: bool = True
) -> Tensor:
    """Bucket indices in [0, num_buckets) of integer distances `relative` = key slot - query
    slot (any shape). Computed in fp32 as T5 and transformers' MPNet do, so the rounding at
    bucket edges is theirs."""
    buckets = torch.zeros_like(relative)
    n = -relative  # how far the key lies before the query
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (n < 0).long() * num_buckets  # keys after the query: upper half
        n = n.abs()
    else:
        n = n.clamp(min=0)  # causal: keys after the query share bucket 0
    max_exact = num_buckets // 2
    is_small = n < max_exact
    # log-spaced buckets from max_exact to max_distance; n is clamped so log never sees 0
    # (those entries take the `is_small` branch anyway)
    large = (
        max_exact
        + (
            torch.log(n.clamp(min=max_exact).float() / max_exact)
            / math.log(max_distance / max_exact)
            * (num_buckets - max_exact)
        ).long()
    )
    large = large.clamp(max=num_buckets - 1)
    return buckets + torch.where(is_small, n, large)


class RelativePositionBias(PositionScheme):
    """`MultiHeadAttention(position=RelativePositionBias(H))`: a learned bias per head from the
    bucketed distance between query and key slots. Slots, not token positions: padding at
    either end leaves the distances between real tokens unchanged, and packed sequences
    (`lengths=`) restart at slot 0 in each sequence."""

    def __init__(
        self,
        num_heads: int,
        *,
        num_buckets: int = 32,
        max_distance: int = 128,
        bidirectional: bool = True,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        for name, value in (("num_heads", num_heads), ("max_distance", max_distance)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        smallest = 4 if bidirectional else 2  # at least two exact and one log bucket per side
        if isinstance(num_buckets, bool) or not isinstance(num_buckets, int):
            raise ValueError(f"num_buckets must be an int, got {num_buckets!r}")
        if num_buckets < smallest:
            raise ValueError(f"num_buckets must be at least {smallest}, got {num_buckets}")
        max_exact = (num_buckets // 2 if bidirectional else num_buckets) // 2
        if max_distance <= max_exact:
            raise ValueError(
                f"max_distance must exceed the {max_exact} distances that get exact buckets, "
                f"got {max_distance}"
            )
        self.num_heads, self.num_buckets = num_heads, num_buckets
        self.max_distance, self.bidirectional = max_distance, bidirectional
        self.weight = nn.Parameter(torch.zeros(num_buckets, num_heads, device=device, dtype=dtype))

    def extra_repr(self) -> str:
        return (
            f"num_heads={self.num_heads}, num_buckets={self.num_buckets}, "
            f"max_distance={self.max_distance}, bidirectional={self.bidirectional}"
        )

    def check(self, num_heads: int, head_dim: int) -> None:
        if num_heads != self.num_heads:
            raise ValueError(
                f"RelativePositionBias has a bias for {self.num_heads} heads but the attention "
                f"has {num_heads} heads: build it as RelativePositionBias({num_heads})"
            )

    def buckets(self, q_index: Tensor, k_index: Tensor) -> Tensor:
        """(Tq, Tk) bucket of each (query slot, key slot) pair."""
        relative = k_index[None, :] - q_index[:, None]  # (Tq, Tk)
        return relative_position_bucket(
            relative,
            num_buckets=self.num_buckets,
            max_distance=self.max_distance,
            bidirectional=self.bidirectional,
        )

    def bias(self, q_index: Tensor, k_index: Tensor) -> Tensor:
        """(1, H, Tq, Tk) in the table's dtype."""
        table = self.weight[self.buckets(q_index, k_index)]  # (Tq, Tk, H)
        return table.permute(2, 0, 1)[None]  # (Tq, Tk, H) -> (1, H, Tq, Tk)

    def shared(self) -> SharedPosition:
        """A view of this table for one more layer (see `SharedPosition`)."""
        return SharedPosition(self)


class SharedPosition(PositionScheme):
    """Another module's position scheme, used by this layer but owned (registered) elsewhere.

    Each layer's attention holds its own view, so no module is registered under every layer:
    the owner's parameters appear once in `state_dict()`, `parameters()` and key maps, under
    the owner's name. The owner must be registered in the model (else its parameters are not
    the model's: not trained, not moved by `.to()`).
    """

    def __init__(self, scheme: PositionScheme) -> None:
        super().__init__()
        if not isinstance(scheme, PositionScheme):
            raise TypeError(f"scheme must be a PositionScheme, got {type(scheme).__name__}")
        self._owner = (scheme,)  # in a tuple: an attribute, not a registered submodule
        self.uses_positions = scheme.uses_positions

    @property
    def scheme(self) -> PositionScheme:
        return self._owner[0]

    def extra_repr(self) -> str:
        return f"shares {type(self.scheme).__name__}"

    def check(self, num_heads: int, head_dim: int) -> None:
        self.scheme.check(num_heads, head_dim)

    def rotate(self, q: Tensor, k: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        return self.scheme.rotate(q, k, positions)

    def bias(self, q_index: Tensor, k_index: Tensor) -> Tensor | None:
        return self.scheme.bias(q_index, k_index)
