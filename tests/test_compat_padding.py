"""Fully padded items through converted torch transformer models, in eval under no_grad.

There torch's fused kernels take over (the encoder layer's fast path gives NaN for an item whose
keys are all padding; the encoder's nested-tensor path writes zeros at every padded position).
`replace_attention` keeps the drop-in running, so such an item's attention gives zeros (before the
output projection) and the rest of the layer proceeds as written: checked against the layer's
arithmetic done by hand. Every other item equals torch's own output.

Sizes: B=3 items, T=6 positions, E=16, H=4; item 1 is all padding, item 2 half.
"""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from multihead.compat import MultiheadAttention, replace_attention

E, H, B, T = 16, 4, 3, 6


def padding():
    pad = torch.zeros(B, T, dtype=torch.bool)  # True = padding (torch's convention)
    pad[1] = True
    pad[2, 3:] = True
    return pad


def layer_without_attention(layer: nn.TransformerEncoderLayer, x: torch.Tensor) -> torch.Tensor:
    """The encoder layer's arithmetic when the attention gives zeros: only out_proj's bias is
    added (post-norm, ReLU, as torch's defaults)."""
    attn = layer.self_attn.out_proj.bias.expand_as(x)
    h = layer.norm1(x + attn)
    return layer.norm2(h + layer.linear2(F.relu(layer.linear1(h))))


@pytest.fixture
def x():
    torch.manual_seed(1)
    return torch.randn(B, T, E)


def test_encoder_layer(x):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(E, H, 32, dropout=0.0, batch_first=True).eval()
    converted = replace_attention(copy.deepcopy(layer))
    seen = []
    converted.self_attn.register_forward_hook(lambda m, i, o: seen.append(o[0]))
    pad = padding()
    with torch.no_grad():
        theirs = layer(x, src_key_padding_mask=pad)
        ours = converted(x, src_key_padding_mask=pad)
    assert torch.isnan(theirs[1]).all()  # torch's fused layer: NaN for the padded item
    assert len(seen) == 1  # the drop-in ran (and hooks see it)
    torch.testing.assert_close(seen[0][1], layer.self_attn.out_proj.bias.expand(T, E))
    with torch.no_grad():
        torch.testing.assert_close(ours[1], layer_without_attention(layer, x[1]))
    torch.testing.assert_close(ours[[0, 2]], theirs[[0, 2]], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("nested", [True, False])
def test_encoder(x, nested):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(E, H, 32, dropout=0.0, batch_first=True)
    encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=nested).eval()
    converted = replace_attention(copy.deepcopy(encoder))
    assert all(type(m.self_attn) is MultiheadAttention for m in converted.layers)
    assert converted.use_nested_tensor is False
    pad = padding()
    with torch.no_grad():
        theirs = encoder(x, src_key_padding_mask=pad)
        ours = converted(x, src_key_padding_mask=pad)
        expected_item = x[1]
        for block in encoder.layers:
            expected_item = layer_without_attention(block, expected_item)
    assert torch.isfinite(ours).all()
    torch.testing.assert_close(ours[1], expected_item)
    real = ~pad  # positions holding tokens: equal to torch's (its padded positions differ)
    torch.testing.assert_close(ours[real], theirs[real], atol=1e-5, rtol=1e-4)


def test_transformer_with_padded_memory(x):
    """nn.Transformer: item 1's source is all padding, so the encoder's and the decoder's
    cross-attention rows for it have no key; its target is real."""
    torch.manual_seed(0)
    model = nn.Transformer(E, H, 2, 2, 32, dropout=0.0, batch_first=True).eval()
    converted = replace_attention(copy.deepcopy(model))
    tgt = torch.randn(B, 5, E)
    tgt_mask = nn.Transformer.generate_square_subsequent_mask(5)
    kwargs = dict(src_key_padding_mask=padding(), memory_key_padding_mask=padding())
    with torch.no_grad():
        ours = converted(x, tgt, tgt_mask=tgt_mask, **kwargs)
        theirs = model(x, tgt, tgt_mask=tgt_mask, **kwargs)
    # torch's standard path (grad enabled) is the written arithmetic; its SDPA gives zeros too.
    standard = model(x, tgt, tgt_mask=tgt_mask, **kwargs).detach()
    assert torch.isfinite(ours).all()
    torch.testing.assert_close(ours, standard, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(ours[[0, 2]], theirs[[0, 2]], atol=1e-5, rtol=1e-4)


def test_encoder_bench_runs_and_reports_every_contender():
    """`multihead bench encoder-layer` smoke test: one tiny shape, no timing claims."""
    from multihead.bench.encoder_layer import run

    rows = run([(2, 8, 16, 4)], repeats=1)
    assert [r[1] for r in rows] == ["none", "padded"]
    assert all(len(r) == 8 and r[4].endswith("x") and r[7].endswith("x") for r in rows)
