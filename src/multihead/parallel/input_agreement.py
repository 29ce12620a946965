"""Every tensor-parallel rank must hold the same inputs: checked once per forward, in one small
fixed-size all-gather, before anything shape-dependent is communicated.

Tensor parallelism splits the heads, not the batch: each rank computes its heads on its own copy
of the input, and the ranks' partial results are summed. Ranks given different token ids would
sum unrelated partial results into a wrong output on every rank, silently; different sequence
lengths would make gloo's shape-dependent collectives abort the process (SIGABRT). So each rank
contributes a fixed-size row per forward (number of tensors, their shapes, dtypes and a cheap
position-weighted checksum of their values) and every rank compares the rows, raising on every
rank an error naming the ranks and what differs.

The all-gather is bounded in time (`timeout`, 300 s by default): a rank that failed before
reaching the forward but stays alive makes the others raise TimeoutError instead of blocking
for the process group's own timeout (30 minutes by default in torch).
"""

from __future__ import annotations

import datetime
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

DEFAULT_TIMEOUT = 300.0  # seconds
_SLOTS = 4  # tensors compared per forward (the first ones: ids, masks, positions)
_DIMS = 6  # dimensions compared per tensor
_DTYPES = (
    torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool,
    torch.float64, torch.float32, torch.float16, torch.bfloat16,
)  # fmt: skip
_PRIME = 65521  # position weights cycle through 1 .. _PRIME: a permutation changes the sum


def _tensors(args: tuple, kwargs: dict) -> list[tuple[str, Tensor]]:
    named = [(f"argument {i}", a) for i, a in enumerate(args)]
    named += [(f"{k}=", v) for k, v in sorted(kwargs.items())]
    return [(n, t) for n, t in named if isinstance(t, Tensor)]


def _checksum(t: Tensor) -> Tensor:
    """A position-weighted sum (an int64 0-d tensor): equal tensors give equal sums."""
    flat = t.detach().reshape(-1)
    weights = torch.arange(flat.numel(), device=flat.device) % _PRIME + 1
    if flat.is_floating_point():  # the float64 sum's bits: same values, same order, same bits
        return (flat.double() * weights.double()).sum().view(torch.int64)
    return (flat.long() * weights).sum()


def _row(tensors: list[tuple[str, Tensor]], device: torch.device) -> Tensor:
    per = 2 + _DIMS + 1  # ndim, dtype, dims, checksum
    row = torch.full((1 + _SLOTS * per,), -1, dtype=torch.long)
    row[0] = len(tensors)
    sums = []
    for slot, (_, t) in enumerate(tensors[:_SLOTS]):
        base = 1 + slot * per
        row[base] = t.dim()
        row[base + 1] = _DTYPES.index(t.dtype) if t.dtype in _DTYPES else len(_DTYPES)
        dims = list(t.shape[:_DIMS])
        row[base + 2 : base + 2 + len(dims)] = torch.tensor(dims, dtype=torch.long)
        sums.append((base + 2 + _DIMS, _checksum(t).to("cpu")))
    for index, value in sums:
        row[index] = value
    return row.to(device)


def _device(group: dist.ProcessGroup) -> torch.device:
    if str(dist.get_backend(group)) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _describe(row: list[int], tensors: list[tuple[str, Tensor]]) -> list[str]:
    per = 2 + _DIMS + 1
    out = [f"{row[0]} tensors"]
    for slot in range(min(row[0], _SLOTS)):
        base = 1 + slot * per
        ndim = row[base]
        name = tensors[slot][0] if slot < len(tensors) else f"tensor {slot}"
        shape = tuple(row[base + 2 : base + 2 + min(ndim, _DIMS)])
        out.append(f"{name} shape {shape}")
        out.append(
            f"{name} dtype {_DTYPES[row[base + 1]] if row[base + 1] < len(_DTYPES) else '?'}"
        )
        out.append(f"{name} values (checksum {row[base + 2 + _DIMS]})")
    return out


def all_gather_within(
    row: Tensor, group: dist.ProcessGroup, *, timeout: float, where: str, option: str
) -> list[Tensor]:
    """Every rank's `row` (same shape on all), or TimeoutError after `timeout` seconds when a
    rank does not join (it failed elsewhere and stays alive): the entry points' bound on their
    own agreement collective, far below the process group's default of 30 minutes."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"{option}: timeout must be a positive number of seconds, got {timeout!r}")
    rows = [torch.empty_like(row) for _ in range(dist.get_world_size(group))]
    work = dist.all_gather(rows, row, group=group, async_op=True)
    try:
        assert work is not None
        work.wait(timeout=datetime.timedelta(seconds=timeout))
    except RuntimeError as e:
        raise TimeoutError(
            f"{where}: not every rank arrived within {timeout:g} s (a rank failed or is "
            f"elsewhere; set the limit with {option}(..., timeout=)): {e}"
        ) from None
    return rows


def check_same_inputs(
    args: tuple, kwargs: dict, group: dist.ProcessGroup, *, timeout: float, where: str
) -> None:
    """ValueError on every rank when the ranks' tensor inputs differ (naming the ranks and what
    differs); TimeoutError when a rank does not join within `timeout` seconds."""
    tensors = _tensors(args, kwargs)
    row = _row(tensors, _device(group))
    rows = all_gather_within(row, group, timeout=timeout, where=where, option="tensor_parallel")
    table = [r.tolist() for r in rows]  # one host sync per forward: shapes and checksums only
    if all(r == table[0] for r in table):
        return
    mine = dist.get_rank(group)
    described = [_describe(r, tensors) for r in table]
    for i in range(max(len(d) for d in described)):
        seen = [d[i] if i < len(d) else "-" for d in described]
        if len(set(seen)) > 1:
            by_rank = "; ".join(f"rank {j}: {s}" for j, s in enumerate(seen))
            raise ValueError(
                f"{where}: every tensor-parallel rank must be given the same input, but they "
                f"differ (this is rank {mine}): {by_rank}"
            )
    raise ValueError(f"{where}: the ranks' inputs differ (this is rank {mine})")


def input_check_hook(group: dist.ProcessGroup, timeout: float, where: str) -> Any:
    """A forward pre-hook (with_kwargs=True) running `check_same_inputs`."""

    def hook(module: Any, args: tuple, kwargs: dict) -> None:
        check_same_inputs(args, kwargs, group, timeout=timeout, where=where)

    return hook
