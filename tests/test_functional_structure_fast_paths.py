"""The tiled backend's fast paths against the fp64 textbook reference: a causal window alone
(one batched kernel call over a band, tile_band.py), documents in contiguous runs (kernel calls
per document, tile_segments.py) and an int prefix (three large calls, tile_prefix.py). Each case also checks the path was taken (or not),
so a plan change cannot silently send these shapes back to the general tile loop."""

import functools
import sys

import pytest
import torch

from helpers_spies import count_calls
from multihead import attention
from multihead.functional.backends import tiled as tiled_backend

from conftest import assert_close
from reference import reference_attention, structure_mask_pairwise

D = 8


def window_mask(T, W):
    """(1, 1, T, T): query i sees keys i - W + 1 .. i (from the definition)."""
    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    return ((j <= i) & (j > i - W))[None, None]


def document_mask(ids, causal):
    """(B, 1, T, T): same document (and causal inside it)."""
    ids = torch.as_tensor(ids)
    same = ids[:, :, None] == ids[:, None, :]
    if causal:
        same = same & torch.ones(ids.shape[1], ids.shape[1], dtype=torch.bool).tril()
    return same[:, None]


@pytest.fixture
def spy(monkeypatch):
    """Counts calls of the fast paths' forward and backward functions (one per unit of heads:
    with several threads a call runs several, `tile_threads`)."""
    names = {
        "band_forward": "band", "band_backward": "band_backward",
        "segments_forward": "segments", "segments_backward": "segments_backward",
        "prefix_forward": "prefix", "prefix_backward": "prefix_backward",
        "masked_band_forward": "masked", "masked_band_backward": "masked_backward",
    }  # fmt: skip
    return count_calls(monkeypatch, tiled_backend, names)


def check(out, ref, inputs, dtype):
    assert_close(out, ref, dtype)
    g = torch.randn(out.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    got = torch.autograd.grad((out * g.to(out.dtype)).sum(), inputs)
    want = torch.autograd.grad((ref * g).sum(), inputs)
    for a, b in zip(got, want, strict=True):
        assert_close(a, b, dtype)


def qkv(B, H, Hkv, T, dtype):
    return (
        torch.randn(B, H, T, D, dtype=dtype, requires_grad=True),
        torch.randn(B, Hkv, T, D, dtype=dtype, requires_grad=True),
        torch.randn(B, Hkv, T, D, dtype=dtype, requires_grad=True),
    )


@pytest.mark.parametrize("T, W", [(100, 2), (130, 3), (257, 33), (300, 64), (300, 100), (400, 129)])
@pytest.mark.parametrize("hkv", [4, 2])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_a_causal_window_runs_as_one_band(spy, T, W, hkv, dtype):
    q, k, v = qkv(2, 4, hkv, T, dtype)
    out = attention(q, k, v, causal=True, window=W, backend="tiled")
    assert spy["band"] >= 1
    ref, _ = reference_attention(q, k, v, mask=window_mask(T, W))
    check(out, ref, (q, k, v), dtype)
    assert spy["band_backward"] >= 1


@pytest.mark.parametrize("window", [sys.maxsize, (sys.maxsize, 0), (0, sys.maxsize), 10**30])
def test_a_window_wider_than_the_sequence_is_no_window_at_full_tile_sizes(window):
    # (the tiled backend's own tiles, not the small ones other files force: "no limit" as
    # sys.maxsize once overflowed its int64 positions and emptied rows)
    q, k, v = qkv(1, 2, 2, 300, torch.float64)
    out = attention(q, k, v, causal=True, window=window, backend="tiled")
    mask = structure_mask_pairwise(1, 300, 300, causal=True, window=window)  # (Python ints)
    ref, _ = reference_attention(q, k, v, mask=mask)
    check(out, ref, (q, k, v), torch.float64)


@pytest.mark.parametrize("per_call", [1, 3])
@pytest.mark.parametrize("T, W", [(300, 64), (333, 40)])
def test_a_band_backward_in_several_kernel_calls_adds_up(monkeypatch, spy, per_call, T, W):
    # The band's backward runs a few key blocks per kernel call and overlap-adds each block's
    # query gradients across calls: one block, or three, per call gives the same gradients.
    from multihead.functional.backends import tile_band

    # (a call's elements: blocks x heads x band x D, per batch element)
    monkeypatch.setattr(tile_band, "CHUNK_ELEMENTS", per_call * 4 * (W - 1 + 32) * D)
    q, k, v = qkv(2, 4, 2, T, torch.float64)
    out = attention(q, k, v, causal=True, window=W, backend="tiled")
    ref, _ = reference_attention(q, k, v, mask=window_mask(T, W))
    check(out, ref, (q, k, v), torch.float64)
    assert spy["band_backward"] >= 1


def _head_dim_strided(layout, B, H, T, dtype):
    """q, k, v (B, H, T, D) whose head dimension is not contiguous, with their leaves."""
    if layout == "permuted":  # a (B, T, D, H) layout seen as (B, H, T, D)
        leaves = [torch.randn(B, T, D, H, dtype=dtype, requires_grad=True) for _ in range(3)]
        return [x.permute(0, 3, 1, 2) for x in leaves], leaves
    if layout == "every-other":
        leaves = [torch.randn(B, H, T, 2 * D, dtype=dtype, requires_grad=True) for _ in range(3)]
        return [x[..., ::2] for x in leaves], leaves
    leaves = [torch.randn(B, H, T, 1, dtype=dtype, requires_grad=True) for _ in range(3)]
    return [x.expand(B, H, T, D) for x in leaves], leaves  # (stride 0)


STRIDED_IDS = [[0] * 120 + [1] * 100 + [2] * 80, [0] * 300]  # (B 2, T 300)
STRIDED_CASES = {
    "band": {"window": 64},
    "segments": {"documents": STRIDED_IDS},
    "prefix": {"prefix": 70},
    "masked": {"window": 9, "documents": STRIDED_IDS},  # (the masked band)
    "tiles": {"window": 9, "documents": STRIDED_IDS, "prefix": 20},  # (the general plan)
}


@functools.cache
def _pairwise_mask(kind):  # (written out pair by pair: once per case, not per test)
    return structure_mask_pairwise(2, 300, 300, causal=True, **STRIDED_CASES[kind])


# (fp32 with an expanded head dimension sums 8 rounded gradients into each leaf entry: past
# fp32's tolerance where they cancel, so that layout runs in fp64 only)
LAYOUTS = [
    (layout, dtype)
    for layout in ("permuted", "every-other", "expanded")
    for dtype in (torch.float64, torch.float32)
    if not (layout == "expanded" and dtype == torch.float32)
]


@pytest.mark.parametrize(("layout", "dtype"), LAYOUTS)
@pytest.mark.parametrize("kind", ["band", "segments", "prefix", "masked", "tiles"])
def test_a_head_dimension_that_is_not_contiguous(spy, layout, kind, dtype):
    # torch's bare CPU kernel, which the fast paths call, reads the head dimension as
    # contiguous without checking: such inputs once gave NaN, inf and 1e20 here
    T = 300
    (q, k, v), leaves = _head_dim_strided(layout, 2, 4, T, dtype)
    ids = STRIDED_IDS
    structure = STRIDED_CASES[kind]
    args = {**structure, "documents": torch.tensor(ids)} if "documents" in structure else structure
    allowed = _pairwise_mask(kind)
    out = attention(q, k, v, causal=True, backend="tiled", **args)
    ref, _ = reference_attention(*(t.double() for t in (q, k, v)), mask=allowed)
    assert (not any(spy.values())) if kind == "tiles" else spy[kind] >= 1  # the path ran
    check(out, ref, leaves, dtype)


@pytest.mark.parametrize("layout", ["expanded", "transposed"])
@pytest.mark.parametrize("kind", ["band", "segments", "prefix"])
def test_fast_path_backwards_read_strided_output_gradients(spy, layout, kind):
    # The fast paths read grad_out in slices, never copying it whole: an expanded one (from
    # out.sum()) and a (B, T, H, D) one (a module's output projection) give the same gradients.
    T = 300
    q, k, v = qkv(2, 4, 2, T, torch.float64)
    ids = [[0] * 120 + [1] * 100 + [2] * 80, [0] * 300]
    args, allowed = {
        "band": ({"window": 64}, window_mask(T, 64)),
        "segments": ({"documents": torch.tensor(ids)}, document_mask(ids, True)),
        "prefix": ({"prefix": 70}, structure_mask_pairwise(2, T, T, causal=True, prefix=70)),
    }[kind]
    out = attention(q, k, v, causal=True, backend="tiled", **args)
    ref, _ = reference_attention(q, k, v, mask=allowed, causal=kind != "prefix")
    if layout == "expanded":
        got = torch.autograd.grad(out.sum(), (q, k, v))
        want = torch.autograd.grad(ref.sum(), (q, k, v))
    else:
        g = torch.randn(2, T, 4, D, dtype=torch.float64).transpose(1, 2)  # (B, H, T, D) view
        got = torch.autograd.grad(out, (q, k, v), g)
        want = torch.autograd.grad(ref, (q, k, v), g)
    assert spy[f"{kind}_backward"] >= 1
    for a, b in zip(got, want, strict=True):
        assert_close(a, b, torch.float64)


@pytest.mark.parametrize("hkv", [4, 2])
@pytest.mark.parametrize("kind", ["band", "segments", "prefix", "tiles"])
def test_projection_views_give_the_reference_and_a_tokens_first_output(spy, kind, hkv):
    # A module's q, k, v: heads-first views of one (B, T, (H + 2 Hkv) D) projection. The
    # fast paths read them in place (the band per batch element, blocks as the kernel's
    # batch) and the output comes back stored (B, T, H, D), the rows out_proj reads.
    T, H = 300, 4
    base = torch.randn(2, T, (H + 2 * hkv) * D, dtype=torch.float64, requires_grad=True)
    parts = base.split([H * D, hkv * D, hkv * D], dim=-1)
    q, k, v = (p.unflatten(-1, (-1, D)).transpose(1, 2) for p in parts)
    structure = STRIDED_CASES[kind]
    args = (
        {**structure, "documents": torch.tensor(STRIDED_IDS)}
        if "documents" in structure
        else structure
    )
    out = attention(q, k, v, causal=True, backend="tiled", **args)
    assert (not any(spy.values())) if kind == "tiles" else spy[kind] >= 1
    if kind != "tiles":  # (the general plan copies its inputs and stores heads-first)
        assert out.transpose(1, 2).is_contiguous()
    ref, _ = reference_attention(q, k, v, mask=_pairwise_mask(kind))
    check(out, ref, (base,), torch.float64)


def test_a_window_with_a_key_mask_or_cross_lengths_takes_the_general_plan(spy):
    q, k, v = qkv(1, 2, 2, 200, torch.float64)
    key_mask = torch.ones(1, 1, 1, 200, dtype=torch.bool)
    key_mask[..., :7] = False
    out = attention(q, k, v, causal=True, window=40, mask=key_mask, backend="tiled")
    ref, _ = reference_attention(q, k, v, mask=window_mask(200, 40) & key_mask)
    check(out, ref, (q, k, v), torch.float64)
    q2 = q[:, :, -150:].detach().requires_grad_()
    out = attention(q2, k, v, causal=True, window=40, backend="tiled")
    ref, _ = reference_attention(q2, k, v, mask=window_mask(200, 40)[..., -150:, :])
    check(out, ref, (q2, k, v), torch.float64)
    assert spy["band"] == 0


def test_a_bidirectional_window_takes_the_general_plan(spy):
    q, k, v = qkv(1, 2, 2, 200, torch.float64)
    out = attention(q, k, v, window=(30, 10), backend="tiled")
    i, j = torch.arange(200)[:, None], torch.arange(200)[None, :]
    ref, _ = reference_attention(q, k, v, mask=((j >= i - 30) & (j <= i + 10))[None, None])
    check(out, ref, (q, k, v), torch.float64)
    assert spy["band"] == 0


DOCS = [
    [0] * 37 + [1] * 100 + [2] * 63,  # unequal runs
    [5] * 199 + [9],  # a one-token document at the end
]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("hkv", [4, 1])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_contiguous_documents_run_one_call_each(spy, causal, hkv, dtype):
    q, k, v = qkv(2, 4, hkv, 200, dtype)
    out = attention(q, k, v, causal=causal, documents=torch.tensor(DOCS), backend="tiled")
    assert spy["segments"] >= 1
    ref, _ = reference_attention(q, k, v, mask=document_mask(DOCS, causal))
    check(out, ref, (q, k, v), dtype)
    assert spy["segments_backward"] >= 1


@pytest.mark.parametrize("hkv", [4, 1])
def test_long_causal_documents_run_in_chunks_and_still_match(spy, hkv):
    """Documents of 256 .. 2047 positions run as causal chunks (128 or 256) plus the keys before
    each chunk: 300 -> 128 + 128 + 44, 400 -> 128 x 3 + 16, 520 -> 256 + 256 + 8."""
    ids = [[0] * 300 + [1] * 400, [2] * 520 + [3] * 180]
    q, k, v = qkv(2, 4, hkv, 700, torch.float64)
    out = attention(q, k, v, causal=True, documents=torch.tensor(ids), backend="tiled")
    assert spy["segments"] >= 1
    ref, _ = reference_attention(q, k, v, mask=document_mask(ids, True))
    check(out, ref, (q, k, v), torch.float64)


def test_a_document_in_two_runs_takes_the_general_plan(spy):
    ids = [[0] * 50 + [1] * 50 + [0] * 100, [2] * 200]  # document 0 comes back
    q, k, v = qkv(2, 2, 2, 200, torch.float64)
    out = attention(q, k, v, causal=True, documents=torch.tensor(ids), backend="tiled")
    ref, _ = reference_attention(q, k, v, mask=document_mask(ids, True))
    check(out, ref, (q, k, v), torch.float64)
    assert spy["segments"] == 0


def test_documents_with_a_window_take_the_masked_band(spy):
    ids = [[0] * 120 + [1] * 80]
    q, k, v = qkv(1, 2, 2, 200, torch.float64)
    out = attention(q, k, v, causal=True, window=20, documents=torch.tensor(ids), backend="tiled")
    ref, _ = reference_attention(q, k, v, mask=document_mask(ids, True) & window_mask(200, 20))
    check(out, ref, (q, k, v), torch.float64)
    assert spy["segments"] == 0 and spy["band"] == 0
    assert spy["masked"] >= 1 and spy["masked_backward"] >= 1


def test_nan_in_a_value_reaches_the_rows_whose_window_holds_it_and_no_far_row(spy):
    q, k, v = (t.detach() for t in qkv(1, 2, 2, 300, torch.float32))
    v[0, :, 150] = float("nan")
    out = attention(q, k, v, causal=True, window=64, backend="tiled")
    assert spy["band"] >= 1
    rows = out.isnan().any(dim=-1)[0, 0]  # (T,)
    assert rows[150 : 150 + 64].all()  # queries 150 .. 213 attend to key 150
    # Inside a block's band a blocked NaN value spreads as 0 * NaN (as in the dense backends,
    # where it reaches every row); rows more than a block (32 rows here) away never meet it.
    assert not rows[: 150 - 32].any() and not rows[150 + 64 + 32 :].any()


def prefix_mask(T, P):
    """(1, 1, T, T): causal, and the first P positions see each other both ways."""
    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    return ((j <= i) | ((i < P) & (j < P)))[None, None]


@pytest.mark.parametrize("P", [0, 1, 37, 130, 200])
@pytest.mark.parametrize("hkv", [4, 1])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_an_int_prefix_runs_as_three_large_calls(spy, P, hkv, dtype):
    q, k, v = qkv(2, 4, hkv, 200, dtype)
    out = attention(q, k, v, causal=True, prefix=P, backend="tiled")
    assert spy["prefix"] >= 1
    ref, _ = reference_attention(q, k, v, mask=prefix_mask(200, P))
    check(out, ref, (q, k, v), dtype)
    assert spy["prefix_backward"] >= 1


def test_a_prefix_per_row_or_with_a_window_takes_the_general_plan(spy):
    q, k, v = qkv(2, 2, 2, 200, torch.float64)
    out = attention(q, k, v, causal=True, prefix=torch.tensor([30, 90]), backend="tiled")
    mask = torch.cat([prefix_mask(200, 30), prefix_mask(200, 90)])
    ref, _ = reference_attention(q, k, v, mask=mask)
    check(out, ref, (q, k, v), torch.float64)
    out = attention(q, k, v, causal=True, prefix=60, window=50, backend="tiled")
    ref, _ = reference_attention(q, k, v, mask=prefix_mask(200, 60) & window_mask_both(200, 50))
    check(out, ref, (q, k, v), torch.float64)
    assert spy["prefix"] == 0


def window_mask_both(T, W):
    """(1, 1, T, T): |i - j| < W (an int window without causality cutting its right side)."""
    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    return ((j - i).abs() < W)[None, None]


@pytest.mark.parametrize("backend", ["tiled", "auto"])
@pytest.mark.parametrize("kind", ["band", "segments", "prefix"])
def test_values_wider_than_queries_take_the_plain_tiles(spy, kind, backend):
    # torch's fused CPU kernel refuses a value width other than the query's ("Q/K/V should
    # have the same head size"): such calls once raised from inside it on every fast path
    T = 1030
    gen = torch.Generator().manual_seed(1)
    q, k = (torch.randn(1, 2, T, D, dtype=torch.float64, generator=gen) for _ in range(2))
    v = torch.randn(1, 2, T, 2 * D, dtype=torch.float64, generator=gen)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    ids = torch.arange(T)[None] // 400
    args, allowed = {
        "band": ({"window": 64}, window_mask(T, 64)),
        "segments": ({"documents": ids}, document_mask(ids, True)),
        "prefix": ({"prefix": 70}, structure_mask_pairwise(1, T, T, causal=True, prefix=70)),
    }[kind]
    out = attention(q, k, v, causal=True, backend=backend, **args)
    assert spy[kind] == 0
    ref, _ = reference_attention(q, k, v, mask=allowed, causal=kind != "prefix")
    check(out, ref, (q, k, v), torch.float64)
