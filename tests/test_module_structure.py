"""window=, documents=, prefix= through MultiHeadAttention, blocks, CausalLM and KV caches
(each against the same module under the equivalent dense mask), and bad input naming the
argument."""

import itertools
import sys

import numpy as np
import pytest
import torch

from multihead import CausalLM, LMConfig, MultiHeadAttention, attention
from multihead.functional import masks
from multihead.modules.block import TransformerBlock
from multihead.modules.cache import KVCache
from multihead.modules.static_cache import StaticKVCache

from conftest import assert_close

B, T, C, H, HKV = 2, 11, 24, 3, 1


def module(**kw):
    return MultiHeadAttention(C, H, num_kv_heads=HKV, dtype=torch.float64, **kw).eval()


def doc_mask(documents):  # (B, T) -> (B, 1, T, T), True within a document
    return (documents[:, :, None] == documents[:, None, :])[:, None]


def test_module_structure_equals_the_dense_mask():
    m = module()
    x = torch.randn(B, T, C, dtype=torch.float64)
    documents = torch.tensor([[0] * 4 + [1] * 7, [5] * 9 + [6] * 2])
    key_mask = torch.ones(B, T, dtype=torch.bool)
    key_mask[1, 9:] = False
    got = m(x, causal=True, window=3, documents=documents, key_mask=key_mask)
    mask = masks.sliding_window(T, T, 3) & doc_mask(documents)
    want = m(x, causal=True, mask=mask, key_mask=key_mask)
    assert_close(got, want)
    prefix = m(x, causal=True, prefix=torch.tensor([4, 0]))
    pre = torch.zeros(B, 1, T, T, dtype=torch.bool)
    pre[0, :, :4, :4] = True
    assert_close(prefix, m(x, mask=masks.causal(T) | pre))


def test_block_and_causal_lm_pass_structure_on():
    block = TransformerBlock(C, H, 2 * C).double().eval()
    x = torch.randn(B, T, C, dtype=torch.float64)
    documents = torch.tensor([[0] * 6 + [1] * 5, [0] * 2 + [1] * 9])
    got = block(x, documents=documents, window=(1, 2))  # keys p - 1 .. p + 2
    assert_close(got, block(x, mask=doc_mask(documents) & _band(T, 1, 2)))

    config = LMConfig(vocab_size=50, dim=C, num_layers=2, num_heads=H, position="rope",
                      norm="rmsnorm", mlp="swiglu", sliding_window=4, full_attention_layers=(1,))  # fmt: skip
    lm = CausalLM(config).double().eval()
    ids = torch.randint(0, 50, (B, T))
    # The config's window (layer 0 only), as structure, equals running each layer by hand.
    h = lm.hidden_states(ids)
    x = lm.tok(ids)
    for i, layer in enumerate(lm.layers):
        mask = masks.sliding_window(T, T, 4) if i == 0 else masks.causal(T)
        x = layer(x, mask=mask, positions=torch.arange(T))
    assert_close(h, lm.norm_f(x))
    # documents= on the whole model: equal to each document run alone (positions restart).
    documents = torch.tensor([[0] * 5 + [1] * 6] * B)
    packed = lm(ids, documents=documents, positions=torch.tensor([*range(5), *range(6)]))
    assert_close(packed[:, 5:], lm(ids[:, 5:]))
    assert_close(packed[:, :5], lm(ids[:, :5]))


def _band(t, left, right):
    d = torch.arange(t)[None, :] - torch.arange(t)[:, None]  # key minus query
    return (d >= -left) & (d <= right)


def test_window_cache_decoding_equals_the_full_forward():
    m = module(causal=True)
    x = torch.randn(B, T, C, dtype=torch.float64)
    full = m(x, window=4)
    cache = KVCache(B, HKV, C // H, window=4, dtype=torch.float64)
    steps = [m(x[:, :5], cache=cache)] + [m(x[:, i : i + 1], cache=cache) for i in range(5, T)]
    assert_close(torch.cat(steps, dim=1), full)
    # A window given to the call narrows the cache's own.
    cache = KVCache(B, HKV, C // H, window=6, dtype=torch.float64)
    steps = [m(x[:, :5], cache=cache, window=4)]
    steps += [m(x[:, i : i + 1], cache=cache, window=4) for i in range(5, T)]
    assert_close(torch.cat(steps, dim=1), full)
    # ... and the cache's narrows a wider one, given as a numpy integer as well as an int
    # (a numpy window once skipped the narrowing and attended past the cache's window).
    for wide in (9, np.int64(9)):
        cache = KVCache(B, HKV, C // H, window=4, dtype=torch.float64)
        steps = [m(x[:, :5], cache=cache, window=wide)]
        steps += [m(x[:, i : i + 1], cache=cache, window=wide) for i in range(5, T)]
        assert_close(torch.cat(steps, dim=1), full)


def _token_positions_mod(b, h, q_idx, kv_idx):  # reads absolute positions
    return (kv_idx % 3 != 1) | (kv_idx == q_idx)


@pytest.mark.parametrize("max_length", [None, T])
@pytest.mark.parametrize("chunk", [1, 3])
def test_a_window_cache_counts_structure_in_token_positions(max_length, chunk):
    # A window cache hands attention only its last keys; documents, prefix and mask_mod are
    # given in token positions (documents cover every token so far), so decoding equals the
    # full forward. (They were counted among the kept keys: mask_mod gave other results,
    # documents of every token so far were refused.)
    m = module(causal=True)
    x = torch.randn(B, T, C, dtype=torch.float64)
    documents = torch.tensor([[0] * 4 + [1] * 7, [5] * 9 + [6] * 2])
    cases = [
        ({"mask_mod": _token_positions_mod}, lambda t1: {"mask_mod": _token_positions_mod}),
        ({"documents": documents}, lambda t1: {"documents": documents[:, :t1]}),
        ({"prefix": 5}, lambda t1: {"prefix": 5}),
        ({"prefix": torch.tensor([5, 0])}, lambda t1: {"prefix": torch.tensor([5, 0])}),
    ]
    for whole, upto in cases:
        full = m(x, window=4, **whole)
        cache = KVCache(B, HKV, C // H, window=4, max_length=max_length, dtype=torch.float64)
        starts = [0, 5, *range(5 + chunk, T, chunk)]  # (a prefill of 5: the prefix's tokens)
        steps = [m(x[:, a:b], cache=cache, **upto(b)) for a, b in itertools.pairwise([*starts, T])]
        assert_close(torch.cat(steps, dim=1), full)


def test_a_causal_lm_with_window_layers_decodes_structure_as_its_full_forward():
    config = LMConfig(vocab_size=50, dim=C, num_layers=2, num_heads=H, num_kv_heads=HKV,
                      position="rope", sliding_window=4, full_attention_layers=(1,))  # fmt: skip
    lm = CausalLM(config).double().eval()
    ids = torch.randint(0, 50, (B, 14))
    documents = torch.tensor([[0] * 6 + [1] * 8, [0] * 3 + [1] * 11])
    full = lm(ids, mask_mod=_token_positions_mod, documents=documents)
    caches = lm.make_caches(B)
    steps = [
        lm(ids[:, t : t + 1], caches=caches, mask_mod=_token_positions_mod,
           documents=documents[:, : t + 1])
        for t in range(14)
    ]  # fmt: skip
    assert_close(torch.cat(steps, dim=1), full)


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        ({"documents": torch.zeros(B, 5, dtype=torch.long)}, r"documents must cover every token so far: shape \(2, 7\)"),
        # (the 3 kept keys' length: refused too, one shape means one thing)
        ({"documents": torch.zeros(B, 3, dtype=torch.long)}, r"documents must cover every token so far"),
        ({"prefix": 8}, r"prefix must be in 0 .. 7 \(the tokens so far\), got 8"),
        ({"prefix": torch.tensor([-1, 2])}, r"prefix must be in 0 .. 7 \(the tokens so far\), got values -1 .. 2"),
        ({"prefix": torch.tensor([99, 2])}, r"prefix must be in 0 .. 7 .*got values 2 .. 99"),
    ],
)  # fmt: skip
def test_structure_past_a_window_cache_names_the_tokens_so_far(bad, match):
    m = module(causal=True)
    cache = KVCache(B, HKV, C // H, window=3, dtype=torch.float64)
    m(torch.randn(B, 6, C, dtype=torch.float64), cache=cache)  # next call: 3 keys, 4 dropped
    with pytest.raises(ValueError, match=match):
        m(torch.randn(B, 1, C, dtype=torch.float64), cache=cache, **bad)
    assert cache.length == 6  # (and the failed call left the cache as it was)


def test_caches_take_numpy_and_unbounded_windows_as_attention_does():
    m = module(causal=True)
    x = torch.randn(B, T, C, dtype=torch.float64)
    for window, full in [(np.int64(4), m(x, window=4)), (sys.maxsize, m(x)), (10**30, m(x))]:
        for cache in (
            KVCache(B, HKV, C // H, window=window, dtype=torch.float64),
            KVCache(B, HKV, C // H, window=window, max_length=T, dtype=torch.float64),
            StaticKVCache(B, HKV, C // H, T, window=window, dtype=torch.float64),
        ):
            steps = [m(x[:, :5], cache=cache)] + [
                m(x[:, t : t + 1], cache=cache) for t in range(5, T)
            ]
            assert_close(torch.cat(steps, dim=1), full)
    assert torch.equal(masks.sliding_window(5, 5, np.int32(3)), masks.sliding_window(5, 5, 3))


def test_large_module_call_runs_tiled_and_matches_dense():
    m = MultiHeadAttention(32, 4).eval()
    x = torch.randn(1, 1100, 32, requires_grad=True)
    got = m(x, causal=True, window=50)
    want = m(x, causal=True, mask=masks.sliding_window(1100, 1100, 50))
    assert_close(got, want)
    (ga,) = torch.autograd.grad(got.sum(), x)
    (gb,) = torch.autograd.grad(want.sum(), x)
    assert_close(ga, gb)


# -- bad input ----------------------------------------------------------------------------


def qkv():
    return torch.randn(B, H, 5, 8), torch.randn(B, HKV, 7, 8), torch.randn(B, HKV, 7, 8)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(window=0), ValueError, r"window must be a positive int.*got 0"),
        (dict(window=-3), ValueError, r"window.*got -3"),
        (dict(window=True), ValueError, r"window.*got True"),
        (dict(window=(1, -1)), ValueError, r"window.*\(left, right\).*got \(1, -1\)"),
        (dict(window=2.5), ValueError, r"window.*got 2.5"),
        (dict(documents=[0] * 7), TypeError, r"documents must be a \(B, Tk\) integer tensor"),
        (dict(documents=torch.zeros(B, 7)), TypeError, r"documents must be an integer.*float"),
        (
            dict(documents=torch.zeros(B, 5, dtype=torch.long)),
            ValueError,
            r"documents must have shape \(2, 7\), got \(2, 5\)",
        ),
        (dict(documents=torch.zeros(B, 7, dtype=torch.bool)), TypeError, r"documents.*bool"),
        (dict(causal=True, prefix=8), ValueError, r"prefix must be in 0 .. T=7, got 8"),
        (dict(causal=True, prefix=torch.tensor([2, 9])), ValueError, r"prefix.*2 .. 9"),
        (dict(causal=True, prefix=torch.tensor([2])), ValueError, r"prefix must have shape"),
        (dict(causal=True, prefix=2.0), TypeError, r"prefix must be an int"),
        (dict(prefix=2), ValueError, r"prefix=.*needs causal=True"),
    ],
)
def test_bad_structure_names_the_argument(kwargs, error, match):
    with pytest.raises(error, match=match):
        attention(*qkv(), **kwargs)


def test_documents_on_another_device_and_too_few_keys():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"documents is on meta but the inputs are on cpu"):
        attention(q, k, v, documents=torch.zeros(B, 7, dtype=torch.long, device="meta"))
    with pytest.raises(ValueError, match=r"documents need at least as many keys.*Tq=7 > Tk=5"):
        attention(k.expand(B, H, 7, 8), q[:, :1], q[:, :1], documents=torch.zeros(B, 5).long())


def test_documents_with_lengths_and_structure_with_a_static_cache_are_refused():
    m = module()
    packed = torch.randn(9, C, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"documents cannot be combined with lengths"):
        m(packed, lengths=[4, 5], documents=torch.zeros(1, 9, dtype=torch.long))
    with pytest.raises(ValueError, match=r"window, prefix cannot be combined with lengths"):
        m(packed, lengths=[4, 5], window=2, prefix=1)
    cache = StaticKVCache(B, HKV, C // H, 16, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"prefix= and mask_mod= need keys in position"):
        m(torch.randn(B, 3, C, dtype=torch.float64), cache=cache, causal=True, window=2)


def test_module_window_compiles_to_one_graph_for_every_length():
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    m = MultiHeadAttention(C, H, num_kv_heads=HKV, causal=True).eval()
    counter = CompileCounter()
    f = torch.compile(m, backend=counter, fullgraph=True, dynamic=True)
    for t in (5, 9, 1100):  # 1100: large enough that eager mode runs the tiled backend
        x = torch.randn(1, t, C)
        torch.testing.assert_close(f(x, window=4), m(x, mask=masks.sliding_window(t, t, 4)))
    assert counter.frame_count == 1
