"""KV caches, passed to `MultiHeadAttention.forward(..., cache=...)` and never stored on modules.

KVCache (self-attention): appends each call's keys/values (B, Hkv, T, D) and hands out everything
to attend over, with a key mask (B, Tk) that remembers padding. `max_length` preallocates
(static: no reallocation per token); `window` keeps only the last W keys (sliding window).
CrossKVCache: keys/values of an encoder output, computed at the first call and reused.
StaticKVCache (`multihead.modules.static_cache`): fixed shapes, written at index tensors,
for compiled decoding and CUDA graphs.

The attention module talks to a cache through two methods (a protocol; any object with them
works): `next_positions(T, device)` (RoPE positions of the next T tokens) and `keys_for(...)`
(self-attention) or `memory_for(...)` (cross-attention, `cross = True`), which return a `KeySet`.
A cache serves one attention module: it refuses a second one (`caches=[cache] * layers` is a bug).
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import Tensor

from ..functional.structure import WINDOW_CAP


class KeySet(NamedTuple):
    """What one attention call attends to, as a cache hands it out.

    k (B, Hkv, Tk, D), v (B, Hkv, Tk, Dv); `key_mask` (B, Tk) True = a real key, or None when no
    key is padding; `mask` an extra boolean mask broadcastable to (B, H, Tq, Tk) (sliding
    window) or None; `causal` whether bottom-right causality applies; `first_slot` the slot of
    the first query along the keys (queries sit at first_slot .. first_slot + Tq - 1), which
    index-based position biases (ALiBi) need: an int, or a 0-d tensor (a static cache, whose
    count lives on the device); `key_slots` (Tk,) the slot of each key when the keys are not
    in order 0 .. Tk - 1 (a ring buffer), else None; `window` a sliding window (an int, as
    `attention(window=)`) for keys in position order, bottom-right aligned; `dropped` how many
    tokens before the first key the cache no longer holds (a window cache's), so that
    structure given in token positions (documents, prefix, mask_mod) can be shifted to the
    keys handed out.
    """

    k: Tensor
    v: Tensor
    key_mask: Tensor | None
    mask: Tensor | None
    causal: bool
    first_slot: int | Tensor
    key_slots: Tensor | None = None
    window: int | None = None  # a sliding window over keys in position order (structure)
    dropped: int = 0  # tokens before keys[0] no longer held (the first key's position)


def _positive_int(name: str, value: object, *, optional: bool = False) -> int | None:
    """value as an int (numpy integers too), checked positive; None where optional."""
    if optional and value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        kind = "a positive int or None" if optional else "a positive int"
        raise ValueError(f"{name} must be {kind}, got {value!r}")
    return int(value)


def _window(value: object) -> int | None:
    """A cache's window: a positive int or None, capped as `attention(window=)` caps it (wider
    restricts no sequence; uncapped, sys.maxsize overflowed int64 position arithmetic)."""
    window = _positive_int("window", value, optional=True)
    return None if window is None else min(window, WINDOW_CAP)


class _OneModule:
    """Remembers the attention module a cache serves and refuses any other until reset()."""

    _owner: int | None = None

    def _bind(self, module: object) -> None:
        if self._owner is None:
            self._owner = id(module)
        elif self._owner != id(module):
            raise ValueError(
                f"this {type(self).__name__} already holds another attention module's keys: "
                "give each layer its own cache (e.g. CausalLM.make_caches), or reset() it"
            )


class _SelfAttentionCache(_OneModule):
    """What both self-attention caches (KVCache, StaticKVCache) hold and check: the layout of
    the keys and values (batch, kv heads, widths) and their dtype."""

    cross = False

    def _set_layout(
        self, batch_size: int, num_kv_heads: int, head_dim: int, value_dim: int | None, dtype
    ) -> None:
        _positive_int("batch_size", batch_size)
        _positive_int("num_kv_heads", num_kv_heads)
        _positive_int("head_dim", head_dim)
        _positive_int("value_dim", value_dim, optional=True)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
        self.batch_size, self.num_kv_heads, self.head_dim = batch_size, num_kv_heads, head_dim
        self.value_dim = value_dim or head_dim
        self.dtype = dtype

    def _check_layout(self, k: Tensor, v: Tensor, key_mask: Tensor | None) -> None:
        """This call's keys k (B, Hkv, T, D), values and key mask (B, T) fit the cache."""
        T = k.shape[2]
        B, H = self.batch_size, self.num_kv_heads
        # (torch.Size compares with a tuple as is: no tuple() or slices, ~1 us per decode step)
        if k.shape != (B, H, T, self.head_dim) or v.shape != (B, H, T, self.value_dim):
            raise ValueError(
                f"the cache holds (batch {self.batch_size}, kv heads {self.num_kv_heads}, "
                f"head_dim {self.head_dim}); got keys {tuple(k.shape)} and values {tuple(v.shape)}"
            )
        if k.dtype != self.dtype or v.dtype != self.dtype:
            raise ValueError(
                f"the cache holds {self.dtype}, got keys of {k.dtype} and values of {v.dtype}"
            )
        if key_mask is not None and tuple(key_mask.shape) != (self.batch_size, T):
            raise ValueError(
                f"key_mask must have shape (B, T) = {(self.batch_size, T)}, "
                f"got {tuple(key_mask.shape)}"
            )


class KVCache(_SelfAttentionCache):
    # A static cache's keys and values in one buffer (B, 2 Hkv, room, D), `_k` and `_v` its
    # halves; None for a growing cache (and where values are wider or narrower than keys)
    _kv: Tensor | None = None

    def __init__(
        self,
        batch_size: int,
        num_kv_heads: int,
        head_dim: int,
        *,
        max_length: int | None = None,
        window: int | None = None,
        value_dim: int | None = None,
        dtype: torch.dtype = torch.float32,
        device=None,
    ) -> None:
        self._set_layout(batch_size, num_kv_heads, head_dim, value_dim, dtype)
        max_length = _positive_int("max_length", max_length, optional=True)
        window = _window(window)
        self.max_length, self.window = max_length, window
        self.device = torch.device(device) if device is not None else None
        self.reset()
        if max_length is not None:
            # Static: room for max_length keys, or for a window plus one chunk of the same size.
            room = max_length if window is None else min(max_length, 2 * window)
            self._allocate(room, self.device or torch.device("cpu"))

    def reset(self) -> None:
        """Forget every cached key (a static cache keeps its buffers): the cache is as new, and
        may serve another module."""
        self.length = 0  # tokens seen so far: the position of the next token
        self._stored = 0
        self._padded = False  # has any call passed a key mask? If not, no mask is handed out
        self._owner = None
        if self.max_length is None:
            self._k: Tensor | None = None
            self._v: Tensor | None = None
            self._mask: Tensor | None = None  # (B, stored), True = a real key

    def checkpoint(self) -> tuple:
        """The cache's state before an append, for `rollback` (references only: no copy)."""
        return (self.length, self._stored, self._padded, self._k, self._v, self._mask, self._owner)

    def rollback(self, checkpoint: tuple) -> None:
        """Undo what was appended since `checkpoint`: a call that appended its keys and then
        failed leaves the cache as it was, so a retry does not attend to its keys twice. A
        dynamic cache gets its old tensors back (appending made new ones). A preallocated one
        wrote past what it held, which becomes unused again; if it slid its window to the
        front to make room, the slid keys (the last window - 1) stay as all it holds: exactly
        what the next call would have kept of the old ones."""
        length, stored, padded, k, v, mask, owner = checkpoint
        if self.max_length is None:
            self._k, self._v, self._mask, self._stored = k, v, mask, stored
        else:
            self._stored -= self.length - length
        self.length, self._padded, self._owner = length, padded, owner

    def _allocate(self, room: int, device) -> None:
        B, H = self.batch_size, self.num_kv_heads
        if self.value_dim == self.head_dim:
            # keys and values in one buffer (B, 2 Hkv, room, D), keys first: the plain path
            # writes a decode step's k and v (adjacent heads of the fused projection) in one copy
            self._kv = torch.zeros(B, 2 * H, room, self.head_dim, dtype=self.dtype, device=device)
            self._k, self._v = self._kv[:, :H], self._kv[:, H:]
        else:
            self._kv = None
            self._k = torch.zeros(B, H, room, self.head_dim, dtype=self.dtype, device=device)
            self._v = torch.zeros(B, H, room, self.value_dim, dtype=self.dtype, device=device)
        self._mask = torch.zeros(B, room, dtype=torch.bool, device=device)

    def next_positions(self, count: int, device) -> Tensor:
        """(count,): positions of the next tokens, continuing from what is cached."""
        return torch.arange(self.length, self.length + count, device=device)

    def _check_room(self, T: int) -> None:
        """T more tokens fit max_length (a cache without one takes any number)."""
        if self.max_length is not None and self.length + T > self.max_length:
            raise ValueError(
                f"{self.length + T} tokens do not fit a cache of max_length "
                f"{self.max_length} ({self.length} cached, {T} new)"
            )

    def update(
        self, k: Tensor, v: Tensor, key_mask: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """Append k (B, Hkv, T, D), v and their key mask (B, T); return all keys, values and the
        key mask to attend over (the window's, when one is set; None until a call passes a key
        mask, so the fused kernel runs without a mask)."""
        self._check_layout(k, v, key_mask)
        T = k.shape[2]
        self._check_room(T)
        # Decided from the call's structure, never from mask values (no host sync, traceable):
        # until a call passes a key mask, no mask is kept or handed out (every stored key is
        # real), and calls run unmasked on the fused kernel.
        new_mask = None
        if key_mask is not None or self._padded:
            if not self._padded:
                self._start_mask()
                self._padded = True
            new_mask = (
                torch.ones(self.batch_size, T, dtype=torch.bool, device=k.device)
                if key_mask is None
                else key_mask.to(torch.bool)
            )
        if self.max_length is None:
            self._append_dynamic(k, v, new_mask)
        else:
            self._append_static(k, v, new_mask)
        self.length += T
        assert self._k is not None and self._v is not None
        n = self._stored
        # (narrow: one op; indexing with slices costs several times more per decode step)
        keys, values = self._k.narrow(2, 0, n), self._v.narrow(2, 0, n)
        mask = None if not self._padded or self._mask is None else self._mask[:, :n]
        if self.window is not None:  # this call's queries need up to window - 1 earlier keys
            keep = min(n, self.window - 1 + T)
            keys, values = keys[:, :, n - keep :], values[:, :, n - keep :]
            mask = None if mask is None else mask[:, n - keep :]
        return keys, values, mask

    def _start_mask(self) -> None:
        """The first key mask: every key stored so far is real (the buffer of a static cache
        held nothing meaningful until now; a dynamic cache had none)."""
        B, n = self.batch_size, self._stored
        if self.max_length is None:  # (no keys yet: the first append brings the mask)
            self._mask = (
                None
                if self._k is None
                else torch.ones(B, n, dtype=torch.bool, device=self._k.device)
            )
        else:
            assert self._mask is not None
            self._mask[:, :n] = True

    def plain_row_slot(
        self, module: Any, kv_heads: int, head_dim: int
    ) -> tuple[Tensor, int] | None:
        """For the plain path's one-token step of one row (float32 on the CPU): this cache's
        buffer (1, 2 Hkv, room, D) and the slot s where the step's keys and values go, the
        counts moved on as `append_plain` moves them (the caller writes the slot before anything
        reads the cache: `kernels.append_attend`). None, nothing changed, where `append_plain`
        must run: no single buffer, a window, padding, no room (it raises), another layout or
        dtype (it names the mismatch), another module's cache (it raises)."""
        buffer = self._kv
        if (
            buffer is None
            or self.window is not None
            or self._padded
            or self.batch_size != 1
            or self.num_kv_heads != kv_heads
            or self.head_dim != head_dim
            or self.dtype is not torch.float32
            or buffer.device.type != "cpu"
            or not buffer.is_contiguous()
            or self.length + 1 > self.max_length  # type: ignore[operator]
            or self._stored >= buffer.shape[2]
            or (self._owner is not None and self._owner != id(module))
        ):
            return None
        self._owner = id(module)
        s = self._stored
        self._stored = s + 1
        self.length += 1
        return buffer, s

    def append_plain(
        self, module: Any, kv: Tensor
    ) -> tuple[Tensor, Tensor, Tensor | None, int | None]:
        """`keys_for` without a key mask, for the module's plain path (a decode step): append
        this call's keys and values kv (B, 2 Hkv, T, D) (keys, then values: heads of the fused
        projection, Hkv = the module's key/value heads); return all keys, values, the key mask
        (B, Tk) or None and the window, with no KeySet built."""
        if self._owner != id(module):
            self._bind(module)
        buffer = self._kv
        if buffer is None or self.window is not None or self._padded:
            hkv = module.num_kv_heads
            k, v = kv.split_with_sizes((hkv, kv.shape[1] - hkv), dim=1)
            keys, values, mask = self.update(k, v)
            return keys, values, mask, self.window
        # A static cache, no window, no padding (a plain decode step): `update` without its
        # mask and window steps, and `_append_static` without its sliding, written out here,
        # with one copy for keys and values (each Python call, test and tensor op of the
        # general path costs ~1% of the step at small widths).
        T, s = kv.shape[2], self._stored
        # (torch.Size compares with a tuple as is)
        if kv.shape != (self.batch_size, 2 * self.num_kv_heads, T, self.head_dim) or (
            kv.dtype != self.dtype
        ):
            hkv = module.num_kv_heads
            k, v = kv.split_with_sizes((hkv, kv.shape[1] - hkv), dim=1)
            self._check_layout(k, v, None)  # (names what does not fit)
            raise ValueError(
                f"the cache holds (batch {self.batch_size}, kv heads {self.num_kv_heads}, "
                f"head_dim {self.head_dim}); got keys and values {tuple(kv.shape)}"
            )
        if self.length + T > self.max_length:  # type: ignore[operator]
            self._check_room(T)
        if buffer.device != kv.device:
            raise ValueError(f"the cache is on {buffer.device}, got keys on {kv.device}")
        buffer.narrow(2, s, T).copy_(kv)
        n = self._stored = s + T
        self.length += T
        assert self._k is not None and self._v is not None
        return self._k.narrow(2, 0, n), self._v.narrow(2, 0, n), None, None

    def keys_for(
        self, module: object, k: Tensor, v: Tensor, key_mask: Tensor | None, causal: bool
    ) -> KeySet:
        """The module-facing step: append this call's keys and hand out what to attend over."""
        self._bind(module)
        T = k.shape[2]
        keys, values, mask = self.update(k, v, key_mask)
        Tk = keys.shape[2]
        # The window travels as structure (keys are in position order, bottom-right aligned):
        # a long prefill into a window cache builds no (T, Tk) mask.
        dropped = self.length - Tk  # (a window cache keeps the last window - 1 + T only)
        return KeySet(keys, values, mask, None, causal, Tk - T, window=self.window, dropped=dropped)

    def _append_dynamic(self, k: Tensor, v: Tensor, mask: Tensor | None) -> None:
        if self._k is None:
            self._k, self._v = k, v
            if mask is not None:
                self._mask = mask
        else:
            assert self._v is not None
            keep = self._stored if self.window is None else min(self._stored, self.window - 1)
            self._k = torch.cat([self._k[:, :, self._stored - keep :], k], dim=2)
            self._v = torch.cat([self._v[:, :, self._stored - keep :], v], dim=2)
            if mask is not None:
                assert self._mask is not None
                self._mask = torch.cat([self._mask[:, self._stored - keep :], mask], dim=1)
        self._stored = self._k.shape[2]

    def _append_static(self, k: Tensor, v: Tensor, mask: Tensor | None) -> None:
        assert self._k is not None and self._v is not None and self._mask is not None
        if self._k.device != k.device:
            raise ValueError(f"the cache is on {self._k.device}, got keys on {k.device}")
        T, room = k.shape[2], self._k.shape[2]
        if self._stored + T > room:  # window only: slide the last window - 1 keys to the front
            assert self.window is not None
            keep = min(self._stored, self.window - 1)
            if keep + T > room:
                raise ValueError(
                    f"a chunk of {T} tokens does not fit a window cache of room {room}"
                )
            s = self._stored
            self._k[:, :, :keep] = self._k[:, :, s - keep : s].clone()
            self._v[:, :, :keep] = self._v[:, :, s - keep : s].clone()
            if mask is not None:
                self._mask[:, :keep] = self._mask[:, s - keep : s].clone()
            self._stored = keep
        s = self._stored
        self._k.narrow(2, s, T).copy_(k)
        self._v.narrow(2, s, T).copy_(v)
        if mask is not None:
            self._mask[:, s : s + T] = mask
        self._stored = s + T

    def reorder(self, rows: Tensor) -> None:
        """Keep rows (B,) of the batch, in that order (beam search, dropping finished rows)."""
        if self._k is None or self._v is None:
            raise ValueError("reorder() needs a cache that holds keys")
        if self._kv is not None:  # (a static cache's one buffer, as allocated)
            self._kv = self._kv[rows]
            self._k, self._v = self._kv[:, : self.num_kv_heads], self._kv[:, self.num_kv_heads :]
        else:
            self._k, self._v = self._k[rows], self._v[rows]
        if self._mask is not None:
            self._mask = self._mask[rows]
        self.batch_size = self._k.shape[0]


class CrossKVCache(_OneModule):
    """Keys and values of a cross-attention's memory (encoder output), computed once.

    The memory tensor it was filled from is remembered: a later call with another memory tensor
    is refused (it would silently attend to the old one); call reset() to start over.
    """

    cross = True

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.k: Tensor | None = None
        self.v: Tensor | None = None
        self.key_mask: Tensor | None = None
        self._source: Tensor | None = None
        self._owner = None

    @property
    def filled(self) -> bool:
        return self.k is not None

    def checkpoint(self) -> tuple:
        """The cache's state before a call, for `rollback` (references only)."""
        return (self.k, self.v, self.key_mask, self._source, self._owner)

    def rollback(self, checkpoint: tuple) -> None:
        """As before the call: a failed first call leaves the cache empty, not holding the
        memory (and key mask) it was given."""
        self.k, self.v, self.key_mask, self._source, self._owner = checkpoint

    def memory_for(
        self,
        module: object,
        memory: Tensor | None,
        key_mask: Tensor | None,
        project: Callable[[], tuple[Tensor, Tensor]],
    ) -> KeySet:
        """The memory's keys and values: `project()` at the first call, reused afterwards."""
        self._bind(module)
        if self.k is None:
            if memory is None:
                raise ValueError("an empty CrossKVCache needs the memory (key/value) to project")
            self.k, self.v = project()
            self.key_mask, self._source = key_mask, memory
        elif memory is not None and memory is not self._source:
            raise ValueError(
                "this CrossKVCache already holds the keys of another memory tensor; call "
                "reset() before attending to new memory (or pass the same tensor, or none)"
            )
        assert self.v is not None
        mask = self.key_mask if key_mask is None else key_mask
        return KeySet(self.k, self.v, mask, None, False, 0)


def checkpoints(*caches: object) -> list[tuple]:
    """(cache, checkpoint) of each cache that can undo a call (KVCache, CrossKVCache; a
    StaticKVCache's checks all run before it writes), for `roll_back`."""
    return [(c, c.checkpoint()) for c in caches if isinstance(c, (KVCache, CrossKVCache))]


def roll_back(points: list[tuple]) -> None:
    """Every cache in `points` as it was at its checkpoint (a call that failed its checks
    after caches took its keys: a corrected retry must not attend to them twice)."""
    for cache, point in reversed(points):
        cache.rollback(point)


def make_caches(num_layers: int, *args, **kwargs) -> list[KVCache]:
    """One KVCache per layer, all configured alike."""
    return [KVCache(*args, **kwargs) for _ in range(num_layers)]
