"""StaticKVCache: fixed shapes, writes at index tensors; decoding equals the full forward."""

import pytest
import torch

from multihead import MultiHeadAttention
from multihead.functional import masks
from multihead.modules.static_cache import StaticKVCache
from multihead.positional import ALiBi, RotaryEmbedding

B, T, C, H, D = 2, 9, 24, 6, 4


def decode(m, x, cache, steps, key_mask=None, positions=None):
    """Feed x in chunks of the given sizes through the cache."""
    outs, start = [], 0
    for size in steps:
        cut = slice(start, start + size)
        km = None if key_mask is None else key_mask[:, cut]
        pos = None if positions is None else positions[:, cut]
        outs.append(m(x[:, cut], cache=cache, causal=True, key_mask=km, positions=pos))
        start += size
    return torch.cat(outs, dim=1)


def model(position, kv_heads):
    pos = {"rope": RotaryEmbedding(D), "alibi": ALiBi(H), None: None}[position]
    return MultiHeadAttention(C, H, num_kv_heads=kv_heads, causal=True, position=pos).double()


@pytest.mark.parametrize("position", [None, "rope", "alibi"])
@pytest.mark.parametrize("kv_heads", [6, 2, 1])
@pytest.mark.parametrize("steps", [[4, 1, 1, 1, 1, 1], [3, 3, 2, 1], [1] * 9])
def test_decoding_equals_full_forward(position, kv_heads, steps):
    torch.manual_seed(0)
    m = model(position, kv_heads)
    x = torch.randn(B, T, C, dtype=torch.float64)
    cache = StaticKVCache(B, kv_heads, D, 13, dtype=torch.float64)  # room to spare
    k_before, v_before = cache.k, cache.v
    torch.testing.assert_close(decode(m, x, cache, steps), m(x))
    assert cache.length == T
    assert cache.k is k_before and cache.v is v_before  # written in place, never replaced
    assert cache.k.shape == (B, kv_heads, 13, D)


@pytest.mark.parametrize("position", [None, "rope", "alibi"])
@pytest.mark.parametrize(
    "chunk,steps", [(None, [4, 1, 2, 1, 1]), (2, [2, 1, 2, 1, 1, 2]), (1, [1] * 9)]
)
def test_sliding_window_and_ring_buffer(position, chunk, steps):
    """A window of 3: the ring holds window - 1 + chunk slots and wraps around."""
    torch.manual_seed(0)
    m = model(position, 2)
    x = torch.randn(B, T, C, dtype=torch.float64)
    full = m(x, mask=masks.sliding_window(T, T, 3))
    cache = StaticKVCache(B, 2, D, T, window=3, chunk=chunk, dtype=torch.float64)
    torch.testing.assert_close(decode(m, x, cache, steps), full)
    if chunk is not None:
        assert cache.ring and cache.k.shape[2] == 3 - 1 + chunk


def test_ring_buffer_runs_past_max_length():
    """With a ring, tokens keep flowing in bounded memory (window 3, chunk 1: 3 slots)."""
    torch.manual_seed(0)
    m = model("alibi", 2)
    x = torch.randn(B, 20, C, dtype=torch.float64)
    full = m(x, mask=masks.sliding_window(20, 20, 3))
    cache = StaticKVCache(B, 2, D, 4, window=3, chunk=1, dtype=torch.float64)
    torch.testing.assert_close(decode(m, x, cache, [1] * 20), full)


@pytest.mark.parametrize("position", ["rope", "alibi"])
def test_left_padded_batch_equals_each_sequence_alone(position):
    torch.manual_seed(0)
    m = model(position, 3)
    lengths, P, new = [5, 3], 5, 3
    prompts = [torch.randn(n, C, dtype=torch.float64) for n in lengths]
    after = torch.randn(B, new, C, dtype=torch.float64)
    batch = torch.zeros(B, P, C, dtype=torch.float64)
    pad = torch.zeros(B, P, dtype=torch.bool)
    positions = torch.zeros(B, P, dtype=torch.long)
    for i, p in enumerate(prompts):
        batch[i, P - len(p) :], pad[i, P - len(p) :] = p, True
        positions[i, P - len(p) :] = torch.arange(len(p))
    rope = position == "rope"  # ALiBi reads slot distances, which left padding keeps
    cache = StaticKVCache(B, 3, D, 16, dtype=torch.float64)
    m(batch, cache=cache, key_mask=pad, positions=positions if rope else None)
    steps = [
        m(
            after[:, t : t + 1],
            cache=cache,
            positions=torch.tensor(lengths)[:, None] + t if rope else None,
        )
        for t in range(new)
    ]
    for i, p in enumerate(prompts):
        alone = m(torch.cat([p, after[i]])[None])[0, len(p) :]
        torch.testing.assert_close(torch.cat(steps, 1)[i], alone)


def test_reset_and_errors():
    m = MultiHeadAttention(C, H, num_kv_heads=2, causal=True)
    x = torch.randn(B, 4, C)
    cache = StaticKVCache(B, 2, D, 6)
    first = m(x, cache=cache)
    with pytest.raises(
        ValueError, match=r"3 new tokens do not fit a cache of max_length 6 \(4 cached\)"
    ):
        m(torch.randn(B, 3, C), cache=cache)
    with pytest.raises(ValueError, match="already holds another attention module"):
        MultiHeadAttention(C, H, num_kv_heads=2)(x, cache=cache)
    cache.reset()
    assert cache.length == 0
    torch.testing.assert_close(m(x, cache=cache), first)  # stale keys are gone
    with pytest.raises(ValueError, match=r"kv heads 2, head_dim 4\); got keys \(2, 6, 4, 4\)"):
        MultiHeadAttention(C, H, causal=True)(x, cache=StaticKVCache(B, 2, D, 6))
    with pytest.raises(ValueError, match=r"holds torch.float64, got keys of torch.float32"):
        m(x, cache=StaticKVCache(B, 2, D, 6, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"key_mask must have shape \(B, T\) = \(2, 4\)"):
        StaticKVCache(B, 2, D, 6).keys_for(
            m,
            torch.zeros(B, 2, 4, D),
            torch.zeros(B, 2, 4, D),
            torch.ones(B, 3, dtype=torch.bool),
            True,
        )
    with pytest.raises(ValueError, match=r"chunks of at most 2 tokens"):
        m(x, cache=StaticKVCache(B, 2, D, 20, window=3, chunk=2))
    with pytest.raises(ValueError, match="max_length must be a positive int"):
        StaticKVCache(B, 2, D, 0)
    with pytest.raises(TypeError, match=r"floating-point torch\.dtype"):
        StaticKVCache(B, 2, D, 4, dtype="float32")
