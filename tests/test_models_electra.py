"""ELECTRA: the encoder inside a discriminator checkpoint (ElectraForPreTraining, keys under
'electra.', its prediction head left out) equals transformers' ElectraModel on the same weights;
embeddings narrower than the stream go through embeddings_project; `multihead syntax` reads it.
(Hidden states, attention weights, sentence-transformers embeddings, inspect and heads: the
"electra" case of test_models_encoders.py and test_cli_encoder_families.py.)"""

import pytest
import torch

from helpers_encoders import SENTENCES, save_tokenizer
from multihead.cli import main
from multihead.pretrained import load_encoder

transformers = pytest.importorskip("transformers")


def test_discriminator_checkpoint_and_syntax(tmp_path, capsys):
    vocab = save_tokenizer(tmp_path, "wordpiece")
    config = transformers.ElectraConfig(
        vocab_size=vocab, embedding_size=16, hidden_size=24, num_hidden_layers=2,
        num_attention_heads=3, intermediate_size=40, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.ElectraForPreTraining(config).eval()
    with torch.no_grad():
        for key, p in model.named_parameters():
            p.normal_(1.0 if "LayerNorm" in key else 0.0, 0.2)
    model.save_pretrained(tmp_path)
    enc = load_encoder(tmp_path)
    assert enc.model.embeddings_project is not None
    assert enc.model.embeddings.word_embeddings.weight.shape == (vocab, 16)
    input_ids, mask = enc.batch(enc.tokenize(SENTENCES[:3]))
    with torch.no_grad():
        ref = model.electra(input_ids=input_ids, attention_mask=mask).last_hidden_state
        ours = enc(input_ids, mask).last_hidden_state
    real = mask.bool()
    torch.testing.assert_close(ours[real], ref[real], atol=1e-5, rtol=1e-4)
    out = tmp_path / "syntax.json"
    assert main(["syntax", "--model", str(tmp_path), "-o", str(out)]) == 0
    assert out.stat().st_size > 100
