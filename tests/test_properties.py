"""Property-based tests: random shapes, masks and flags against the fp64 reference."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from multihead.functional import attention

from reference import reference_attention


@st.composite
def calls(draw):
    B = draw(st.integers(1, 3))
    Hkv = draw(st.integers(1, 3))
    H = Hkv * draw(st.integers(1, 3))
    Tq, Tk = draw(st.integers(1, 6)), draw(st.integers(1, 6))
    D, Dv = draw(st.integers(1, 9)), draw(st.integers(1, 9))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, Tq, D, generator=g, dtype=torch.float64)
    k = torch.randn(B, Hkv, Tk, D, generator=g, dtype=torch.float64)
    v = torch.randn(B, Hkv, Tk, Dv, generator=g, dtype=torch.float64)
    # Any broadcastable mask shape: each dim either full or 1.
    mask = bias = None
    if draw(st.booleans()):
        shape = [n if draw(st.booleans()) else 1 for n in (B, H, Tq, Tk)]
        mask = torch.rand(*shape, generator=g) > draw(st.floats(0.0, 0.9))
    if draw(st.booleans()):
        bias = torch.randn(1, H, Tq, Tk, generator=g, dtype=torch.float64)
    causal = draw(st.booleans())
    scale = draw(st.one_of(st.none(), st.floats(0.05, 2.0)))
    return q, k, v, dict(mask=mask, bias=bias, causal=causal, scale=scale)


@settings(max_examples=150, deadline=None)
@given(calls(), st.sampled_from(["auto", "eager", "sdpa"]))
def test_any_call_matches_reference(case, backend):
    q, k, v, kw = case
    out = attention(q, k, v, backend=backend, **kw)
    ref, ref_w = reference_attention(q, k, v, **kw)
    torch.testing.assert_close(out, ref, atol=1e-10, rtol=1e-8)
    assert torch.isfinite(out).all()
    if backend == "eager":
        _, w = attention(q, k, v, backend=backend, return_weights=True, **kw)
        torch.testing.assert_close(w, ref_w, atol=1e-10, rtol=1e-8)
