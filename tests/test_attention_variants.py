"""Logit soft-capping (`softcap=`), sink logits (`sinks=`) and `scale=`, on every backend,
against the fp64 textbook reference (tests/reference.py); backends that cannot apply a variant
refuse it by name, and `auto` picks one that can."""

from __future__ import annotations

import math

import pytest
import torch

from multihead import MultiHeadAttention
from multihead.functional import available_backends, get_backend
from multihead.functional.attention import attention, explain
from multihead.functional.call import make_call

from reference import reference_attention

B, H, HKV, TQ, TK, D = 2, 6, 3, 5, 7, 8
VARIANTS = {
    "softcap": {"softcap": 1.5},
    "sinks": {"sinks": "sinks"},
    "both": {"softcap": 1.5, "sinks": "sinks"},
}


def _inputs(seed: int = 0, dtype=torch.float32, tq: int = TQ, tk: int = TK):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, tq, D, generator=g) * 2.0  # scores well past the cap
    k = torch.randn(B, HKV, tk, D, generator=g) * 2.0
    v = torch.randn(B, HKV, tk, D, generator=g)
    sinks = torch.randn(H, generator=g) * 2.0
    return q.to(dtype), k.to(dtype), v.to(dtype), sinks


def _cases():
    g = torch.Generator().manual_seed(1)
    mask = torch.rand(B, 1, TQ, TK, generator=g) > 0.3
    mask[0, 0, 2] = False  # an empty row
    bias = torch.randn(1, H, TQ, TK, generator=g)
    return {
        "plain": {},
        "mask": {"mask": mask},
        "causal": {"causal": True},
        "mask+bias+causal": {"mask": mask, "bias": bias, "causal": True},
    }


CASES = _cases()


def _kwargs(variant: str, sinks: torch.Tensor) -> dict:
    return {n: (sinks if a == "sinks" else a) for n, a in VARIANTS[variant].items()}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("backend", ["eager", "sdpa", "tiled", "flex"])
def test_every_backend_applies_or_refuses(backend, variant, case):
    q, k, v, sinks = _inputs()
    kwargs = {**_kwargs(variant, sinks), **CASES[case], "scale": 0.3}
    call = make_call(q, k, v, **kwargs)
    reasons = get_backend(backend).why_not(call)
    if reasons:  # refused by name, never run with a silent difference
        refused = " ".join(reasons)
        assert ("soft-capping" in refused) == ("softcap" in kwargs)
        takes_sinks = backend == "sdpa"  # (through one more key: sdpa._with_sinks)
        assert ("sink" in refused) == ("sinks" in kwargs and not takes_sinks)
        with pytest.raises(ValueError, match=f"backend '{backend}' cannot run this call"):
            attention(q, k, v, backend=backend, **kwargs)
        return
    assert backend in ("eager", "sdpa")  # the two that take variants (sdpa: sinks only)
    ref, ref_w = reference_attention(
        q, k, v, mask=kwargs.get("mask"), bias=kwargs.get("bias"),
        causal=kwargs.get("causal", False), scale=0.3, softcap=kwargs.get("softcap"),
        sinks=kwargs.get("sinks"),
    )  # fmt: skip
    out = attention(q, k, v, backend=backend, **kwargs)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-4)
    if backend == "eager":
        _, w = attention(q, k, v, backend="eager", return_weights=True, **kwargs)
        torch.testing.assert_close(w.double(), ref_w, atol=1e-5, rtol=1e-4)
    if "mask" in kwargs:  # the empty row is zeros, sinks or not
        assert out[0, :, 2].abs().max() == 0


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_auto_picks_a_backend_that_can(variant):
    q, k, v, sinks = _inputs()
    kwargs = _kwargs(variant, sinks)
    chosen = explain(q, k, v, causal=True, **kwargs)
    assert chosen.reasons[chosen.chosen] == []
    assert chosen.chosen == ("sdpa" if variant == "sinks" else "eager")
    assert "soft-capping" in str(chosen) if "softcap" in kwargs else "sink" in str(chosen)
    # structured calls (a window) go past the tiled backend too
    windowed = explain(q, k, v, causal=True, window=3, **kwargs)
    assert windowed.chosen in ("sdpa", "eager") and windowed.reasons["tiled"]
    ref, _ = reference_attention(
        q, k, v, causal=True, softcap=kwargs.get("softcap"), sinks=kwargs.get("sinks")
    )
    out = attention(q, k, v, causal=True, **kwargs).double()
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4)


def test_hand_computed_sink_and_cap():
    # one query, two keys, D = 1, scale 1: scores 2 and 0; cap 1 -> tanh(2), tanh(0) = 0
    q = torch.tensor([[[[1.0]]]])
    k = torch.tensor([[[[2.0], [0.0]]]])
    v = torch.tensor([[[[10.0], [20.0]]]])
    sink = torch.tensor([math.log(2.0)])  # e^sink = 2
    out, w = attention(
        q, k, v, scale=1.0, softcap=1.0, sinks=sink, return_weights=True, backend="eager"
    )
    e1, e2 = math.exp(math.tanh(2.0)), 1.0
    want = torch.tensor([e1, e2]) / (e1 + e2 + 2.0)
    torch.testing.assert_close(w[0, 0, 0], want)
    torch.testing.assert_close(out[0, 0, 0, 0], (want * torch.tensor([10.0, 20.0])).sum())


def test_sinks_gradients_agree_between_backends():
    q, k, v, sinks = _inputs(3)
    grads = []
    for backend in ("eager", "sdpa"):
        leaves = [t.clone().requires_grad_() for t in (q, k, v, sinks)]
        out = attention(*leaves[:3], sinks=leaves[3], causal=True, backend=backend)
        out.square().sum().backward()
        grads.append([t.grad for t in leaves])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    assert grads[0][3].abs().min() > 0  # every head's sink is learned


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_bf16(backend):
    q, k, v, sinks = _inputs(4, torch.bfloat16)
    kwargs = {"sinks": sinks} if backend == "sdpa" else {"sinks": sinks, "softcap": 1.5}
    ref, _ = reference_attention(q, k, v, causal=True, **kwargs)
    out = attention(q, k, v, causal=True, backend=backend, **kwargs)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), ref, atol=3e-2, rtol=3e-2)


def test_bad_arguments_are_named():
    q, k, v, sinks = _inputs()
    with pytest.raises(ValueError, match=r"sinks must have shape \(H,\) = \(6,\)"):
        attention(q, k, v, sinks=sinks[:3])
    with pytest.raises(TypeError, match="sinks must be a floating-point"):
        attention(q, k, v, sinks=torch.zeros(H, dtype=torch.long))
    with pytest.raises(ValueError, match="softcap must be finite and positive"):
        attention(q, k, v, softcap=-1.0)
    with pytest.raises(TypeError, match="softcap must be a float"):
        attention(q, k, v, softcap="2")


def test_module_passes_variants_through():
    torch.manual_seed(0)
    C = 24
    mha = MultiHeadAttention(
        C, H, num_kv_heads=HKV, causal=True, scale=0.2, softcap=2.0, sinks=True
    )
    with torch.no_grad():
        mha.sinks.normal_(0, 2.0)
    x = torch.randn(B, TQ, C) * 3
    with torch.no_grad():  # (the reference, by hand from the module's weights)
        w, b = mha.in_proj.weight, mha.in_proj.bias
        q = (x @ w[: H * 4].T + b[: H * 4]).view(B, TQ, H, 4).transpose(1, 2)
        kv = x @ w[H * 4 :].T + b[H * 4 :]
        k, v = (t.reshape(B, TQ, HKV, 4).transpose(1, 2) for t in kv.split(HKV * 4, dim=-1))
        ref, ref_w = reference_attention(
            q, k, v, causal=True, scale=0.2, softcap=2.0, sinks=mha.sinks
        )
        want = ref.transpose(1, 2).reshape(B, TQ, H * 4) @ mha.out_proj.weight.double().T
        want = want + mha.out_proj.bias.double()
    out, weights = mha(x, return_weights=True)
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(weights.double(), ref_w, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(mha(x).double(), want, atol=1e-5, rtol=1e-4)  # default path
    assert "softcap=2.0" in repr(mha) and "sinks=True" in repr(mha)
    with pytest.raises(ValueError, match="packed sequences"):
        mha(x.reshape(B * TQ, C), lengths=[TQ] * B)


def test_compile_fullgraph_default_path():
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4, causal=True, softcap=3.0, sinks=True).eval()
    x = torch.randn(2, 6, 16)
    compiled = torch.compile(mha, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(x), mha(x))


def test_backends_listed_are_covered():
    # a backend registered later must be added to the parametrisation above
    assert set(available_backends()) <= {"eager", "sdpa", "tiled", "flex"}


def test_packed_sequences_refuse_q_k_norms_by_name():
    """Qwen3's q/k norms are not applied on the packed path: refused, naming them."""
    from multihead.modules import TransformerBlock

    block = TransformerBlock(
        16, 4, 32, norm_first=True, norm="rmsnorm", mlp="swiglu", causal=True, qk_norm="head"
    )
    with pytest.raises(ValueError, match=r"q/k norms .*packed sequences"):
        block(torch.randn(6, 16), lengths=[3, 3])
