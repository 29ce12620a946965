"""ModernBERT: a tiny random checkpoint (4 layers: global, local, local, global; a local window
of 3 tokens each side, shorter than the sentences; distinct RoPE bases) against transformers'
ModernBertModel in eager fp32 (hidden states, attention weights, a padded batch); the Hub's
legacy config keys; the masked-LM checkpoint's 'model.' prefix; packed input; `syntax`.
(Sentence-transformers embeddings, inspect and heads: the "modernbert" case of
test_models_encoders.py and test_cli_encoder_families.py.)"""

import json

import pytest
import torch

from helpers_encoders import SENTENCES, save_tokenizer
from multihead.cli import main
from multihead.pretrained import load_encoder

transformers = pytest.importorskip("transformers")

HALF = 3  # local_attention 6: |q - k| <= 3


def save(directory, *, biases, head=False):
    vocab = save_tokenizer(directory, "wordpiece")
    config = transformers.ModernBertConfig(
        vocab_size=vocab, hidden_size=40, num_hidden_layers=4, num_attention_heads=4,
        intermediate_size=56, local_attention=2 * HALF, global_attn_every_n_layers=3,
        global_rope_theta=500.0, local_rope_theta=40.0, max_position_embeddings=64,
        norm_bias=biases, attention_bias=biases, mlp_bias=biases, pad_token_id=0,
        cls_token_id=2, sep_token_id=3, bos_token_id=2, eos_token_id=3,
        attn_implementation="eager",
    )  # fmt: skip
    torch.manual_seed(1)
    model = (transformers.ModernBertForMaskedLM if head else transformers.ModernBertModel)(config)
    with torch.no_grad():  # every weight random, norms around 1
        for key, p in model.named_parameters():
            p.normal_(1.0 if "norm" in key else 0.0, 0.2)
    model.save_pretrained(directory)
    return model.eval()


@pytest.mark.parametrize("biases", [True, False])
def test_states_and_patterns_equal_transformers(tmp_path, biases):
    hf = save(tmp_path, biases=biases)
    enc = load_encoder(tmp_path)
    assert enc.model.config.local_layers == (1, 2)
    assert isinstance(enc.model.blocks[0].ln1, torch.nn.Identity)
    assert (enc.model.final_norm.bias is not None) == biases
    input_ids, mask = enc.batch(enc.tokenize(SENTENCES[:4]))
    assert mask.sum(1).min() > 2 * HALF + 1  # every text longer than the window
    assert mask.sum(1).min() < mask.shape[1]  # and padding
    with torch.no_grad():
        ref = hf(input_ids=input_ids, attention_mask=mask, output_attentions=True)
        ours = enc(input_ids, mask, return_weights=True)
    real = mask.bool()
    torch.testing.assert_close(
        ours.last_hidden_state[real], ref.last_hidden_state[real], atol=1e-5, rtol=1e-4
    )
    assert len(ours.attentions) == len(ref.attentions) == 4
    T = input_ids.shape[1]
    far = (torch.arange(T)[:, None] - torch.arange(T)[None]).abs() > HALF  # (Tq, Tk)
    pairs = real[:, :, None] & real[:, None, :] & far  # (B, Tq, Tk): real tokens, far apart
    for i, (w, r) in enumerate(zip(ours.attentions, ref.attentions, strict=True)):
        # (B, H, Tq, Tk) -> real queries (n, H, Tk)
        torch.testing.assert_close(
            w.transpose(1, 2)[real], r.transpose(1, 2)[real], atol=1e-6, rtol=1e-5
        )
        beyond = w.permute(0, 2, 3, 1)[pairs]  # (B, H, Tq, Tk) -> (n, H): far real pairs
        if i in (1, 2):  # local: nothing beyond the window
            assert beyond.abs().max() == 0
        else:  # global: real keys beyond the window take weight
            assert beyond.abs().max() > 1e-3


def test_hub_config_keys_and_masked_lm_checkpoint(tmp_path):
    """The Hub's configs say global_attn_every_n_layers and global/local_rope_theta (no
    layer_types, no rope_parameters); ModernBertForMaskedLM's keys sit under 'model.' beside
    the head, which is left out."""
    hf = save(tmp_path, biases=True, head=True)
    path = tmp_path / "config.json"
    config = json.loads(path.read_text())
    assert "layer_types" in config and "rope_parameters" in config
    del config["layer_types"], config["rope_parameters"]
    config.update(global_attn_every_n_layers=3, global_rope_theta=500.0, local_rope_theta=40.0)
    path.write_text(json.dumps(config))
    enc = load_encoder(tmp_path)
    cfg = enc.model.config
    assert (cfg.local_layers, cfg.global_rope_theta, cfg.local_rope_theta) == ((1, 2), 500.0, 40.0)
    ids = enc.tokenize(SENTENCES[:3])
    input_ids, mask = enc.batch(ids)
    with torch.no_grad():
        ref = hf.model(input_ids=input_ids, attention_mask=mask).last_hidden_state
        padded = enc(input_ids, mask).last_hidden_state
        packed = enc(
            torch.tensor([t for x in ids for t in x]), lengths=[len(x) for x in ids]
        ).last_hidden_state
    real = mask.bool()
    torch.testing.assert_close(padded[real], ref[real], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(packed, ref[real], atol=1e-5, rtol=1e-4)  # (N, C), in order

    # a legacy key that disagrees with rope_parameters, a scaled RoPE: refused by name
    for bad in (
        {"global_rope_theta": 500.0, "rope_parameters": {"full_attention": {"rope_theta": 9.0}}},
        {"rope_parameters": {"sliding_attention": {"rope_type": "yarn", "factor": 2.0}}},
    ):
        path.write_text(json.dumps({**config, **bad}))
        with pytest.raises(ValueError, match="rope"):
            load_encoder(tmp_path)


def test_syntax_reads_modernbert(tmp_path):
    save(tmp_path / "model", biases=False)
    out = tmp_path / "syntax.json"
    assert main(["syntax", "--model", str(tmp_path / "model"), "-o", str(out)]) == 0
    assert out.stat().st_size > 100


def test_fold_and_centre_keep_the_output(tmp_path):
    """TransformerLens' weight processing on ModernBERT (LayerNorm; its first layer has no
    norm before attention, an Identity): the final hidden states are unchanged, and the
    writers are centred (a LayerNorm model, though block 0's ln1 is no LayerNorm)."""
    from multihead.modules.folding import process_weights_

    save(tmp_path, biases=True)
    encoder = load_encoder(tmp_path).model
    ids = torch.randint(4, 30, (2, 9))
    with torch.no_grad():
        want = encoder(ids).last_hidden_state
        process_weights_(encoder, center_unembed=False)
        got = encoder(ids).last_hidden_state
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    down = encoder.layers[0].ffn.down.weight.detach()  # (C, hidden): each column's mean over C is 0
    assert float(down.mean(0).abs().max()) < 1e-6
