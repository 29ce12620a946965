"""`mask_mod=`: which pairs may attend, as a function of their indices (FlexAttention's form).

`mask_mod(b, h, q_idx, kv_idx)` returns a boolean tensor, True = may attend. It is called with
broadcastable integer (torch.long) index tensors, never with Python ints:

    b (B, 1, 1, 1)    the batch row
    h (1, H, 1, 1)    the QUERY head (with grouped-query heads, query head h reads kv head
                      h // (H // Hkv))
    q_idx (1, 1, rows, 1)   the queries' POSITIONS among the keys: query i of a call with Tq
                      queries and Tk keys sits at i + Tk - Tq (bottom-right, as causality,
                      windows and documents; equal to i when Tq == Tk)
    kv_idx (1, 1, 1, keys)  the keys' indices

and must return a result broadcastable to (B, H, rows, keys) (a pattern that ignores b or h
returns size 1 there). Backends that read structure (the tiled one) evaluate it on one tile
at a time: `rows` x `keys` is at most the block size, on worker threads, several tiles at
once (so it must keep no state of its own); every other backend gets it evaluated once on the
whole (Tq, Tk) grid, as a dense mask (`call.dense_call`).

`block_size` (an int, or a (queries, keys) pair) is the tile the tiled backend classifies by:
a tile whose evaluation is all False is skipped, all True runs with no mask, anything else
runs under the evaluated block. It must divide Tq and Tk; the default, 128, leaves a shorter
last tile instead.
"""

from __future__ import annotations

import threading
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from ..value_checks import may_read
from .structure import MaskMod as MaskMod  # re-exported: the type's public name
from .tile_plan import FULL, NONE, PARTIAL

DEFAULT_BLOCK = 128


def check_block_size(block_size: object) -> tuple[int, int]:
    def bad() -> ValueError:
        return ValueError(
            "block_size must be a positive int or a (queries, keys) pair of positive ints, "
            f"got {block_size!r}"
        )

    sizes = block_size if isinstance(block_size, (tuple, list)) else (block_size, block_size)
    if len(sizes) != 2:
        raise bad()
    for size in sizes:
        if isinstance(size, bool) or not isinstance(size, int):
            raise TypeError(
                f"block_size must be an int or a (queries, keys) pair of ints, got {block_size!r}"
            )
        if size < 1:
            raise bad()
    return int(sizes[0]), int(sizes[1])


@runtime_checkable
class HeldPlan(Protocol):
    """A mask function held with its classification (`mask_plan.MaskPlan`, which builds on
    this module): its tile, and a check of a call's shapes against it."""

    block: tuple[int, int]

    def __call__(self, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor: ...

    def check(
        self, batch: int | None, heads: int | None, tq: int, tk: int, block_size: object
    ) -> None: ...


def check_mask_mod(
    mask_mod: object,
    block_size: object,
    tq: int,
    tk: int,
    batch: int | None = None,
    heads: int | None = None,
) -> tuple[MaskMod, tuple[int, int]]:
    """Validate `mask_mod=` and `block_size=` of a call with Tq queries and Tk keys (and
    `batch` rows of `heads` query heads, which a held `mask_plan.MaskPlan` is checked
    against) -> (the function, (query block, key block)). Reads no tensor values
    (traceable)."""
    if mask_mod is None:
        raise ValueError(
            f"block_size={block_size!r} was given without mask_mod=: the block size is the "
            "tile a mask_mod is evaluated and classified by, and means nothing without one"
        )
    if not callable(mask_mod):
        raise TypeError(
            "mask_mod must be a function mask_mod(b, h, q_idx, kv_idx) -> boolean tensor, got "
            f"{type(mask_mod).__name__}"
        )
    if isinstance(mask_mod, HeldPlan):  # a held plan: its own tile, checked against the call
        mask_mod.check(batch, heads, tq, tk, block_size)
        return mask_mod, mask_mod.block
    if block_size is None:  # the default leaves a shorter last tile where 128 does not divide
        return mask_mod, (DEFAULT_BLOCK, DEFAULT_BLOCK)
    bq, bk = check_block_size(block_size)
    if tq % bq != 0 or tk % bk != 0:
        raise ValueError(
            f"block_size {block_size!r} (queries {bq}, keys {bk}) must divide the query length "
            f"Tq={tq} and the key length Tk={tk}"
        )
    return mask_mod, (bq, bk)


def _checked(result: object, target: tuple[int, int, int, int], device: torch.device) -> Tensor:
    """`mask_mod`'s result, checked (dtype, device, shape: metadata only) -> 4-D."""
    if not isinstance(result, Tensor):
        raise TypeError(
            f"mask_mod must return a boolean tensor (True = may attend), got "
            f"{type(result).__name__}"
        )
    shape = tuple(result.shape)
    if result.dtype != torch.bool:
        raise TypeError(
            f"mask_mod must return a boolean tensor (True = may attend), got dtype "
            f"{result.dtype} (shape {shape})"
        )
    fits = result.dim() <= 4 and all(
        got in (1, want) for got, want in zip(reversed(shape), reversed(target), strict=False)
    )
    if not fits:
        raise ValueError(
            f"mask_mod returned shape {shape}, which does not broadcast to (B, H, rows, keys) = "
            f"{target} (it is called with b (B, 1, 1, 1), h (1, H, 1, 1), q_idx (1, 1, rows, 1), "
            "kv_idx (1, 1, 1, keys))"
        )
    if result.device != device:
        raise ValueError(
            f"mask_mod returned a tensor on {result.device}, but the inputs are on {device}"
        )
    return result if result.dim() == 4 else result.view((1,) * (4 - result.dim()) + shape)


# What torch says when a mask_mod branches on its index tensors in Python (`and`, `or`, `not`,
# `if`): eagerly, and under vmap (flex's create_block_mask calls it with scalars, batched).
_PYTHON_LOGIC = ("Boolean value of Tensor", "data-dependent control flow")


def call_mask_mod(mask_mod: MaskMod, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor):
    """`mask_mod(b, h, q_idx, kv_idx)`, with Python logic on its tensors named as the
    mask_mod's mistake (torch's own message names neither the argument nor the fix)."""
    try:
        return mask_mod(b, h, q_idx, kv_idx)
    except RuntimeError as e:
        if not any(text in str(e) for text in _PYTHON_LOGIC):
            raise
        raise TypeError(
            "mask_mod must combine its index tensors with tensor operations (&, |, ~, "
            "torch.where), not Python `and`, `or`, `not` or `if`: it is called with tensors of "
            f"many indices at once (torch: {str(e).splitlines()[0]})"
        ) from e


def mod_mask(
    mask_mod: MaskMod,
    batch: int,
    heads: int,
    q0: int,
    q1: int,
    k0: int,
    k1: int,
    tq: int,
    tk: int,
    device: torch.device,
) -> Tensor:
    """`mask_mod` on queries q0..q1 x keys k0..k1 of a (tq, tk) call with `batch` rows and
    `heads` query heads -> (B or 1, H or 1, q1 - q0, k1 - k0) booleans."""
    offset = tk - tq  # queries sit at the last Tq positions (bottom-right)
    b = torch.arange(batch, device=device).view(-1, 1, 1, 1)
    h = torch.arange(heads, device=device).view(1, -1, 1, 1)
    q_idx = torch.arange(q0 + offset, q1 + offset, device=device).view(1, 1, -1, 1)
    kv_idx = torch.arange(k0, k1, device=device).view(1, 1, 1, -1)
    result = call_mask_mod(mask_mod, b, h, q_idx, kv_idx)
    return _checked(result, (batch, heads, q1 - q0, k1 - k0), device)


CACHE_ELEMENTS = 2**25  # a call's partial tiles kept from classification (32 MB of booleans)
STRIP_ELEMENTS = 2**20  # pairs per evaluation when classifying a query block's tiles


class TileClassifier:
    """The kinds (NONE / PARTIAL / FULL) of a query block's tiles (`row`), for
    `tile_plan.plan_tiles`; the partial tiles' evaluations are kept in `masks` (keyed by
    (q0, q1, k0, k1), up to CACHE_ELEMENTS booleans in all) for the call's forward and backward
    to use instead of evaluating them again. One per call: it lives on the call's plan, never
    beyond it.

    Reading the evaluated tile (any / all) decides the plan on the host: only where that is
    free (`readable`: eager mode, CPU; see `value_checks.may_read`). Elsewhere every tile is
    PARTIAL without evaluating here: correct (the tile's mask is evaluated when it runs), and
    no host synchronisation or data-dependent branch."""

    def __init__(self, mask_mod, batch, heads, tq, tk, device, readable: bool):
        self.args = (mask_mod, batch, heads)
        self.shape = (tq, tk, device)
        self.readable = readable
        self.masks: dict[tuple[int, int, int, int], Tensor] = {}
        self._kept = 0
        self._lock = threading.Lock()  # (the plan's rows may be classified on several threads)

    def row(self, q0: int, q1: int, keys: list[tuple[int, int]]) -> list[int]:
        """The kinds of one query block's tiles (keys: their (k0, k1), in order): the
        function evaluated once per contiguous stretch of them (at most STRIP_ELEMENTS
        pairs a call), each tile's count read from its columns' (one read per stretch)."""
        if not self.readable:
            return [PARTIAL] * len(keys)
        rows = q1 - q0
        kinds: list[int] = []
        i = 0
        while i < len(keys):
            j = i + 1  # the stretch: tiles i..j-1, contiguous, within the size cap
            while (
                j < len(keys)
                and keys[j][0] == keys[j - 1][1]
                and rows * (keys[j][1] - keys[i][0]) <= STRIP_ELEMENTS
            ):
                j += 1
            kinds.extend(self._stretch(q0, q1, keys[i:j]))
            i = j
        return kinds

    def _stretch(self, q0: int, q1: int, keys: list[tuple[int, int]]) -> list[int]:
        a, b = keys[0][0], keys[-1][1]
        strip = mod_mask(*self.args, q0, q1, a, b, *self.shape)  # (B or 1, H or 1, rows, b - a)
        if not may_read(strip):
            return [PARTIAL] * len(keys)
        strip = strip.expand(*strip.shape[:3], b - a)  # (a result that ignores kv_idx: 1 key)
        # allowed pairs up to each key: bytes summed down the rows (measured: a third less
        # than a bool -> long sum over (0, 1, 2))
        flat = strip.reshape(-1, b - a).view(torch.uint8)
        per_key = flat.sum(dim=0, dtype=torch.int32).cumsum(0)
        ends = per_key[torch.tensor([k1 - a - 1 for _, k1 in keys])].tolist()
        per_key_pairs = strip.shape[0] * strip.shape[1] * strip.shape[2]
        kinds, before = [], 0
        for (k0, k1), end in zip(keys, ends, strict=True):
            allowed, before = end - before, end
            if allowed == per_key_pairs * (k1 - k0):
                kinds.append(FULL)
            elif not allowed:
                kinds.append(NONE)
            else:
                kinds.append(PARTIAL)
                self._keep((q0, q1, k0, k1), strip[..., k0 - a : k1 - a].clone())
        return kinds

    def _keep(self, key: tuple[int, int, int, int], tile: Tensor) -> None:
        with self._lock:
            if self._kept + tile.numel() <= CACHE_ELEMENTS:
                self.masks[key] = tile
                self._kept += tile.numel()
