"""scaled_dot_product_attention: torch's semantics, zeros instead of NaN."""

import pytest
import torch
import torch.nn.functional as F

from multihead.functional import scaled_dot_product_attention as sdpa


def rand(*shape):
    return torch.randn(*shape, dtype=torch.float64)


@pytest.mark.parametrize(
    "shape_q,shape_kv",
    [
        ((2, 3, 5, 8), (2, 3, 7, 8)),
        ((3, 5, 8), (3, 7, 8)),
        ((5, 8), (7, 8)),
        ((2, 2, 3, 5, 8), (2, 2, 3, 7, 8)),
    ],
)
def test_matches_torch_on_shapes(shape_q, shape_kv):
    q, k, v = rand(*shape_q), rand(*shape_kv), rand(*shape_kv[:-1], 6)
    torch.testing.assert_close(sdpa(q, k, v), F.scaled_dot_product_attention(q, k, v))


@pytest.mark.parametrize("tq,tk", [(5, 5), (5, 7), (7, 5)])
def test_is_causal_is_top_left(tq, tk):
    q, k, v = rand(2, 3, tq, 8), rand(2, 3, tk, 8), rand(2, 3, tk, 8)
    torch.testing.assert_close(
        sdpa(q, k, v, is_causal=True), F.scaled_dot_product_attention(q, k, v, is_causal=True)
    )


def test_bool_and_float_masks_scale_dropout_gqa():
    q, k, v = rand(2, 4, 5, 8), rand(2, 4, 7, 8), rand(2, 4, 7, 8)
    bool_mask = torch.rand(2, 1, 5, 7) > 0.3
    bool_mask[..., 0] = True
    float_mask = rand(5, 7)
    for m in (bool_mask, float_mask):
        torch.testing.assert_close(
            sdpa(q, k, v, attn_mask=m, scale=0.2),
            F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=0.2),
        )
    k2, v2 = k[:, :2], v[:, :2]
    torch.testing.assert_close(
        sdpa(q, k2, v2, enable_gqa=True), F.scaled_dot_product_attention(q, k2, v2, enable_gqa=True)
    )
    torch.manual_seed(1)
    a = sdpa(q, k, v, dropout_p=0.3)
    assert not torch.allclose(a, sdpa(q, k, v))


def test_fully_masked_row_gives_zeros_not_nan():
    q, k, v = rand(1, 2, 3, 4), rand(1, 2, 5, 4), rand(1, 2, 5, 4)
    m = torch.ones(3, 5, dtype=torch.bool)
    m[1] = False
    out = sdpa(q, k, v, attn_mask=m)
    assert (out[..., 1, :] == 0).all() and torch.isfinite(out).all()


def test_errors_like_torch():
    q, k, v = rand(2, 4, 5, 8), rand(2, 2, 7, 8), rand(2, 2, 7, 8)
    with pytest.raises(ValueError, match="enable_gqa"):
        sdpa(q, k, v)
    with pytest.raises(ValueError, match="is_causal"):
        sdpa(q, q, q, attn_mask=torch.ones(5, 5, dtype=torch.bool), is_causal=True)
