"""Soft-capping and sink logits on CUDA: every backend that takes them agrees with the fp64
reference computed on the CPU (masks with an empty row, causal, grouped-query, fp32 and bf16),
and every backend that cannot refuses by name there too; gradients of the sink logits match
between eager and sdpa. Skipped without a CUDA device (tests/conftest.py)."""

from __future__ import annotations

import pytest
import torch

from multihead import MultiHeadAttention
from multihead.functional import get_backend
from multihead.functional.attention import attention
from multihead.functional.call import make_call

from reference import reference_attention

pytestmark = pytest.mark.gpu

B, H, HKV, TQ, TK, D = 2, 6, 3, 5, 7, 8
CUDA = "cuda"


def _inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, TQ, D, generator=g) * 2.0  # scores well past the cap
    k = torch.randn(B, HKV, TK, D, generator=g) * 2.0
    v = torch.randn(B, HKV, TK, D, generator=g)
    sinks = torch.randn(H, generator=g) * 2.0
    mask = torch.rand(B, 1, TQ, TK, generator=g) > 0.3
    mask[0, 0, 2] = False  # an empty row
    return q, k, v, sinks, mask


VARIANTS = ["softcap", "sinks", "both"]
CASES = ["plain", "mask", "causal"]
TOL = {torch.float32: dict(atol=1e-4, rtol=1e-3), torch.bfloat16: dict(atol=4e-2, rtol=4e-2)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("backend", ["eager", "sdpa", "flex", "tiled", "auto"])
def test_variants_on_cuda_match_the_reference(backend, variant, case, dtype):
    q, k, v, sinks, mask = _inputs()
    kwargs: dict = {"scale": 0.3}
    if variant in ("softcap", "both"):
        kwargs["softcap"] = 1.5
    if variant in ("sinks", "both"):
        kwargs["sinks"] = sinks
    if case == "mask":
        kwargs["mask"] = mask
    if case == "causal":
        kwargs["causal"] = True
    ref, _ = reference_attention(q.double(), k.double(), v.double(), **{
        n: (a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a)
        for n, a in kwargs.items()
    })  # fmt: skip
    on = {n: (a.to(CUDA) if isinstance(a, torch.Tensor) else a) for n, a in kwargs.items()}
    qc, kc, vc = (t.to(CUDA, dtype) for t in (q, k, v))
    if "sinks" in on:
        on["sinks"] = on["sinks"].to(dtype)
    if backend != "auto":
        reasons = get_backend(backend).why_not(make_call(qc, kc, vc, **on))
        if reasons:  # refused by name on CUDA too, never run with a silent difference
            with pytest.raises(ValueError, match=f"backend '{backend}' cannot run this call"):
                attention(qc, kc, vc, backend=backend, **on)
            return
    out = attention(qc, kc, vc, backend=backend, **on)
    assert out.device.type == torch.device(CUDA).type and out.dtype == dtype
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double().cpu(), ref, **TOL[dtype])
    if case == "mask":  # the empty row is zeros, sinks or not
        assert out[0, :, 2].abs().max() == 0


def test_sink_gradients_on_cuda_agree_between_backends():
    q, k, v, sinks, _ = _inputs(3)
    grads = []
    for backend in ("eager", "sdpa"):
        leaves = [t.to(CUDA).requires_grad_() for t in (q, k, v, sinks)]
        out = attention(*leaves[:3], sinks=leaves[3], causal=True, backend=backend)
        out.square().sum().backward()
        grads.append([t.grad.cpu() for t in leaves])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-3)


def test_module_with_variants_on_cuda_equals_cpu():
    torch.manual_seed(0)
    m = MultiHeadAttention(48, 6, num_kv_heads=3, causal=True, scale=0.2, softcap=2.0, sinks=True)
    with torch.no_grad():
        m.sinks.normal_()
    x = torch.randn(2, 9, 48)
    want = m(x)
    got = m.to(CUDA)(x.to(CUDA))
    torch.testing.assert_close(got.cpu(), want, atol=1e-4, rtol=1e-3)
