"""A call that fails leaves its caches as they were: a KVCache appends a call's keys (a
CrossKVCache takes the memory) before the checks that need them (mask shape, structure, a
mask_mod's result), so each failure undoes that, in the module, the block, the decoder stack
and the causal LM; a StaticKVCache, which cannot undo its writes, is checked before it
writes. A corrected retry then equals an uninterrupted run (it once attended to the failed
call's keys twice)."""

import pytest
import torch

from multihead import CausalLM, LMConfig, MultiHeadAttention
from multihead.functional.backends import register_backend, unregister_backend
from multihead.modules.block import TransformerBlock
from multihead.modules.cache import CrossKVCache, KVCache
from multihead.modules.static_cache import StaticKVCache

from conftest import assert_close

B, T, C, H, HKV = 2, 11, 24, 3, 1


def module(**kw):
    return MultiHeadAttention(C, H, num_kv_heads=HKV, dtype=torch.float64, **kw).eval()


def _python_and(b, h, q, k):
    return (k <= q) and (k >= 0)


@pytest.mark.parametrize(
    "cache_args", [{}, {"max_length": T}, {"window": 3}, {"window": 3, "max_length": T}]
)
def test_a_call_that_fails_its_checks_leaves_the_cache_as_it_was(cache_args):
    # The cache appends a call's keys before the checks that need them (mask shape,
    # structure); a failed check undoes it, so the corrected retry attends to them once.
    # (The preallocated window cache, room 6, slides its window to the front on that call.)
    m = module(causal=True)
    x = torch.randn(B, T, C, dtype=torch.float64)
    reference = KVCache(B, HKV, C // H, dtype=torch.float64, **cache_args)
    cache = KVCache(B, HKV, C // H, dtype=torch.float64, **cache_args)
    want = [m(x[:, a:b], cache=reference) for a, b in [(0, 5), (5, 7), (7, T)]]
    got = [m(x[:, :5], cache=cache)]
    for bad in [
        {"mask": torch.ones(B, 1, 1, 99, dtype=torch.bool)},
        {"documents": torch.zeros(B, 99, dtype=torch.long)},
        {"prefix": 99},
        {"mask_mod": _python_and},  # (found while attention runs: TypeError)
        {"mask_mod": lambda b, h, q, k: (q - k).float()},  # (its result checked then)
    ]:
        with pytest.raises((ValueError, TypeError)):
            m(x[:, 5:7], cache=cache, **bad)
        assert cache.length == 5
    got += [m(x[:, 5:7], cache=cache), m(x[:, 7:], cache=cache)]
    assert_close(torch.cat(got, dim=1), torch.cat(want, dim=1))


def test_a_causal_lm_whose_later_layer_fails_leaves_every_cache_as_it_was():
    config = LMConfig(vocab_size=50, dim=C, num_layers=2, num_heads=H, num_kv_heads=HKV,
                      position="rope", sliding_window=3, full_attention_layers=(1,))  # fmt: skip
    lm = CausalLM(config).double().eval()
    ids = torch.randint(0, 50, (B, 8))
    want = lm(ids)
    caches = lm.make_caches(B)
    first = lm(ids[:, :6], caches=caches)
    # documents the window layer (3 keys) takes and the full layer (7 keys) refuses
    with pytest.raises(ValueError, match="documents"):
        lm(ids[:, 6:7], caches=caches, documents=torch.zeros(B, 3, dtype=torch.long))
    assert [c.length for c in caches] == [6, 6]
    rest = lm(ids[:, 6:], caches=caches)
    assert_close(torch.cat([first, rest], dim=1), want)


def test_a_static_cache_is_checked_before_it_writes():
    m = module(causal=True)
    x = torch.randn(B, T, C, dtype=torch.float64)
    reference, cache = (StaticKVCache(B, HKV, C // H, 16, dtype=torch.float64) for _ in range(2))
    want = [m(x[:, :5], cache=reference), m(x[:, 5:], cache=reference)]
    got = [m(x[:, :5], cache=cache)]
    with pytest.raises(ValueError, match="StaticKVCache keeps them in slots"):
        m(x[:, 5:], cache=cache, documents=torch.zeros(B, 11, dtype=torch.long))
    with pytest.raises(ValueError, match=r"mask of shape \(2, 1, 1, 99\)"):
        m(x[:, 5:], cache=cache, mask=torch.ones(B, 1, 1, 99, dtype=torch.bool))
    assert cache.length == 5
    got.append(m(x[:, 5:], cache=cache))
    assert_close(torch.cat(got, dim=1), torch.cat(want, dim=1))


def test_a_failed_first_call_leaves_a_cross_cache_empty():
    m = MultiHeadAttention(C, H, kdim=10, vdim=10, dtype=torch.float64).eval()
    x, memory = (
        torch.randn(B, 3, C, dtype=torch.float64),
        torch.randn(B, 7, 10, dtype=torch.float64),
    )
    cache = CrossKVCache()
    with pytest.raises(ValueError, match="does not broadcast"):
        m(x, memory, cache=cache, mask=torch.ones(B, 1, 1, 99, dtype=torch.bool))
    assert not cache.filled
    # (a key mask given to the failed call is not kept either)
    with pytest.raises(ValueError):
        m(x, memory, cache=cache, key_mask=torch.zeros(B, 7, dtype=torch.bool),
          mask=torch.ones(B, 1, 1, 99, dtype=torch.bool))  # fmt: skip
    assert_close(m(x, memory, cache=cache), m(x, memory))


def test_a_failed_call_leaves_an_empty_cache_free_for_another_module():
    a, b = module(causal=True), module(causal=True)
    x = torch.randn(B, T, C, dtype=torch.float64)
    cache = KVCache(B, HKV, C // H, dtype=torch.float64)
    with pytest.raises(ValueError):
        a(x, cache=cache, mask=torch.ones(B, 1, 1, 99, dtype=torch.bool))
    assert_close(b(x, cache=cache), b(x))


def test_a_block_whose_cross_attention_fails_undoes_its_self_attention_append():
    block = TransformerBlock(C, H, 2 * C, causal=True, cross_attention=True).double().eval()
    x, memory = torch.randn(B, 6, C, dtype=torch.float64), torch.randn(B, 5, C, dtype=torch.float64)
    reference, cache = (
        KVCache(B, H, C // H, dtype=torch.float64),
        KVCache(B, H, C // H, dtype=torch.float64),
    )
    cross_ref, cross = CrossKVCache(), CrossKVCache()
    want = [block(x[:, a:b], memory=memory, cache=reference, cross_cache=cross_ref)
            for a, b in [(0, 4), (4, 6)]]  # fmt: skip
    got = [block(x[:, :4], memory=memory, cache=cache, cross_cache=cross)]
    with pytest.raises(ValueError, match=r"mask of shape \(2, 1, 1, 9\) does not broadcast"):
        block(x[:, 4:], memory=memory, cache=cache, cross_cache=cross,
              memory_key_mask=torch.ones(B, 9, dtype=torch.bool))  # fmt: skip
    assert cache.length == 4
    got.append(block(x[:, 4:], memory=memory, cache=cache, cross_cache=cross))
    assert_close(torch.cat(got, dim=1), torch.cat(want, dim=1))


@pytest.mark.parametrize("cache_args", [{}, {"max_length": T}])
def test_the_plain_path_undoes_its_append_when_a_backend_refuses_at_run_time(cache_args):
    # (a module's common call, no mask or structure, appends through its own short path)
    def refusing(call):
        raise ValueError("refused at run time")

    m = module(causal=True)
    x = torch.randn(B, T, C, dtype=torch.float64)
    cache = KVCache(B, HKV, C // H, dtype=torch.float64, **cache_args)
    first = m(x[:, :5], cache=cache)
    register_backend("refusing", refusing, priority=100)
    try:
        with pytest.raises(ValueError, match="refused at run time"):
            m(x[:, 5:], cache=cache)
    finally:
        unregister_backend("refusing")
    assert cache.length == 5
    assert_close(torch.cat([first, m(x[:, 5:], cache=cache)], dim=1), m(x))
