"""torch.compile(fullgraph=True, dynamic=True) of every loaded model family: Llama-family
decoders (GQA, explicit head_dim, q/k/v bias, RoPE theta and scaling, sliding windows) and the
RoBERTa / DistilBERT / MPNet encoders (RoBERTa's positions counted over padding, MPNet's relative
bias). One graph for every sequence length, with and without padding, and the graph computes
what eager does (which the loader tests hold against Hugging Face). Counted with dynamo's
CompileCounter backend, as in test_compile.py. And torch.export with a dynamic sequence length
for the decoders whose masks differ most (windows, biases)."""

import pytest
import torch
import torch._dynamo
from torch._dynamo.testing import CompileCounter
from torch.export import Dim, export

from helpers_encoders import save_encoder
from helpers_llama import VOCAB, save_causal
from multihead.models import load_causal_lm, load_encoder_model

LENGTHS = (7, 11, 13)  # past mistral's and qwen2's window of 5
B = 2


def compiled(module):
    torch._dynamo.reset()
    counter = CompileCounter()
    return torch.compile(module, backend=counter, fullgraph=True, dynamic=True), counter


def left_padded(T):
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, :3] = 0
    return mask


@pytest.mark.parametrize(
    "case", ["llama-head-dim-biases", "llama3", "llama-dynamic", "mistral-window", "qwen2-window"]
)
def test_decoders_one_graph_for_every_length(case, tmp_path):
    save_causal(tmp_path, case)
    m = load_causal_lm(tmp_path)
    f, counter = compiled(m)
    lengths = (7, 11, 15) if case != "llama-dynamic" else (7, 11, 13)  # dynamic: 16 positions
    for T in lengths:
        ids = torch.randint(0, VOCAB, (B, T))
        mask = left_padded(T)
        torch.testing.assert_close(f(ids), m(ids))
        torch.testing.assert_close(f(ids, attention_mask=mask), m(ids, attention_mask=mask))
    assert counter.frame_count == 2  # with and without attention_mask


@pytest.mark.parametrize("model_type", ["roberta", "distilbert", "mpnet"])
def test_encoders_one_graph_for_every_length(model_type, tmp_path):
    save_encoder(tmp_path, model_type, attn_implementation="eager")
    enc = load_encoder_model(tmp_path)
    vocab = enc.config.vocab_size
    f, counter = compiled(enc)
    for T in LENGTHS:
        ids = torch.randint(5, vocab, (B, T))  # past the special tokens (RoBERTa's pad is 1)
        mask = torch.ones(B, T, dtype=torch.long)
        mask[0, T - 3 :] = 0
        got = f(ids, mask).last_hidden_state
        torch.testing.assert_close(got, enc(ids, mask).last_hidden_state)
    assert counter.frame_count == 1


@pytest.mark.parametrize("case", ["mistral-window", "qwen2-window"])
def test_decoders_export_with_a_dynamic_length(case, tmp_path):
    save_causal(tmp_path, case)
    m = load_causal_lm(tmp_path)
    T = Dim("T", min=2, max=60)
    ids = torch.randint(0, VOCAB, (B, 9))
    shapes = {"input_ids": {1: T}, "attention_mask": {1: T}}
    program = export(m, (ids,), {"attention_mask": left_padded(9)}, dynamic_shapes=shapes)
    for length in (6, 14):
        ids, mask = torch.randint(0, VOCAB, (B, length)), left_padded(length)
        got = program.module()(ids, attention_mask=mask)
        torch.testing.assert_close(got, m(ids, attention_mask=mask))


@pytest.mark.parametrize("case", ["mistral-window", "qwen2-window", "llama-dynamic"])
def test_compiled_generation_matches_eager(case, tmp_path):
    """Static caches with sliding windows (prompt longer than the window) and left padding;
    dynamic RoPE. Greedy tokens equal eager generation's, which test_models_llama.py holds
    against Hugging Face's."""
    save_causal(tmp_path, case)
    m = load_causal_lm(tmp_path)
    ids = torch.randint(0, VOCAB, (B, 7))
    mask = left_padded(7)
    new = 20 if case == "llama-dynamic" else 9  # dynamic RoPE: past its 16-position table
    eager = m.generate(ids, new, attention_mask=mask)
    compiled = m.generate(ids, new, attention_mask=mask, compile={"backend": "eager"})
    assert torch.equal(compiled, eager)
