"""window=, documents= and prefix= on every backend against the fp64 reference under a dense
mask written out here pair by pair: outputs, weights, gradients of q, k, v and bias, zeros on
rows with nothing to attend, grouped-query heads, cross lengths (bottom-right), and property
tests over shapes and structures."""

import sys

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers_structure import B, H, grads, qkv
from multihead import attention
from multihead.functional import explain
from multihead.functional.backends import tiled as tiled_backend

from conftest import assert_close
from reference import reference_attention, structure_mask_pairwise

BACKENDS = ["eager", "sdpa", "tiled", "auto"]


@pytest.fixture(autouse=True)
def small_tiles(monkeypatch):
    """Tiles of 4 queries x 4 keys, so that these small shapes cross many tiles (full,
    partial and skipped ones)."""
    monkeypatch.setattr(tiled_backend, "block_size", lambda structure: 4)


def dense_mask(tq, tk, **structure):
    """(B, 1, Tq, Tk) may-attend mask, written out pair by pair from the definitions."""
    return structure_mask_pairwise(B, tq, tk, **structure)


DOCS = [[0] * 5 + [1] * 9 + [2] * 6, [3] * 12 + [4] * 8]  # (B, 20) ids
CASES = {
    "window": dict(causal=True, window=5),
    "window-pair": dict(window=(2, 6)),
    "bidirectional-window": dict(window=3),
    "documents-causal": dict(causal=True, documents=DOCS),
    "documents": dict(documents=DOCS),
    "prefix": dict(causal=True, prefix=7),
    "prefix-per-row": dict(causal=True, prefix=[3, 11]),
    "all": dict(causal=True, window=6, documents=DOCS, prefix=[4, 9]),
}


def as_args(case):
    args = dict(case)
    if "documents" in args:
        args["documents"] = torch.tensor(args["documents"])
    if isinstance(args.get("prefix"), list):
        args["prefix"] = torch.tensor(args["prefix"])
    return args


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("hkv", [H, 1])
def test_structure_matches_the_dense_mask(backend, name, hkv):
    case = CASES[name]
    q, k, v = qkv(20, 20, hkv)
    key_mask = torch.ones(B, 1, 1, 20, dtype=torch.bool)
    key_mask[1, ..., 16:] = False  # padding in row 1
    out = attention(q, k, v, mask=key_mask, backend=backend, **as_args(case))
    mask = dense_mask(20, 20, **case) & key_mask
    ref, _ = reference_attention(q, k, v, mask=mask)
    assert_close(out, ref)
    for a, b in zip(grads(out, q, k, v), grads(ref, q, k, v), strict=True):
        assert_close(a, b)


UNBOUNDED = [sys.maxsize, 10**30, (0, sys.maxsize), (sys.maxsize, 2), (2**62, 2**62)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("window", UNBOUNDED, ids=str)
@pytest.mark.parametrize("causal", [False, True])
def test_a_window_wider_than_any_sequence_restricts_only_what_it_reaches(backend, window, causal):
    # "No limit" written as sys.maxsize once wrapped around in int64 position arithmetic
    # (p + right) and emptied rows without an error; 10**30 raised torch's OverflowError.
    q, k, v = qkv(20, 20)
    out = attention(q, k, v, causal=causal, window=window, backend=backend)
    # (the reference's positions are Python ints: exact at any width)
    ref, _ = reference_attention(q, k, v, mask=dense_mask(20, 20, causal=causal, window=window))
    assert_close(out, ref)
    for a, b in zip(grads(out, q, k, v), grads(ref, q, k, v), strict=True):
        assert_close(a, b)


@pytest.mark.parametrize("backend", BACKENDS)
def test_numpy_integers_are_windows_like_ints(backend):
    q, k, v = qkv(20, 20)
    for np_window, window in [(np.int64(5), 5), ((np.int32(2), np.uint8(6)), (2, 6))]:
        out = attention(q, k, v, causal=True, window=np_window, backend=backend)
        assert_close(out, attention(q, k, v, causal=True, window=window, backend=backend))
    with pytest.raises(ValueError, match=r"window must be a positive int.*got np.int64\(0\)"):
        attention(q, k, v, window=np.int64(0), backend=backend)
    with pytest.raises(ValueError, match=r"window must be .*got tensor\(4\)"):
        attention(q, k, v, window=torch.tensor(4), backend=backend)  # (reading it breaks tracing)


@pytest.mark.parametrize("backend", ["eager", "sdpa", "tiled"])
def test_cross_lengths_align_bottom_right(backend):
    q, k, v = qkv(6, 20, hkv=1)
    case = dict(causal=True, window=4, documents=DOCS)
    out = attention(q, k, v, backend=backend, **as_args(case))
    ref, _ = reference_attention(q, k, v, mask=dense_mask(6, 20, **case))
    assert_close(out, ref)
    for a, b in zip(grads(out, q, k, v), grads(ref, q, k, v), strict=True):
        assert_close(a, b)


@pytest.mark.parametrize("backend", ["eager", "sdpa", "tiled"])
def test_bias_and_its_gradient_with_a_window(backend):
    q, k, v = qkv(13, 13)
    bias = torch.randn(1, H, 13, 13, dtype=torch.float64, requires_grad=True)
    out = attention(q, k, v, bias=bias, causal=True, window=4, backend=backend)
    ref, _ = reference_attention(q, k, v, mask=dense_mask(13, 13, causal=True, window=4), bias=bias)
    assert_close(out, ref)
    for a, b in zip(grads(out, q, k, v, bias), grads(ref, q, k, v, bias), strict=True):
        assert_close(a, b)


def test_an_alibi_bias_that_broadcasts_over_batch_and_rows():
    q, k, v = qkv(12, 12)
    slopes = torch.tensor([0.5, 0.25, 0.125], dtype=torch.float64).view(1, H, 1, 1)
    distance = (torch.arange(12)[None, :] - torch.arange(12)[:, None]).double()
    bias = (slopes * distance).requires_grad_()  # (1, H, 12, 12)
    key_bias = torch.randn(1, 1, 1, 12, dtype=torch.float64, requires_grad=True)
    for b in (bias, key_bias):
        out = attention(q, k, v, bias=b, causal=True, window=5, backend="tiled")
        mask = dense_mask(12, 12, causal=True, window=5)
        ref, _ = reference_attention(q, k, v, mask=mask, bias=b)
        for x, y in zip(grads(out, q, b), grads(ref, q, b), strict=True):
            assert_close(x, y)


@pytest.mark.parametrize("name", ["window", "documents-causal", "prefix-per-row", "all"])
def test_weights_route_to_eager_and_match(name):
    case = CASES[name]
    q, k, v = qkv(20, 20)
    out, weights = attention(q, k, v, return_weights=True, **as_args(case))
    ref, ref_weights = reference_attention(q, k, v, mask=dense_mask(20, 20, **case))
    assert_close(out, ref)
    assert_close(weights, ref_weights)


@pytest.mark.parametrize("backend", ["eager", "sdpa", "tiled"])
def test_rows_with_nothing_to_attend_are_zero(backend):
    # A window that the key mask empties (queries 9 and 10 see keys 7..10: all padding), and a
    # document of padding whose keys are all masked.
    q, k, v = qkv(16, 16)
    key_mask = torch.ones(B, 1, 1, 16, dtype=torch.bool)
    key_mask[0, ..., 7:11] = False
    documents = torch.tensor([[0] * 16, [0] * 10 + [1] * 6])
    key_mask[1, ..., 10:] = False  # document 1 of row 1 is padding
    out = attention(
        q, k, v, mask=key_mask, causal=True, window=3, documents=documents, backend=backend
    )
    ref, _ = reference_attention(
        q, k, v, mask=key_mask & dense_mask(16, 16, causal=True, window=3, documents=documents)
    )
    assert torch.equal(out[0, :, 9:11], torch.zeros_like(out[0, :, 9:11]))
    assert torch.equal(out[1, :, 10:], torch.zeros_like(out[1, :, 10:]))
    assert_close(out, ref)
    dq, dk, dv = grads(out, q, k, v)
    for g in (dq, dk, dv):
        assert torch.isfinite(g).all()
    assert torch.equal(dq[0, :, 9:11], torch.zeros_like(dq[0, :, 9:11]))


def test_nan_in_a_value_reaches_only_the_rows_that_attend_to_it():
    q, k, v = qkv(16, 16, dtype=torch.float32)
    v = v.detach().clone()
    v[:, :, 3] = float("nan")
    out = attention(q.detach(), k.detach(), v, causal=True, window=4, backend="tiled")
    assert torch.isnan(out[:, :, 3:7]).all()  # queries 3..6 see key 3
    # Queries 8.. never share a tile with key 3 (tiles of 4), so it cannot reach them. (Inside
    # a tile a blocked NaN value spreads as 0 * NaN, as in the dense backends.)
    assert not torch.isnan(out[:, :, 8:]).any()


def test_float32_matches_the_reference():
    q, k, v = qkv(20, 20, dtype=torch.float32)
    case = CASES["all"]
    out = attention(q, k, v, backend="tiled", **as_args(case))
    ref, _ = reference_attention(q, k, v, mask=dense_mask(20, 20, **case))
    assert_close(out, ref, torch.float32)
    for a, b in zip(grads(out, q, k, v), grads(ref, q, k, v), strict=True):
        assert_close(a, b.float(), torch.float32)


def test_auto_runs_tiled_on_cpu_for_large_structured_calls_only():
    big = torch.randn(1, 2, 1024, 8)
    assert explain(big, big, big, causal=True, window=64).chosen == "tiled"
    assert explain(big, big, big, causal=True).chosen == "sdpa"  # nothing to skip
    small = torch.randn(1, 2, 16, 8)
    why_small = explain(small, small, small, causal=True, window=4)
    assert why_small.chosen == "sdpa" and "tiled" in why_small.not_preferred
    assert "auto does not pick it" in str(why_small)
    # training with dropout stays tiled (keep masks per tile: test_functional_structure_dropout)
    assert explain(big, big, big, causal=True, window=64, dropout_p=0.1).chosen == "tiled"
    assert explain(big, big, big, window=64, return_weights=True).chosen == "eager"


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    tq=st.integers(1, 14),
    extra=st.integers(0, 6),
    causal=st.booleans(),
    window=st.one_of(st.none(), st.integers(1, 9), st.tuples(st.integers(0, 6), st.integers(0, 6))),
    cuts=st.lists(st.integers(1, 19), max_size=3),
    prefix=st.one_of(st.none(), st.integers(0, 20)),
    hkv=st.sampled_from([1, H]),
)
def test_property_tiled_equals_the_dense_mask(tq, extra, causal, window, cuts, prefix, hkv):
    tk = tq + extra
    ids = [sum(j >= c for c in cuts) for j in range(tk)]
    documents = [ids, ids[::-1]]
    prefix = min(prefix, tk) if (prefix is not None and causal) else None
    q, k, v = qkv(tq, tk, hkv)
    args = dict(causal=causal, window=window, prefix=prefix)
    out = attention(q, k, v, documents=torch.tensor(documents), backend="tiled", **args)
    ref, _ = reference_attention(q, k, v, mask=dense_mask(tq, tk, documents=documents, **args))
    assert_close(out, ref)
    for a, b in zip(grads(out, q, k, v), grads(ref, q, k, v), strict=True):
        assert_close(a, b)


@pytest.mark.parametrize("grad", [False, True])  # the fused tiles, and the plain-torch ones
def test_nan_in_the_bias_is_not_a_block(grad):
    q, k, v = (t.detach() for t in qkv(16, 16, dtype=torch.float32))
    bias = torch.zeros(1, 1, 16, 16)
    bias[..., 9, :] = float("nan")  # every key of query 9
    out = attention(q, k, v, bias=bias.requires_grad_(grad), causal=True, window=4,
                    backend="tiled")  # fmt: skip
    assert torch.isnan(out[:, :, 9]).all()
    assert not torch.isnan(out[:, :, 12:]).any()


def test_structure_traces_under_torch_compile_fullgraph():
    # Compiled code cannot trace the tiled backend's autograd.Function: auto runs sdpa under
    # the dense mask there (built from the structure inside the graph), with equal results.
    q, k, v = (torch.randn(1, 2, 300, 8, requires_grad=True) for _ in range(3))
    documents = torch.tensor([[0] * 100 + [1] * 200])

    def f(q, k, v, documents):
        return attention(q, k, v, causal=True, window=64, documents=documents, prefix=10)

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    got, want = compiled(q, k, v, documents), f(q, k, v, documents)  # want: the tiled backend
    assert_close(got, want, torch.float32)
    for a, b in zip(grads(got, q, k, v), grads(want, q, k, v), strict=True):
        assert_close(a, b, torch.float32)
