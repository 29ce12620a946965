"""Distributed failures end, they do not hang or lie: tensor-parallel ranks given different
inputs fail on every rank naming the ranks and what differs (before gloo could abort on a shape
mismatch), and a rank that fails but stays alive makes the others fail within the stated
timeout. Spawned gloo worlds on 127.0.0.1, bounded in time."""

from __future__ import annotations

import os
import time

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh

from helpers_parallel import run_world
from multihead import CausalLM, LMConfig
from multihead.parallel import tensor_parallel


def make_model(world: int, timeout: float = 60.0):
    torch.manual_seed(0)
    config = LMConfig(vocab_size=37, dim=24, num_layers=2, num_heads=4, ffn_dim=16)
    mesh = init_device_mesh("cpu", (world,))
    return tensor_parallel(CausalLM(config).eval(), mesh, timeout=timeout)


def expect(error: type, fragments: list[str], fn) -> None:
    try:
        fn()
    except error as e:
        for fragment in fragments:
            assert fragment in str(e), str(e)
        return
    raise AssertionError(f"no {error.__name__} raised")


def different_ids(rank: int, world: int) -> None:
    model = make_model(world)
    ids = torch.arange(2 * 9).reshape(2, 9) % 37
    with torch.no_grad():
        model(ids)  # same inputs: fine
        if rank == 1:
            ids = ids.clone()
            ids[1, 4] += 1  # one token differs
        expect(ValueError, ["same input", "rank 0:", "rank 1:", "values", f"rank {rank})"],
               lambda: model(ids))  # fmt: skip


def different_lengths(rank: int, world: int) -> None:
    model = make_model(world)
    ids = torch.arange(2 * (9 + rank)).reshape(2, 9 + rank) % 37  # rank 1: one token longer
    with torch.no_grad():
        expect(ValueError, ["shape (2, 9)", "shape (2, 10)"], lambda: model(ids))


def failed_rank_stays_alive(rank: int, world: int) -> None:
    model = make_model(world, timeout=3.0)
    ids = torch.arange(18).reshape(2, 9) % 37
    if rank == 1:
        time.sleep(8)  # failed elsewhere, still alive, never reaches the forward
    else:
        start = time.monotonic()
        with torch.no_grad():
            expect(TimeoutError, ["within 3 s", "timeout="], lambda: model(ids))
        assert time.monotonic() - start < 30
    # the group is unusable after a timed-out collective: leave without the world's closing
    # barrier (an exit code of 0 is success to the launcher)
    os._exit(0)


def ring_rank_stays_alive(rank: int, world: int) -> None:
    from multihead.parallel import ring_attention

    q = torch.randn(1, 2, 4, 8)
    if rank == 1:
        time.sleep(8)
    else:
        expect(TimeoutError, ["ring_attention", "within 2 s"],
               lambda: ring_attention(q, q, q, timeout=2.0))  # fmt: skip
    os._exit(0)  # as above: no closing barrier on a group with a timed-out collective


@pytest.mark.parametrize("check", [different_ids, different_lengths])
def test_tensor_parallel_ranks_with_different_inputs_fail_on_every_rank(check):
    run_world(check, 2, timeout=120)


def test_tensor_parallel_rank_that_never_arrives_times_out():
    run_world(failed_rank_stays_alive, 2, timeout=120)


def test_ring_attention_rank_that_never_arrives_times_out():
    run_world(ring_rank_stays_alive, 2, timeout=120)


def test_timeout_must_be_positive():
    with pytest.raises(ValueError, match="timeout must be a positive number of seconds"):
        tensor_parallel(torch.nn.Linear(2, 2), object(), timeout=0)  # type: ignore[arg-type]
