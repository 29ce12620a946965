"""Llama, Mistral and Qwen2 checkpoints written by Hugging Face transformers load into CausalLM
with the same logits, greedy generations (single and left-padded), and KV-cache decoding equal
to the full forward; one random small model per feature."""

import dataclasses

import pytest
import torch

from helpers_llama import CASES, VOCAB, load_hf, save_causal
from multihead import CausalLM
from multihead.pretrained import load_causal_lm

pytest.importorskip("transformers")

# What each case exercises: config changes that switch its feature off, each of which must
# change the logits (so the parity below cannot pass with the feature ignored). head_dim and
# the biases change shapes: the key map checks those.
FEATURES = {
    "llama-theta-linear": [{"rope_theta": 10000.0}, {"rope_scaling": None}],
    "llama-dynamic": [{"rope_scaling": None, "max_positions": 64}],
    "llama3": [{"rope_scaling": None}],
    "llama-yarn": [{"rope_scaling": None}],
    "mistral-window": [{"sliding_window": None}],
    "qwen2-window": [{"sliding_window": None}, {"full_attention_layers": ()}],
}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """name -> (directory, a function giving the transformers model)."""
    cache = {}

    def get(name):
        if name not in cache:
            path = tmp_path_factory.mktemp(name)
            hf = save_causal(path, name)
            # dynamic RoPE keeps state between calls in transformers: a fresh model each time
            cache[name] = (path, (lambda: load_hf(path)) if "dynamic" in name else (lambda: hf))
        return cache[name]

    return get


def real_positions(mask):
    """Positions of left-padded rows counted over real tokens, as CausalLM does."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def _max_diff(a, b):
    return float((a - b).abs().max())


@pytest.mark.parametrize("name", list(CASES))
def test_logits_match_transformers(saved, name):
    path, hf = saved(name)
    ours = load_causal_lm(path)
    assert not ours.training and ours.tok.weight.dtype == torch.float32
    T = 24 if name == "llama-dynamic" else 20  # dynamic: past max_position_embeddings (16)
    torch.manual_seed(1)
    ids = torch.randint(0, VOCAB, (3, T))
    mask = torch.ones(3, T, dtype=torch.long)
    mask[1, :4] = 0  # left padding
    mask[2, :9] = 0
    with torch.no_grad():
        ref = hf()(ids).logits
        assert _max_diff(ours(ids), ref) <= 1e-5
        ref_pad = hf()(ids, attention_mask=mask, position_ids=real_positions(mask)).logits
        real = mask.bool()
        assert _max_diff(ours(ids, attention_mask=mask)[real], ref_pad[real]) <= 1e-5
        for change in FEATURES.get(name, []):  # the feature is not a no-op
            plain = CausalLM(dataclasses.replace(ours.config, **change)).eval()
            plain.load_state_dict(ours.state_dict())
            assert _max_diff(plain(ids), ref) > 1e-2, change


@pytest.mark.parametrize("name", list(CASES))
def test_greedy_generation_matches(saved, name):
    path, hf = saved(name)
    ours = load_causal_lm(path)
    torch.manual_seed(2)
    ids = torch.randint(0, VOCAB, (1, 9))
    new = 12  # llama-dynamic: 21 tokens, past max_position_embeddings (16)
    expected = hf().generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=new,
        do_sample=False,
        pad_token_id=0,
        eos_token_id=None,
    )
    assert torch.equal(ours.generate(ids, new), expected)
    generated = set(expected[0, 9:].tolist())

    batch = torch.randint(0, VOCAB, (3, 8))
    mask = torch.ones(3, 8, dtype=torch.long)
    mask[1, :3] = 0
    mask[2, :6] = 0
    batch[mask == 0] = 0
    expected = hf().generate(
        batch,
        attention_mask=mask,
        max_new_tokens=8,
        do_sample=False,
        pad_token_id=0,
        eos_token_id=None,
    )
    assert torch.equal(ours.generate(batch, 8, attention_mask=mask), expected)
    generated |= set(expected[:, 8:].flatten().tolist())
    assert len(generated) > 5  # paths that are not constant


@pytest.mark.parametrize("name", list(CASES))
def test_kv_cache_decoding_equals_full_forward(saved, name):
    ours = load_causal_lm(saved(name)[0])
    T = 13  # dynamic: within max_position_embeddings (past it, see the README)
    torch.manual_seed(3)
    ids = torch.randint(0, VOCAB, (2, T))
    mask = torch.ones(2, T, dtype=torch.long)
    mask[1, :5] = 0
    with torch.no_grad():
        full = ours(ids, attention_mask=mask)
        for chunks in ([6, 1, 3, 1], [1] * T):
            caches = ours.make_caches(2, max_length=T)
            start, steps = 0, []
            while start < T:
                n = chunks[len(steps)] if len(steps) < len(chunks) else 1
                part, part_mask = ids[:, start : start + n], mask[:, start : start + n]
                pos = real_positions(mask)[:, start : start + n]
                steps.append(ours(part, attention_mask=part_mask, caches=caches, positions=pos))
                start += n
            cached = torch.cat(steps, dim=1)
            real = mask.bool()
            assert _max_diff(cached[real], full[real]) <= 1e-5


def test_config_fields_reach_the_model(saved):
    c = load_causal_lm(saved("llama-head-dim-biases")[0]).config
    assert (c.head_dim, c.qkv_bias, c.out_bias, c.mlp_bias, c.norm_eps) == (
        16,
        True,
        True,
        True,
        1e-5,
    )
    m = load_causal_lm(saved("llama-mqa-tied")[0])
    assert m.head.weight is m.tok.weight and m.attention(0).num_kv_heads == 1
    q = load_causal_lm(saved("qwen2-window")[0])
    assert [q.config.window(i) for i in range(3)] == [None, 5, 5]
    assert q.attention(0).in_proj.bias is not None and q.attention(0).out_proj.bias is None
    assert [c.window for c in q.make_caches(1)] == [None, 5, 5]
    assert load_causal_lm(saved("qwen2")[0]).config.sliding_window is None  # use_sliding_window off
