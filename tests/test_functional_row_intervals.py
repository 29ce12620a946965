"""The row-interval kernel (`backends.tile_intervals`, row_intervals.c): each query row sees
one interval of keys. The kernel alone (windows of 1, 7, 64 and 200 keys, documents with a
window, rows with no key, grouped-query heads, two batch rows, an odd length, one and two
threads, the AVX2 and scalar builds) against the fp64 reference under the dense mask, outputs
and gradients; the calls routed to it (window=, window= with documents=, a held mask_mod
plan, the module) against the reference and against the band paths they replace; no
compiler: the band paths."""

import pytest
import torch

from multihead import MultiHeadAttention, attention, native
from multihead.functional import block_mask
from multihead.functional.backends import tile_intervals, tile_threads
from multihead.functional.backends import tiled as tiled_backend

from conftest import assert_close
from reference import reference_attention

B, H, T, D = 2, 4, 151, 32  # (151: odd, not a whole number of the kernel's 4-row blocks)
SCALE = 0.3


def needs_kernel():
    if tile_intervals.library() is None:
        pytest.skip("no C compiler: the kernel is not built")


def intervals(W: int, docs: torch.Tensor | None = None, empty: bool = False):
    """lo, hi (B, H, T) int32: a causal window of W keys (within docs' contiguous documents);
    `empty`: some rows see nothing (lo > hi)."""
    i = torch.arange(T)
    lo = (i - W + 1).clamp(min=0).expand(B, H, T)
    if docs is not None:  # (B, T): the first position of each row's document
        first = torch.zeros(B, T, dtype=torch.long)
        for p in range(1, T):  # a new document starts where the id changes
            first[:, p] = torch.where(docs[:, p] == docs[:, p - 1], first[:, p - 1], p)
        lo = torch.maximum(lo, first[:, None, :])
    hi = (i + 1).expand(B, H, T).clone()
    lo = lo.clone()
    if empty:
        lo[0, 1, 3:9] = T  # rows 3..8 of batch row 0, head 1: no key
        hi[1, 2, 100] = 50  # and row 100 of (1, 2) (lo > hi)
    return lo.int().contiguous(), hi.int().contiguous()


def dense(lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    j = torch.arange(T)
    return (j >= lo[..., None].long()) & (j < hi[..., None].long())  # (B, H, T, T)


def inputs(hkv: int, seed: int = 0):
    torch.manual_seed(seed)
    return [torch.randn(B, h, T, D) for h in (H, hkv, hkv)]


def reference(q, k, v, allowed, grad_out):
    """fp64 reference output and gradients (q, k, v) for grad_out."""
    q, k, v = (t.double().requires_grad_() for t in (q, k, v))
    out, _ = reference_attention(q, k, v, mask=allowed, scale=SCALE)
    return (out.detach(), *torch.autograd.grad(out, (q, k, v), grad_out.double()))


def run_kernel(q, k, v, lo, hi, grad_out):
    out, lse = torch.empty(B, H, T, D), torch.empty(B, H, T)
    tile_intervals.interval_forward(
        q, k, v, lo, hi, SCALE, out, lse, _dense_pairs(lo, hi, *lo.shape[:2])
    )
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    tile_intervals.interval_backward(
        q, k, v, grad_out, out, lse, lo, hi, SCALE, dq, dk, dv, _dense_pairs(lo, hi, *lo.shape[:2])
    )
    return out, lse, dq, dk, dv


@pytest.mark.parametrize("W", [1, 7, 64, 200])
@pytest.mark.parametrize("hkv", [H, 2], ids=["mha", "gqa"])
@pytest.mark.parametrize("busy", [False, True], ids=["inline", "units"])
def test_the_kernel_against_the_reference(monkeypatch, threads, W, hkv, busy):
    """Inline (one C call on OpenMP threads) and in units on the workers (the per-call choice
    of `tile_threads.per_call`, here forced by the runnable count it reads)."""
    needs_kernel()
    monkeypatch.setattr(tile_threads, "_runnable", lambda: 10**6 if busy else 1)
    q, k, v = inputs(hkv)
    lo, hi = intervals(W, empty=W == 7)
    grad_out = torch.randn(B, H, T, D)
    out, lse, *got = run_kernel(q, k, v, lo, hi, grad_out)
    want = reference(q, k, v, dense(lo, hi), grad_out)
    for a, b in zip((out, *got), want, strict=True):
        assert_close(a, b)
    assert torch.isfinite(lse).all()
    if W == 7:  # rows with no key: zeros, lse 0 (as the fused kernel gives)
        assert torch.equal(out[0, 1, 3:9], torch.zeros(6, D)) and lse[0, 1, 3:9].eq(0).all()
        assert torch.equal(got[0][0, 1, 3:9], torch.zeros(6, D))


@pytest.mark.parametrize("case", ["window-40", "window-300", "documents", "empty-rows"])
@pytest.mark.parametrize("busy", [False, True], ids=["inline", "units"])
def test_rows_past_one_chunk_against_the_reference(monkeypatch, case, busy):
    """T 603: three chunks of rows (the kernel transposes the keys each chunk of 256 rows sees,
    `CHUNK` in row_intervals.c) and an odd tail; windows within a chunk and reaching two back,
    bidirectional documents whose rows see keys after them and across a chunk's edge, and
    rows with no key at a chunk's edge; grouped-query heads."""
    needs_kernel()
    monkeypatch.setattr(tile_threads, "_runnable", lambda: 10**6 if busy else 1)
    n = 603
    i = torch.arange(n)
    if case.startswith("window"):
        lo, hi = (i - int(case.split("-")[1]) + 1).clamp(min=0), i + 1
    else:  # documents 0..199, 200..479, 480..602, each row sees its whole document
        starts = torch.tensor([0, 200, 480])
        doc = torch.bucketize(i, starts, right=True) - 1
        lo, hi = starts[doc], torch.tensor([200, 480, n])[doc]
    lo, hi = lo.expand(2, 4, n).clone(), hi.expand(2, 4, n).clone()
    if case == "empty-rows":
        lo[1, 2, 250:262] = n  # rows 250..261 of (1, 2): no key, across the first chunk's end
    lo, hi = lo.int().contiguous(), hi.int().contiguous()
    torch.manual_seed(7)
    q, k, v = torch.randn(2, 4, n, 32), torch.randn(2, 2, n, 32), torch.randn(2, 2, n, 32)
    grad_out = torch.randn(2, 4, n, 32)
    out, lse = torch.empty(2, 4, n, 32), torch.empty(2, 4, n)
    tile_intervals.interval_forward(
        q, k, v, lo, hi, SCALE, out, lse, _dense_pairs(lo, hi, *lo.shape[:2])
    )
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    tile_intervals.interval_backward(
        q, k, v, grad_out, out, lse, lo, hi, SCALE, dq, dk, dv, _dense_pairs(lo, hi, *lo.shape[:2])
    )
    j = torch.arange(n)
    allowed = (j >= lo[..., None].long()) & (j < hi[..., None].long())
    for a, b in zip((out, dq, dk, dv), reference(q, k, v, allowed, grad_out), strict=True):
        assert_close(a, b)
    if case == "empty-rows":
        assert out[1, 2, 250:262].eq(0).all() and dq[1, 2, 250:262].eq(0).all()


def gradient_layouts():
    """Gradients whose rows are not contiguous D values: a sum's (every stride 0), one
    expanded over heads, one in a transposed layout (D rows of T)."""
    torch.manual_seed(5)
    return {
        "sum": torch.ones(()).expand(B, H, T, D),
        "over-heads": torch.randn(B, 1, T, D).expand(B, H, T, D),
        "transposed": torch.randn(B, H, D, T).transpose(2, 3),
    }


@pytest.mark.parametrize("layout", list(gradient_layouts()))
@pytest.mark.parametrize("busy", [False, True], ids=["inline", "units"])
def test_gradients_in_any_layout_equal_the_contiguous_one(monkeypatch, layout, busy):
    """An expanded gradient is read through its zero strides, its distinct rows made once
    (`rows_contiguous`), not copied whole: the same gradients as its contiguous copy and the
    reference."""
    needs_kernel()
    monkeypatch.setattr(tile_threads, "_runnable", lambda: 10**6 if busy else 1)
    grad_out = gradient_layouts()[layout]
    rows = tile_intervals.rows_contiguous(grad_out)
    assert rows.stride(3) == 1 and torch.equal(rows, grad_out)
    if layout != "transposed":  # (the broadcast dims stay broadcast: no whole copy)
        assert rows.untyped_storage().nbytes() < grad_out.contiguous().untyped_storage().nbytes()
    q, k, v = inputs(2)
    lo, hi = intervals(40)
    got = run_kernel(q, k, v, lo, hi, grad_out)
    want = run_kernel(q, k, v, lo, hi, grad_out.contiguous())
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)
    for a, b in zip(got[2:], reference(q, k, v, dense(lo, hi), grad_out)[1:], strict=True):
        assert_close(a, b)


def test_documents_with_a_window_in_the_kernel():
    needs_kernel()
    docs = torch.tensor([[0] * 40 + [1] * 70 + [2] * 41, [3] * 1 + [4] * 150])
    q, k, v = inputs(1)
    lo, hi = intervals(64, docs)
    grad_out = torch.randn(B, H, T, D)
    got = run_kernel(q, k, v, lo, hi, grad_out)
    want = reference(q, k, v, dense(lo, hi), grad_out)
    for a, b in zip((got[0], *got[2:]), want, strict=True):
        assert_close(a, b)


@pytest.mark.parametrize("flags", [("-mno-avx512f",), ("-mno-avx512f", "-mno-avx2", "-mno-fma")],
                         ids=["avx2", "scalar"])  # fmt: skip
def test_the_narrower_builds(monkeypatch, flags):
    needs_kernel()
    lib = tile_intervals.library(flags)
    assert lib is not None
    monkeypatch.setattr(tile_intervals, "library", lambda extra=(): lib)
    q, k, v = inputs(2)
    lo, hi = intervals(20, empty=True)
    grad_out = torch.randn(B, H, T, D)
    out, _, *got = run_kernel(q, k, v, lo, hi, grad_out)
    for a, b in zip((out, *got), reference(q, k, v, dense(lo, hi), grad_out), strict=True):
        assert_close(a, b)


def windowed_documents(b, h, q, k):
    return (k <= q) & (q - k < 24) & (q // 64 == k // 64)


def window_mod(b, h, q, k):
    return (k <= q) & (q - k < 40)


def documents_mod(b, h, q, k):
    return (k <= q) & (q // 64 == k // 64)


N = 256  # (the held plans' length: a whole number of their 32-row blocks)
DOCS = torch.arange(N) // 64


def routed_cases():
    return {
        "window": {"window": 40},
        "window-documents": {"window": 24, "documents": DOCS[None].expand(B, N)},
        "held-general": {
            "mask_mod": block_mask(windowed_documents, None, None, N, N, block_size=32)
        },
        "held-window": {"mask_mod": block_mask(window_mod, None, None, N, N, block_size=32)},
        "documents": {"documents": DOCS[None].expand(B, N)},
        "held-documents": {"mask_mod": block_mask(documents_mod, None, None, N, N, block_size=32)},
    }


def _call(q, k, v, given):
    out = attention(q, k, v, causal=True, backend="tiled", **given)
    torch.manual_seed(5)
    grad_out = torch.randn(out.shape)
    return (out, *torch.autograd.grad(out, (q, k, v), grad_out)), grad_out


@pytest.mark.parametrize("case", list(routed_cases()))
@pytest.mark.parametrize("hkv", [H, 1], ids=["mha", "gqa"])
def test_routed_calls_match_the_reference_and_the_band(monkeypatch, threads, case, hkv):
    needs_kernel()
    given = routed_cases()[case]
    torch.manual_seed(3)
    q, k, v = (torch.randn(B, h, N, D, requires_grad=True) for h in (H, hkv, hkv))
    calls = []
    real = tiled_backend.interval_forward
    monkeypatch.setattr(tiled_backend, "interval_forward", lambda *a: calls.append(a) or real(*a))
    got, grad_out = _call(q, k, v, given)
    assert calls, "the interval kernel did not run"
    W = {"window": 40, "held-window": 40, "documents": N, "held-documents": N}.get(case, 24)
    i = torch.arange(N)
    allowed = (i[None] <= i[:, None]) & (i[:, None] - i[None] < W)
    if "window" not in case or case == "window-documents":
        allowed &= DOCS[:, None] == DOCS[None]
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    out, _ = reference_attention(qd, kd, vd, mask=allowed, scale=D**-0.5)
    want = (out, *torch.autograd.grad(out, (qd, kd, vd), grad_out.double()))
    for a, b in zip(got, want, strict=True):
        assert_close(a, b)
    # again: the call's pairs come from the intervals (counted where they were made, a held
    # plan's once), no torch op per call (beside a busy process each waits on a thread)
    monkeypatch.setattr(tile_intervals, "_pairs", lambda *a: pytest.fail("pairs counted per call"))
    again, _ = _call(q, k, v, given)
    for a, b in zip(got, again, strict=True):
        assert torch.equal(a, b)
    # the band paths it replaces, on the same inputs (the kernel not built)
    monkeypatch.setattr(tile_intervals, "library", lambda extra=(): None)
    calls.clear()
    band, _ = _call(q, k, v, given)
    assert not calls
    for a, b in zip(got, band, strict=True):
        assert_close(a, b)


def test_documents_without_causality(monkeypatch):
    needs_kernel()
    ids = torch.tensor([[0] * 100 + [1] * 156, [2] * 3 + [3] * 200 + [4] * 53])  # (B, N)
    torch.manual_seed(6)
    q, k, v = (torch.randn(B, h, N, D, requires_grad=True) for h in (H, 2, 2))
    calls = []
    real = tiled_backend.interval_forward
    monkeypatch.setattr(tiled_backend, "interval_forward", lambda *a: calls.append(a) or real(*a))
    out = attention(q, k, v, documents=ids, backend="tiled")
    assert calls
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    want, _ = reference_attention(qd, kd, vd, mask=(ids[:, :, None] == ids[:, None, :])[:, None])
    grad_out = torch.randn(out.shape)
    got = torch.autograd.grad(out, (q, k, v), grad_out)
    for a, b in zip((out, *got), (want, *torch.autograd.grad(want, (qd, kd, vd), grad_out.double())),
                    strict=True):  # fmt: skip
        assert_close(a, b)


def test_the_module_runs_the_kernel_on_its_projections(monkeypatch):
    needs_kernel()
    torch.manual_seed(4)
    m = MultiHeadAttention(64, 4, causal=True)  # D 16
    n = 1024  # (auto picks the tiled backend from 1024 x 1024 pairs)
    x = torch.randn(B, n, 64, requires_grad=True)
    calls = []
    real = tiled_backend.interval_backward
    monkeypatch.setattr(tiled_backend, "interval_backward", lambda *a: calls.append(a) or real(*a))

    def run():
        out = m(x, window=33, documents=(torch.arange(n) // 300)[None].expand(B, n))
        return (out, *torch.autograd.grad(out.square().sum(), (x, *m.parameters())))

    got = run()
    assert calls
    monkeypatch.setattr(tile_intervals, "library", lambda extra=(): None)
    for a, b in zip(got, run(), strict=True):
        assert_close(a, b)


def test_no_compiler_means_no_kernel(monkeypatch):
    monkeypatch.setenv("MULTIHEAD_NO_KERNELS", "1")
    assert native.load("row_intervals", "int x;", ("-shared", "-fPIC")) is None
    monkeypatch.setattr(tile_intervals, "library", lambda extra=(): None)
    q = torch.randn(1, 2, 64, 16)
    assert not tile_intervals.interval_runs(q, q, q)
    out = attention(q, q, q, causal=True, window=8, backend="tiled")
    want = attention(q, q, q, causal=True, window=8, backend="sdpa")
    assert_close(out, want)


def test_inputs_the_kernel_does_not_take():
    needs_kernel()
    q = torch.randn(1, 2, 64, 16)
    assert tile_intervals.interval_runs(q, q, q)
    assert not tile_intervals.interval_runs(q.double(), q.double(), q.double())  # fp64
    r = torch.randn(1, 2, 64, 24)
    assert not tile_intervals.interval_runs(r, r, r)  # D not a multiple of 16
    s = torch.randn(1, 2, 16, 64).transpose(2, 3)
    assert not tile_intervals.interval_runs(s, s, s)  # D strided


def _dense_pairs(lo: torch.Tensor, hi: torch.Tensor, B_: int, H_: int) -> int:
    """Pairs of the intervals expanded to (B_, H_, T), counted key by key (the reference)."""
    keys = torch.arange(lo.shape[-1])[None, None, None, :]
    lo, hi = lo.expand(B_, H_, -1)[..., None], hi.expand(B_, H_, -1)[..., None]
    return int(((keys >= lo) & (keys < hi)).sum())


@pytest.mark.parametrize("causal", [True, False])
def test_intervals_carry_the_pairs_they_allow(causal):
    """Every way intervals are made carries the count of the pairs they allow (the per-call
    thread choice weighs it without torch ops per call), equal to a key-by-key count, for the
    call they are expanded to: windows (narrower and wider than the rows), documents with
    and without causality (positions outside every document see nothing), a window within
    documents, a held band's rows."""
    from multihead.functional.mask_band import BandMask

    made = [tile_intervals.window_intervals(left, T) for left in (0, 6, 63, 400)]
    ids = torch.tensor([[0] * 40 + [1] * 90 + [2] * 21, [5] * 151])
    segments = [(0, 0, 40), (0, 40, 130), (1, 0, 151)]  # (b, start, stop); row 0's 130.. none
    made.append(tile_intervals.segments_intervals(segments, 2, T, causal))
    if causal:
        made += [tile_intervals.documents_intervals(ids, left) for left in (0, 9, 200)]
        L, gen = 11, torch.Generator().manual_seed(0)
        allowed = torch.zeros(2, 1, T, L + 1, dtype=torch.bool)
        for b in range(2):
            for p in range(T):  # row p: columns a .. e - 1 (keys p - L + a ..), none before 0
                a, e = sorted(torch.randint(max(0, L - p), L + 2, (2,), generator=gen).tolist())
                allowed[b, 0, p, a:e] = True
        band = tile_intervals.band_intervals(BandMask(L, allowed))
        assert band is not None
        made.append(band)
    for iv in made:
        for B_, H_ in ((iv.lo.shape[0], iv.lo.shape[1]), (2, 4), (2, 8)):
            assert iv.pairs(B_, H_) == _dense_pairs(iv.lo, iv.hi, B_, H_), iv
