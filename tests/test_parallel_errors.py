"""ring_attention rejects bad input with errors naming the argument, on every rank at once: a
rank with bad input never leaves its peers waiting (each check below would hang otherwise)."""

from __future__ import annotations

import pytest
import torch

from helpers_parallel import run_world
from multihead.parallel import ring_attention

B, H, HKV, T_R, D, DV = 2, 4, 2, 5, 8, 6


def good_inputs():
    return (
        torch.randn(B, H, T_R, D),
        torch.randn(B, HKV, T_R, D),
        torch.randn(B, HKV, T_R, DV),
    )


def expect(error: type[Exception], match: str, *args, **kwargs) -> None:
    with pytest.raises(error, match=match):
        ring_attention(*args, **kwargs)


def check_errors(rank: int, world: int) -> None:
    q, k, v = good_inputs()
    # Inputs wrong on every rank: every rank raises the same error.
    expect(ValueError, r"q must have 4 dimensions", q[0], k, v)
    expect(TypeError, r"q must be a floating-point tensor, got dtype torch.int64", q.long(), k, v)
    expect(TypeError, r"k must be a torch.Tensor, got list", q, [1], v)
    expect(TypeError, r"q, k, v must share one dtype", q, k.double(), v)
    expect(ValueError, r"k \(2, 2, 5, 8\) and v \(2, 2, 4, 6\) must agree", q, k, v[:, :, :4])
    expect(
        ValueError,
        r"key/value heads \(3, k",
        q,
        torch.randn(B, 3, T_R, D),
        torch.randn(B, 3, T_R, DV),
    )
    expect(ValueError, r"batch sizes differ", q[:1], k, v)
    expect(ValueError, r"head_dim of q .* and k .* differ \(8 != 4\)", q, k[..., :4], v)
    expect(
        ValueError,
        r"must hold the same positions of the sequence \(dim 2: 4 != 5\)",
        q[:, :, :4],
        k,
        v,
    )
    expect(TypeError, r"key_mask must be boolean", q, k, v, key_mask=torch.ones(B, T_R))
    expect(
        ValueError,
        r"key_mask must have shape \(B, T/P\) = \(2, 5\)",
        q,
        k,
        v,
        key_mask=torch.ones(T_R, B, dtype=torch.bool),
    )
    expect(TypeError, r"causal must be a bool, got str", q, k, v, causal="yes")
    expect(ValueError, r"scale must be finite and positive, got -1", q, k, v, scale=-1.0)
    expect(TypeError, r"scale must be a float or None, got str", q, k, v, scale="0.1")
    expect(ValueError, r"dropout_p must be in \[0, 1\), got 1.5", q, k, v, dropout_p=1.5)
    expect(ValueError, r"dropout_p > 0 needs dropout_seed", q, k, v, dropout_p=0.1)
    expect(
        ValueError,
        r"dropout_seed must be an int in \[0, 2\*\*63\), got 'x'",
        q,
        k,
        v,
        dropout_p=0.1,
        dropout_seed="x",
    )
    expect(
        ValueError,
        r"layout must be one of \('contiguous', 'zigzag'\), got 'ring'",
        q,
        k,
        v,
        layout="ring",
    )
    expect(ValueError, r"block_size must be a positive int, got 0", q, k, v, block_size=0)
    expect(TypeError, r"bias_fn must be callable", q, k, v, bias_fn=3)
    expect(
        ValueError,
        r"bias_fn returned shape \(7,\), which does not broadcast to \(B, H, tq, tk\) = \(2, 4, 2, 3\)",
        q,
        k,
        v,
        bias_fn=lambda i, j: torch.zeros(7),
    )
    expect(
        TypeError,
        r"bias_fn must return a floating-point tensor, got dtype torch.bool",
        q,
        k,
        v,
        bias_fn=lambda i, j: i[:, None] < j,
    )
    expect(
        ValueError,
        r"bias_fn must return a tensor that does not require grad",
        q,
        k,
        v,
        bias_fn=lambda i, j: torch.zeros(1, requires_grad=True),
    )
    expect(
        TypeError, r"group must be a torch.distributed.ProcessGroup or None", q, k, v, group="world"
    )
    # Zig-zag chunks must have the lengths shard_sequence gives them (5 and 5 for T = 10).
    n = [6, 4][rank]
    expect(
        ValueError,
        r"must have lengths \[5, 5\] \(as shard_sequence makes them\), got \[6, 4\]",
        q[:, :, :n] if n < T_R else torch.randn(B, H, n, D),
        torch.randn(B, HKV, n, D),
        torch.randn(B, HKV, n, DV),
        layout="zigzag",
    )

    # Wrong on one rank only: that rank names the argument, the others name that rank.
    if rank == 1:
        expect(TypeError, r"q, k, v must share one dtype", q.double(), k, v)
    else:
        expect(ValueError, r"rank\(s\) \[1\] of the group rejected their inputs", q, k, v)

    def failing(i, j):
        raise RuntimeError("bias table missing")

    if rank == 0:
        expect(RuntimeError, r"bias table missing", q, k, v, bias_fn=failing)
    else:
        expect(
            ValueError,
            r"rank\(s\) \[0\] of the group rejected",
            q,
            k,
            v,
            bias_fn=lambda i, j: torch.zeros(1),
        )

    # Valid on each rank but not in agreement: every rank names the argument and the values.
    expect(
        ValueError,
        r"causal must be the same on every rank, got rank 0: False, rank 1: True",
        q,
        k,
        v,
        causal=rank == 1,
    )
    expect(
        ValueError,
        r"scale must be the same on every rank, got rank 0: 0.5, rank 1: 0.25",
        q,
        k,
        v,
        scale=0.5 / (rank + 1),
    )
    expect(
        ValueError,
        r"dropout_seed must be the same on every rank",
        q,
        k,
        v,
        dropout_p=0.1,
        dropout_seed=rank,
    )
    expect(
        ValueError,
        r"key/value heads Hkv \(dim 1 of k, v\) must be the same on every rank, got rank 0: 2, rank 1: 1",
        q,
        k[:, : 2 - rank],
        v[:, : 2 - rank],
    )
    q_grad = q.clone().requires_grad_(rank == 0)
    expect(ValueError, r"needs gradients .* must be the same on every rank", q_grad, k, v)

    # After all that, the ring still works.
    out = ring_attention(q, k, v, causal=True)
    assert out.shape == (B, H, T_R, DV) and torch.isfinite(out).all()


def test_errors_name_the_argument_on_every_rank():
    run_world(check_errors, 2)
