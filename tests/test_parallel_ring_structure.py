"""ring_attention with window= and documents= (ids travelling with the keys) on gloo worlds,
against single-process attention() with the same structure: outputs and gradients of q, k, v,
both layouts, with key masks and grouped-query heads."""

from __future__ import annotations

import random

import pytest
import torch

from helpers_parallel import run_world
from multihead.functional import attention
from multihead.parallel import ring_attention, shard_sequence

from conftest import assert_close

CASES = [
    dict(causal=True, window=3, documents=False, layout="contiguous", key_mask=False),
    dict(causal=False, window=(1, 4), documents=False, layout="zigzag", key_mask=True),
    dict(causal=True, window=None, documents=True, layout="zigzag", key_mask=False),
    dict(causal=True, window=4, documents=True, layout="contiguous", key_mask=True),
    dict(causal=False, window=None, documents=True, layout="contiguous", key_mask=True),
]


def inputs(case: dict, seed: int):
    torch.manual_seed(seed)
    B, H, Hkv, T, D = 2, 4, 2, 13, 8
    q = torch.randn(B, H, T, D, dtype=torch.float64)
    k = torch.randn(B, Hkv, T, D, dtype=torch.float64)
    v = torch.randn(B, Hkv, T, 5, dtype=torch.float64)
    grad = torch.randn(B, H, T, 5, dtype=torch.float64)
    docs = torch.tensor([[0] * 4 + [1] * 6 + [2] * 3, [7] * 9 + [8] * 4])
    key_mask = torch.rand(B, T, generator=torch.Generator().manual_seed(seed)) < 0.7
    return (
        q,
        k,
        v,
        grad,
        docs if case["documents"] else None,
        key_mask if case["key_mask"] else None,
    )


def check(rank: int, world: int) -> None:
    for i, case in enumerate(CASES):
        q, k, v, grad, docs, key_mask = inputs(case, i)
        full = [t.detach().requires_grad_() for t in (q, k, v)]
        mask = None if key_mask is None else key_mask[:, None, None, :]
        out = attention(*full, mask=mask, causal=case["causal"], window=case["window"],
                        documents=docs, backend="eager")  # fmt: skip
        out.backward(grad)
        expected = [out.detach()] + [t.grad for t in full]

        def shard(t, dim, case=case):
            return (
                None
                if t is None
                else shard_sequence(t, world, rank, dim=dim, layout=case["layout"])
            )

        mine = [shard(t, 2).detach().requires_grad_() for t in (q, k, v)]
        got = ring_attention(*mine, causal=case["causal"], key_mask=shard(key_mask, 1),
                             layout=case["layout"], block_size=2, window=case["window"],
                             documents=shard(docs, 1))  # fmt: skip
        got.backward(shard(grad, 2))
        for name, g, e in zip(("out", "dq", "dk", "dv"), [got.detach()] + [t.grad for t in mine],
                              expected, strict=True):  # fmt: skip
            try:
                assert_close(g, shard(e, 2))
            except AssertionError as err:
                raise AssertionError(f"{name} differs on rank {rank} for {case}") from err


@pytest.mark.parametrize("world", [2, 3])
def test_ring_window_and_documents_match_single_process(world):
    random.seed(world)
    run_world(check, world)


def check_mixed_id_dtypes(rank: int, world: int) -> None:
    # Ranks may hold the same ids in different integer dtypes (each is accepted alone): the
    # ring once sized each rank's receive buffer by its own dtype, which aborted gloo on one
    # rank and read half-filled buffers as ids on the other.
    case = dict(causal=True, window=None, documents=True, layout="contiguous", key_mask=False)
    q, k, v, _, docs, _ = inputs(case, 0)
    want = attention(q, k, v, causal=True, documents=docs, backend="eager")
    mine = [shard_sequence(t, world, rank, dim=2) for t in (q, k, v)]
    ids = shard_sequence(docs, world, rank, dim=1).to(torch.int32 if rank == 0 else torch.int64)
    got = ring_attention(*mine, causal=True, block_size=2, documents=ids)
    assert_close(got, shard_sequence(want, world, rank, dim=2))


def test_ranks_may_hold_ids_of_different_integer_dtypes():
    run_world(check_mixed_id_dtypes, 2)
