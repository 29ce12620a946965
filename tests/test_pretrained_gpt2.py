"""GPT-2 checkpoints written by Hugging Face transformers load with identical logits and greedy
generations."""

import pytest
import torch

from multihead.pretrained import load_causal_lm

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        vocab_size=120,
        n_embd=48,
        n_layer=3,
        n_head=4,
        n_positions=64,
        bos_token_id=0,
        eos_token_id=1,
    )
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():
        for p in hf.parameters():  # larger weights: greedy paths that are not constant
            p.mul_(5)
    path = tmp_path_factory.mktemp("gpt2")
    hf.save_pretrained(path)
    return hf, path


def test_logits_match(saved):
    hf, path = saved
    ours = load_causal_lm(path)
    ids = torch.randint(0, 120, (3, 20))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), hf(ids).logits, atol=1e-5, rtol=1e-4)


def test_greedy_generations_match(saved):
    hf, path = saved
    ours = load_causal_lm(path)
    ids = torch.randint(2, 120, (1, 9))
    expected = hf.generate(
        ids, max_new_tokens=20, do_sample=False, pad_token_id=0, eos_token_id=None
    )
    assert torch.equal(ours.generate(ids, 20), expected)
    assert len(set(expected[0, 9:].tolist())) > 1  # a path that is not constant


def test_left_padded_batch_matches_transformers(saved):
    hf, path = saved
    ours = load_causal_lm(path)
    ids = torch.randint(2, 120, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, :3] = 0
    ids[1, :3] = 0
    expected = hf.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=12,
        do_sample=False,
        pad_token_id=0,
        eos_token_id=None,
    )
    assert torch.equal(ours.generate(ids, 12, attention_mask=mask), expected)


def test_checkpoint_mismatch_names_keys(saved, tmp_path):
    from safetensors.torch import load_file, save_file

    _, path = saved
    weights = load_file(path / "model.safetensors")
    del weights["transformer.h.2.mlp.c_fc.weight"]
    weights["transformer.h.0.ln_1.weight"] = torch.ones(5)
    for name in ("config.json",):
        (tmp_path / name).write_text((path / name).read_text())
    save_file(weights, tmp_path / "model.safetensors")
    with pytest.raises(ValueError) as err:
        load_causal_lm(tmp_path)
    assert "h.2.mlp.c_fc.weight" in str(
        err.value
    ) and "layers.0.norm1.weight: checkpoint (5,)" in str(err.value)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx = True"),
        ({"reorder_and_upcast_attn": True}, "reorder_and_upcast_attn = True"),
        ({"scale_attn_weights": False}, "scale_attn_weights = False"),
        ({"add_cross_attention": True}, "add_cross_attention = True"),
        ({"activation_function": "quick_gelu"}, "activation_function = 'quick_gelu' is not"),
        ({"layer_norm_epsilon": 0}, "layer_norm_epsilon must be a positive number, got 0"),
        ({"layer_norm_epsilon": -1e-5}, "layer_norm_epsilon must be a positive number"),
        ({"n_embd": 0}, "n_embd must be a positive int, got 0"),
        ({"n_head": 5}, "n_embd 48 is not divisible by n_head 5"),
        ({"n_positions": -1}, "n_positions must be a positive int"),
        ({"resid_pdrop": 0.2}, "resid_pdrop 0.2 != embd_pdrop 0.1"),
        ({"attn_pdrop": 1.5}, r"attn_pdrop must be in \[0, 1\)"),
    ],
)
def test_unimplemented_gpt2_flags_are_refused(saved, tmp_path, change, message):
    import json

    _, path = saved
    config = json.loads((path / "config.json").read_text()) | change
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors").write_bytes((path / "model.safetensors").read_bytes())
    with pytest.raises(ValueError, match=message):
        load_causal_lm(tmp_path)


def test_dropout_rates_and_dtype(saved):
    _, path = saved
    ours = load_causal_lm(path, dtype=torch.bfloat16)
    assert ours.config.dropout == 0.1 and ours.config.attn_dropout == 0.1
    assert ours.attention(0).dropout == 0.1 and not ours.training
    assert ours.tok.weight.dtype == torch.bfloat16 and ours.head.weight is ours.tok.weight
