"""The logit lens against Hugging Face: a random GPT-2 saved by `transformers`; each block's
prediction equals HF's lm_head(ln_f(hidden state)), the last block's is HF's own output and
loss; padded positions are left out of the loss."""

import pytest
import torch
import torch.nn.functional as F

from multihead import CausalLM, LMConfig
from multihead.interpret import logit_lens
from multihead.pretrained import load_causal_lm

transformers = pytest.importorskip("transformers")
V, L = 61, 3


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        vocab_size=V, n_embd=40, n_layer=L, n_head=5, n_positions=32, bos_token_id=0, eos_token_id=1
    )
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():
        for p in hf.parameters():  # larger weights: predictions that differ between blocks
            p.mul_(4)
    path = tmp_path_factory.mktemp("gpt2")
    hf.save_pretrained(path)
    return hf, load_causal_lm(path).eval()


def test_each_block_reads_as_transformers_would(saved):
    hf, ours = saved
    ids = torch.randint(0, V, (2, 9))
    lens = logit_lens(ours, ids, top_k=4, keep_logits=True)
    with torch.no_grad():
        ref = hf(ids, labels=ids, output_hidden_states=True)
        t = hf.transformer
        for i in range(L - 1):  # HF's last hidden state is already after ln_f
            expected = hf.lm_head(t.ln_f(ref.hidden_states[i + 1]))
            torch.testing.assert_close(lens.logits[i], expected, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(lens.logits[-1], ref.logits, atol=1e-4, rtol=1e-4)
    assert lens.top_tokens.shape == lens.top_probs.shape == (L, 2, 9, 4)
    top = lens.logits.softmax(-1).topk(4, dim=-1)
    assert torch.equal(lens.top_tokens, top.indices)
    torch.testing.assert_close(lens.top_probs, top.values)
    assert lens.token_loss.shape == (L, 2, 8) and lens.loss.shape == (L,)
    assert float(lens.loss[-1]) == pytest.approx(float(ref.loss), abs=1e-4)
    for i in range(L):
        expected = F.cross_entropy(lens.logits[i, :, :-1].reshape(-1, V), ids[:, 1:].reshape(-1))
        assert float(lens.loss[i]) == pytest.approx(float(expected), abs=1e-4)
    assert len(set(lens.top_tokens[:, 0, -1, 0].tolist())) > 1  # the blocks disagree somewhere
    assert logit_lens(ours, ids).logits is None  # logits only when asked


def test_padding_is_left_out_of_the_loss(saved):
    _, ours = saved
    long, short = torch.randint(2, V, (1, 8)), torch.randint(2, V, (1, 5))
    ids = torch.cat([long, torch.cat([torch.zeros(1, 3, dtype=torch.long), short], 1)])
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, :3] = 0  # left padding
    both = logit_lens(ours, ids, attention_mask=mask)
    alone_long, alone_short = logit_lens(ours, long), logit_lens(ours, short)
    torch.testing.assert_close(
        both.token_loss[:, 1, 3:], alone_short.token_loss[:, 0], atol=1e-5, rtol=1e-4
    )
    assert (both.token_loss[:, 1, :3] == 0).all()
    expected = (alone_long.loss * 7 + alone_short.loss * 4) / 11
    torch.testing.assert_close(both.loss, expected, atol=1e-5, rtol=1e-4)


def test_table_and_errors(saved):
    _, ours = saved
    ids = torch.randint(0, V, (1, 6))
    text = logit_lens(ours, ids, top_k=2).table(decode=lambda i: f"<{i}>")
    lines = text.splitlines()
    assert len(lines) == 2 + L and lines[2].startswith("block 0") and "<" in lines[2]
    with pytest.raises(TypeError, match="CausalLM"):
        logit_lens(torch.nn.Linear(2, 2), ids)
    with pytest.raises(ValueError, match="top_k must be a positive int"):
        logit_lens(ours, ids, top_k=0)
    with pytest.raises(ValueError, match=r"T >= 2.*\(1, 1\)"):
        logit_lens(ours, ids[:, :1])


def test_rmsnorm_rope_model():
    cfg = LMConfig(vocab_size=V, dim=24, num_layers=2, num_heads=4, position="rope", norm="rmsnorm")
    model = CausalLM(cfg).eval()
    ids = torch.randint(0, V, (2, 7))
    lens = logit_lens(model, ids, keep_logits=True)
    with torch.no_grad():
        torch.testing.assert_close(lens.logits[-1], model(ids))
