"""MultiHeadAttention and caches refuse what they cannot mean, with errors that name the
argument: non-bool flags, positions nobody reads, negative positions, mismatched dtypes and
devices, caches misused (shared between layers, refilled with other memory)."""

import pytest
import torch

from multihead import MultiHeadAttention, attention
from multihead.functional import varlen_attention
from multihead.modules.cache import CrossKVCache, KVCache
from multihead.positional import ALiBi, RotaryEmbedding

from conftest import assert_close

B, T, C, H = 2, 5, 24, 6


def test_flags_must_be_bools_everywhere():
    m = MultiHeadAttention(C, H)
    x = torch.randn(B, T, C)
    q = torch.randn(B, H, T, 4)
    for call in (
        lambda: m(x, causal="no"),
        lambda: m(x, return_weights="no"),
        lambda: attention(q, q, q, causal="no"),
        lambda: attention(q, q, q, return_weights=1),
        lambda: varlen_attention(
            q[0].transpose(0, 1), q[0].transpose(0, 1), q[0].transpose(0, 1), [T], causal="yes"
        ),
        lambda: MultiHeadAttention(C, H, causal="no"),
    ):
        with pytest.raises(TypeError, match=r"(causal|return_weights) must be a bool, got"):
            call()


def test_positions_must_mean_something():
    x = torch.randn(B, T, C)
    with pytest.raises(
        ValueError, match="positions were given but this attention has no position scheme"
    ):
        MultiHeadAttention(C, H)(x, positions=torch.arange(T))
    with pytest.raises(ValueError, match="positions were given but this attention has ALiBi"):
        MultiHeadAttention(C, H, position=ALiBi(H))(x, positions=torch.arange(T))
    rope = MultiHeadAttention(C, H, position=RotaryEmbedding(4))
    with pytest.raises(
        TypeError, match=r"positions must be an integer tensor, got dtype torch\.float32"
    ):
        rope(x, positions=torch.arange(T).float())
    with pytest.raises(
        ValueError,
        match=r"positions must have shape \(T,\) = \(5,\) or \(B, T\) = \(2, 5\).*got \(4,\)",
    ):
        rope(x, positions=torch.arange(4))
    with pytest.raises(ValueError, match="positions must be >= 0, got a minimum of -3"):
        rope(x, positions=torch.arange(T) - 3)


def test_alibi_must_have_a_slope_per_head():
    with pytest.raises(
        ValueError, match=r"ALiBi has slopes for 4 heads but the attention has 6 heads"
    ):
        MultiHeadAttention(C, H, position=ALiBi(4))
    with pytest.raises(
        TypeError, match=r"position must be a multihead\.positional\.PositionScheme"
    ):
        MultiHeadAttention(C, H, position=torch.nn.Identity())


def test_inputs_must_match_the_weights_dtype_and_device():
    m = MultiHeadAttention(C, H)
    with pytest.raises(
        TypeError, match=r"query has dtype torch.float64 but the module's weights are torch.float32"
    ):
        m(torch.randn(B, T, C, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"query is on meta but the module's weights are on cpu"):
        m(torch.randn(B, T, C, device="meta"))
    cross = MultiHeadAttention(C, H, kdim=10)
    with pytest.raises(TypeError, match=r"key has dtype torch.float64"):
        cross(torch.randn(B, T, C), torch.randn(B, 3, 10, dtype=torch.float64))
    with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast casts: allowed
        assert m(torch.randn(B, T, C)).dtype == torch.bfloat16


def test_masks_are_checked_before_use():
    m = MultiHeadAttention(C, H)
    x = torch.randn(B, T, C)
    with pytest.raises(TypeError, match="key_mask must be boolean"):
        m(x, key_mask=torch.ones(B, T, dtype=torch.long))
    with pytest.raises(
        ValueError, match=r"key_mask must have shape \(B, Tk\) = \(2, 5\), got \(2, 4\)"
    ):
        m(x, key_mask=torch.ones(B, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="key_mask is on meta but the inputs are on cpu"):
        m(x, key_mask=torch.ones(B, T, dtype=torch.bool, device="meta"))
    with pytest.raises(ValueError, match="mask is on meta but the inputs are on cpu"):
        m(x, mask=torch.ones(T, T, dtype=torch.bool, device="meta"))
    with pytest.raises(TypeError, match="mask must be boolean"):
        m(x, mask=torch.ones(T, T))


def test_kv_cache_arguments_are_checked():
    for kwargs, pattern in [
        (dict(window=True), "window must be a positive int or None, got True"),
        (dict(max_length=0), "max_length must be a positive int or None, got 0"),
        (dict(value_dim=-1), "value_dim must be a positive int or None"),
    ]:
        with pytest.raises(ValueError, match=pattern):
            KVCache(1, 1, 4, **kwargs)
    with pytest.raises(
        TypeError, match=r"dtype must be a floating-point torch\.dtype, got .float32."
    ):
        KVCache(1, 1, 4, dtype="float32")


@pytest.mark.parametrize("static", [False, True])
def test_reset_makes_a_used_cache_new(static):
    m = MultiHeadAttention(C, H, causal=True, position=RotaryEmbedding(4)).double()
    x = torch.randn(B, T, C, dtype=torch.float64)
    cache = KVCache(B, H, 4, max_length=2 * T if static else None, dtype=torch.float64)
    m(torch.randn(B, T, C, dtype=torch.float64), cache=cache)
    cache.reset()
    assert cache.length == 0
    assert_close(m(x, cache=cache), m(x))


def test_a_cache_serves_one_module():
    a, b = MultiHeadAttention(C, H, causal=True), MultiHeadAttention(C, H, causal=True)
    cache = KVCache(B, H, 4)
    x = torch.randn(B, T, C)
    a(x, cache=cache)
    with pytest.raises(ValueError, match="already holds another attention module's keys"):
        b(x, cache=cache)
    cache.reset()
    b(x, cache=cache)  # after a reset it may serve another


def test_cross_cache_refuses_new_memory_until_reset():
    m = MultiHeadAttention(C, H, kdim=10, vdim=10).double()
    q = torch.randn(B, 1, C, dtype=torch.float64)
    first, second = (torch.randn(B, 7, 10, dtype=torch.float64) for _ in range(2))
    cache = CrossKVCache()
    m(q, first, cache=cache)
    m(q, first, cache=cache)  # the same memory: reused
    m(q, cache=cache)  # no memory: the cached one
    with pytest.raises(
        ValueError, match="already holds the keys of another memory tensor; call reset"
    ):
        m(q, second, cache=cache)
    cache.reset()
    assert_close(m(q, second, cache=cache), m(q, second))
    with pytest.raises(ValueError, match="a KVCache serves self-attention"):
        m(q, second, cache=KVCache(B, H, 4, dtype=torch.float64))
