"""MultiHeadAttention against the textbook fp64 reference and against the functional core."""

import pytest
import torch
import torch.nn.functional as F

from multihead import MultiHeadAttention, attention
from multihead.functional import masks

from conftest import assert_close
from reference import reference_mha

B, TQ, TK, C, H = 2, 5, 7, 24, 6


def widths(m: MultiHeadAttention):
    """Rows of q, k and v in the packed projection (q | k | v, head by head)."""
    return (m.num_heads * m.head_dim,) + (m.num_kv_heads * m.head_dim,) * 2


def projection_weights(m: MultiHeadAttention):
    """(w_q, w_k, w_v, b_q, b_k, b_v) whatever the layout."""
    if m.packed:
        ws = m.in_proj.weight.split(widths(m))
        bs = (None,) * 3 if m.in_proj.bias is None else m.in_proj.bias.split(widths(m))
    else:
        ws = (m.q_proj.weight, m.k_proj.weight, m.v_proj.weight)
        bs = (m.q_proj.bias, m.k_proj.bias, m.v_proj.bias)
    return (*ws, *bs)


def reference(m, query, key, value, mask=None, causal=False):
    w_q, w_k, w_v, b_q, b_k, b_v = projection_weights(m)
    return reference_mha(
        query,
        key,
        value,
        w_q,
        w_k,
        w_v,
        m.out_proj.weight,
        b_q,
        b_k,
        b_v,
        m.out_proj.bias,
        m.num_heads,
        m.num_kv_heads,
        mask=mask,
        causal=causal,
    )


@pytest.mark.parametrize("num_kv_heads", [None, 3, 2, 1])
@pytest.mark.parametrize("bias", [True, False])
def test_self_attention_matches_textbook(num_kv_heads, bias):
    m = MultiHeadAttention(C, H, num_kv_heads=num_kv_heads, bias=bias)
    x = torch.randn(B, TQ, C)
    out, w = m(x, return_weights=True)
    ref_out, ref_w = reference(m, x, x, x)
    assert out.shape == (B, TQ, C) and w.shape == (B, H, TQ, TQ)
    assert_close(out, ref_out)
    assert_close(w, ref_w)
    assert_close(m(x), ref_out)  # the fused path, without weights


@pytest.mark.parametrize("kdim,vdim", [(None, None), (10, 10), (10, 12)])
@pytest.mark.parametrize("same_kv", [True, False])
def test_cross_attention_matches_textbook(kdim, vdim, same_kv):
    m = MultiHeadAttention(C, H, num_kv_heads=2, kdim=kdim, vdim=vdim)
    q = torch.randn(B, TQ, C)
    key = torch.randn(B, TK, kdim or C)
    value = key if same_kv and kdim == vdim else torch.randn(B, TK, vdim or C)
    out = m(q, key, value)
    assert out.shape == (B, TQ, C)
    assert_close(out, reference(m, q, key, value)[0])
    if value is key:
        assert_close(m(q, key), out)  # value defaults to key


def test_cross_attention_takes_values_from_value_input():
    m = MultiHeadAttention(C, H)
    q, key = torch.randn(B, TQ, C), torch.randn(B, TK, C)
    a, b = m(q, key, torch.randn(B, TK, C)), m(q, key, torch.randn(B, TK, C))
    assert not torch.allclose(a, b)


def test_head_dim_override():
    m = MultiHeadAttention(C, 4, head_dim=5)
    x = torch.randn(B, TQ, C)
    assert m.in_proj.weight.shape == (3 * 4 * 5, C) and m.out_proj.weight.shape == (C, 20)
    assert_close(m(x), reference(m, x, x, x)[0])


def test_masks_key_mask_and_causal():
    m = MultiHeadAttention(C, H, num_kv_heads=3)
    x = torch.randn(B, TQ, C)
    mask = torch.rand(B, 1, TQ, TQ) > 0.3
    key_mask = masks.padding([TQ, 3])
    out = m(x, mask=mask, key_mask=key_mask, causal=True)
    full = mask & key_mask[:, None, None, :]
    assert_close(out, reference(m, x, x, x, mask=full, causal=True)[0])
    mc = MultiHeadAttention(C, H, causal=True)
    assert_close(mc(x), reference(mc, x, x, x, causal=True)[0])
    assert_close(mc(x, causal=False), reference(mc, x, x, x)[0])


def test_padded_batch_equals_each_sequence_alone():
    m = MultiHeadAttention(C, H, num_kv_heads=2).eval()
    lengths = [5, 2, 4]
    seqs = [torch.randn(n, C) for n in lengths]
    batch = torch.zeros(3, 5, C)
    for i, s in enumerate(seqs):
        batch[i, : len(s)] = s
    out = m(batch, key_mask=masks.padding(lengths))
    for i, s in enumerate(seqs):
        alone = m(s[None])[0]
        torch.testing.assert_close(out[i, : len(s)], alone, atol=1e-5, rtol=1e-4)


def test_unbatched_inputs():
    m = MultiHeadAttention(C, H)
    x, key = torch.randn(TQ, C), torch.randn(TK, C)
    out, w = m(x, key, return_weights=True, key_mask=torch.ones(TK, dtype=torch.bool))
    assert out.shape == (TQ, C) and w.shape == (H, TQ, TK)
    torch.testing.assert_close(out, m(x[None], key[None])[0])


def test_module_equals_functional_composition():
    m = MultiHeadAttention(C, H, num_kv_heads=3)
    x = torch.randn(B, TQ, C)
    qkv = F.linear(x, m.in_proj.weight, m.in_proj.bias)
    q, k, v = qkv.split(widths(m), dim=-1)
    q = q.view(B, TQ, H, 4).transpose(1, 2)
    k = k.view(B, TQ, 3, 4).transpose(1, 2)
    v = v.view(B, TQ, 3, 4).transpose(1, 2)
    o = attention(q, k, v, causal=True).transpose(1, 2).reshape(B, TQ, C)
    torch.testing.assert_close(m(x, causal=True), m.out_proj(o))


def test_self_attention_runs_one_fused_projection(monkeypatch):
    import multihead.modules.projections as mod

    calls = []
    real = F.linear

    def counting(x, w, b=None):
        calls.append(tuple(w.shape))
        return real(x, w, b)

    monkeypatch.setattr(mod.F, "linear", counting)
    m = MultiHeadAttention(C, H)
    m(torch.randn(B, TQ, C))
    assert calls == [(3 * C, C), (C, C)]  # one packed QKV matmul, then the output projection


def test_dropout_only_in_training():
    m = MultiHeadAttention(C, H, dropout=0.5)
    x = torch.randn(B, TQ, C)
    m.eval()
    assert torch.equal(m(x), m(x))
    assert_close(m(x), reference(m, x, x, x)[0])
    m.train()
    assert not torch.allclose(m(x), m(x))


def test_gradients_match_textbook():
    m = MultiHeadAttention(C, H, num_kv_heads=2).double()
    x = torch.randn(B, TQ, C, dtype=torch.float64)
    m(x, causal=True).square().sum().backward()
    got = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    ref_out, _ = reference(m, x, x, x, causal=True)
    ref_out.square().sum().backward()
    for g, p in zip(got, m.parameters(), strict=True):
        assert_close(g, p.grad)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16])
def test_dtypes(dtype):
    m = MultiHeadAttention(C, H, dtype=dtype)
    x = torch.randn(B, TQ, C, dtype=dtype)
    out = m(x)
    assert out.dtype == dtype
    assert_close(out, reference(m, x, x, x)[0], dtype)


def test_torch_compile_fullgraph_no_graph_break():
    m = MultiHeadAttention(C, H, num_kv_heads=3).eval()
    x = torch.randn(B, TQ, C)
    key_mask = masks.padding([TQ, 3])
    compiled = torch.compile(m, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(x), m(x))
    torch.testing.assert_close(compiled(x, key_mask=key_mask), m(x, key_mask=key_mask))
    torch.testing.assert_close(compiled(x, causal=True), m(x, causal=True))


@pytest.mark.slow
def test_torch_compile_inductor():
    m = MultiHeadAttention(C, H).eval()
    x = torch.randn(B, TQ, C)
    compiled = torch.compile(m, fullgraph=True)
    torch.testing.assert_close(compiled(x), m(x), atol=1e-5, rtol=1e-4)


@pytest.mark.gpu
def test_cuda_matches_cpu():
    m = MultiHeadAttention(C, H, num_kv_heads=2)
    x = torch.randn(B, TQ, C)
    mask = masks.padding([TQ, 2])
    ref = m(x, key_mask=mask, causal=True)
    mc = m.cuda()
    out = mc(x.cuda(), key_mask=mask.cuda(), causal=True)
    torch.testing.assert_close(out.cpu(), ref, atol=1e-4, rtol=1e-3)
    assert torch.isfinite(out).all()
