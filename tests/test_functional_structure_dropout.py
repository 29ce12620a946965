"""Attention dropout on the tiled backend: each tile drops the entries of the counter-based keep
mask (`functional.dropout_mask`, ring attention's rule) at its global coordinates, so the
result equals the fp64 textbook attention with that whole keep mask applied to the normalised
weights (scaled by 1 / (1 - p)), gradients included, for every structure."""

import pytest
import torch

from multihead import attention
from multihead.functional import explain
from multihead.functional.backends import tiled as tiled_backend
from multihead.functional.dropout_mask import dropout_keep_mask

from conftest import assert_close

SEED, P = 1234, 0.3
B, H, D = 2, 4, 8


@pytest.fixture
def fixed_seed(monkeypatch):
    monkeypatch.setattr(tiled_backend, "_draw_seed", lambda: SEED)


def reference(q, k, v, allowed, p=P, seed=SEED):
    """Dense fp64: softmax over allowed keys, keep / (1 - p) on the weights, zeros on empty rows.
    allowed (B or 1, 1 or H, Tq, Tk); queries sit at positions Tk - Tq + i."""
    q, k, v = q.double(), k.double(), v.double()
    Tq, Tk = q.shape[2], k.shape[2]
    group = H // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = q @ k.transpose(-1, -2) / D**0.5
    s = s.masked_fill(~allowed, float("-inf"))
    w = torch.softmax(s, dim=-1).nan_to_num(0.0)  # empty rows: all -inf -> 0
    keep = dropout_keep_mask(seed, p, B, H, torch.arange(Tk - Tq, Tk), torch.arange(Tk))
    return (w * keep / (1 - p)) @ v


def positions(Tq, Tk):
    i = torch.arange(Tk - Tq, Tk)[:, None]
    j = torch.arange(Tk)[None, :]
    return i, j


def inputs(Tq, Tk, hkv):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, Tq, D, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(B, hkv, Tk, D, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(B, hkv, Tk, D, generator=g, dtype=torch.float64, requires_grad=True)
    return q, k, v


DOCS = torch.tensor([[0] * 40 + [1] * 60 + [2] * 28, [3] * 128])


def case(name, Tq, Tk):
    """(attention() arguments, allowed (B or 1, 1, Tq, Tk)) of a named structure."""
    i, j = positions(Tq, Tk)
    causal = j <= i
    if name == "window":
        return {"causal": True, "window": 24}, (causal & (j > i - 24))[None, None]
    if name == "documents":
        same = (DOCS[:, Tk - Tq :, None] == DOCS[:, None, :])[:, None]  # (B, 1, Tq, Tk)
        return {"causal": True, "documents": DOCS}, same & causal
    if name == "prefix":
        return {"causal": True, "prefix": 50}, (causal | ((i < 50) & (j < 50)))[None, None]
    if name == "mask_mod":

        def mod(b, h, qi, kv):  # every third key, and the query's own
            return (kv % 3 == 0) | (kv == qi)

        return {"mask_mod": mod}, ((j % 3 == 0) | (j == i))[None, None]
    raise ValueError(name)


@pytest.mark.parametrize("name", ["window", "documents", "prefix", "mask_mod"])
@pytest.mark.parametrize("hkv", [H, 2])
@pytest.mark.parametrize("Tq", [128, 100])  # square, and cross lengths (bottom-right)
def test_dropout_equals_the_reference_with_the_same_keep_mask(fixed_seed, name, hkv, Tq):
    Tk = 128
    q, k, v = inputs(Tq, Tk, hkv)
    args, allowed = case(name, Tq, Tk)
    out = attention(q, k, v, dropout_p=P, backend="tiled", **args)
    ref = reference(q, k, v, allowed)
    assert_close(out, ref)
    g = torch.randn(out.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    for a, b in zip(
        torch.autograd.grad((out * g).sum(), (q, k, v)),
        torch.autograd.grad((ref * g).sum(), (q, k, v)),
        strict=True,
    ):
        assert_close(a, b)


def test_a_key_mask_that_empties_rows_gives_zeros_with_dropout(fixed_seed):
    q, k, v = inputs(128, 128, H)
    key_mask = torch.ones(B, 1, 1, 128, dtype=torch.bool)
    key_mask[1, ..., :40] = False  # row 1's first 40 queries see nothing in a window of 24
    args, allowed = case("window", 128, 128)
    out = attention(q, k, v, mask=key_mask, dropout_p=P, backend="tiled", **args)
    assert torch.equal(out[1, :, :40], torch.zeros_like(out[1, :, :40]))
    assert_close(out, reference(q, k, v, allowed & key_mask))
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    assert all(torch.isfinite(t).all() for t in grads)


def test_dropout_repeats_under_torch_manual_seed_and_varies_without():
    q, k, v = (t.detach() for t in inputs(128, 128, H))
    torch.manual_seed(7)
    a = attention(q, k, v, causal=True, window=24, dropout_p=P, backend="tiled")
    torch.manual_seed(7)
    b = attention(q, k, v, causal=True, window=24, dropout_p=P, backend="tiled")
    c = attention(q, k, v, causal=True, window=24, dropout_p=P, backend="tiled")
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_dropout_keeps_about_one_minus_p_and_is_unbiased(monkeypatch):
    """The expected output equals attention without dropout: averaged over many seeds, the
    dropped result approaches the plain one (and a seed keeps ~1 - p of the entries)."""
    keep = dropout_keep_mask(SEED, P, B, H, torch.arange(512), torch.arange(512))
    assert abs(keep.double().mean().item() - (1 - P)) < 0.01
    q, k, v = (t.detach() for t in inputs(64, 64, H))
    plain = attention(q, k, v, causal=True, window=16, backend="tiled")
    runs = []
    for seed in range(400):
        monkeypatch.setattr(tiled_backend, "_draw_seed", lambda s=seed: s)
        runs.append(attention(q, k, v, causal=True, window=16, dropout_p=P, backend="tiled"))
    mean = torch.stack(runs).mean(0)
    assert (mean - plain).abs().mean() < 0.05 * plain.abs().mean()


def test_auto_keeps_a_training_call_with_dropout_on_the_tiled_backend():
    big = torch.randn(1, 2, 1024, 8)
    why = explain(big, big, big, causal=True, window=64, dropout_p=0.1)
    assert why.chosen == "tiled"
