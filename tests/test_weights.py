"""Per-head weights by TransformerLens' names against the checkpoints' own tensors sliced by hand
(Hugging Face GPT-2's Conv1D (in, out) layout, Llama's separate q/k/v projections with grouped
kv heads, BERT's query/key/value), against the activations the model computes, and after the
weights change (the attributes follow them)."""

import pytest
import torch

from helpers_bert import save_bert
from helpers_llama import save_causal
from multihead import CausalLM, LMConfig
from multihead.interpret import run_with_cache
from multihead.models.encoder import load_encoder_model
from multihead.pretrained import load_causal_lm

transformers = pytest.importorskip("transformers")

CLOSE = dict(atol=1e-5, rtol=1e-4)


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpt2")
    torch.manual_seed(1)
    cfg = transformers.GPT2Config(vocab_size=53, n_embd=30, n_layer=3, n_head=5, n_positions=32)
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():  # random biases (init: zeros)
        for name, p in hf.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.1)
    hf.save_pretrained(path)
    return hf, load_causal_lm(path).eval()


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama")
    # 4 query heads over 2 kv heads, head_dim 16 != 48 / 4, biases on q/k/v and the MLP
    hf = save_causal(path, "llama-head-dim-biases")
    return hf, load_causal_lm(path).eval()


def test_gpt2_weights_are_the_checkpoint_sliced_by_hand(gpt2):
    hf, ours = gpt2
    C, H, D, L = 30, 5, 6, 3
    assert ours.W_Q.shape == (L, H, C, D) and ours.W_O.shape == (L, H, D, C)
    assert ours.b_Q.shape == (L, H, D) and ours.b_O.shape == (L, C)
    for layer, block in enumerate(hf.transformer.h):
        w, b = block.attn.c_attn.weight, block.attn.c_attn.bias  # (C, 3C): columns q | k | v
        for h in range(H):
            for i, (W, bias) in enumerate(
                ((ours.W_Q, ours.b_Q), (ours.W_K, ours.b_K), (ours.W_V, ours.b_V))
            ):
                cols = slice(i * C + h * D, i * C + (h + 1) * D)
                torch.testing.assert_close(W[layer, h], w[:, cols], atol=0, rtol=0)
                torch.testing.assert_close(bias[layer, h], b[cols], atol=0, rtol=0)
            rows = slice(h * D, (h + 1) * D)
            torch.testing.assert_close(ours.W_O[layer, h], block.attn.c_proj.weight[rows])
        torch.testing.assert_close(ours.b_O[layer], block.attn.c_proj.bias)
        torch.testing.assert_close(ours.W_in[layer], block.mlp.c_fc.weight)
        torch.testing.assert_close(ours.b_in[layer], block.mlp.c_fc.bias)
        torch.testing.assert_close(ours.W_out[layer], block.mlp.c_proj.weight)
        torch.testing.assert_close(ours.b_out[layer], block.mlp.c_proj.bias)
    # GPT-2 has as many kv heads as query heads: the two forms agree
    torch.testing.assert_close(ours._W_K, ours.W_K, atol=0, rtol=0)
    torch.testing.assert_close(ours.W_E, hf.transformer.wte.weight)
    torch.testing.assert_close(ours.W_pos, hf.transformer.wpe.weight)
    torch.testing.assert_close(ours.W_U, hf.lm_head.weight.T)
    torch.testing.assert_close(ours.b_U, torch.zeros(53))


def test_llama_grouped_weights_per_kv_head_and_per_query_head(llama):
    hf, ours = llama
    L, H, Hkv, C, D = 2, 4, 2, 48, 16
    assert ours.W_K.shape == (L, H, C, D) and ours._W_K.shape == (L, Hkv, C, D)
    assert ours._b_V.shape == (L, Hkv, D) and ours.b_V.shape == (L, H, D)
    for layer, block in enumerate(hf.model.layers):
        a, m = block.self_attn, block.mlp
        for h in range(H):
            rows = slice(h * D, (h + 1) * D)
            torch.testing.assert_close(ours.W_Q[layer, h], a.q_proj.weight[rows].T)
            torch.testing.assert_close(ours.b_Q[layer, h], a.q_proj.bias[rows])
            torch.testing.assert_close(ours.W_O[layer, h], a.o_proj.weight[:, rows].T)
            g = h // (H // Hkv)  # the kv head query head h reads
            kv = slice(g * D, (g + 1) * D)
            torch.testing.assert_close(ours.W_K[layer, h], a.k_proj.weight[kv].T)
            torch.testing.assert_close(ours.W_V[layer, h], a.v_proj.weight[kv].T)
            torch.testing.assert_close(ours.b_K[layer, h], a.k_proj.bias[kv])
        for g in range(Hkv):
            kv = slice(g * D, (g + 1) * D)
            torch.testing.assert_close(ours._W_K[layer, g], a.k_proj.weight[kv].T)
            torch.testing.assert_close(ours._W_V[layer, g], a.v_proj.weight[kv].T)
            torch.testing.assert_close(ours._b_V[layer, g], a.v_proj.bias[kv])
        torch.testing.assert_close(ours.b_O[layer], a.o_proj.bias)  # attention_bias: o_proj too
        torch.testing.assert_close(ours.W_gate[layer], m.gate_proj.weight.T)
        torch.testing.assert_close(ours.W_in[layer], m.up_proj.weight.T)
        torch.testing.assert_close(ours.b_in[layer], m.up_proj.bias)
        torch.testing.assert_close(ours.W_out[layer], m.down_proj.weight.T)
    torch.testing.assert_close(ours.W_U, hf.lm_head.weight.T)
    with pytest.raises(AttributeError):
        ours.W_pos  # RoPE: no position table  # noqa: B018


@pytest.mark.parametrize("which", ["gpt2", "llama"])
def test_weights_reproduce_the_activations(which, gpt2, llama):
    """hook_q = ln1.hook_normalized @ W_Q + b_Q (the norm's output includes its weight), k and
    v through the expanded weights, and the attention output as the sum of z @ W_O."""
    _, ours = gpt2 if which == "gpt2" else llama
    ids = torch.randint(0, 53, (2, 7))
    with torch.no_grad():
        _, cache = run_with_cache(ours, ids)
    H = ours.W_Q.shape[1]
    groups = H // ours._W_K.shape[1]
    for layer in range(ours.W_Q.shape[0]):
        x = cache["normalized", layer, "ln1"]  # (B, T, C)
        for h in range(H):
            for name, W, b in (("q", ours.W_Q, ours.b_Q), ("k", ours.W_K, ours.b_K)):
                head = h if name == "q" else h // groups
                got = x @ W[layer, h] + b[layer, h]
                torch.testing.assert_close(got, cache[name, layer][:, :, head], **CLOSE)
            got = x @ ours.W_V[layer, h] + ours.b_V[layer, h]
            torch.testing.assert_close(got, cache["v", layer][:, :, h // groups], **CLOSE)
        z = cache["z", layer]  # (B, T, H, D)
        out = torch.einsum("bthd,hdc->btc", z, ours.W_O[layer]) + ours.b_O[layer]
        torch.testing.assert_close(out, cache["attn_out", layer], **CLOSE)


def test_weights_follow_changes_to_the_parameters():
    cfg = LMConfig(vocab_size=41, dim=24, num_layers=2, num_heads=4, num_kv_heads=2, ffn_dim=36)
    model = CausalLM(cfg)
    attn = model.blocks[1].attn
    per_layer = attn.W_Q, attn._W_K, attn.W_O  # views: they see later changes
    with torch.no_grad():
        attn.in_proj.weight.mul_(3.0)
        attn.out_proj.weight.add_(1.0)
        attn.in_proj.bias.fill_(0.5)
    w = attn.in_proj.weight  # rows q (4 * 6) | k (2 * 6) | v (2 * 6)
    torch.testing.assert_close(per_layer[0][2], w[12:18].T, atol=0, rtol=0)
    torch.testing.assert_close(per_layer[1][1], w[30:36].T, atol=0, rtol=0)
    torch.testing.assert_close(per_layer[2][3], attn.out_proj.weight[:, 18:24].T)
    # the stacked model attributes are read afresh at each access
    torch.testing.assert_close(model.W_Q[1, 2], w[12:18].T, atol=0, rtol=0)
    torch.testing.assert_close(model.W_K[1, 3], w[30:36].T, atol=0, rtol=0)
    torch.testing.assert_close(model.b_V[1], torch.full((4, 6), 0.5))
    with torch.no_grad():
        model.tok.weight.zero_()
    assert model.W_E.abs().sum() == 0 and model.W_U.abs().sum() == 0  # tied head


def test_bert_encoder_weights_and_aliases(tmp_path):
    hf = save_bert(tmp_path)  # 24 wide, 3 heads of 8, 2 layers
    ours = load_encoder_model(tmp_path)
    assert ours.blocks is ours.layers
    for layer, block in enumerate(hf.encoder.layer):
        s = block.attention.self
        for h in range(3):
            rows = slice(h * 8, (h + 1) * 8)
            torch.testing.assert_close(ours.W_Q[layer, h], s.query.weight[rows].T)
            torch.testing.assert_close(ours.b_K[layer, h], s.key.bias[rows])
            torch.testing.assert_close(ours.W_V[layer, h], s.value.weight[rows].T)
            out = block.attention.output.dense.weight
            torch.testing.assert_close(ours.W_O[layer, h], out[:, rows].T)
    torch.testing.assert_close(ours.W_E, hf.embeddings.word_embeddings.weight)
    torch.testing.assert_close(ours.W_pos, hf.embeddings.position_embeddings.weight)
    with pytest.raises(AttributeError):
        ours.W_U  # no LM head  # noqa: B018
