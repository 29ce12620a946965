"""StaticKVCache: a KV cache whose tensors never change shape, so a decode step is one fixed graph
(torch.compile without recompilation, CUDA graphs).

Each call writes its keys and values at a position index *tensor* (`index_copy_`), and the
attention reads the whole buffer, with a mask of what may be attended: slots that hold a real
key (not padding, not yet written), causality by token index, and the sliding window. Nothing
reads a tensor value on the host and no shape depends on how many tokens were cached.

With a `window` and a `chunk` (the most tokens one call adds), the buffer is a ring of
`window - 1 + chunk` slots: token i lives in slot i % room, so any number of tokens may pass
through in bounded memory; each slot remembers its token's index for causality, the window and
index-based biases (ALiBi).

Shapes: B batch, Hkv key/value heads, R slots (room), D head width, T this call's tokens.
k (B, Hkv, R, D), v (B, Hkv, R, Dv), key_mask (B, R), key_index (R,), index () (tokens so far).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..value_checks import values_readable
from .cache import KeySet, _positive_int, _SelfAttentionCache, _window


class StaticKVCache(_SelfAttentionCache):
    """A fixed-shape self-attention cache for `max_length` tokens (see the module docstring).

    Speaks the cache protocol of `KVCache` (`keys_for`, `next_positions`, `reset`); `length` reads
    the token count from the device (a host sync: not for forward paths). A call past
    `max_length` is refused where the count is free to read (eager, CPU); elsewhere the caller
    sizes the cache (`CausalLM.generate` does)."""

    def __init__(
        self,
        batch_size: int,
        num_kv_heads: int,
        head_dim: int,
        max_length: int,
        *,
        window: int | None = None,
        chunk: int | None = None,
        value_dim: int | None = None,
        dtype: torch.dtype = torch.float32,
        device=None,
    ) -> None:
        self._set_layout(batch_size, num_kv_heads, head_dim, value_dim, dtype)
        max_length = _positive_int("max_length", max_length)  # type: ignore[assignment]
        window = _window(window)
        chunk = _positive_int("chunk", chunk, optional=True)
        self.max_length, self.window = max_length, window
        room = max_length
        if window is not None and chunk is not None:
            room = min(max_length, window - 1 + chunk)
        self.room = room
        self.ring = room < max_length  # tokens wrap around; any number may pass through
        device = torch.device(device) if device is not None else torch.device("cpu")
        B, H = batch_size, num_kv_heads
        self.k = torch.zeros(B, H, room, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros(B, H, room, self.value_dim, dtype=dtype, device=device)
        self.key_mask = torch.zeros(B, room, dtype=torch.bool, device=device)  # True = real key
        self.key_index = torch.zeros(room, dtype=torch.long, device=device)  # token in each slot
        self.index = torch.zeros((), dtype=torch.long, device=device)  # tokens written so far
        self.device = self.k.device  # "cuda" -> "cuda:0", as the keys will report it
        self._owner = None
        _mark_for_compile(self)

    def reset(self) -> None:
        """Forget every key (in place: the buffers keep their addresses); the cache may then
        serve another module."""
        self.index.zero_()
        self.key_mask.zero_()
        self._owner = None

    @property
    def length(self) -> int:
        """Tokens seen so far (reads the device counter: a host sync)."""
        return int(self.index)

    def next_positions(self, count: int, device) -> Tensor:
        """(count,): positions of the next tokens, continuing from what is cached."""
        return self.index.to(device) + torch.arange(count, device=device)

    def _check(self, k: Tensor, v: Tensor, key_mask: Tensor | None) -> None:
        """Shapes, dtype and device (traceable); the token budget where it is free to read."""
        self._check_layout(k, v, key_mask)
        T = k.shape[2]
        if k.device != self.device:
            raise ValueError(f"the cache is on {self.device}, got keys on {k.device}")
        if self.ring:
            assert self.window is not None
            if T > self.room - (self.window - 1):
                raise ValueError(
                    f"a call of {T} tokens does not fit this window cache: it was built for "
                    f"chunks of at most {self.room - self.window + 1} tokens"
                )
        elif T > self.room or (values_readable(self.index) and int(self.index) + T > self.room):
            cached = int(self.index) if values_readable(self.index) else "?"
            raise ValueError(
                f"{T} new tokens do not fit a cache of max_length {self.max_length} "
                f"({cached} cached)"
            )

    def keys_for(
        self, module: object, k: Tensor, v: Tensor, key_mask: Tensor | None, causal: bool
    ) -> KeySet:
        """Write this call's keys k (B, Hkv, T, D) and values at their slots; hand out the whole
        buffer with the mask of what each of the T queries may attend."""
        self._bind(module)
        self._check(k, v, key_mask)
        T = k.shape[2]
        first = self.index.clone()
        index = first + torch.arange(T, device=self.device)  # (T,) this call's token indices
        slots = index % self.room if self.ring else index
        real = (
            torch.ones(self.batch_size, T, dtype=torch.bool, device=self.device)
            if key_mask is None
            else key_mask.to(torch.bool)
        )
        self.k.index_copy_(2, slots, k)
        self.v.index_copy_(2, slots, v)
        self.key_mask.index_copy_(1, slots, real)
        self.key_index.index_copy_(0, slots, index)
        self.index.add_(T)
        distance = index[:, None] - self.key_index[None, :]  # (T, R): query minus key index
        allowed = distance >= 0 if causal else None
        if self.window is not None:
            near = distance < self.window if causal else distance.abs() < self.window
            allowed = near if allowed is None else allowed & near
        mask = None if allowed is None else allowed[None, None]  # (1, 1, T, R)
        return KeySet(self.k, self.v, self.key_mask, mask, False, first, self.key_index)


def _mark_for_compile(cache: StaticKVCache) -> None:
    """Tell torch.compile what never changes. CUDA graphs replay at fixed addresses: the buffers
    are updated in place, never replaced (static addresses; guard=False, so a new cache of the
    same shapes reuses the compiled code). Batch, heads and head width are static sizes even
    under dynamic=True (symbolic head counts would reach SDPA's enable_gqa flag); the slot
    count may vary between caches."""
    from torch._dynamo import mark_static, mark_static_address

    for t in (cache.k, cache.v, cache.key_mask, cache.key_index, cache.index):
        mark_static_address(t, guard=False)
    for t in (cache.k, cache.v):
        for dim in (0, 1, 3):
            mark_static(t, dim)
    mark_static(cache.key_mask, 0)
