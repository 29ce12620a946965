"""The bridge refuses what it cannot route, by name, before it changes anything; and every
extra the registry passes is applied (checked against the textbook formula) or refused."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

pytest.importorskip("transformers")

from helpers_bridge import UNREGISTERED, tiny
from multihead.bridge import BridgeError, bridge_attention, wrap


def untouched(model: nn.Module, implementation: str) -> None:
    assert model.config._attn_implementation == implementation
    assert not any(hasattr(m, "hook_points") for m in model.modules())
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


@pytest.mark.parametrize("name", sorted(UNREGISTERED))
def test_architectures_outside_the_registry_are_refused_by_name(name):
    model = tiny(name, table=UNREGISTERED)
    with pytest.raises(BridgeError, match=rf"{type(model).__name__}.*attention registry"):
        wrap(model)
    untouched(model, "eager")


def test_not_a_pretrained_model():
    with pytest.raises(TypeError, match="PreTrainedModel, got Linear"):
        wrap(nn.Linear(2, 2))


def test_wrapped_twice():
    bridged = wrap(tiny("llama"))
    for again in (bridged, bridged.hf):
        with pytest.raises(ValueError, match="already wrapped"):
            wrap(again)


def test_another_attention_implementation_chosen_by_the_user():
    model = tiny("llama")
    model.config._attn_implementation_internal = "flex_attention"
    with pytest.raises(
        ValueError, match="LlamaForCausalLM's config sets attn_implementation='flex"
    ):
        wrap(model)


def test_layers_that_cannot_be_found():
    model = tiny("llama")
    model.model.layers = nn.ModuleList([nn.Identity(), nn.Identity()])
    with pytest.raises(BridgeError, match="LlamaForCausalLM: no list of layers"):
        wrap(model)
    untouched(model, "eager")


def test_a_layer_without_an_mlp_refuses_the_whole_model():
    model = tiny("llama")
    del model.model.layers[1].mlp
    with pytest.raises(BridgeError, match=r"layer model.layers.1 .*no MLP submodule"):
        wrap(model)
    untouched(model, "eager")  # layer 0 got no hooks either


# -- the extras, against the textbook formula (fp64) ---------------------------------------


class Module(nn.Module):
    is_causal = True


def textbook(q, k, v, allowed, scale, softcap=None, sinks=None):
    q, k, v = q.double(), k.double(), v.double()
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    s = q @ k.transpose(-1, -2) * scale
    if softcap is not None:
        s = torch.tanh(s / softcap) * softcap
    s = s.masked_fill(~allowed, -math.inf)
    if sinks is not None:
        column = sinks.double().view(1, -1, 1, 1).expand(*s.shape[:3], 1)
        p = torch.cat([column, s], -1).softmax(-1)[..., 1:]
    else:
        p = s.softmax(-1)
    return (p @ v).transpose(1, 2), p


def qkv(seed=0, B=2, H=4, Hkv=2, Tq=5, Tk=5, D=8):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(B, H, Tq, D, generator=g),
        torch.randn(B, Hkv, Tk, D, generator=g),
        torch.randn(B, Hkv, Tk, D, generator=g),
    )


def causal_window(T, window=None):
    i, j = torch.arange(T)[:, None], torch.arange(T)[None]
    allowed = j <= i
    return allowed if window is None else allowed & (j > i - window)


@pytest.mark.parametrize("window", [None, 2])
@pytest.mark.parametrize("softcap", [None, 1.5])
@pytest.mark.parametrize("sinks", [False, True])
def test_extras_match_the_formula(window, softcap, sinks):
    q, k, v = qkv()
    s_aux = torch.tensor([0.5, -1.0, 2.0, 0.0]) if sinks else None
    out, weights = bridge_attention(
        Module(), q, k, v, None, scaling=0.3, sliding_window=window, softcap=softcap,
        s_aux=s_aux, output_attentions=True,
    )  # fmt: skip
    want, p = textbook(q, k, v, causal_window(5, window), 0.3, softcap, s_aux)
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(weights.double(), p, atol=1e-5, rtol=1e-4)


def test_a_boolean_mask_and_position_bias():
    q, k, v = qkv(Tq=3, Tk=6)
    mask = torch.rand(2, 1, 3, 6, generator=torch.Generator().manual_seed(2)) > 0.3
    mask[..., 0] = True
    bias = torch.randn(1, 4, 3, 6)
    out, _ = bridge_attention(Module(), q, k, v, mask, scaling=1.0, position_bias=bias)
    s = q.double() @ k.double().repeat_interleave(2, 1).transpose(-1, -2) + bias.double()
    p = s.masked_fill(~mask, -math.inf).softmax(-1)
    want = (p @ v.double().repeat_interleave(2, 1)).transpose(1, 2)
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-4)


def test_dropout_is_applied_in_training_only():
    q, k, v = qkv()
    a, _ = bridge_attention(Module(), q, k, v, None, dropout=0.0)
    torch.manual_seed(0)
    b, _ = bridge_attention(Module(), q, k, v, None, dropout=0.5)
    assert not torch.allclose(a, b)
    model = tiny("llama")
    model.config.attention_dropout = 0.5
    for layer in model.model.layers:
        layer.self_attn.attention_dropout = 0.5
    bridged = wrap(model)
    ids = torch.randint(4, 96, (1, 6))
    with torch.no_grad():
        first, second = bridged(ids), bridged(ids)  # eval: no dropout
        torch.testing.assert_close(first, second)
        bridged.train()
        assert not torch.allclose(bridged(ids), first)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"cu_seq_lens_q": torch.tensor([0, 5])}, "'cu_seq_lens_q'.*packed sequences"),
        ({"some_new_bias": torch.ones(1)}, "'some_new_bias'.*refusing rather than ignoring"),
    ],
)
def test_unknown_extras_are_refused_by_name(extra, message):
    q, k, v = qkv()
    with pytest.raises(ValueError, match=message):
        bridge_attention(Module(), q, k, v, None, **extra)


def test_multihead_load_refuses_an_unregistered_checkpoint_by_name(tmp_path):
    import multihead

    tiny("bloom", table=UNREGISTERED).save_pretrained(tmp_path / "bloom")
    with pytest.raises(ValueError, match=r"BloomForCausalLM \(model_type 'bloom'\).*registry"):
        multihead.load(tmp_path / "bloom")
