"""Attention structure as data: a sliding window, document ids and a prefix, as the backends see
them (not a dense (Tq, Tk) mask built early). A backend that exploits structure (the tiled one)
reads it to skip whole tiles; any other gets the dense mask, built only then (`dense_call`).

Positions: query i sits at key position p = i + Tk - Tq (bottom-right, as causality). A pair
(query at p, key j) is allowed when all of these hold:
- causal (when the call is causal): j <= p, or, with a prefix P, also p < P and j < P
  (prefix-LM: the first P positions see each other both ways);
- window (left, right): p - left <= j <= p + right (an int W is (W - 1, W - 1), so with
  causal query p sees keys p - W + 1 .. p, as `masks.sliding_window`);
- documents (B, Tk): documents[b, p] == documents[b, j];
- mask_mod (a function of b, h, p, j; see `functional.mask_mod`): mask_mod(b, h, p, j) is True.

The masks built here cover window, documents and prefix (positions only); a mask_mod is
evaluated by its own module, per tile or on the whole grid (`call.dense_call`).

Shapes: documents (B, Tk) integer ids; prefix an int or (B,) integer tensor; masks built here
are (B or 1, 1, tq, tk) booleans, True = may attend.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from ..value_checks import may_read

# A mask function of (b, h, q_idx, kv_idx) -> bool (see `functional.mask_mod`); defined here, where
# the structure that carries it is, so that mask_mod -> tile_plan -> structure runs one way.
MaskMod = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]


class Structure(NamedTuple):
    """The structure of one attention call, validated (see `check_structure`).

    `window`: (left, right) keys each side of the query's position, or None; `documents`:
    (B, Tk) integer ids, or None; `prefix`: an int, a (B,) integer tensor, or None;
    `mask_mod`: a function of (b, h, q_idx, kv_idx), or None, with `block`: the (query, key)
    tile the tiled backend classifies it by (set exactly when mask_mod is).
    (A NamedTuple, like AttentionCall: cheap to build and traced by dynamo without breaks.)
    """

    window: tuple[int, int] | None = None
    documents: Tensor | None = None
    prefix: int | Tensor | None = None
    mask_mod: MaskMod | None = None
    block: tuple[int, int] | None = None


# A window side wider than this restricts no sequence that fits in memory; capping it keeps the
# position arithmetic (p - left, p + right, in int64 tensors) from overflowing when a caller
# writes "no limit" as sys.maxsize (which wrapped around and emptied rows) or 10**30.
WINDOW_CAP = 2**40


def _window_side(value: object) -> int | None:
    """A non-negative integer (Python or numpy; not bool, not a tensor: reading one would
    break tracing) capped at WINDOW_CAP, else None."""
    if isinstance(value, (bool, Tensor)) or not isinstance(value, numbers.Integral):
        return None
    side = int(value)
    return min(side, WINDOW_CAP) if side >= 0 else None


def check_window(window: object) -> tuple[int, int]:
    """`window=` as (left, right) keys each side of the query's position: an int W >= 1 is
    (W - 1, W - 1); a (left, right) pair is taken as is. Sides are capped at WINDOW_CAP."""

    def bad() -> ValueError:
        return ValueError(
            "window must be a positive int W (keys within W positions of the query: "
            "p - W + 1 .. p with causal) or a (left, right) pair of non-negative ints, "
            f"got {window!r}"
        )

    if not isinstance(window, (tuple, list)):
        side = _window_side(window)
        if side is None or side < 1:
            raise bad()
        return side - 1, side - 1
    if len(window) == 2:
        left, right = (_window_side(s) for s in window)
        if left is None or right is None:
            raise bad()
        return left, right
    raise bad()


def check_integer_ids(name: str, t: Tensor, shape: tuple[int, ...], device: torch.device) -> None:
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor (e.g. torch.long), got dtype {t.dtype}")
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but the inputs are on {device}")


def check_document_ids(
    documents: object, shape: tuple[int, int], layout: str, device: torch.device
) -> Tensor:
    """`documents=`: a `layout` (e.g. "(B, Tk)") integer tensor of `shape` on `device`."""
    if not isinstance(documents, Tensor):
        raise TypeError(
            f"documents must be a {layout} integer tensor or None, got {type(documents).__name__}"
        )
    check_integer_ids("documents", documents, shape, device)
    return documents


def check_structure(
    window: object,
    documents: object,
    prefix: object,
    *,
    causal: bool,
    batch: int,
    tq: int,
    tk: int,
    device: torch.device,
) -> Structure | None:
    """Validate `window=`, `documents=` and `prefix=` of a call with q (B, H, Tq, D) and
    k (B, Hkv, Tk, D); None when none is given. Reads values only where that is free."""
    if window is None and documents is None and prefix is None:
        return None
    win = None if window is None else check_window(window)
    if documents is not None:
        documents = check_document_ids(documents, (batch, tk), "(B, Tk)", device)
        if tq > tk:
            raise ValueError(
                f"documents need at least as many keys as queries (Tq={tq} > Tk={tk}): "
                "queries are the last Tq positions of the documents"
            )
    if prefix is not None:
        if not causal:
            raise ValueError(
                "prefix= relaxes causality (the first P positions see each other both ways); "
                "it needs causal=True"
            )
        if isinstance(prefix, Tensor):
            check_integer_ids("prefix", prefix, (batch,), device)
            check_prefix_range(prefix, tk, f"T={tk}")
        elif isinstance(prefix, int) and not isinstance(prefix, bool):
            check_prefix_range(prefix, tk, f"T={tk}")
        else:
            raise TypeError(
                f"prefix must be an int, a (B,) integer tensor or None, got {type(prefix).__name__}"
            )
    return Structure(win, documents, prefix)


def check_prefix_range(prefix: int | Tensor, top: int, top_text: str) -> None:
    """0 <= prefix <= top, for an int or a tensor's values (read only where that is free);
    `top_text` names the bound in the message."""
    if isinstance(prefix, Tensor):
        if may_read(prefix):
            low, high = (int(x) for x in torch.aminmax(prefix))
            if low < 0 or high > top:
                raise ValueError(f"prefix must be in 0 .. {top_text}, got values {low} .. {high}")
    elif not 0 <= prefix <= top:
        raise ValueError(f"prefix must be in 0 .. {top_text}, got {prefix}")


def structure_mask(
    structure: Structure,
    causal: bool,
    q_start: int,
    q_stop: int,
    k_start: int,
    k_stop: int,
    tq: int,
    tk: int,
    device: torch.device,
) -> Tensor | None:
    """(B or 1, 1, q_stop - q_start, k_stop - k_start) may-attend mask of queries q_start..q_stop
    and keys k_start..k_stop of a (tq, tk) call, from its structure and causality; None when
    every pair is allowed. Small when the tile is: the tiled backend builds one per tile."""
    offset = tk - tq
    pos = torch.arange(q_start + offset, q_stop + offset, device=device)[:, None]  # (tq', 1)
    key = torch.arange(k_start, k_stop, device=device)[None, :]  # (1, tk')
    allowed: Tensor | None = None
    if causal:
        allowed = key <= pos
        prefix = structure.prefix
        if isinstance(prefix, Tensor):  # (B,) -> (B, 1, 1, 1)
            p = prefix.view(-1, 1, 1, 1)
            allowed = allowed | ((pos < p) & (key < p))
        elif prefix:
            allowed = allowed | ((pos < prefix) & (key < prefix))
    if structure.window is not None:
        left, right = structure.window
        near = (key >= pos - left) & (key <= pos + right)
        allowed = near if allowed is None else allowed & near
    if structure.documents is not None:
        docs = structure.documents
        same = docs[:, q_start + offset : q_stop + offset, None] == docs[:, None, k_start:k_stop]
        same = same[:, None]  # (B, tq', tk') -> (B, 1, tq', tk')
        allowed = same if allowed is None else allowed & same
    if allowed is not None and allowed.dim() < 4:
        allowed = allowed.view((1,) * (4 - allowed.dim()) + tuple(allowed.shape))
    return allowed


def dense_mask(structure: Structure, causal: bool, tq: int, tk: int, device) -> Tensor | None:
    """The whole (B or 1, 1, Tq, Tk) mask of a structure's positions (and causality): for
    backends that cannot read the structure itself (`call.dense_call` adds a mask_mod's)."""
    return structure_mask(structure, causal, 0, tq, 0, tk, tq, tk, device)
