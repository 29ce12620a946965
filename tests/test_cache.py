"""KV-cache decoding equals the full forward."""

import pytest
import torch

from multihead import MultiHeadAttention
from multihead.functional import masks
from multihead.modules.cache import CrossKVCache, KVCache
from multihead.positional import ALiBi, RotaryEmbedding

B, T, C, H = 2, 9, 24, 6


def decode(m, x, cache, steps, key_mask=None):
    """Prefill the first steps[0] tokens, then chunks of the given sizes."""
    outs, start = [], 0
    for size in steps:
        km = None if key_mask is None else key_mask[:, start : start + size]
        outs.append(m(x[:, start : start + size], cache=cache, causal=True, key_mask=km))
        start += size
    return torch.cat(outs, dim=1)


@pytest.mark.parametrize("position", [None, "rope", "alibi"])
@pytest.mark.parametrize("kv_heads", [6, 2, 1])
@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("steps", [[4, 1, 1, 1, 1, 1], [3, 3, 2, 1], [1] * 9])
def test_decoding_equals_full_forward(position, kv_heads, static, steps):
    torch.manual_seed(0)
    pos = {"rope": RotaryEmbedding(4), "alibi": ALiBi(H), None: None}[position]
    m = MultiHeadAttention(C, H, num_kv_heads=kv_heads, causal=True, position=pos).double()
    x = torch.randn(B, T, C, dtype=torch.float64)
    full = m(x)
    cache = KVCache(B, kv_heads, 4, max_length=T if static else None, dtype=torch.float64)
    torch.testing.assert_close(decode(m, x, cache, steps), full)
    assert cache.length == T


@pytest.mark.parametrize("static", [False, True])
def test_sliding_window(static):
    torch.manual_seed(0)
    m = MultiHeadAttention(C, H, num_kv_heads=2, causal=True, position=RotaryEmbedding(4)).double()
    x = torch.randn(B, T, C, dtype=torch.float64)
    full = m(x, mask=masks.sliding_window(T, T, 3))
    cache = KVCache(B, 2, 4, window=3, max_length=T if static else None, dtype=torch.float64)
    torch.testing.assert_close(decode(m, x, cache, [4, 1, 2, 1, 1]), full)
    assert cache._stored <= (2 * 3 if static else 3 - 1 + 2)


def test_batch_with_different_prompt_lengths_left_padded():
    torch.manual_seed(0)
    m = MultiHeadAttention(C, H, causal=True, position=RotaryEmbedding(4)).double()
    lengths = [5, 3]
    prompts = [torch.randn(n, C, dtype=torch.float64) for n in lengths]
    new = torch.randn(B, 3, C, dtype=torch.float64)
    P = max(lengths)
    batch = torch.zeros(B, P, C, dtype=torch.float64)
    pad = torch.zeros(B, P, dtype=torch.bool)
    positions = torch.zeros(B, P, dtype=torch.long)
    for i, p in enumerate(prompts):
        batch[i, P - len(p) :] = p
        pad[i, P - len(p) :] = True
        positions[i, P - len(p) :] = torch.arange(len(p))
    cache = KVCache(B, H, 4, dtype=torch.float64)
    m(batch, cache=cache, key_mask=pad, positions=positions)
    steps = []
    for t in range(3):
        pos = torch.tensor(lengths)[:, None] + t
        steps.append(m(new[:, t : t + 1], cache=cache, positions=pos))
    for i, p in enumerate(prompts):
        alone = m(torch.cat([p, new[i]])[None])[0, len(p) :]
        torch.testing.assert_close(torch.cat(steps, 1)[i], alone)


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("window", [None, 4])
def test_a_key_mask_after_unmasked_calls_keeps_the_earlier_keys_real(static, window):
    """The cache keeps no mask until a call passes one; from then on the keys stored before
    count as real and the new call's padding is honoured."""
    torch.manual_seed(0)
    m = MultiHeadAttention(C, H, num_kv_heads=2, causal=True).double()
    x = torch.randn(B, T, C, dtype=torch.float64)
    key_mask = torch.ones(B, T, dtype=torch.bool)
    key_mask[1, 6] = False  # one padded key in the third chunk of row 1
    allowed = masks.causal(T) & key_mask[:, None, None, :]
    if window is not None:
        allowed = allowed & masks.sliding_window(T, T, window)
    full = m(x, mask=allowed)
    cache = KVCache(B, 2, 4, window=window, max_length=T if static else None, dtype=torch.float64)
    steps = [3, 2, 2, 1, 1]  # masks from the third chunk on
    outs, start = [], 0
    for i, size in enumerate(steps):
        km = None if i < 2 else key_mask[:, start : start + size]
        outs.append(m(x[:, start : start + size], cache=cache, key_mask=km))
        start += size
    got = torch.cat(outs, dim=1)
    keep = key_mask.clone()  # padded query rows are not compared (they attend as any row)
    torch.testing.assert_close(got[keep], full[keep])


def test_cross_attention_memory_is_projected_once(monkeypatch):
    torch.manual_seed(0)
    m = MultiHeadAttention(C, H, kdim=10, vdim=10).double()
    memory = torch.randn(B, 7, 10, dtype=torch.float64)
    q = torch.randn(B, 4, C, dtype=torch.float64)
    cache = CrossKVCache()
    outs = [m(q[:, t : t + 1], memory, cache=cache) for t in range(4)]
    torch.testing.assert_close(torch.cat(outs, 1), m(q, memory))
    calls = []
    monkeypatch.setattr(m.k_proj, "forward", lambda x: calls.append(x) or x)
    m(q[:, :1], memory, cache=cache)
    assert calls == []  # reused: keys were not projected again


def test_cache_errors():
    cache = KVCache(2, 3, 4, max_length=5)
    with pytest.raises(ValueError, match=r"6 tokens do not fit a cache of max_length 5"):
        cache.update(torch.zeros(2, 3, 6, 4), torch.zeros(2, 3, 6, 4))
    with pytest.raises(
        ValueError, match=r"batch 2, kv heads 3, head_dim 4\); got keys \(1, 3, 1, 4\)"
    ):
        cache.update(torch.zeros(1, 3, 1, 4), torch.zeros(1, 3, 1, 4))
    with pytest.raises(ValueError, match="kv heads 3"):
        cache.update(torch.zeros(2, 2, 1, 4), torch.zeros(2, 2, 1, 4))
    with pytest.raises(ValueError, match=r"holds torch\.float32, got keys of torch\.float64"):
        cache.update(
            torch.zeros(2, 3, 1, 4, dtype=torch.float64),
            torch.zeros(2, 3, 1, 4, dtype=torch.float64),
        )
    with pytest.raises(ValueError, match=r"float32, got keys of torch\.float32 and values of"):
        cache.update(torch.zeros(2, 3, 1, 4), torch.zeros(2, 3, 1, 4, dtype=torch.float16))
    assert cache.length == 0  # nothing was written
    with pytest.raises(ValueError, match="window"):
        KVCache(1, 1, 4, window=0)
    m = MultiHeadAttention(C, H, causal=True)
    with pytest.raises(ValueError, match=r"kv heads 2, head_dim 4\); got keys \(2, 6, 2, 4\)"):
        m(torch.randn(B, 2, C), cache=KVCache(B, 2, 4))
    with pytest.raises(ValueError, match="head_dim 4"):
        MultiHeadAttention(C, H, position=RotaryEmbedding(8))


@pytest.mark.parametrize("max_length", [None, 6])
def test_the_module_plain_path_checks_the_cache_as_update_does(max_length):
    """A decode step with nothing but a cache (the module's fast path, which writes a static
    cache itself) refuses what `update` refuses, names the same numbers, and writes nothing."""
    torch.manual_seed(0)
    m = MultiHeadAttention(C, H, num_kv_heads=2, causal=True)
    cache = KVCache(B, 2, 4, max_length=max_length)
    m(torch.randn(B, 4, C), cache=cache)
    if max_length is not None:
        with pytest.raises(ValueError, match=r"7 tokens do not fit a cache of max_length 6"):
            m(torch.randn(B, 3, C), cache=cache)
    with pytest.raises(ValueError, match=r"batch 2, kv heads 2, head_dim 4\); got keys \(1, 2"):
        m(torch.randn(1, 1, C), cache=cache)
    with pytest.raises(ValueError, match=r"holds torch\.float32, got keys of torch\.float64"):
        m.double()(torch.randn(B, 1, C, dtype=torch.float64), cache=cache)
    m.float()
    assert cache.length == 4  # nothing was written
    # and the step it does take is the full forward's last row
    x = torch.randn(B, 5, C)
    fresh = KVCache(B, 2, 4, max_length=max_length)
    m(x[:, :4], cache=fresh)
    torch.testing.assert_close(m(x[:, 4:], cache=fresh), m(x)[:, 4:], atol=1e-6, rtol=1e-5)
    assert fresh.length == 5
