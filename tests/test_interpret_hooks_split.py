"""Per-head attention inputs (hook_attn_in, hook_q_input, hook_k_input, hook_v_input; computed
only when hooked) against Hugging Face's modules on random GPT-2 and Llama (grouped kv heads)
checkpoints: a patched head's q / k equals HF's norm and projection applied to the patch, the
other heads are untouched; and run_with_cache's names_filter and ungroup_grouped_query_attention."""

import pytest
import torch

from helpers_llama import save_causal
from multihead.interpret import hook_names, run_with_cache, run_with_hooks
from multihead.pretrained import load_causal_lm

transformers = pytest.importorskip("transformers")

CLOSE = dict(atol=1e-5, rtol=1e-4)
B, T = 2, 7
SPLIT = ("hook_attn_in", "hook_q_input", "hook_k_input", "hook_v_input")


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpt2")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=61, n_embd=30, n_layer=2, n_head=5, n_positions=32)
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    hf.save_pretrained(path)
    return hf, load_causal_lm(path).eval()


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama")
    hf = save_causal(path, "llama")  # 4 query heads, 2 kv heads, head_dim 12
    return hf, load_causal_lm(path).eval()


def test_split_inputs_are_on_request_and_reading_them_changes_nothing(gpt2):
    _, model = gpt2
    ids = torch.randint(0, 61, (B, T))
    assert all(f"blocks.1.{p}" in hook_names(model) for p in SPLIT)
    with torch.no_grad():
        plain, default = run_with_cache(model, ids)
        read, cache = run_with_cache(
            model, ids, names=[n for n in hook_names(model) if n.endswith(SPLIT)]
        )
        _, by_predicate = run_with_cache(model, ids, names=lambda n: True)
    assert not any(n.endswith(SPLIT) for n in default)  # not computed unless asked
    assert not any(n.endswith(SPLIT) for n in by_predicate)  # by name only
    torch.testing.assert_close(read, plain, **CLOSE)
    for layer in range(2):
        resid = default["resid_pre", layer][:, :, None].expand(B, T, 5, 30)
        for p in SPLIT:
            torch.testing.assert_close(cache[f"blocks.{layer}.{p}"], resid)


def test_patching_one_heads_query_input_changes_that_head_only(gpt2):
    hf, model = gpt2
    ids, other = torch.randint(0, 61, (B, T)), torch.randint(0, 61, (B, T))
    layer, head, D = 1, 3, 6
    with torch.no_grad():
        hidden = hf(other, output_hidden_states=True).hidden_states[layer]  # other's resid_pre
        block = hf.transformer.h[layer]
        expected_q = block.attn.c_attn(block.ln_1(hidden))[..., head * D : (head + 1) * D]
        _, clean = run_with_cache(model, ids)

        def patch(x, name):
            x = x.clone()
            x[:, :, head] = hidden
            return x

        seen = {}
        patched = run_with_hooks(
            model,
            ids,
            fwd_hooks=[
                (f"blocks.{layer}.hook_q_input", patch),
                (f"blocks.{layer}.attn.hook_q", lambda q, n: seen.setdefault("q", q.clone())),
            ],
        )
    q = seen["q"]
    torch.testing.assert_close(q[:, :, head], expected_q, **CLOSE)
    others = [h for h in range(5) if h != head]
    torch.testing.assert_close(q[:, :, others], clean["q", layer][:, :, others], **CLOSE)
    assert not torch.allclose(patched, clean["logits"], atol=1e-4)


def test_llama_key_input_per_kv_head(llama):
    hf, model = llama
    ids, other = torch.randint(0, 96, (B, T)), torch.randint(0, 96, (B, T))
    layer, g, D = 1, 0, 12
    with torch.no_grad():
        hidden = hf(other, output_hidden_states=True).hidden_states[layer]
        block = hf.model.layers[layer]
        expected_k = block.self_attn.k_proj(block.input_layernorm(hidden))[..., g * D : (g + 1) * D]
        _, clean = run_with_cache(model, ids)

        def patch(x, name):
            assert x.shape == (B, T, 2, 48)  # per kv head
            x = x.clone()
            x[:, :, g] = hidden
            return x

        seen = {}
        run_with_hooks(
            model,
            ids,
            fwd_hooks=[
                (f"blocks.{layer}.hook_k_input", patch),
                (f"blocks.{layer}.attn.hook_k", lambda k, n: seen.setdefault("k", k.clone())),
            ],
        )
    torch.testing.assert_close(seen["k"][:, :, g], expected_k, **CLOSE)
    torch.testing.assert_close(seen["k"][:, :, 1], clean["k", layer][:, :, 1], **CLOSE)


def test_names_filter_alias_and_ungrouped_keys(llama):
    _, model = llama
    ids = torch.randint(0, 96, (B, T))
    with torch.no_grad():
        _, by_names = run_with_cache(model, ids, names=lambda n: n.endswith(("hook_k", "hook_v")))
        _, by_filter = run_with_cache(model, ids, names_filter=["blocks.0.attn.hook_k"])
        _, ungrouped = run_with_cache(
            model, ids, names_filter=lambda n: "attn" in n, ungroup_grouped_query_attention=True
        )
    torch.testing.assert_close(by_filter["k", 0], by_names["k", 0], atol=0, rtol=0)
    assert list(by_filter) == ["blocks.0.attn.hook_k"]
    for layer in range(2):
        for name in ("k", "v", "rot_k"):
            grouped = by_names["k" if name == "rot_k" else name, layer]
            assert ungrouped[name, layer].shape == (B, T, 4, 12)
            if name != "rot_k":  # query head h reads kv head h // 2
                for h in range(4):
                    torch.testing.assert_close(
                        ungrouped[name, layer][:, :, h], grouped[:, :, h // 2]
                    )
        assert ungrouped["q", layer].shape == (B, T, 4, 12)
    with pytest.raises(TypeError, match="names_filter"):
        run_with_cache(model, ids, names=["hook_embed"], names_filter=["hook_embed"])
