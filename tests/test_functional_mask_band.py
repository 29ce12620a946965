"""A mask inside a causal band (a causal window within documents, a window per head, a
window with holes) runs as batched kernel calls over overlapping key bands, each block under
its own mask (`functional.mask_band`, `backends.tile_masked_band`), given as
`window=` + `documents=`, as a bare mask function, or held in a plan: values and gradients
against the fp64 reference under the dense mask written out pair by pair (one and two
threads, grouped-query heads, different documents per batch row, a length that is not a
whole number of blocks); a grid that is not inside a band, or whose band costs more than the
plan's tiles, is refused and runs the general plan with the right values."""

import functools

import pytest
import torch

from helpers_structure import B, H, grads, qkv
from multihead import MultiHeadAttention, attention
from multihead.functional import block_mask
from multihead.functional.backends import tiled as tiled_backend
from multihead.functional.mask_band import band_of_grid

from conftest import assert_close
from reference import reference_attention

N, BLOCK, W = 150, 30, 12  # (150: not a whole number of the band's 32-row blocks)
# per batch row, contiguous runs; boundaries inside tiles and on them, one of 1 position
IDS = [[0] * 17 + [1] * 43 + [2] * 1 + [3] * 59 + [4] * 30, [5] * 30 + [6] * 64 + [7] * 56]
IDS_T = torch.tensor(IDS)  # (B, N)


def windowed_documents(b, h, q, k):
    return (k <= q) & (q - k < W) & (IDS_T[b, q] == IDS_T[b, k])


def window_per_head(b, h, q, k):  # head h: a causal window of 4 + 4 h
    return (k <= q) & (q - k < 4 + 4 * h)


def holes(b, h, q, k):  # every third key of the window, and rows 40..44 see nothing
    return (k <= q) & (q - k < W) & ((q - k) % 3 != 1) & ((q < 40) | (q > 44))


def dense(fn, causal: bool = False) -> torch.Tensor:
    """(B, H, N, N) booleans: the function on the whole grid."""
    i = torch.arange(N)
    got = fn(torch.arange(B).view(B, 1, 1, 1), torch.arange(H).view(1, H, 1, 1), i.view(-1, 1),
             i.view(1, -1)).expand(B, H, N, N)  # fmt: skip
    return got & (i.view(-1, 1) >= i.view(1, -1)) if causal else got


def inputs(seed: int, hkv: int = H):
    torch.manual_seed(seed)
    return qkv(N, N, hkv)


@functools.cache
def expected(fn, seed: int, hkv: int = H):
    """The fp64 reference's output and gradients (`helpers_structure.grads`) of inputs(seed)
    under fn's dense mask (once per case: the reference runs row by row)."""
    q, k, v = inputs(seed, hkv)
    ref, _ = reference_attention(q, k, v, mask=dense(fn))
    return ref.detach(), grads(ref, q, k, v)


def check(out, inputs, fn, seed, hkv=H):
    ref, want = expected(fn, seed, hkv)
    assert_close(out, ref)
    for a, b in zip(grads(out, *inputs), want, strict=True):
        assert_close(a, b)


def sdpa(out, inputs, fn, causal=False):
    """Against torch's SDPA under fn's dense mask (the cases the general plan runs)."""
    want = attention(*inputs, mask=dense(fn, causal), backend="sdpa")
    assert_close(out, want)
    for a, b in zip(grads(out, *inputs), grads(want, *inputs), strict=True):
        assert_close(a, b)


@pytest.fixture
def paths(monkeypatch):
    calls = {"band": 0, "tiles": 0, "spans": 0}

    def counting(name, real):
        def fn(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)

        return fn

    for name, attr in (("band", "masked_band_forward"), ("tiles", "kernel_forward"),
                       ("spans", "run_forward")):  # fmt: skip
        monkeypatch.setattr(tiled_backend, attr, counting(name, getattr(tiled_backend, attr)))
    return calls


@pytest.mark.parametrize("form", ["native", "function", "held"])
@pytest.mark.parametrize("hkv", [H, 1])
def test_a_window_within_documents_runs_the_masked_band(paths, threads, form, hkv):
    q, k, v = inputs(0, hkv)
    if form == "native":
        given = {"causal": True, "window": W, "documents": IDS_T}
    elif form == "function":
        given = {"mask_mod": windowed_documents, "block_size": BLOCK}
    else:
        given = {"mask_mod": block_mask(windowed_documents, B, None, N, N, block_size=BLOCK)}
    out = attention(q, k, v, backend="tiled", **given)
    assert paths["band"] > 0 and paths["tiles"] == 0 and paths["spans"] == 0
    check(out, (q, k, v), windowed_documents, 0, hkv)


@pytest.mark.parametrize("fn", [window_per_head, holes], ids=["window-per-head", "holes"])
@pytest.mark.parametrize("held", [True, False], ids=["held", "function"])
def test_any_mask_inside_a_band_runs_it_exactly(paths, fn, held):
    q, k, v = inputs(1)
    plan = block_mask(fn, None, H, N, N, block_size=BLOCK) if held else fn
    out = attention(q, k, v, backend="tiled", mask_mod=plan, block_size=BLOCK)
    assert paths["band"] > 0 and paths["tiles"] == 0
    check(out, (q, k, v), fn, 1)
    if fn is holes:  # rows that see nothing: zeros, and no gradient through them
        assert torch.equal(out[:, :, 40:45], torch.zeros_like(out[:, :, 40:45]))


def test_a_held_plan_keeps_its_band_for_every_call(paths):
    plan = block_mask(windowed_documents, B, None, N, N, block_size=BLOCK)
    q, k, v = inputs(0)
    first = attention(q, k, v, mask_mod=plan, backend="tiled")
    held = plan.held(("masked band", False), lambda: pytest.fail("built again"))
    assert held is not None and held.left == W - 1
    assert_close(attention(q, k, v, mask_mod=plan, backend="tiled"), first)


def _grid(fn, causal=False, block=BLOCK):
    plan = block_mask(fn, B, H, N, N, block_size=block)
    return plan.kinds, plan.masks, causal, (block, block), N, N


def far_key(b, h, q, k):  # one pair far back
    return windowed_documents(b, h, q, k) | ((q == 140) & (k == 3))


def past_the_diagonal(b, h, q, k):  # one key after its query
    return windowed_documents(b, h, q, k) | ((q == 70) & (k == 71))


def everything(b, h, q, k):
    return q >= 0


GRIDS = {  # name: (fn, causal call, max_left, the band's L or None: refused)
    "window-in-documents": (windowed_documents, False, 64, W - 1),
    "per-head": (window_per_head, False, 64, 4 + 4 * (H - 1) - 1),
    "far-key-too-dear": (far_key, False, 64, None),  # the band must reach it: past its cost
    "far-key": (far_key, False, 200, 137),
    "past-the-diagonal": (past_the_diagonal, False, 64, None),  # not a causal band
    "past-the-diagonal-cut": (past_the_diagonal, True, 64, W - 1),  # the call's causality
    "everything": (everything, False, 64, None),  # keys after every query
}


@pytest.mark.parametrize("name", list(GRIDS))
def test_the_band_holds_exactly_the_grid_or_is_refused(name):
    fn, causal, max_left, left = GRIDS[name]
    found = band_of_grid(*_grid(fn, causal)[:2], causal, (BLOCK, BLOCK), N, N, max_left)
    if left is None:
        assert found is None
        return
    assert found is not None and found.left == left
    # every pair of the band, against the function itself (the grid's own pairs)
    want = dense(fn, causal)  # (B, H, N, N)
    got = torch.zeros(B, H, N, N, dtype=torch.bool)
    for p in range(N):
        for e in range(left + 1):
            if p - left + e >= 0:
                got[:, :, p, p - left + e] = found.allowed[:, :, p, e]
    assert torch.equal(got, want)


def padded(b, h, q, k):  # the last 7 keys of batch row 1 are padding
    return windowed_documents(b, h, q, k) & ((b == 0) | (k < N - 7))


def test_a_mask_beside_it_runs_the_general_plan(paths):
    q, k, v = inputs(0)
    pad = torch.ones(B, 1, 1, N, dtype=torch.bool)
    pad[1, ..., -7:] = False
    out = attention(q, k, v, causal=True, window=W, documents=IDS_T, mask=pad, backend="tiled")
    assert paths["band"] == 0
    sdpa(out, (q, k, v), padded)


def same_document(b, h, q, k):
    return IDS_T[b, q] == IDS_T[b, k]


def test_a_wide_window_within_documents_keeps_the_cheaper_plan(paths):
    # a window of 1000 within documents of 30..64: the band would compute 1000 keys a row
    q, k, v = inputs(0)
    out = attention(q, k, v, causal=True, window=1000, documents=IDS_T, backend="tiled")
    assert paths["band"] == 0
    sdpa(out, (q, k, v), same_document, causal=True)


@pytest.mark.parametrize("form", ["native", "held"])
def test_the_module_runs_the_masked_band(paths, threads, form):
    T, C, heads, w = 1024, 16, 2, 64  # (auto leaves smaller calls to sdpa under the dense mask)
    ids = torch.tensor([[0] * 300 + [1] * 500 + [2] * 224, [4] * 700 + [5] * 324])  # (B, T)

    def fn(b, h, q, k):
        return (k <= q) & (q - k < w) & (ids[b, q] == ids[b, k])

    torch.manual_seed(0)
    mha = MultiHeadAttention(C, heads, causal=True, dtype=torch.float64)
    x = torch.randn(B, T, C, dtype=torch.float64, requires_grad=True)
    if form == "native":
        got = mha(x, window=w, documents=ids)
    else:
        got = mha(x, mask_mod=block_mask(fn, B, None, T, T))
    assert paths["band"] > 0 and paths["tiles"] == 0
    i = torch.arange(T)
    allowed = (ids[:, :, None] == ids[:, None]) & (i[:, None] >= i) & (i[:, None] - i < w)
    want = mha(x, mask=allowed[:, None], causal=False)
    assert_close(got, want)
    g_got = torch.autograd.grad(got.square().sum(), (x, mha.in_proj.weight))
    g_want = torch.autograd.grad(want.square().sum(), (x, mha.in_proj.weight))
    for a, b in zip(g_got, g_want, strict=True):
        assert_close(a, b)
