"""Which heads each tensor-parallel rank holds, and the rows of the projection weights that hold
them.

Whole heads go to ranks: rank r of tp holds query heads r*H/tp .. (r+1)*H/tp - 1. Key/value
heads follow the query heads that read them (query head h reads kv head h // (H / Hkv)): with
Hkv >= tp rank r holds kv heads r*Hkv/tp .. (r+1)*Hkv/tp - 1; with fewer kv heads than ranks
each kv head is replicated to the tp/Hkv ranks whose query heads use it (one kv head per rank).
Either way a rank's query heads read only its own kv heads, in the same grouped order.

Row layouts (D = head_dim, C = input width):
- packed `in_proj` weight ((H + 2 Hkv) D, C), rows q | k | v; a rank's shard is its q rows, then
  its k rows, then its v rows: ((H/tp + 2 Hkv_r) D, C), itself a packed q | k | v weight;
- separate q_proj (H D, C), k_proj / v_proj (Hkv D, C): a rank keeps its heads' rows.
The output projection (C, H D) is split by columns in head order (rank r: its heads' columns).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class HeadSplit:
    """The heads of one attention module across `tp` ranks, seen from `rank`."""

    num_heads: int  # H, the whole module's
    num_kv_heads: int  # Hkv
    head_dim: int  # D
    tp: int
    rank: int

    @staticmethod
    def plan(num_heads: int, num_kv_heads: int, head_dim: int, tp: int, rank: int) -> HeadSplit:
        """Check that whole heads divide over `tp` ranks; ValueError naming the counts if not."""
        if num_heads % tp != 0:
            raise ValueError(
                f"tensor parallelism splits whole heads: num_heads ({num_heads}) must be a "
                f"multiple of the tensor-parallel size ({tp})"
            )
        if num_kv_heads >= tp and num_kv_heads % tp != 0:
            raise ValueError(
                f"num_kv_heads ({num_kv_heads}) must be a multiple of the tensor-parallel size "
                f"({tp}), or divide it (then each kv head is replicated to tp / num_kv_heads ranks)"
            )
        if num_kv_heads < tp and tp % num_kv_heads != 0:
            raise ValueError(
                f"with fewer kv heads ({num_kv_heads}) than tensor-parallel ranks ({tp}), "
                "num_kv_heads must divide the tensor-parallel size so that each kv head is "
                "replicated to a whole number of ranks"
            )
        return HeadSplit(num_heads, num_kv_heads, head_dim, tp, rank)

    @property
    def local_heads(self) -> int:
        return self.num_heads // self.tp

    @property
    def local_kv_heads(self) -> int:
        return max(self.num_kv_heads // self.tp, 1)

    @property
    def kv_replicas(self) -> int:
        """How many ranks hold each kv head (1: no replication)."""
        return max(self.tp // self.num_kv_heads, 1)

    def query_heads(self, rank: int | None = None) -> range:
        r = self.rank if rank is None else rank
        return range(r * self.local_heads, (r + 1) * self.local_heads)

    def kv_heads(self, rank: int | None = None) -> range:
        r = self.rank if rank is None else rank
        if self.kv_replicas > 1:
            first = r // self.kv_replicas
            return range(first, first + 1)
        return range(r * self.local_kv_heads, (r + 1) * self.local_kv_heads)

    def kv_owner(self, kv_head: int) -> tuple[int, int]:
        """(rank, local index) of the first rank holding `kv_head`: where a full weight takes it."""
        if self.kv_replicas > 1:
            return kv_head * self.kv_replicas, 0
        return kv_head // self.local_kv_heads, kv_head % self.local_kv_heads

    def _rows(self, heads: range, offset: int = 0) -> Tensor:
        """Row indices of `heads` in a weight whose head h occupies rows offset + h*D .. +D."""
        D = self.head_dim
        return torch.arange(offset + heads.start * D, offset + heads.stop * D)

    def packed_rows(self) -> Tensor:
        """Rows of this rank's shard in a packed ((H + 2 Hkv) D, C) weight, in shard order."""
        H, Hkv, D = self.num_heads, self.num_kv_heads, self.head_dim
        kv = self.kv_heads()
        return torch.cat(
            [self._rows(self.query_heads()), self._rows(kv, H * D), self._rows(kv, (H + Hkv) * D)]
        )

    def query_rows(self) -> Tensor:
        return self._rows(self.query_heads())

    def kv_rows(self) -> Tensor:
        return self._rows(self.kv_heads())

    def packed_kv_slice(self) -> slice:
        """Rows of this rank's k and v heads within its packed shard (they are adjacent)."""
        start = self.local_heads * self.head_dim
        return slice(start, start + 2 * self.local_kv_heads * self.head_dim)

    # -- putting full weights back together (every rank's shard, gathered) ---------------------

    def _kv_from_shards(self, shards: list[Tensor], start: int) -> Tensor:
        """The Hkv heads' rows of one kind (k or v) from the shards, where each shard holds its
        kv heads of that kind from row `start` on; a replicated head is taken once."""
        D = self.head_dim
        parts = []
        for head in range(self.num_kv_heads):
            rank, local = self.kv_owner(head)
            parts.append(shards[rank][start + local * D : start + (local + 1) * D])
        return torch.cat(parts)

    def full_packed(self, shards: list[Tensor]) -> Tensor:
        """The packed ((H + 2 Hkv) D, ...) tensor from every rank's shard (rank order)."""
        D, h, hkv = self.head_dim, self.local_heads, self.local_kv_heads
        q = torch.cat([s[: h * D] for s in shards])
        k = self._kv_from_shards(shards, h * D)
        v = self._kv_from_shards(shards, (h + hkv) * D)
        return torch.cat([q, k, v])

    def full_query(self, shards: list[Tensor]) -> Tensor:
        return torch.cat(shards)

    def full_kv(self, shards: list[Tensor]) -> Tensor:
        return self._kv_from_shards(shards, 0)
