"""process_weights_ (fold_ln, center_writing_weights, center_unembed) against the unprocessed
model and Hugging Face: random GPT-2 (LayerNorm, random norm weights and biases) and Llama
(RMSNorm, grouped kv heads, tied and untied) checkpoints, and a pre-norm Encoder stack."""

import copy

import pytest
import torch

from helpers_llama import save_causal
from multihead.interpret import run_with_cache
from multihead.modules import Encoder, StackConfig
from multihead.modules.norm import LayerNormPre, RMSNormPre
from multihead.pretrained import BertConfig, BertEncoder, load_causal_lm

transformers = pytest.importorskip("transformers")

CLOSE = dict(atol=1e-5, rtol=1e-4)
B, T = 2, 7


def centred(logits):
    return logits - logits.mean(-1, keepdim=True)


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpt2")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=61, n_embd=30, n_layer=3, n_head=5, n_positions=32)
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():  # norms and biases random (init: ones / zeros), so folding shows
        for name, p in hf.named_parameters():
            if "ln" in name or name.endswith("bias"):
                p.normal_(1.0 if "ln" in name and name.endswith("weight") else 0.0, 0.3)
    hf.save_pretrained(path)
    return hf, load_causal_lm(path).eval()


@pytest.fixture(scope="module", params=["llama", "llama-mqa-tied"])
def llama(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    hf = save_causal(path, request.param)
    return hf, load_causal_lm(path).eval()


def test_gpt2_folding_keeps_the_logits(gpt2):
    hf, model = gpt2
    ids = torch.randint(0, 61, (B, T))
    with torch.no_grad():
        ref = hf(ids).logits
        before = model(ids)
        folded = copy.deepcopy(model).process_weights_(center_unembed=False)
        after = folded(ids)
        full = copy.deepcopy(model).process_weights_()(ids)
    torch.testing.assert_close(before, ref, **CLOSE)
    torch.testing.assert_close(after, before, **CLOSE)  # fold_ln + centring: same logits
    # centring the unembedding shifts each position's logits by a constant
    torch.testing.assert_close(full, centred(before), **CLOSE)
    torch.testing.assert_close(full.log_softmax(-1), before.log_softmax(-1), **CLOSE)
    assert not torch.allclose(full, before, atol=1e-3)
    # the norms are scale-only; the writers and the unembedding are centred
    assert all(
        isinstance(b.ln1, LayerNormPre) and isinstance(b.ln2, LayerNormPre) for b in folded.blocks
    )
    assert isinstance(folded.ln_final, LayerNormPre) and not list(folded.ln_final.parameters())
    for W in (folded.W_E, folded.W_pos, folded.W_O, folded.b_O, folded.W_out, folded.b_out):
        torch.testing.assert_close(W.mean(-1), torch.zeros(W.shape[:-1]), atol=1e-6, rtol=0)
    assert folded.W_E.data_ptr() != folded.W_U.data_ptr()  # untied before folding


@pytest.mark.filterwarnings("ignore:center_writing_weights is skipped")
def test_after_folding_normalized_times_weights_is_q_k_v(gpt2, llama):
    for _, model in (gpt2, llama):
        folded = copy.deepcopy(model).process_weights_()
        ids = torch.randint(0, 61, (B, T))
        with torch.no_grad():
            _, cache = run_with_cache(folded, ids)
        groups = folded.W_Q.shape[1] // folded._W_K.shape[1]
        for layer in range(folded.W_Q.shape[0]):
            x = cache["normalized", layer, "ln1"]
            # scale-only: the normalised input is the stream over its scale (centred for LN)
            resid = cache["resid_pre", layer]
            if isinstance(folded.blocks[layer].ln1, LayerNormPre):
                resid = resid - resid.mean(-1, keepdim=True)
            torch.testing.assert_close(x, resid / cache["scale", layer, "ln1"], **CLOSE)
            for h in range(folded.W_Q.shape[1]):
                q = x @ folded.W_Q[layer, h] + folded.b_Q[layer, h]
                k = x @ folded.W_K[layer, h] + folded.b_K[layer, h]
                v = x @ folded.W_V[layer, h] + folded.b_V[layer, h]
                torch.testing.assert_close(q, cache["q", layer][:, :, h], **CLOSE)
                torch.testing.assert_close(k, cache["k", layer][:, :, h // groups], **CLOSE)
                torch.testing.assert_close(v, cache["v", layer][:, :, h // groups], **CLOSE)


def test_llama_rmsnorm_folds_without_centring(llama):
    hf, model = llama
    ids = torch.randint(0, 96, (B, T))
    folded = copy.deepcopy(model)
    with pytest.warns(UserWarning, match="RMSNorm"):
        folded.process_weights_()
    with torch.no_grad():
        ref, before, after = hf(ids).logits, model(ids), folded(ids)
        tokens = folded.generate(ids[:1, :4], 5)
        expected = model.generate(ids[:1, :4], 5)
    torch.testing.assert_close(before, ref, **CLOSE)
    torch.testing.assert_close(after, centred(before), **CLOSE)
    assert all(isinstance(b.ln1, RMSNormPre) for b in folded.blocks)
    assert isinstance(folded.ln_final, RMSNormPre)
    # no centring of the writers: W_E keeps its (nonzero) mean along d_model
    torch.testing.assert_close(folded.W_E, model.W_E, atol=0, rtol=0)
    assert torch.equal(tokens, expected)
    assert model.config.tie_embeddings == (hf.config.tie_word_embeddings is True)


def test_pre_norm_encoder_stack_folds_and_keeps_its_output():
    stack = Encoder(StackConfig(dim=24, num_layers=2, num_heads=3, ffn_dim=40)).eval()
    with torch.no_grad():
        for name, p in stack.named_parameters():
            if "norm" in name:
                p.normal_(1.0 if name.endswith("weight") else 0.0, 0.3)
        x = torch.randn(B, T, 24)
        before = stack(x)
        after = stack.process_weights_(center_unembed=False)(x)
    torch.testing.assert_close(after, before, **CLOSE)
    assert isinstance(stack.blocks[0].ln1, LayerNormPre)
    with pytest.raises(ValueError, match="no unembedding"):
        stack.process_weights_()


def test_post_norm_bert_is_refused_by_name():
    bert = BertEncoder(BertConfig(41, 30, 2, 5, 44, max_position_embeddings=32)).eval()
    with pytest.raises(ValueError, match="post-norm"):
        bert.process_weights_()
    with pytest.raises(TypeError, match="fold_ln"):
        bert.process_weights_(fold_ln=1)
