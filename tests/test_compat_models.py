"""The drop-in inside torch's transformer layers, conversions, and state_dict compatibility."""

import pytest
import torch
from torch import nn

from multihead import MultiHeadAttention
from multihead.compat import MultiheadAttention, from_modern, replace_attention, to_modern

E, H = 16, 4


def clone_with_dropin(model):
    import copy

    twin = copy.deepcopy(model)
    return replace_attention(twin)


def count(model, cls):
    return sum(type(m) is cls for m in model.modules())


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_in_train_and_eval(batch_first, norm_first):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(
        E, H, 32, dropout=0.0, batch_first=batch_first, norm_first=norm_first
    )
    ref = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
    ours = clone_with_dropin(ref)
    assert count(ours, MultiheadAttention) == 2 and count(ours, nn.MultiheadAttention) == 0
    x = torch.randn(3, 6, E) if batch_first else torch.randn(6, 3, E)
    pad = torch.tensor([[False] * 6, [False] * 4 + [True] * 2, [False] * 2 + [True] * 4])
    causal = nn.Transformer.generate_square_subsequent_mask(6)
    for mode in ("train", "eval"):
        ref.train(mode == "train"), ours.train(mode == "train")
        for kw in (dict(), dict(src_key_padding_mask=pad), dict(mask=causal, is_causal=True)):
            with torch.no_grad():
                out_r, out_o = ref(x, **kw), ours(x, **kw)
            # Eval: torch's fast path pads masked positions with zeros in nested mode only.
            torch.testing.assert_close(out_o, out_r, atol=1e-5, rtol=1e-4)
    # Gradients in training mode.
    ref.train(), ours.train()
    ref(x, src_key_padding_mask=pad).sum().backward()
    ours(x, src_key_padding_mask=pad).sum().backward()
    for (n, a), b in zip(ours.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-5, rtol=1e-4, msg=n)


@pytest.mark.parametrize("batch_first", [True, False])
def test_decoder_layer_and_full_transformer(batch_first):
    torch.manual_seed(0)
    ref = nn.Transformer(
        E,
        H,
        num_encoder_layers=2,
        num_decoder_layers=2,
        dim_feedforward=32,
        dropout=0.0,
        batch_first=batch_first,
    )
    ours = clone_with_dropin(ref)
    assert count(ours, MultiheadAttention) == 6  # 2 encoder self, 2 decoder self, 2 cross
    src = torch.randn(2, 7, E) if batch_first else torch.randn(7, 2, E)
    tgt = torch.randn(2, 5, E) if batch_first else torch.randn(5, 2, E)
    tgt_mask = nn.Transformer.generate_square_subsequent_mask(5)
    mem_pad = torch.zeros(2, 7, dtype=torch.bool)
    mem_pad[1, 5:] = True
    for mode in (True, False):
        ref.train(mode), ours.train(mode)
        kw = dict(
            tgt_mask=tgt_mask,
            tgt_is_causal=True,
            memory_key_padding_mask=mem_pad,
            src_key_padding_mask=mem_pad,
        )
        torch.testing.assert_close(ours(src, tgt, **kw), ref(src, tgt, **kw), atol=1e-5, rtol=1e-4)
    layer = nn.TransformerDecoderLayer(E, H, 32, dropout=0.0, batch_first=batch_first)
    ours_layer = clone_with_dropin(layer)
    torch.testing.assert_close(
        ours_layer(tgt, src, tgt_mask=tgt_mask), layer(tgt, src, tgt_mask=tgt_mask)
    )


@pytest.mark.parametrize(
    "cfg",
    [dict(), dict(bias=False), dict(kdim=6, vdim=10), dict(add_bias_kv=True, add_zero_attn=True)],
)
def test_state_dict_both_ways_and_attributes(cfg):
    ref = nn.MultiheadAttention(E, H, batch_first=True, **cfg)
    ours = MultiheadAttention(E, H, batch_first=True, **cfg)
    sd_r, sd_o = ref.state_dict(), ours.state_dict()
    assert list(sd_r) == list(sd_o)
    assert all(sd_r[k].shape == sd_o[k].shape and sd_r[k].dtype == sd_o[k].dtype for k in sd_r)
    ours.load_state_dict(sd_r, strict=True)
    ref.load_state_dict(ours.state_dict(), strict=True)
    for attr in (
        "embed_dim",
        "num_heads",
        "head_dim",
        "kdim",
        "vdim",
        "batch_first",
        "dropout",
        "_qkv_same_embed_dim",
        "add_zero_attn",
    ):
        assert getattr(ours, attr) == getattr(ref, attr), attr
    assert isinstance(ours, nn.MultiheadAttention)


def test_constructor_signature_and_defaults_match_torch():
    import inspect

    for method in ("__init__", "forward"):
        ours = inspect.signature(getattr(MultiheadAttention, method)).parameters
        theirs = inspect.signature(getattr(nn.MultiheadAttention, method)).parameters
        assert [(p.name, p.kind, p.default) for p in ours.values()] == [
            (p.name, p.kind, p.default) for p in theirs.values()
        ]


def test_from_torch_to_torch_round_trip():
    ref = nn.MultiheadAttention(E, H, kdim=6, vdim=10, add_bias_kv=True, dtype=torch.float64).eval()
    ours = MultiheadAttention.from_torch(ref)
    assert (
        type(ours) is MultiheadAttention
        and not ours.training
        and ours.in_proj_bias.dtype == torch.float64
    )
    back = ours.to_torch()
    assert type(back) is nn.MultiheadAttention
    q, k, v = (
        torch.randn(5, 2, E, dtype=torch.float64),
        torch.randn(7, 2, 6, dtype=torch.float64),
        torch.randn(7, 2, 10, dtype=torch.float64),
    )
    for m in (ours, back):
        torch.testing.assert_close(m(q, k, v)[0], ref(q, k, v)[0])
    assert replace_attention(ref) is not ref and type(replace_attention(ref)) is MultiheadAttention


@pytest.mark.parametrize("cfg", [dict(), dict(bias=False), dict(kdim=6, vdim=10)])
def test_modern_conversion_both_ways(cfg):
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(E, H, batch_first=True, **cfg)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    modern = to_modern(ref)
    assert isinstance(modern, MultiHeadAttention) and modern.packed == ("kdim" not in cfg)
    q = torch.randn(2, 5, E)
    k, v = torch.randn(2, 7, cfg.get("kdim", E)), torch.randn(2, 7, cfg.get("vdim", E))
    pad = torch.rand(2, 7) > 0.7
    pad[:, 0] = False
    expected = ref(q, k, v, key_padding_mask=pad, need_weights=False)[0]
    torch.testing.assert_close(modern(q, k, v, key_mask=~pad), expected)
    back = from_modern(modern)
    torch.testing.assert_close(back(q, k, v, key_padding_mask=pad)[0], expected)
    assert MultiheadAttention.from_modern(modern).state_dict().keys() == ref.state_dict().keys()


def test_modern_conversion_rejects_what_it_cannot_express():
    with pytest.raises(ValueError, match="add_bias_kv"):
        to_modern(nn.MultiheadAttention(E, H, add_bias_kv=True))
    with pytest.raises(ValueError, match="num_kv_heads"):
        from_modern(MultiHeadAttention(E, H, num_kv_heads=2))
