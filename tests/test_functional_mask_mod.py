"""mask_mod= and block_size= on every backend against the fp64 reference under a dense mask
written out here by calling the function pair by pair (0-d index tensors, Python loops: no
use of the library's evaluation): outputs and gradients of q, k, v and bias, patterns that
depend on positions, heads and batch rows, rows left empty, the AND with causal / window /
documents / prefix / a key mask, grouped-query heads, cross lengths (bottom-right); that the
tiled backend skips all-False tiles and never evaluates more than a tile; torch's own
flex_attention on one pattern; every bad input."""

import pytest
import torch

from helpers_spies import count_calls
from helpers_structure import B, H, grads, qkv
from multihead import CausalLM, LMConfig, MultiHeadAttention, attention
from multihead.functional import explain, masks
from multihead.functional import mask_mod as mask_mod_module
from multihead.functional.backends import tile_spans
from multihead.functional.backends import tiled as tiled_backend
from multihead.functional.backends.tile_band import band_plan
from multihead.functional.backends.tile_segments import segment_plan
from multihead.functional.structure import Structure
from multihead.modules.block import TransformerBlock
from multihead.modules.cache import KVCache
from multihead.modules.static_cache import StaticKVCache
from multihead.parallel.sequence_parallel import RingRunner

from conftest import assert_close
from reference import reference_attention, structure_mask_pairwise

T = 24  # 6 tiles of 4 each way
BLOCK = 4
BACKENDS = ["eager", "sdpa", "tiled", "auto"]
LENGTHS = torch.tensor([24, 13])  # per batch row: keys before this are real
DOCS = [[0] * 7 + [1] * 11 + [2] * 6, [3] * 15 + [4] * 9]  # (B, 24) ids

PATTERNS = {
    # the sliding window of `causal=True, window=5`, written as a function
    "sliding-window": lambda b, h, q, k: (k <= q) & (q - k < 5),
    "dilated": lambda b, h, q, k: (q - k) % 3 == 0,
    "per-head": lambda b, h, q, k: (q - k).abs() <= 2 * h + 1,
    "per-batch": lambda b, h, q, k: k < LENGTHS[b],
    # queries 1, 5, 9, ... see nothing: zeros, zero gradients
    "empty-rows": lambda b, h, q, k: (q % 4 != 1) & (k <= q + 2),
    # whole 8 x 8 blocks on the diagonal, causal inside: many all-False tiles
    "block-diagonal": lambda b, h, q, k: (q // 8 == k // 8) & (k <= q),
}


def dense_from(fn, tq, tk, heads=H):
    """(B, heads, Tq, Tk) booleans, calling `fn` once per pair with 0-d index tensors; query i
    sits at position i + Tk - Tq (bottom-right)."""
    out = torch.zeros(B, heads, tq, tk, dtype=torch.bool)
    for b in range(B):
        for h in range(heads):
            for i in range(tq):
                p = i + tk - tq
                for j in range(tk):
                    index = (torch.tensor(b), torch.tensor(h), torch.tensor(p), torch.tensor(j))
                    out[b, h, i, j] = bool(fn(*index))
    return out


def check(out, ref, inputs, dtype=None):
    assert_close(out, ref, dtype)
    for a, b in zip(grads(out, *inputs), grads(ref, *inputs), strict=True):
        assert_close(a, b, dtype)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(PATTERNS))
@pytest.mark.parametrize("hkv", [H, 1])
def test_mask_mod_matches_the_dense_mask(backend, name, hkv):
    fn = PATTERNS[name]
    q, k, v = qkv(T, T, hkv)
    out = attention(q, k, v, mask_mod=fn, block_size=BLOCK, backend=backend)
    ref, _ = reference_attention(q, k, v, mask=dense_from(fn, T, T))
    check(out, ref, (q, k, v))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_window_written_as_mask_mod_equals_window(backend):
    q, k, v = qkv(T, T)
    out = attention(q, k, v, mask_mod=PATTERNS["sliding-window"], block_size=BLOCK,
                    backend=backend)  # fmt: skip
    want = attention(q, k, v, causal=True, window=5, backend=backend)
    check(out, want, (q, k, v))


@pytest.mark.parametrize("backend", BACKENDS)
def test_rows_with_nothing_to_attend_give_zeros(backend):
    q, k, v = qkv(T, T)
    out = attention(q, k, v, mask_mod=PATTERNS["empty-rows"], block_size=BLOCK, backend=backend)
    dq = grads(out, q, k, v)[0]
    empty = torch.arange(1, T, 4)
    assert not out.isnan().any() and not dq.isnan().any()
    assert (out[:, :, empty] == 0).all() and (dq[:, :, empty] == 0).all()


COMBINED = {
    "causal-documents-keymask": dict(causal=True, documents=DOCS),
    "window-prefix": dict(causal=True, window=(6, 6), prefix=9),
    "bidirectional-window": dict(window=(3, 7)),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(COMBINED))
@pytest.mark.parametrize("hkv", [H, 1])
def test_mask_mod_ands_with_the_structure_and_a_key_mask(backend, name, hkv):
    case = COMBINED[name]
    fn = PATTERNS["dilated"] if name != "window-prefix" else PATTERNS["per-head"]
    q, k, v = qkv(T, T, hkv)
    key_mask = torch.ones(B, 1, 1, T, dtype=torch.bool)
    key_mask[1, ..., 19:] = False  # padding in row 1
    args = dict(case)
    if "documents" in args:
        args["documents"] = torch.tensor(args["documents"])
    out = attention(q, k, v, mask=key_mask, mask_mod=fn, block_size=BLOCK, backend=backend,
                    **args)  # fmt: skip
    dense = structure_mask_pairwise(B, T, T, **case) & key_mask
    ref, _ = reference_attention(q, k, v, mask=dense & dense_from(fn, T, T))
    check(out, ref, (q, k, v))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("block", [(4, 8), (2, 24), 1])
def test_cross_lengths_align_bottom_right(backend, block):
    # 8 queries, 24 keys: query i sits at position i + 16, which is what q_idx receives
    fn = PATTERNS["sliding-window"]
    q, k, v = qkv(8, T, hkv=1)
    out = attention(q, k, v, mask_mod=fn, block_size=block, backend=backend)
    ref, _ = reference_attention(q, k, v, mask=dense_from(fn, 8, T))
    check(out, ref, (q, k, v))
    want = attention(q, k, v, causal=True, window=5, backend="eager")
    assert_close(out, want)


@pytest.mark.parametrize("backend", ["eager", "sdpa", "tiled"])
@pytest.mark.parametrize("name", ["per-head", "empty-rows"])
def test_bias_and_its_gradient(backend, name):
    fn = PATTERNS[name]
    q, k, v = qkv(T, T)
    bias = torch.randn(1, H, T, T, dtype=torch.float64, requires_grad=True)
    out = attention(q, k, v, bias=bias, mask_mod=fn, block_size=BLOCK, backend=backend)
    ref, _ = reference_attention(q, k, v, mask=dense_from(fn, T, T), bias=bias)
    check(out, ref, (q, k, v, bias))


@pytest.mark.parametrize("name", list(PATTERNS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])  # fused / plain-torch tiles
def test_lower_precision_tiles(name, dtype):
    fn = PATTERNS[name]
    q, k, v = qkv(T, T, dtype=dtype)
    out = attention(q, k, v, mask_mod=fn, block_size=(8, 4), backend="tiled")
    ref, _ = reference_attention(q, k, v, mask=dense_from(fn, T, T))
    check(out, ref, (q, k, v), dtype)


def test_default_block_size_leaves_a_shorter_last_tile():
    # 200 is not a multiple of the default 128: no error, and the same answer
    fn = PATTERNS["dilated"]
    q, k, v = qkv(200, 200, hkv=1)
    out = attention(q, k, v, mask_mod=fn, backend="tiled")
    want = attention(q, k, v, mask_mod=fn, backend="eager")
    check(out, want, (q, k, v))


# -- what the tiled backend computes ------------------------------------------------------------


@pytest.fixture
def spy(monkeypatch):
    """Counts the tiled backend's fused-kernel tile calls (forward and backward) and its runs
    of batched spans (`tile_spans`: one kernel call per batch row each)."""
    names = {
        "kernel_forward": "forward",
        "kernel_backward": "backward",
        "run_forward": "span forward",
        "run_backward": "span backward",
    }
    return count_calls(monkeypatch, tiled_backend, names)


def recording(fn, shapes):
    """`fn`, noting the broadcast (.., rows, keys) of every call's index tensors."""

    def mask_mod(b, h, q_idx, kv_idx):
        shapes.append(tuple(torch.broadcast_shapes(q_idx.shape, kv_idx.shape)[-2:]))
        return fn(b, h, q_idx, kv_idx)

    return mask_mod


def test_tiled_skips_all_false_tiles_and_evaluates_block_by_block(spy, monkeypatch):
    # (causal documents, which the backend recognises and runs on the documents fast path
    # (test_functional_mask_documents.py): here with that turned off, the general plan's)
    monkeypatch.setattr(tiled_backend, "documents_of", lambda *args: None)
    # Block-diagonal 8 x 8 blocks, causal inside, on 4 x 4 tiles: of the 6 x 6 tiles, 6 are
    # partial (the diagonal: triangles), 3 full (below it, inside a block) and 27 all False.
    # A row visits its partial tile and, in odd rows, one full tile: each row is one span
    # (contiguous tiles; spans of 4 and 8 keys alternate: 6 runs of one block).
    fn = PATTERNS["block-diagonal"]
    shapes: list[tuple[int, int]] = []
    q, k, v = qkv(T, T)
    out = attention(q, k, v, mask_mod=recording(fn, shapes), block_size=BLOCK, backend="tiled")
    ref, _ = reference_attention(q, k, v, mask=dense_from(fn, T, T))
    check(out, ref, (q, k, v))
    assert spy == {"forward": 0, "backward": 0, "span forward": 6, "span backward": 6}
    # classified one query block at a time (its 6 tiles in one evaluation); the partial
    # tiles' evaluations are kept on the call's plan for its forward and backward (never
    # evaluated again)
    assert shapes == [(BLOCK, T)] * 6


def test_classification_evaluates_at_most_a_strip_of_pairs(monkeypatch):
    # the cap on one evaluation (2 tiles' pairs here), and a function that ignores kv_idx
    # (its result broadcasts over the keys) or q_idx
    monkeypatch.setattr(mask_mod_module, "STRIP_ELEMENTS", 2 * BLOCK * BLOCK)
    for fn in (lambda b, h, q, k: q % 3 != 0, lambda b, h, q, k: k % 5 != 1):
        shapes: list[tuple[int, int]] = []
        q, k, v = qkv(T, T)
        out = attention(q, k, v, mask_mod=recording(fn, shapes), block_size=BLOCK,
                        backend="tiled")  # fmt: skip
        ref, _ = reference_attention(q, k, v, mask=dense_from(fn, T, T))
        check(out, ref, (q, k, v))
        assert len(shapes) == 18  # 6 blocks x 3 evaluations of 2 tiles


@pytest.mark.parametrize("hkv", [H, 1])
def test_a_window_mask_mod_runs_as_one_band_of_spans(spy, monkeypatch, hkv):
    # A causal window of 16 on tiles of 8 at T 64: rows 2..7 each see a partial, a full and
    # the diagonal tile, spans of 24 keys moving on by 8: one run (the blocks batched in one
    # kernel call per batch row); rows 0 and 1 (spans of 8 and 16) a run each. The backward
    # in chunks of one block, the forward in sub-blocks of 2 rows over the keys they see
    # (both forced), a head- and batch-dependent cut on top, and empty rows (whole sub-blocks:
    # positions 4, 5, 14, 15, ..).
    monkeypatch.setattr(tile_spans, "CHUNK_ELEMENTS", 1)
    monkeypatch.setattr(tile_spans, "FORWARD_ROWS", 2)
    monkeypatch.setattr(tiled_backend, "workers", lambda *tensors: 1)  # one unit: whole runs
    runs: list[tuple[int, int, int]] = []
    real = tile_spans.run_forward

    def noting(run, *args):
        runs.append((run.first, run.blocks, run.width))
        return real(run, *args)

    monkeypatch.setattr(tiled_backend, "run_forward", noting)

    def fn(b, h, q, k):
        return (k <= q) & (q - k < 16) & ((q + h + b) % 7 != 3) & (q // 2 % 5 != 2)

    q, k, v = qkv(64, 64, hkv=hkv)
    out = attention(q, k, v, mask_mod=fn, block_size=8, backend="tiled")
    ref, _ = reference_attention(q, k, v, mask=dense_from(fn, 64, 64))
    check(out, ref, (q, k, v))
    assert runs == [(0, 1, 8), (1, 1, 16), (2, 6, 24)]
    assert spy["forward"] == spy["backward"] == 0
    assert spy["span backward"] == 3


def test_spans_whose_masks_would_be_too_large_run_tile_by_tile(spy, monkeypatch):
    # a head-dependent pattern: its spans' masks are B x H per pair; past the cap the rows
    # run tile by tile (the kernel's tile calls), with the same result
    fn = PATTERNS["per-head"]
    q, k, v = qkv(T, T)
    dense = dense_from(fn, T, T)
    for cap in (0, 2**40):
        monkeypatch.setattr(tile_spans, "MASK_ELEMENTS", cap)
        out = attention(q, k, v, mask_mod=fn, block_size=BLOCK, backend="tiled")
        check(out, reference_attention(q, k, v, mask=dense)[0], (q, k, v))
    assert spy["span forward"] > 0 and spy["forward"] > 0
    assert spy["forward"] == spy["backward"]  # every tile of the first call, each way


def test_structure_skips_tiles_before_mask_mod_is_evaluated(spy):
    # A causal window of 5 leaves 11 of the 36 tiles; mask_mod (always True) sees only those
    shapes: list[tuple[int, int]] = []
    always = recording(lambda b, h, q, k: torch.ones((), dtype=torch.bool), shapes)
    q, k, v = qkv(T, T)
    out = attention(q, k, v, causal=True, window=5, mask_mod=always, block_size=BLOCK,
                    backend="tiled")  # fmt: skip
    check(out, attention(q, k, v, causal=True, window=5, backend="eager"), (q, k, v))
    # classified one query block at a time (1, then 2 tiles), all full: not evaluated again
    assert sorted(shapes) == [(BLOCK, BLOCK)] + [(BLOCK, 2 * BLOCK)] * 5  # (any thread order)


def test_where_reading_is_not_free_every_tile_is_partial(spy, monkeypatch):
    # As on a GPU or under tracing: no tile is read to be skipped, the answer is the same
    monkeypatch.setattr(tiled_backend, "may_read", lambda t, always=False: False)
    fn = PATTERNS["block-diagonal"]
    shapes: list[tuple[int, int]] = []
    q, k, v = qkv(T, T)
    out = attention(q, k, v, mask_mod=recording(fn, shapes), block_size=BLOCK, backend="tiled")
    ref, _ = reference_attention(q, k, v, mask=dense_from(fn, T, T))
    check(out, ref, (q, k, v))
    # every row is one span of all 24 keys (6 runs of one block), each tile evaluated once,
    # when its span's mask is assembled (in the forward; the backward reuses it)
    assert spy == {"forward": 0, "backward": 0, "span forward": 6, "span backward": 6}
    assert len(shapes) == 36  # evaluated where each tile runs, never to classify


def test_the_fast_paths_step_aside_for_a_mask_mod():
    q = torch.randn(1, 2, 512, 8)
    window = Structure(window=(63, 63))
    docs = Structure(documents=torch.tensor([[0] * 200 + [1] * 312]))
    fn = PATTERNS["dilated"]
    assert band_plan(window, True, None, None, q, q) is not None
    assert band_plan(window._replace(mask_mod=fn, block=(128, 128)), True, None, None, q, q) is None
    assert segment_plan(docs, None, None, q, q) is not None
    assert segment_plan(docs._replace(mask_mod=fn, block=(128, 128)), None, None, q, q) is None


def test_auto_picks_tiled_for_large_cpu_calls():
    big = torch.randn(1, 1, 1024, 8)
    fn = PATTERNS["dilated"]
    assert explain(big, big, big, mask_mod=fn).chosen == "tiled"
    assert explain(big, big, big, mask_mod=fn, block_size=64, return_weights=True).chosen == "eager"
    small = torch.randn(1, 1, 64, 8)
    assert explain(small, small, small, mask_mod=fn).chosen == "sdpa"


# -- tracing and torch's own flex_attention -------------------------------------------------------


def test_mask_mod_traces_under_torch_compile_fullgraph():
    # Under compile auto runs sdpa with the mask_mod evaluated on the grid inside the graph
    q, k, v = (torch.randn(1, 2, 48, 8, requires_grad=True) for _ in range(3))
    fn = PATTERNS["per-head"]

    def f(q, k, v):
        return attention(q, k, v, causal=True, mask_mod=fn, block_size=16)

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    got, want = compiled(q, k, v), attention(q, k, v, causal=True, mask_mod=fn, backend="tiled")
    assert_close(got, want, torch.float32)
    for a, b in zip(grads(got, q, k, v), grads(want, q, k, v), strict=True):
        assert_close(a, b, torch.float32)


def test_forward_matches_torch_flex_attention():
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    def fn(b, h, q_idx, kv_idx):  # strided causal, wider per head
        return (kv_idx <= q_idx) & (((q_idx - kv_idx) % (h + 2) == 0) | (q_idx - kv_idx < 16))

    q, k, v = (torch.randn(2, 3, 256, 16) for _ in range(3))
    try:
        block_mask = create_block_mask(fn, None, 3, 256, 256, device="cpu")
        want = torch.compile(flex_attention)(q, k, v, block_mask=block_mask)
    except Exception as error:  # flex on CPU needs torch.compile and a working C++ compiler
        pytest.skip(f"torch's flex_attention does not run here: {type(error).__name__}: {error}")
    got = attention(q, k, v, mask_mod=fn, block_size=128, backend="tiled")
    assert_close(got, want, torch.float32)


# -- the modules -----------------------------------------------------------------------------------


C = 24


def test_module_passes_mask_mod_through():
    mha = MultiHeadAttention(C, H, num_kv_heads=1, causal=True, dtype=torch.float64)
    x = torch.randn(B, T, C, dtype=torch.float64)
    fn = PATTERNS["per-head"]
    got = mha(x, mask_mod=fn, block_size=BLOCK)
    want = mha(x, mask=dense_from(fn, T, T))
    assert_close(got, want)


def test_kv_cache_decoding_sees_positions_among_the_cached_keys():
    # q_idx is the position among every cached key, so decoding equals the full forward
    mha = MultiHeadAttention(C, H, causal=True, dtype=torch.float64).eval()
    x = torch.randn(B, T, C, dtype=torch.float64)
    fn = PATTERNS["dilated"]
    full = mha(x, mask_mod=fn)
    cache = KVCache(B, H, C // H, dtype=torch.float64)
    steps = [mha(x[:, :10], cache=cache, mask_mod=fn)]
    steps += [mha(x[:, i : i + 1], cache=cache, mask_mod=fn) for i in range(10, T)]
    assert_close(torch.cat(steps, dim=1), full)


def test_block_and_causal_lm_pass_mask_mod_on():
    fn = PATTERNS["per-head"]
    block = TransformerBlock(C, H, 2 * C).double().eval()
    x = torch.randn(B, T, C, dtype=torch.float64)
    got = block(x, mask_mod=fn, block_size=BLOCK)
    assert_close(got, block(x, mask=dense_from(fn, T, T)))

    config = LMConfig(vocab_size=50, dim=C, num_layers=2, num_heads=H, position="rope",
                      norm="rmsnorm", mlp="swiglu")  # fmt: skip
    lm = CausalLM(config).double().eval()
    ids = torch.randint(0, 50, (B, T))
    h = lm.hidden_states(ids, mask_mod=fn, block_size=BLOCK)
    x = lm.tok(ids)
    for layer in lm.layers:
        x = layer(x, mask=masks.causal(T) & dense_from(fn, T, T), positions=torch.arange(T))
    assert_close(h, lm.norm_f(x))
    assert_close(lm(ids, mask_mod=fn), lm.logits(h))


def test_where_mask_mod_cannot_apply_the_module_says_so():
    mha = MultiHeadAttention(C, H, dtype=torch.float64)
    fn = PATTERNS["dilated"]
    packed = torch.randn(9, C, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"mask_mod, block_size cannot be combined with lengths"):
        mha(packed, lengths=[4, 5], mask_mod=fn, block_size=1)
    cache = StaticKVCache(B, H, C // H, 16, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"mask_mod= need keys in position order"):
        mha(torch.randn(B, 3, C, dtype=torch.float64), cache=cache, causal=True, mask_mod=fn)
    ring = RingRunner(None, "contiguous", 4)  # type: ignore[arg-type]  (refused before the ring)
    with pytest.raises(ValueError, match=r"mask_mod cannot be used under sequence parallelism"):
        ring(mha, torch.randn(B, T, C, dtype=torch.float64), mask_mod=fn)


# -- bad inputs -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "block_size, error, match",
    [
        (5, ValueError, r"block_size 5 .*Tq=24 and the key length Tk=24"),
        ((4, 5), ValueError, r"block_size \(4, 5\) .*Tk=24"),
        (0, ValueError, "block_size must be a positive int"),
        ((4, -1), ValueError, "block_size must be a positive int"),
        ((4, 4, 4), ValueError, "block_size must be a positive int"),
        (True, TypeError, "block_size must be an int"),
        (4.0, TypeError, "block_size must be an int"),
    ],
)
@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_block_size(block_size, error, match, backend):
    q, k, v = qkv(T, T)
    with pytest.raises(error, match=match):
        attention(q, k, v, mask_mod=PATTERNS["dilated"], block_size=block_size, backend=backend)
    with pytest.raises(error, match=match):
        explain(q, k, v, mask_mod=PATTERNS["dilated"], block_size=block_size)


def test_block_size_without_mask_mod_is_refused():
    q, k, v = qkv(T, T)
    with pytest.raises(ValueError, match="block_size=8 was given without mask_mod"):
        attention(q, k, v, causal=True, block_size=8)


def test_mask_mod_must_be_callable():
    q, k, v = qkv(T, T)
    with pytest.raises(TypeError, match=r"mask_mod must be a function .* got str"):
        attention(q, k, v, mask_mod="causal")


@pytest.mark.parametrize(
    "fn, error, match",
    [
        (lambda b, h, q, k: (q - k).float(), TypeError, "mask_mod must return a boolean .*float32"),
        (lambda b, h, q, k: True, TypeError, "mask_mod must return a boolean tensor.* got bool"),
        (
            lambda b, h, q, k: torch.ones(5, 7, dtype=torch.bool),
            ValueError,
            r"mask_mod returned shape \(5, 7\), which does not broadcast",
        ),
        (
            lambda b, h, q, k: (q >= k)[None],
            ValueError,
            r"mask_mod returned shape \(1, 1, 1, \d+, \d+\)",
        ),
    ],
)
@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_mask_mod_results(fn, error, match, backend):
    q, k, v = qkv(T, T)
    with pytest.raises(error, match=match):
        attention(q, k, v, mask_mod=fn, block_size=BLOCK, backend=backend)


def _python_and(b, h, q, k):
    return (k <= q) and (q - k < 4)


def _python_if(b, h, q, k):
    if q > k:
        return q == q
    return k == k


@pytest.mark.parametrize("fn", [_python_and, _python_if])
@pytest.mark.parametrize("backend", [*BACKENDS, "flex"])
def test_python_logic_in_a_mask_mod_is_named_with_the_fix(fn, backend):
    # torch alone says "Boolean value of Tensor with more than one value is ambiguous" (or,
    # under flex's vmap, "data-dependent control flow"), naming neither mask_mod nor the fix
    q, k, v = (t.float() for t in qkv(T, T))  # (flex takes no fp64)
    with (
        torch.no_grad(),
        pytest.raises(
            TypeError, match=r"mask_mod must combine .* \(&, \|, ~, torch.where\), not Python `and`"
        ),
    ):
        attention(q, k, v, mask_mod=fn, block_size=BLOCK, backend=backend)
