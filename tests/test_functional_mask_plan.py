"""`block_mask`: a mask_mod held as a plan (its tiles classified once) against the fp64
reference under a dense mask written out pair by pair (outputs and gradients of q, k, v), on
every backend and through the module; that the tiled backend reads the held classification
instead of calling the function again; that a plan which is exactly a causal window runs the
band fast path and any other does not; the shape checks against the call."""

import pytest
import torch

from helpers_structure import B, H, qkv
from multihead import MultiHeadAttention, attention
from multihead.functional import MaskPlan, block_mask
from multihead.functional.backends import tiled as tiled_backend
from test_functional_mask_mod import BACKENDS, BLOCK, PATTERNS, T, check, dense_from

from conftest import assert_close
from reference import reference_attention


def counting(fn, calls):
    def mask_mod(b, h, q_idx, kv_idx):
        calls.append(1)
        return fn(b, h, q_idx, kv_idx)

    return mask_mod


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["dilated", "per-head", "per-batch", "empty-rows"])
@pytest.mark.parametrize("hkv", [H, 1])
def test_a_held_plan_matches_the_dense_mask(backend, name, hkv):
    fn = PATTERNS[name]
    plan = block_mask(fn, B, H, T, T, block_size=BLOCK)
    q, k, v = qkv(T, T, hkv)
    out = attention(q, k, v, mask_mod=plan, backend=backend)
    ref, _ = reference_attention(q, k, v, mask=dense_from(fn, T, T))
    check(out, ref, (q, k, v))


def test_the_tiled_backend_reads_the_held_classification():
    # Built once: the function is evaluated while the plan is made, then never again by the
    # tiled backend's forward and backward (every partial tile's mask is held); a bare
    # mask_mod is evaluated on every call.
    calls: list[int] = []
    fn = counting(PATTERNS["per-head"], calls)
    plan = block_mask(fn, None, H, T, T, block_size=BLOCK)
    built = len(calls)
    assert built > 0 and plan.readable and plan.window is None
    q, k, v = qkv(T, T)
    for _ in range(2):
        out = attention(q, k, v, mask_mod=plan, backend="tiled")
        ref, _ = reference_attention(q, k, v, mask=dense_from(PATTERNS["per-head"], T, T))
        check(out, ref, (q, k, v))
    assert len(calls) == built
    attention(q, k, v, mask_mod=fn, block_size=BLOCK, backend="tiled")
    assert len(calls) > built


def test_kinds_are_the_tiles_all_false_all_true_or_mixed():
    # block-diagonal 8 x 8 blocks, causal inside, tiles of 4: diagonal tiles mixed, the tile
    # below the diagonal inside a block all True, everything else all False
    plan = block_mask(PATTERNS["block-diagonal"], None, None, T, T, block_size=BLOCK)
    dense = dense_from(PATTERNS["block-diagonal"], T, T)[0, 0]
    for qi, row in enumerate(plan.kinds):
        for ki, kind in enumerate(row):
            tile = dense[qi * 4 : qi * 4 + 4, ki * 4 : ki * 4 + 4]
            assert kind == (2 if tile.all() else 0 if not tile.any() else 1)
    assert "6 full" not in repr(plan) and "3 full, 6 partial, 27 empty" in repr(plan)


@pytest.fixture
def band_calls(monkeypatch):
    calls = {"band": 0, "spans": 0}
    real_band = tiled_backend.band_forward
    real_spans = tiled_backend.run_forward

    def band(*args):
        calls["band"] += 1
        return real_band(*args)

    def spans(*args):
        calls["spans"] += 1
        return real_spans(*args)

    monkeypatch.setattr(tiled_backend, "band_forward", band)
    monkeypatch.setattr(tiled_backend, "run_forward", spans)
    return calls


@pytest.mark.parametrize("causal, hkv", [(True, H), (False, 1)])
@pytest.mark.parametrize("held", [True, False])
def test_a_causal_window_mask_mod_runs_the_band_fast_path(band_calls, causal, hkv, held):
    # held: read from the plan's classification; bare: from the call's own
    W, n = 20, 96  # (blocks of 32: the band runs blocks 1 and 2, the rest its edges)

    def fn(b, h, q, k):
        return (k <= q) & (q - k < W)

    plan = block_mask(fn, None, None, n, n, block_size=32)
    assert plan.window == W - 1 and f"a causal window of {W}" in repr(plan)
    q, k, v = qkv(n, n, hkv)
    given = {"mask_mod": plan} if held else {"mask_mod": fn, "block_size": 32}
    out = attention(q, k, v, causal=causal, backend="tiled", **given)
    assert band_calls["band"] > 0 and band_calls["spans"] == 0
    ref, _ = reference_attention(q, k, v, mask=dense_from(fn, n, n, heads=1), causal=causal)
    check(out, ref, (q, k, v))
    assert_close(out, attention(q, k, v, causal=True, window=W, backend="tiled"))


@pytest.mark.parametrize(
    "fn, heads",
    [
        (lambda b, h, q, k: (k <= q) & (q - k < 20) & (k != 37), 1),  # one key missing
        (lambda b, h, q, k: (k <= q + 1) & (q - k < 20), 1),  # one key past the diagonal
        (lambda b, h, q, k: (k <= q) & (q - k < 20 + h), H),  # wider for later heads
        (lambda b, h, q, k: (q - k).abs() < 20, 1),  # bidirectional
    ],
)
def test_anything_but_exactly_a_causal_window_stays_on_the_general_plan(band_calls, fn, heads):
    n = 96  # (as above: a window of 20 here would run the band)
    plan = block_mask(fn, None, H, n, n, block_size=32)
    assert plan.window is None
    q, k, v = qkv(n, n)
    dense = dense_from(fn, n, n, heads=heads)
    for given in ({"mask_mod": plan}, {"mask_mod": fn, "block_size": 32}):
        out = attention(q, k, v, backend="tiled", **given)
        ref, _ = reference_attention(q, k, v, mask=dense)
        assert band_calls["band"] == 0
        check(out, ref, (q, k, v))


def test_the_module_takes_a_held_plan():
    C = 24
    mha = MultiHeadAttention(C, H, causal=True, dtype=torch.float64)
    x = torch.randn(B, 96, C, dtype=torch.float64, requires_grad=True)
    for fn in (PATTERNS["per-head"], lambda b, h, q, k: (k <= q) & (q - k < 9)):
        plan = block_mask(fn, None, H, 96, 96, block_size=16)
        got = mha(x, mask_mod=plan)
        want = mha(x, mask=dense_from(fn, 96, 96))
        assert_close(got, want)
        g_got = torch.autograd.grad(got.square().sum(), (x, mha.in_proj.weight))
        g_want = torch.autograd.grad(want.square().sum(), (x, mha.in_proj.weight))
        for a, b in zip(g_got, g_want, strict=True):
            assert_close(a, b)


def test_a_plan_traces_under_torch_compile_fullgraph():
    q, k, v = (torch.randn(1, 2, 48, 8, requires_grad=True) for _ in range(3))
    plan = block_mask(PATTERNS["per-head"], None, 2, 48, 48, block_size=16)

    def f(q, k, v):
        return attention(q, k, v, causal=True, mask_mod=plan)

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    got, want = compiled(q, k, v), attention(q, k, v, causal=True, mask_mod=plan, backend="tiled")
    assert_close(got, want, torch.float32)


@pytest.mark.parametrize(
    "plan_args, call, match",
    [
        ((3, None, T, T), {}, r"B=3 but the call has 2"),
        ((None, 4, T, T), {}, r"H=4 but the call has 3"),
        ((None, None, 20, T), {}, r"Q_LEN=20 but the call has 24"),
        ((None, None, T, 28), {}, r"KV_LEN=28 but the call has 24"),
        ((None, None, T, T), {"block_size": 8}, r"block_size=\(4, 4\) but the call asks for 8"),
    ],
)
def test_a_plan_built_for_other_shapes_is_refused(plan_args, call, match):
    plan = block_mask(PATTERNS["dilated"], *plan_args, block_size=BLOCK)
    q, k, v = qkv(T, T)
    for backend in ("tiled", "eager"):
        with pytest.raises(ValueError, match=match):
            attention(q, k, v, mask_mod=plan, backend=backend, **call)


def test_the_same_block_size_may_be_repeated():
    plan = block_mask(PATTERNS["dilated"], B, H, T, T, block_size=BLOCK)
    q, k, v = qkv(T, T)
    out = attention(q, k, v, mask_mod=plan, block_size=(BLOCK, BLOCK), backend="tiled")
    assert_close(out, attention(q, k, v, mask_mod=PATTERNS["dilated"], block_size=BLOCK))


@pytest.mark.parametrize(
    "args, kwargs, error, match",
    [
        (("not callable", 1, 1, 8, 8), {}, TypeError, "mask_mod must be a function"),
        ((PATTERNS["dilated"], 0, 1, 8, 8), {}, ValueError, "B must be a positive int"),
        ((PATTERNS["dilated"], 1, True, 8, 8), {}, ValueError, "H must be a positive int"),
        ((PATTERNS["dilated"], 1, 1, None, 8), {}, ValueError, "Q_LEN must be a positive int"),
        ((PATTERNS["dilated"], 1, 1, 8, 8), {"block_size": 3}, ValueError, "must divide"),
        ((PATTERNS["dilated"], 1, 1, 8, 8), {"block_size": 0}, ValueError, "block_size must"),
    ],
)
def test_bad_block_mask_arguments(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        block_mask(*args, **kwargs)


def test_a_plan_is_a_mask_function_and_not_rewrapped():
    fn = PATTERNS["dilated"]
    plan = block_mask(fn, None, None, 8, 8)
    again = block_mask(plan, None, None, 8, 8)
    assert isinstance(again, MaskPlan) and again.mask_mod is fn
    i = torch.arange(8)
    assert torch.equal(plan(0, 0, i[:, None], i[None]), fn(0, 0, i[:, None], i[None]))


def test_a_held_plan_keeps_its_spans_masks_for_later_calls(monkeypatch):
    # block-diagonal: every row runs as a span; the spans' masks are assembled by the first
    # call through the plan (per causality and dtype) and read by the later ones; a bare
    # mask_mod assembles them on every call. (Not causal documents, which run the documents
    # fast path and no spans: no key sees itself, so a causal call leaves rows empty.)
    from multihead.functional.backends import tile_spans

    made: list[int] = []
    real = tile_spans.assemble
    monkeypatch.setattr(tiled_backend, "assemble", lambda *a: (made.append(1), real(*a))[1])

    def fn(b, h, q, k):
        return (q // 8 == k // 8) & (k != q)

    plan = block_mask(fn, None, None, T, T, block_size=BLOCK)
    q, k, v = qkv(T, T)
    ref, _ = reference_attention(q, k, v, mask=dense_from(fn, T, T, heads=1))
    first = attention(q, k, v, mask_mod=plan, backend="tiled")
    assert made
    count = len(made)
    for _ in range(2):
        out = attention(q, k, v, mask_mod=plan, backend="tiled")
        check(out, ref, (q, k, v))
        ref, _ = reference_attention(q, k, v, mask=dense_from(fn, T, T, heads=1))
    assert len(made) == count
    assert_close(first, out)
    attention(q, k, v, causal=True, mask_mod=plan, backend="tiled")  # another key: its own
    attention(q.float(), k.float(), v.float(), mask_mod=plan, backend="tiled")
    assert len(made) == 3 * count
    attention(q, k, v, mask_mod=fn, block_size=BLOCK, backend="tiled")
    assert len(made) == 4 * count
