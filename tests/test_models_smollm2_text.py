"""The real decoder carries its tokenizer: SmolLM2-135M-Instruct from its Q4_1 GGUF (the
session's `smollm2` fixture), text in and out, and hooks around its generate."""

from __future__ import annotations

import torch

from multihead.interpret import run_with_cache

PROMPTS = ["The capital of France is", "1, 2, 3, 4,"]


def test_smollm2_text_round_trip(smollm2):
    tok = smollm2.tokenizer
    assert tok is not None and not tok.add_bos  # SmolLM2 was trained without a BOS first
    ids = smollm2.to_tokens(PROMPTS[0])
    assert ids[0].tolist() == tok.encode(PROMPTS[0])
    assert smollm2.to_str_tokens(PROMPTS[0]) == ["The", " capital", " of", " France", " is"]
    assert smollm2.to_string(ids[0]) == PROMPTS[0]
    assert smollm2.to_tokens(PROMPTS[0], prepend_bos=True)[0, 0] == tok.bos_id


def test_smollm2_generate_text(smollm2):
    """generate("text") is the greedy continuation of the prompt's ids; a list of prompts
    (left-padded) gives each prompt's own continuation."""
    texts = smollm2.generate(PROMPTS, 6)
    for prompt, text in zip(PROMPTS, texts, strict=True):
        ids = smollm2.to_tokens(prompt)
        expected = smollm2.to_string(smollm2.generate(ids, 6, eos=smollm2.tokenizer.eos_id)[0])
        assert text == expected and text.startswith(prompt)
        assert smollm2.generate(prompt, 6) == text
    assert texts[0].startswith("The capital of France is Paris")


def test_smollm2_cache_around_generate(smollm2):
    names = ["blocks.17.attn.hook_pattern", "blocks.17.hook_resid_post", "hook_embed"]
    ids = smollm2.to_tokens("When Mary and John went to the store, John gave a drink to")
    out, cache = run_with_cache(smollm2.generate, ids, 4, names=names)
    _, full = run_with_cache(smollm2, out[:, :-1], names=names)
    for name in names:
        torch.testing.assert_close(cache[name], full[name], atol=1e-4, rtol=1e-4)
