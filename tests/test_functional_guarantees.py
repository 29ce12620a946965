"""Guarantees of every attention call, on every backend, against the fp64 reference:
rows with no key give zeros (mask, causality and -inf bias combined), masks of any rank that
broadcast work, and a key mask with causality never builds a T x T tensor."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from multihead import attention
from multihead.functional.backends import sdpa as sdpa_backend

from conftest import assert_close
from reference import reference_attention

B, H, HKV, TQ, TK, D = 2, 3, 1, 5, 7, 8
BACKENDS = ["eager", "sdpa", "auto"]


def qkv(tq=TQ, tk=TK, hkv=H, dtype=torch.float64, grad=False):
    q = torch.randn(B, H, tq, D, dtype=dtype, requires_grad=grad)
    k = torch.randn(B, hkv, tk, D, dtype=dtype, requires_grad=grad)
    v = torch.randn(B, hkv, tk, D, dtype=dtype, requires_grad=grad)
    return q, k, v


def grads(out, *inputs):
    torch.manual_seed(1)
    return torch.autograd.grad((out * torch.randn_like(out)).sum(), inputs)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("causal", [False, True])
def test_mask_and_minus_inf_bias_together_leave_a_row_empty(backend, causal):
    q, k, v = qkv(grad=True)
    mask = torch.ones(B, 1, TQ, TK, dtype=torch.bool)
    bias = torch.zeros(B, 1, TQ, TK, dtype=torch.float64)
    # Row (0, 3): the mask blocks keys 0-2, the bias blocks keys 3-6: nothing left, though each
    # alone leaves keys. Row (1, 4): the mask blocks everything causality left it.
    mask[0, 0, 3, :3] = False
    bias[0, 0, 3, 3:] = float("-inf")
    mask[1, 0, 4, :] = False
    out = attention(q, k, v, mask=mask, bias=bias, causal=causal, backend=backend)
    expected, _ = reference_attention(q, k, v, mask=mask, bias=bias, causal=causal)
    assert_close(out, expected)
    assert (out[0, :, 3] == 0).all() and (out[1, :, 4] == 0).all()
    assert out.isfinite().all()
    ours = grads(out, q, k, v)
    theirs = grads(expected, q, k, v)
    for a, b in zip(ours, theirs, strict=True):
        assert a.isfinite().all()
        assert_close(a, b)
    assert (ours[0][0, :, 3] == 0).all()  # no gradient flows into an empty row's query


@pytest.mark.parametrize("backend", ["eager", "auto"])  # sdpa cannot return weights
def test_weights_of_an_empty_row_are_zero(backend):
    q, k, v = qkv()
    mask = torch.ones(TQ, TK, dtype=torch.bool)
    bias = torch.zeros(TQ, TK, dtype=torch.float64)
    mask[2, :4] = False
    bias[2, 4:] = float("-inf")
    _, w = attention(q, k, v, mask=mask, bias=bias, return_weights=True, backend=backend)
    _, expected = reference_attention(q, k, v, mask=mask, bias=bias)
    assert_close(w, expected)
    assert (w[:, :, 2] == 0).all()


MASK_SHAPES = [(), (TK,), (TQ, TK), (1, TK), (H, TQ, TK), (H, 1, TK), (B, 1, 1, TK), (B, H, TQ, TK)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", MASK_SHAPES, ids=str)
@pytest.mark.parametrize("kind", ["mask", "bias"])
def test_every_broadcastable_rank_works_on_every_backend(backend, shape, kind):
    q, k, v = qkv(hkv=HKV)
    if kind == "mask":
        m = torch.rand(shape) > 0.4 if shape else torch.tensor(True)
        kwargs = {"mask": m}
        expected, _ = reference_attention(q, k, v, mask=m)
    else:
        m = torch.randn(shape, dtype=torch.float64)
        kwargs = {"bias": m}
        expected, _ = reference_attention(q, k, v, bias=m)
    assert_close(attention(q, k, v, backend=backend, **kwargs), expected)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_zero_dim_false_mask_blocks_everything(backend):
    q, k, v = qkv()
    out = attention(q, k, v, mask=torch.tensor(False), backend=backend)
    assert (out == 0).all()


@pytest.fixture
def small_chunks(monkeypatch):
    """Force query chunking at test sizes: 3 rows per chunk."""
    monkeypatch.setattr(sdpa_backend, "CHUNK_ELEMENTS", 1)
    monkeypatch.setattr(sdpa_backend, "MIN_CHUNK_ROWS", 3)


@pytest.mark.parametrize(("tq", "tk"), [(11, 11), (4, 11), (11, 6)])
@pytest.mark.parametrize("hkv", [H, HKV])
@pytest.mark.parametrize("with_bias", [False, True])
def test_chunked_causal_calls_equal_the_reference(small_chunks, tq, tk, hkv, with_bias):
    q, k, v = qkv(tq, tk, hkv, grad=True)
    key_mask = torch.rand(B, 1, 1, tk) > 0.3
    key_mask[1, ..., : tk // 2] = False  # left padding: its first queries see no key
    bias = torch.randn(1, H, tq, tk, dtype=torch.float64) if with_bias else None
    out = attention(q, k, v, mask=key_mask, bias=bias, causal=True, backend="sdpa")
    expected, _ = reference_attention(q, k, v, mask=key_mask, bias=bias, causal=True)
    assert_close(out, expected)
    for a, b in zip(grads(out, q, k, v), grads(expected, q, k, v), strict=True):
        assert_close(a, b)


class LargestTensor(TorchDispatchMode):
    """Records the largest tensor any op produces (elements)."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def test_a_key_mask_with_causality_builds_no_t_by_t_tensor():
    T = 8192
    q = torch.randn(1, 1, T, 8)
    key_mask = torch.ones(1, 1, 1, T, dtype=torch.bool)
    key_mask[..., :100] = False
    with LargestTensor() as seen:
        out = attention(q, q, q, mask=key_mask, causal=True)
    assert seen.largest <= sdpa_backend.CHUNK_ELEMENTS < T * T
    # Spot-check rows against the reference on a slice of keys (the full one is O(T^2) loops).
    rows = [100, 101, 5000, T - 1]
    for i in rows:
        keys = slice(100, i + 1)
        w = torch.softmax(q[0, 0, i] @ q[0, 0, keys].T / 8**0.5, -1)
        torch.testing.assert_close(out[0, 0, i], w @ q[0, 0, keys], atol=1e-5, rtol=1e-4)
    assert (out[0, 0, :100] == 0).all()  # queries before the first real key see nothing
