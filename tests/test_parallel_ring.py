"""ring_attention on gloo worlds of 1, 2 and 4 processes against single-process attention():
outputs and gradients of q, k, v, for both layouts, causal or not, key masks (incl. fully padded
rows and items), GQA, ALiBi / window biases from global positions, and seeded dropout.

Every rank builds the same full inputs from the case's seed, computes the single-process result,
and compares its own chunk; cases are grouped per world to pay the process start once.
"""

from __future__ import annotations

import random

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from helpers_parallel import run_world
from multihead.functional import attention
from multihead.parallel import (
    dropout_keep_mask,
    gather_sequence,
    ring_attention,
    sequence_positions,
    shard_sequence,
    unshard_sequence,
)
from multihead.positional import alibi_slopes, apply_rope, rope_cos_sin, rope_frequencies

from conftest import assert_close
from reference import reference_attention

DTYPES = {"fp32": torch.float32, "fp64": torch.float64}


def make_case(rng: random.Random, world: int, **fixed) -> dict:
    """A random small case: mutually distinct sizes, T often not divisible by P."""
    H = rng.choice([2, 3, 4, 6])
    case = dict(
        seed=rng.randrange(2**31),
        B=rng.choice([1, 2]),
        H=H,
        Hkv=rng.choice([d for d in range(1, H + 1) if H % d == 0]),
        T=rng.randrange(2 * world, 5 * world + 4),
        D=rng.choice([4, 8]),
        Dv=rng.choice([3, 5]),
        dtype=rng.choice(["fp32", "fp64"]),
        layout=rng.choice(["contiguous", "zigzag"]),
        causal=rng.random() < 0.5,
        key_mask=rng.choice([None, "left_padding", "random"]),
        bias=rng.choice([None, None, "alibi", "window"]),
        dropout_p=0.0,
        block_size=rng.choice([2, 3, 64]),
        scale=rng.choice([None, 0.3]),
    )
    case.update(fixed)
    return case


def full_inputs(case: dict):
    """The whole sequence's q, k, v, output gradient and masks, equal on every rank."""
    torch.manual_seed(case["seed"])
    dtype = DTYPES[case["dtype"]]
    B, H, Hkv, T, D, Dv = (case[n] for n in ("B", "H", "Hkv", "T", "D", "Dv"))
    q = torch.randn(B, H, T, D, dtype=dtype)
    k = torch.randn(B, Hkv, T, D, dtype=dtype)
    v = torch.randn(B, Hkv, T, Dv, dtype=dtype)
    grad = torch.randn(B, H, T, Dv, dtype=dtype)
    key_mask = None
    if case["key_mask"] == "left_padding":
        # Item 0 entirely padding; item 1 padded at the start, so under a causal mask its first
        # queries see nothing: rows and items that attend to nothing.
        key_mask = torch.ones(B, T, dtype=torch.bool)
        key_mask[0] = False
        if B > 1:
            key_mask[1, : T // 2] = False
    elif case["key_mask"] == "random":
        key_mask = torch.rand(B, T) < 0.6
        key_mask[0, :] = False  # one fully padded item
    return q, k, v, grad, key_mask


def bias_for(case: dict, dtype: torch.dtype):
    """(bias_fn for ring_attention from global positions, the same bias (1, H, T, T) in full)."""
    if case["bias"] is None:
        return None, None
    slopes = alibi_slopes(case["H"]).to(dtype)

    def bias_fn(q_index, k_index):
        distance = (q_index[:, None] - k_index[None, :]).abs().to(dtype)  # (tq, tk)
        bias = -slopes[None, :, None, None] * distance  # (1, H, tq, tk)
        if case["bias"] == "window":  # -inf blocks keys farther than 2 positions
            bias = bias.masked_fill(distance > 2, float("-inf"))
        return bias

    T = case["T"]
    index = torch.arange(T)
    return bias_fn, bias_fn(index, index)


def single_process(case: dict, q, k, v, grad, key_mask, full_bias):
    """attention() on the whole sequence (plus the same dropout mask applied to its weights)."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    mask = None if key_mask is None else key_mask[:, None, None, :]
    # The eager backend: the sdpa backend gets rows blocked by mask and -inf bias together wrong
    # (it returns a non-zero output for them; reported to the core).
    kwargs = dict(
        mask=mask, bias=full_bias, causal=case["causal"], scale=case["scale"], backend="eager"
    )
    if case["dropout_p"] == 0.0:
        out = attention(q, k, v, **kwargs)
    else:
        # The same masks in one process: attention()'s weights, then the documented keep mask.
        _, weights = attention(q, k, v, return_weights=True, **kwargs)
        index = torch.arange(case["T"])
        B, H = q.shape[:2]
        keep = dropout_keep_mask(case["dropout_seed"], case["dropout_p"], B, H, index, index)
        v_heads = v.repeat_interleave(H // v.shape[1], dim=1)  # (B, Hkv, T, Dv) -> (B, H, T, Dv)
        out = (weights * keep / (1 - case["dropout_p"])) @ v_heads
    out.backward(grad)
    return out.detach(), q.grad, k.grad, v.grad


def sharded(case: dict, rank: int, world: int, q, k, v, grad, key_mask, bias_fn):
    """ring_attention on this rank's chunk; returns its output and gradients."""
    layout = case["layout"]

    def shard(t, dim):
        return None if t is None else shard_sequence(t, world, rank, dim=dim, layout=layout)

    q_r, k_r, v_r = (shard(t, 2).detach().requires_grad_() for t in (q, k, v))
    out = ring_attention(
        q_r,
        k_r,
        v_r,
        causal=case["causal"],
        key_mask=shard(key_mask, 1),
        scale=case["scale"],
        dropout_p=case["dropout_p"],
        dropout_seed=case.get("dropout_seed"),
        layout=layout,
        bias_fn=bias_fn,
        block_size=case["block_size"],
    )
    out.backward(shard(grad, 2))
    return out.detach(), q_r.grad, k_r.grad, v_r.grad


def check_cases(rank: int, world: int, cases: list[dict]) -> None:
    for case in cases:
        q, k, v, grad, key_mask = full_inputs(case)
        bias_fn, full_bias = bias_for(case, q.dtype)
        expected = single_process(case, q, k, v, grad, key_mask, full_bias)
        got = sharded(case, rank, world, q, k, v, grad, key_mask, bias_fn)
        for name, g, e in zip(("out", "dq", "dk", "dv"), got, expected, strict=True):
            want = shard_sequence(e, world, rank, dim=2, layout=case["layout"])
            try:
                assert_close(g, want)
            except AssertionError as err:
                raise AssertionError(f"{name} differs on rank {rank} for {case}") from err
        if case["key_mask"] is not None:  # item 0 has no key at all: zeros, not NaN
            assert torch.equal(got[0][0], torch.zeros_like(got[0][0]))
            assert torch.equal(got[1][0], torch.zeros_like(got[1][0]))


def _cases(world: int, n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    cases = [make_case(rng, world) for _ in range(n)]
    # Every combination of layout x causal x dtype at least once, with masks and GQA.
    for i, (layout, causal, dtype) in enumerate(
        (lay, c, d) for lay in ("contiguous", "zigzag") for c in (False, True) for d in DTYPES
    ):
        cases.append(
            make_case(rng, world, layout=layout, causal=causal, dtype=dtype, H=4, Hkv=2,
                      key_mask=["left_padding", "random"][i % 2])
        )  # fmt: skip
    # Seeded dropout, against attention()'s weights with the same keep mask.
    for layout in ("contiguous", "zigzag"):
        cases.append(
            make_case(rng, world, layout=layout, causal=True, dropout_p=0.3, dropout_seed=1234,
                      key_mask="random", bias="alibi")
        )  # fmt: skip
    return cases


@pytest.mark.parametrize("world", [2, 4])
def test_ring_attention_matches_single_process(world):
    run_world(check_cases, world, _cases(world, n=10, seed=world))


def check_reference_and_one_rank(rank: int, world: int) -> None:
    """Against the independent fp64 textbook attention, with a causal ALiBi case."""
    case = make_case(random.Random(7), world, dtype="fp64", causal=True, bias="alibi",
                     key_mask="left_padding", B=2, H=3, Hkv=1, T=9, D=4, Dv=5)  # fmt: skip
    q, k, v, grad, key_mask = full_inputs(case)
    bias_fn, full_bias = bias_for(case, q.dtype)
    out, *_ = sharded(case, rank, world, q, k, v, grad, key_mask, bias_fn)
    expected, _ = reference_attention(q, k, v, mask=key_mask[:, None, None, :], bias=full_bias,
                                      causal=True, scale=case["scale"])  # fmt: skip
    assert_close(out, shard_sequence(expected, world, rank, dim=2, layout=case["layout"]))


def test_ring_attention_matches_reference_on_two_ranks():
    run_world(check_reference_and_one_rank, 2)


def test_ring_attention_on_one_rank():
    run_world(check_cases, 1, _cases(1, n=4, seed=1))


def check_uneven_contiguous(rank: int, world: int) -> None:
    """Contiguous chunks need not be equal: lengths 3 and 8 here."""
    case = make_case(random.Random(3), world, T=11, causal=True, key_mask="random", dtype="fp64")
    q, k, v, grad, key_mask = full_inputs(case)
    cut = [(0, 3), (3, 11)][rank]
    q_r, k_r, v_r = (t[:, :, cut[0] : cut[1]].detach().requires_grad_() for t in (q, k, v))
    out = ring_attention(q_r, k_r, v_r, causal=True, key_mask=key_mask[:, cut[0] : cut[1]])
    out.backward(grad[:, :, cut[0] : cut[1]])
    expected = single_process(case | {"scale": None}, q, k, v, grad, key_mask, None)
    for g, e in zip((out, q_r.grad, k_r.grad, v_r.grad), expected, strict=True):
        assert_close(g, e[:, :, cut[0] : cut[1]])
    whole = gather_sequence(out.detach(), dim=2)
    assert_close(whole, expected[0])


def check_gather(rank: int, world: int) -> None:
    x = torch.arange(2 * 13 * 3).view(2, 13, 3)  # T = 13: not divisible by 4 nor 8
    for layout in ("contiguous", "zigzag"):
        chunk = shard_sequence(x, world, rank, dim=1, layout=layout)
        assert torch.equal(gather_sequence(chunk, dim=1, layout=layout), x)
        chunks = [shard_sequence(x, world, r, dim=-2, layout=layout) for r in range(world)]
        assert torch.equal(unshard_sequence(chunks, dim=1, layout=layout), x)


def check_rope_at_global_positions(rank: int, world: int) -> None:
    """The recipe of docs/parallel.md: rotate each chunk at its global positions
    (sequence_positions), then ring attention; equals RoPE + attention() on the whole sequence."""
    torch.manual_seed(4)
    B, H, T, D = 2, 3, 23, 8
    q, k, v = torch.randn(B, H, T, D), torch.randn(B, H, T, D), torch.randn(B, H, T, D)
    inv_freq = rope_frequencies(D)
    cos, sin = rope_cos_sin(torch.arange(T), inv_freq)
    expected = attention(apply_rope(q, cos, sin), apply_rope(k, cos, sin), v, causal=True)
    for layout in ("contiguous", "zigzag"):
        cos_r, sin_r = rope_cos_sin(sequence_positions(T, world, rank, layout=layout), inv_freq)
        q_r, k_r, v_r = (shard_sequence(t, world, rank, dim=2, layout=layout) for t in (q, k, v))
        out = ring_attention(apply_rope(q_r, cos_r, sin_r), apply_rope(k_r, cos_r, sin_r), v_r,
                             causal=True, layout=layout)  # fmt: skip
        assert_close(out, shard_sequence(expected, world, rank, dim=2, layout=layout))


def check_gather_and_rope(rank: int, world: int) -> None:
    check_gather(rank, world)
    check_rope_at_global_positions(rank, world)


def test_uneven_chunks_gather_and_rope():
    run_world(check_uneven_contiguous, 2)
    run_world(check_gather_and_rope, 4)


class _Shapes(TorchDispatchMode):
    """Records the shape of every tensor any op returns."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        leaves, _ = tree_flatten(out)
        self.shapes += [tuple(t.shape) for t in leaves if isinstance(t, torch.Tensor)]
        return out


def check_memory_bound(rank: int, world: int) -> None:
    """No tensor made in the forward or backward ring has a dimension as long as the sequence:
    no rank holds a T x T tensor or all of the keys."""
    T = 4 * world + 7  # longer than every other size here (the ranks agree on 19 numbers)
    for layout in ("contiguous", "zigzag"):
        case = make_case(random.Random(5), world, T=T, B=2, H=4, Hkv=2, D=8, Dv=5, layout=layout,
                         causal=True, key_mask="random", bias="alibi", block_size=64,
                         dropout_p=0.1, dropout_seed=3)  # fmt: skip
        q, k, v, grad, key_mask = full_inputs(case)
        bias_fn, _ = bias_for(case, q.dtype)
        with _Shapes() as seen:
            sharded(case, rank, world, q, k, v, grad, key_mask, bias_fn)
        assert len(seen.shapes) > 50  # the mode did see the ring's work
        longest = max(max(s, default=0) for s in seen.shapes)
        assert longest < T, f"a tensor of shape with a dimension {longest} >= T = {T}"


def test_no_rank_holds_the_whole_sequence():
    run_world(check_memory_bound, 4)


@pytest.mark.slow
def test_ring_attention_larger_case():
    case = dict(seed=11, B=2, H=8, Hkv=2, T=517, D=16, Dv=12, dtype="fp32", layout="zigzag",
                causal=True, key_mask="left_padding", bias="alibi", dropout_p=0.0,
                block_size=48, scale=None)  # fmt: skip
    run_world(check_cases, 4, [case, case | {"layout": "contiguous", "T": 450, "Hkv": 8}])
