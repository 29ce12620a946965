"""Checks that read tensor values, run only where reading is free.

A forward path must not read tensor values on the host: on a GPU that is a synchronisation per
call, and under torch.compile / torch.export a data-dependent branch (a graph break, or an
export error). So value checks (positions in range, token ids in the vocabulary) run only in
eager mode on CPU tensors, where reading costs nothing; everywhere else they are skipped, and
the callers that can afford one host read per call (`generate`, once per call) check up front.
Dtype and shape checks never read values and run everywhere.
"""

from __future__ import annotations

import torch
from torch import Tensor


def values_readable(t: Tensor) -> bool:
    """Whether reading `t`'s values is free: eager mode (not tracing) and a CPU tensor."""
    return not torch.compiler.is_compiling() and t.device.type == "cpu" and t.numel() > 0


def may_read(t: Tensor, always: bool = False) -> bool:
    """Whether a value check on `t` runs: where reading is free (`values_readable`), or on any
    device when the caller affords one host read (`always`) and nothing is being traced."""
    return values_readable(t) or (always and t.numel() > 0 and not tracing(t))


def check_non_negative(name: str, t: Tensor) -> None:
    """Values >= 0, checked where it is free (see `values_readable`)."""
    if not values_readable(t):
        return
    low = int(t.min())
    if low < 0:
        raise ValueError(f"{name} must be >= 0, got a minimum of {low}")


def check_integer(name: str, t: object) -> Tensor:
    """An integer tensor (not float, complex or bool): a dtype check, traceable."""
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor (torch.long), got dtype {t.dtype}")
    return t


def check_token_ids(
    name: str, ids: Tensor, vocab_size: int, *, what: str = "vocabulary", always: bool = False
) -> None:
    """Integer ids in [0, vocab_size): TypeError / ValueError naming the argument, not an
    IndexError (or a CUDA device assert) from inside torch. The dtype is checked everywhere;
    the values where they are free to read, or on any device when `always` (one host read:
    once per `generate`, once per encoder call) as long as nothing is being traced."""
    check_integer(name, ids)
    if not may_read(ids, always):
        return
    low, high = (int(v) for v in torch.aminmax(ids))
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise ValueError(f"{name} holds {bad}, outside the {what} (ids 0 .. {vocab_size - 1})")


def tracing(t: Tensor) -> bool:
    """Whether `t` is being traced (torch.compile / export) or captured into a CUDA graph,
    where reading its values is impossible."""
    if torch.compiler.is_compiling():
        return True
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def check_below(name: str, t: Tensor, limit: int, what: str, *, always: bool = False) -> None:
    """Values in [0, limit) (positions in a table of `limit` rows), where free to read."""
    if not may_read(t, always):
        return
    low, high = (int(v) for v in torch.aminmax(t))
    if low < 0:
        raise ValueError(f"{name} must be >= 0, got a minimum of {low}")
    if high >= limit:
        raise ValueError(f"position {high} is past the {what} ({limit} positions)")
