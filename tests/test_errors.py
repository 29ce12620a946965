"""Bad input raises ValueError/TypeError naming the argument and the shapes or values."""

import math

import pytest
import torch

from multihead import MultiHeadAttention, attention


def qkv(B=2, H=4, Hkv=4, Tq=5, Tk=7, D=8):
    return torch.randn(B, H, Tq, D), torch.randn(B, Hkv, Tk, D), torch.randn(B, Hkv, Tk, D)


@pytest.mark.parametrize(
    "make,exc,pattern",
    [
        (lambda q, k, v: (q[0], k, v), ValueError, r"q must have 4 dimensions.*\(4, 5, 8\)"),
        (lambda q, k, v: (q, k[None], v), ValueError, r"k must have 4 dimensions"),
        (
            lambda q, k, v: (q, k[:1], v[:1]),
            ValueError,
            r"batch sizes differ: q \(2, 4, 5, 8\), k \(1,",
        ),
        (
            lambda q, k, v: (q, k[..., :6], v),
            ValueError,
            r"head_dim of q .* and k .* differ \(8 != 6\)",
        ),
        (
            lambda q, k, v: (q, k[:, :3], v[:, :3]),
            ValueError,
            r"key/value heads \(3.*must divide query heads \(4",
        ),
        (lambda q, k, v: (q, k, v[:, :, :6]), ValueError, r"k .* and v .* must agree"),
        (lambda q, k, v: (q, k.double(), v), TypeError, r"dtype.*float32, torch.float64"),
        (lambda q, k, v: (q, k, v.long()), TypeError, r"v must be a floating-point"),
        (lambda q, k, v: (q.tolist(), k, v), TypeError, r"q must be a torch.Tensor, got list"),
    ],
)
def test_bad_qkv(make, exc, pattern):
    with pytest.raises(exc, match=pattern):
        attention(*make(*qkv()))


@pytest.mark.parametrize(
    "kwargs,exc,pattern",
    [
        (
            dict(mask=torch.ones(2, 4, 5, 6, dtype=torch.bool)),
            ValueError,
            r"mask of shape \(2, 4, 5, 6\) does not broadcast to .*\(2, 4, 5, 7\)",
        ),
        (
            dict(mask=torch.ones(1, 1, 1, 5, 7, dtype=torch.bool)),
            ValueError,
            r"mask .* more than 4",
        ),
        (dict(mask=torch.ones(5, 7)), TypeError, r"mask must be boolean .*float32.*bias="),
        (dict(bias=torch.ones(3, 7)), ValueError, r"bias of shape \(3, 7\) does not broadcast"),
        (
            dict(bias=torch.ones(5, 7, dtype=torch.bool)),
            TypeError,
            r"bias must be a floating-point",
        ),
        (dict(scale=0.0), ValueError, r"scale must be finite and positive, got 0.0"),
        (dict(scale=-1.0), ValueError, r"scale"),
        (dict(scale=math.nan), ValueError, r"scale .*nan"),
        (dict(scale=math.inf), ValueError, r"scale .*inf"),
        (dict(scale="1"), TypeError, r"scale must be a float"),
        (dict(dropout_p=1.0), ValueError, r"dropout_p must be a float in \[0, 1\), got 1.0"),
        (dict(dropout_p=-0.1), ValueError, r"dropout_p"),
        (dict(backend="nope"), ValueError, r"unknown backend 'nope'"),
        (dict(backend="sdpa", return_weights=True), ValueError, r"cannot run this call: .*weights"),
    ],
)
def test_bad_options(kwargs, exc, pattern):
    with pytest.raises(exc, match=pattern):
        attention(*qkv(), **kwargs)


@pytest.mark.parametrize(
    "args,kwargs,pattern",
    [
        ((24, 5), {}, r"embed_dim \(24\) must be divisible by num_heads \(5\)"),
        ((24, 0), {}, r"num_heads must be a positive int, got 0"),
        ((24, -2), {}, r"num_heads"),
        ((0, 2), {}, r"embed_dim must be a positive int"),
        ((24, 6), dict(num_kv_heads=4), r"num_kv_heads \(4\) must divide num_heads \(6\)"),
        ((24, 6), dict(num_kv_heads=0), r"num_kv_heads must be a positive int, got 0"),
        ((24, 6), dict(dropout=1.5), r"dropout must be a float in \[0, 1\), got 1.5"),
        ((24, 6), dict(kdim=0), r"kdim"),
    ],
)
def test_bad_module_config(args, kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        MultiHeadAttention(*args, **kwargs)


def test_bad_module_inputs():
    m = MultiHeadAttention(24, 6, kdim=10)
    x = torch.randn(2, 5, 24)
    with pytest.raises(
        ValueError, match=r"query must have shape \(B, T, 24\) or \(T, 24\), got \(2, 5, 23\)"
    ):
        m(torch.randn(2, 5, 23), torch.randn(2, 7, 10))
    with pytest.raises(ValueError, match=r"key must have shape \(B, T, 10\)"):
        m(x, torch.randn(2, 7, 24))
    with pytest.raises(ValueError, match=r"batch sizes differ"):
        m(x, torch.randn(3, 7, 10), torch.randn(3, 7, 24))
    with pytest.raises(ValueError, match=r"same length"):
        m(x, torch.randn(2, 7, 10), torch.randn(2, 6, 24))
    with pytest.raises(ValueError, match=r"all be batched .* or all unbatched"):
        m(x, torch.randn(7, 10), torch.randn(7, 24))
    with pytest.raises(
        ValueError, match=r"key_mask must have shape \(B, Tk\) = \(2, 7\), got \(2, 6\)"
    ):
        m(
            x,
            torch.randn(2, 7, 10),
            torch.randn(2, 7, 24),
            key_mask=torch.ones(2, 6, dtype=torch.bool),
        )
    with pytest.raises(TypeError, match=r"key_mask must be boolean"):
        m(x, torch.randn(2, 7, 10), torch.randn(2, 7, 24), key_mask=torch.ones(2, 7))
    with pytest.raises(TypeError, match=r"query must be a torch.Tensor"):
        m([[1.0]])


def test_empty_sequences_through_module():
    m = MultiHeadAttention(24, 6)
    assert m(torch.randn(2, 0, 24)).shape == (2, 0, 24)
    out = m(torch.randn(2, 3, 24), torch.randn(2, 0, 24))
    # No key: the attention output is zero, so the module returns the output bias.
    torch.testing.assert_close(out, m.out_proj.bias.expand(2, 3, 24))
