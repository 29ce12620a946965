"""attention() against the fp64 textbook reference, on every backend."""

import itertools
import math

import pytest
import torch

from multihead.functional import attention

from conftest import assert_close
from reference import reference_attention

# Mutually distinct sizes so a swapped axis cannot pass.
B, H, TQ, TK, D, DV = 2, 6, 5, 7, 8, 4
BACKENDS = ["eager", "sdpa"]


def qkv(hkv=H, tq=TQ, tk=TK, dtype=torch.float32, dv=DV):
    return (
        torch.randn(B, H, tq, D, dtype=dtype),
        torch.randn(B, hkv, tk, D, dtype=dtype),
        torch.randn(B, hkv, tk, dv, dtype=dtype),
    )


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "hkv,use_mask,use_bias,causal",
    list(itertools.product([H, 3, 1], [False, True], [False, True], [False, True])),
)
def test_matches_reference(backend, hkv, use_mask, use_bias, causal):
    q, k, v = qkv(hkv)
    mask = torch.rand(B, 1, TQ, TK) > 0.3 if use_mask else None
    bias = torch.randn(1, H, TQ, TK) if use_bias else None
    out = attention(q, k, v, mask=mask, bias=bias, causal=causal, backend=backend)
    ref, _ = reference_attention(q, k, v, mask=mask, bias=bias, causal=causal)
    assert out.shape == (B, H, TQ, DV)
    assert_close(out, ref)


@pytest.mark.parametrize("tq,tk", [(5, 7), (7, 5), (1, 9), (6, 6)])
def test_weights_match_reference(tq, tk):
    q, k, v = qkv(3, tq, tk)
    mask = torch.rand(B, H, tq, tk) > 0.2
    out, w = attention(q, k, v, mask=mask, causal=True, return_weights=True)
    ref_out, ref_w = reference_attention(q, k, v, mask=mask, causal=True)
    assert w.shape == (B, H, tq, tk)
    assert_close(out, ref_out)
    assert_close(w, ref_w)


def test_hand_computed_single_head():
    # One query, two keys; scores [0, ln 3] after scaling -> weights [1/4, 3/4].
    q = torch.tensor([[[[1.0, 0.0]]]])
    k = torch.tensor([[[[0.0, 0.0], [math.log(3.0), 0.0]]]])
    v = torch.tensor([[[[4.0, 0.0], [0.0, 8.0]]]])
    for backend in BACKENDS:
        out = attention(q, k, v, scale=1.0, backend=backend)
        torch.testing.assert_close(out, torch.tensor([[[[1.0, 6.0]]]]))
    _, w = attention(q, k, v, scale=1.0, return_weights=True)
    torch.testing.assert_close(w, torch.tensor([[[[0.25, 0.75]]]]))


def test_hand_computed_causal_bottom_right():
    # Tq=2, Tk=3, uniform scores: query 0 sees keys 0..1, query 1 sees keys 0..2.
    q = torch.zeros(1, 1, 2, 1)
    k = torch.zeros(1, 1, 3, 1)
    v = torch.tensor([[[[3.0], [6.0], [9.0]]]])
    for backend in BACKENDS:
        out = attention(q, k, v, causal=True, backend=backend)
        torch.testing.assert_close(out, torch.tensor([[[[4.5], [6.0]]]]))


def test_default_scale_is_inverse_sqrt_head_dim():
    q, k, v = qkv()
    assert_close(attention(q, k, v), reference_attention(q, k, v, scale=1 / math.sqrt(D))[0])
    assert_close(attention(q, k, v, scale=0.3), reference_attention(q, k, v, scale=0.3)[0])


def test_gqa_head_mapping_is_h_div_group():
    # Each kv head has a constant value; query head h must read kv head h // (H // Hkv).
    q, k, _ = qkv(2)
    v = torch.arange(2.0).view(1, 2, 1, 1).expand(B, 2, TK, DV)
    out = attention(q, k, v)
    expected = torch.tensor([0.0, 0, 0, 1, 1, 1]).view(1, H, 1, 1).expand_as(out)
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("backend", BACKENDS)
def test_fully_masked_rows_are_zero_with_zero_grads(backend):
    q, k, v = (t.requires_grad_() for t in qkv())
    mask = torch.rand(B, H, TQ, TK) > 0.4
    mask[:, :, 1] = False
    mask[0, 2, 3] = False
    out = attention(q, k, v, mask=mask, backend=backend)
    ref, _ = reference_attention(q.detach(), k.detach(), v.detach(), mask=mask)
    assert_close(out, ref)
    assert (out[:, :, 1] == 0).all() and (out[0, 2, 3] == 0).all()
    out.square().sum().backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()
    assert (q.grad[:, :, 1] == 0).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_minus_inf_bias_rows_are_zero(backend):
    q, k, v = (t.requires_grad_() for t in qkv())
    bias = torch.zeros(1, 1, TQ, TK)
    bias[..., 2, :] = -math.inf
    bias[..., 0, :3] = -math.inf
    out = attention(q, k, v, bias=bias, backend=backend)
    assert_close(out, reference_attention(q.detach(), k.detach(), v.detach(), bias=bias)[0])
    out.sum().backward()
    assert torch.isfinite(q.grad).all() and (q.grad[:, :, 2] == 0).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_causal_with_more_queries_than_keys_zeroes_early_queries(backend):
    q, k, v = qkv(tq=7, tk=5)
    out = attention(q, k, v, causal=True, backend=backend)
    assert (out[:, :, :2] == 0).all()
    assert_close(out, reference_attention(q, k, v, causal=True)[0])


def test_gradients_match_reference_across_backends():
    q, k, v = (t.double().requires_grad_() for t in qkv(3))
    mask = torch.rand(B, 1, TQ, TK) > 0.3
    grads = []
    for backend in BACKENDS:
        out = attention(q, k, v, mask=mask, causal=True, backend=backend)
        grads.append(torch.autograd.grad(out.sin().sum(), (q, k, v)))

    def ref_fn(q, k, v):
        return reference_attention(q, k, v, mask=mask, causal=True)[0].sin().sum()

    ref_grads = torch.autograd.grad(ref_fn(q, k, v), (q, k, v))
    for got in grads:
        for g, r in zip(got, ref_grads, strict=True):
            assert_close(g, r)


@pytest.mark.parametrize("backend", ["eager"])
def test_empty_key_sequence_gives_zeros(backend):
    q, k, v = (t.requires_grad_() for t in qkv(tk=0))
    out, w = attention(q, k, v, return_weights=True, backend=backend)
    assert out.shape == (B, H, TQ, DV) and (out == 0).all()
    assert w.shape == (B, H, TQ, 0)
    out.sum().backward()
    assert (q.grad == 0).all()


def test_empty_sequences_via_auto():
    q, k, v = qkv(tk=0)
    assert (attention(q, k, v) == 0).all()
    q, k, v = qkv(tq=0)
    assert attention(q, k, v).shape == (B, H, 0, DV)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("backend", BACKENDS)
def test_dtypes(dtype, backend):
    q, k, v = qkv(3, dtype=dtype)
    mask = torch.rand(B, 1, TQ, TK) > 0.3
    out = attention(q, k, v, mask=mask, causal=True, backend=backend)
    assert out.dtype == dtype
    assert_close(out, reference_attention(q, k, v, mask=mask, causal=True)[0], dtype)


@pytest.mark.parametrize("backend", BACKENDS)
def test_dropout(backend):
    q, k, v = qkv()
    plain = attention(q, k, v, backend=backend)
    assert torch.equal(attention(q, k, v, dropout_p=0.0, backend=backend), plain)
    dropped = attention(q, k, v, dropout_p=0.5, backend=backend)
    assert not torch.allclose(dropped, plain)
    # Inverted dropout keeps the expectation: average many draws.
    mean = torch.stack(
        [attention(q, k, v, dropout_p=0.5, backend=backend) for _ in range(400)]
    ).mean(0)
    torch.testing.assert_close(mean, plain, atol=0.25, rtol=0)


def test_weights_rows_sum_to_one_where_allowed():
    q, k, v = qkv()
    mask = torch.rand(B, H, TQ, TK) > 0.5
    _, w = attention(q, k, v, mask=mask, return_weights=True)
    sums = w.sum(-1)
    has_key = mask.any(-1)
    torch.testing.assert_close(sums[has_key], torch.ones_like(sums[has_key]))
    assert (sums[~has_key] == 0).all()
    assert (w[~mask] == 0).all()
