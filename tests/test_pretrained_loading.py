"""load_encoder on random small BERT checkpoints written by Hugging Face transformers."""

import json

import pytest
import torch

from helpers_bert import VOCAB, save_bert
from multihead.pretrained import load_encoder


def hf_forward(model, ids, mask):
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, output_attentions=True)
    return out.last_hidden_state, out.attentions


@pytest.mark.parametrize("layout", ["safetensors", "bin", "prefixed"])
@pytest.mark.parametrize("act", ["gelu", "gelu_new", "relu"])
def test_random_bert_matches_transformers(tmp_path, layout, act):
    kwargs = dict(hidden_act=act, attn_implementation="eager")
    if layout == "prefixed":  # BertForMaskedLM: 'bert.' prefix plus an unused 'cls.' head
        hf = save_bert(tmp_path, cls="BertForMaskedLM", **kwargs).bert
    else:
        hf = save_bert(tmp_path, safetensors=layout == "safetensors", **kwargs)
    enc = load_encoder(tmp_path)
    assert not enc.training
    ids = torch.randint(5, 40, (3, 9))
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[1, 6:] = 0
    mask[2, 2:] = 0
    ours = enc(ids, mask, return_weights=True)
    ref_h, ref_w = hf_forward(hf, ids, mask)
    real = mask.bool()
    torch.testing.assert_close(ours.last_hidden_state[real], ref_h[real], atol=1e-5, rtol=1e-4)
    for w, r in zip(ours.attentions, ref_w, strict=True):
        torch.testing.assert_close(
            w.transpose(1, 2)[real], r.transpose(1, 2)[real], atol=1e-6, rtol=1e-5
        )


def test_token_types_and_config_fields(tmp_path):
    hf = save_bert(tmp_path, type_vocab_size=3, layer_norm_eps=1e-6, num_hidden_layers=3)
    enc = load_encoder(tmp_path)
    assert len(enc.model.layers) == 3 and enc.model.config.layer_norm_eps == 1e-6
    ids = torch.randint(5, 40, (2, 7))
    types = torch.randint(0, 3, (2, 7))
    with torch.no_grad():
        ref = hf(input_ids=ids, token_type_ids=types).last_hidden_state
    torch.testing.assert_close(
        enc(ids, token_type_ids=types).last_hidden_state, ref, atol=1e-5, rtol=1e-4
    )


def test_fixed_padding_in_tokenizer_json_does_not_leak(tmp_path):
    save_bert(tmp_path)
    enc = load_encoder(tmp_path)
    assert enc.tokenize(["the cat"]) == [[2, 31, 32, 3]]  # [CLS] the cat [SEP], no padding to 32
    a = enc.encode(["the cat sat on the mat", "dog"])
    b = enc.encode(["dog"])
    torch.testing.assert_close(torch.from_numpy(a[1]), torch.from_numpy(b[0]), atol=1e-6, rtol=1e-5)


def test_strict_key_checks_name_the_keys(tmp_path):
    from safetensors.torch import load_file, save_file

    save_bert(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    broken = dict(weights)
    del broken["encoder.layer.1.attention.self.key.weight"]
    broken["encoder.layer.0.extra.weight"] = torch.zeros(1)
    broken["embeddings.word_embeddings.weight"] = torch.zeros(5, 24)
    save_file(broken, tmp_path / "model.safetensors")
    with pytest.raises(ValueError) as err:
        load_encoder(tmp_path)
    msg = str(err.value)
    assert "missing from the checkpoint: encoder.layer.1.attention.self.key.weight" in msg
    assert "unexpected in the checkpoint: encoder.layer.0.extra.weight |" in msg  # only that one
    assert (
        f"embeddings.word_embeddings.weight: checkpoint (5, 24) != model ({len(VOCAB)}, 24)" in msg
    )


def test_bad_model_directories(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_encoder(tmp_path / "nope")
    save_bert(tmp_path / "m")
    (tmp_path / "m" / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"lacks tokenizer\.json"):
        load_encoder(tmp_path / "m")
    save_bert(tmp_path / "w")
    (tmp_path / "w" / "model.safetensors").unlink()
    with pytest.raises(
        FileNotFoundError,
        match=r"lacks model\.safetensors, model\.safetensors\.index\.json or pytorch_model\.bin",
    ):
        load_encoder(tmp_path / "w")
    save_bert(tmp_path / "c")
    (tmp_path / "c" / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"lacks config\.json"):
        load_encoder(tmp_path / "c")


def test_truncated_and_corrupted_safetensors(tmp_path):
    save_bert(tmp_path)
    path = tmp_path / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="corrupted or truncated"):
        load_encoder(tmp_path)
    path.write_bytes(b"\x00" * 64)
    with pytest.raises(ValueError, match="corrupted or truncated"):
        load_encoder(tmp_path)


def test_unsupported_architecture_is_named(tmp_path):
    save_bert(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["model_type"], cfg["architectures"] = "gpt2", ["GPT2LMHeadModel"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(
        ValueError,
        match=r"unsupported architecture: model_type 'gpt2' \(architectures: GPT2LMHeadModel\)",
    ):
        load_encoder(tmp_path)
    cfg["model_type"], cfg["position_embedding_type"] = "bert", "relative_key"
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="relative_key"):
        load_encoder(tmp_path)


def test_position_table_limit(tmp_path):
    save_bert(tmp_path)
    enc = load_encoder(tmp_path)
    with pytest.raises(ValueError, match=r"sequence length 65 exceeds the position table \(64"):
        enc(torch.ones(1, 65, dtype=torch.long))
