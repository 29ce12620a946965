"""torch.export with a dynamic sequence length, and ONNX (the dynamo exporter) run in
onnxruntime: the exported programs compute what eager does, at lengths other than the one
traced."""

import pytest
import torch
from torch.export import Dim, export

from multihead import CausalLM, LMConfig, MultiHeadAttention
from multihead.models.bert import BertConfig, BertEncoder
from multihead.modules import TransformerBlock
from multihead.positional import ALiBi, RotaryEmbedding

B, C, H, D = 2, 36, 6, 6
T = Dim("T", min=2, max=40)


def padding(batch, length):
    """A (B, T) key mask with the first row's last 3 keys padded."""
    mask = torch.ones(batch, length, dtype=torch.bool)
    mask[0, length - 3 :] = False
    return mask


@pytest.mark.parametrize("pos,kv", [(None, 6), ("rope", 3), ("alibi", 2)])
def test_attention_module_exports_with_key_mask(pos, kv):
    scheme = {"rope": RotaryEmbedding(D), "alibi": ALiBi(H), None: None}[pos]
    m = MultiHeadAttention(C, H, num_kv_heads=kv, causal=True, position=scheme).eval()
    x = torch.randn(B, 9, C)
    program = export(
        m, (x,), {"key_mask": padding(B, 9)}, dynamic_shapes={"query": {1: T}, "key_mask": {1: T}}
    )
    for length in (5, 13):
        x = torch.randn(B, length, C)
        km = padding(B, length)
        torch.testing.assert_close(program.module()(x, key_mask=km), m(x, key_mask=km))


def test_block_exports():
    blk = TransformerBlock(C, H, 50, num_kv_heads=3, norm_first=True, causal=True).eval()
    x = torch.randn(B, 9, C)
    program = export(
        blk, (x,), {"key_mask": padding(B, 9)}, dynamic_shapes={"x": {1: T}, "key_mask": {1: T}}
    )
    for length in (5, 13):
        x, km = torch.randn(B, length, C), padding(B, length)
        torch.testing.assert_close(program.module()(x, key_mask=km), blk(x, key_mask=km))


def causal_lm(position):
    torch.manual_seed(0)
    cfg = LMConfig(
        vocab_size=53, dim=C, num_layers=2, num_heads=H, num_kv_heads=3, position=position
    )
    return CausalLM(cfg).eval()


def lm_inputs(length):
    ids = torch.randint(0, 53, (B, length))
    mask = torch.ones(B, length, dtype=torch.long)
    mask[1, :3] = 0  # left padding
    return ids, mask


@pytest.mark.parametrize("position", ["learned", "rope", "alibi"])
def test_causal_lm_exports(position):
    m = causal_lm(position)
    ids, mask = lm_inputs(9)
    shapes = {"input_ids": {1: T}, "attention_mask": {1: T}}
    program = export(m, (ids,), {"attention_mask": mask}, dynamic_shapes=shapes)
    for length in (5, 13):
        ids, mask = lm_inputs(length)
        got = program.module()(ids, attention_mask=mask)
        torch.testing.assert_close(got, m(ids, attention_mask=mask))


def bert():
    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=57,
        hidden_size=C,
        num_hidden_layers=2,
        num_attention_heads=H,
        intermediate_size=50,
        max_position_embeddings=40,
    )
    return BertEncoder(cfg).eval()


def bert_inputs(length):
    ids = torch.randint(0, 57, (B, length))
    mask = torch.ones(B, length, dtype=torch.long)
    mask[0, length - 3 :] = 0  # right padding
    return ids, mask


def test_bert_encoder_exports():
    enc = bert()
    program = export(enc, bert_inputs(9), dynamic_shapes=({1: T}, {1: T}))
    for length in (5, 13):
        ids, mask = bert_inputs(length)
        got = program.module()(ids, mask).last_hidden_state
        torch.testing.assert_close(got, enc(ids, mask).last_hidden_state)


def onnx_session(model, args, kwargs, shapes, tmp_path):
    import onnxruntime as ort  # the test extra installs it, with onnxscript (the exporter)

    program = torch.onnx.export(
        model, args, kwargs=kwargs, dynamo=True, dynamic_shapes=shapes, verbose=False
    )
    path = tmp_path / "model.onnx"
    program.save(str(path))
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("position", ["learned", "rope"])
def test_causal_lm_onnx_runs_in_onnxruntime(position, tmp_path):
    m = causal_lm(position)
    ids, mask = lm_inputs(9)
    shapes = {"input_ids": {1: T}, "attention_mask": {1: T}}
    session = onnx_session(m, (ids,), {"attention_mask": mask}, shapes, tmp_path)
    for length in (5, 13):
        ids, mask = lm_inputs(length)
        (logits,) = session.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
        with torch.no_grad():
            expected = m(ids, attention_mask=mask)
        torch.testing.assert_close(torch.from_numpy(logits), expected, atol=1e-5, rtol=1e-4)


def test_bert_encoder_onnx_runs_in_onnxruntime(tmp_path):
    enc = bert()
    session = onnx_session(enc, bert_inputs(9), None, ({1: T}, {1: T}), tmp_path)
    names = [i.name for i in session.get_inputs()]
    for length in (5, 13):
        ids, mask = bert_inputs(length)
        (states,) = session.run(None, dict(zip(names, (ids.numpy(), mask.numpy()), strict=True)))
        with torch.no_grad():
            expected = enc(ids, mask).last_hidden_state
        torch.testing.assert_close(torch.from_numpy(states), expected, atol=1e-5, rtol=1e-4)
