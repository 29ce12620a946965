"""Hooks around the calls that run a model several times: `SentenceEncoder.encode` (packed
batches) and `generate` (a prefill, then one token per step from KV caches).

References: each sentence run alone through the padded forward (encode), and one full forward
over the generated sequence (generate), observed with the same hooks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers_gpt2 import save_gpt2
from helpers_llama import save_causal
from multihead.interpret import capture, hooks, run_with_cache, run_with_hooks
from multihead.pretrained import load_causal_lm, load_encoder

SENTENCES = ["Hello world.", "A much longer sentence about cats and their dogs.", "Hi", "Ok then"]


@pytest.fixture(scope="module")
def minilm():
    return load_encoder()


@pytest.fixture(scope="module", params=["gpt2", "llama", "mistral-window"])
def lm(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp(request.param)
    if request.param == "gpt2":
        save_gpt2(directory, scale=3.0)
    else:
        save_causal(directory, request.param)
    return load_causal_lm(directory)


def _alone(encoder, text):
    ids = torch.tensor([encoder.tokenize([text])[0]])
    return ids


def test_capture_around_encode_gives_each_sentence_alone(minilm):
    with capture(minilm) as records:
        observed = minilm.encode(SENTENCES)
    layers = len(minilm.model.layers)
    assert len(records) == layers * len(SENTENCES)
    for i, text in enumerate(SENTENCES):
        with capture(minilm) as alone:
            minilm(_alone(minilm, text))
        mine = records[i * layers : (i + 1) * layers]
        assert [r.name for r in mine] == alone.names()
        for got, expected in zip(mine, alone, strict=True):
            torch.testing.assert_close(got.weights, expected.weights, atol=1e-6, rtol=1e-5)
            assert got.weights.shape[-1] == _alone(minilm, text).shape[1]
    # the embeddings are those of the packed path
    np.testing.assert_allclose(observed, minilm.encode(SENTENCES), atol=1e-5)


def test_run_with_cache_around_encode_gives_a_cache_per_text(minilm):
    embeddings, caches = run_with_cache(minilm.encode, SENTENCES, names=lambda n: "blocks.2" in n)
    assert len(caches) == len(SENTENCES)
    for text, cache in zip(SENTENCES, caches, strict=True):
        _, expected = run_with_cache(minilm, _alone(minilm, text), names=lambda n: "blocks.2" in n)
        assert set(cache) == set(expected)
        for name in expected:
            torch.testing.assert_close(cache[name], expected[name], atol=1e-6, rtol=1e-5)
    np.testing.assert_allclose(embeddings, minilm.encode(SENTENCES), atol=1e-5)


def test_hooks_around_encode_change_the_embedding(minilm):
    """A hook that zeroes head 3 of layer 1 acts on encode as on each sentence's forward."""

    def zero(z, name):
        z = z.clone()
        z[:, :, 3] = 0
        return z

    fwd_hooks = [("blocks.1.attn.hook_z", zero)]
    with hooks(minilm, fwd_hooks):
        ablated = minilm.encode(SENTENCES, convert_to_tensor=True)
    assert torch.equal(
        ablated,
        run_with_hooks(minilm.encode, SENTENCES, fwd_hooks=fwd_hooks, convert_to_tensor=True),
    )
    for i, text in enumerate(SENTENCES):
        ids = _alone(minilm, text)
        hidden = run_with_hooks(minilm, ids, fwd_hooks=fwd_hooks).last_hidden_state
        pooled = minilm.pool(hidden, torch.ones_like(ids))
        expected = torch.nn.functional.normalize(pooled, dim=1)[0]
        torch.testing.assert_close(ablated[i], expected, atol=1e-6, rtol=1e-5)
    assert not torch.allclose(ablated, minilm.encode(SENTENCES, convert_to_tensor=True))


def _prompts(lm):
    torch.manual_seed(1)
    ids = torch.randint(0, lm.config.vocab_size - 10, (2, 5))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0  # row 1 left-padded
    return ids, mask


@pytest.mark.parametrize("padded", [False, True])
def test_run_with_cache_around_generate_equals_a_full_forward(lm, padded):
    """One cache over the generated sequence: each step's activations at their positions; the
    same as one forward over the sequence (its last token was never fed back), at every real
    position. mistral-window: window 5 < the sequence, the cache holds the latest keys."""
    ids, mask = _prompts(lm)
    kwargs = {"attention_mask": mask} if padded else {}
    new = 6
    out, cache = run_with_cache(lm.generate, ids, new, **kwargs)
    assert out.shape == (2, 5 + new)
    sequence = out[:, :-1]
    full_mask = torch.cat([mask, torch.ones(2, new - 1, dtype=torch.long)], 1)
    _, expected = run_with_cache(lm, sequence, attention_mask=full_mask if padded else None)
    assert set(cache) == set(expected)
    real = full_mask.bool() if padded else torch.ones_like(full_mask, dtype=torch.bool)
    for name in expected:
        got, want = cache[name], expected[name]
        assert got.shape == want.shape, name
        if name.endswith(("hook_pattern", "hook_attn_scores")):
            rows = real[:, None, :, None].expand_as(got)  # real queries; every key
            both_inf = torch.isneginf(got) & torch.isneginf(want)
            got = torch.where(both_inf, 0.0, got)[rows]
            want = torch.where(both_inf, 0.0, want)[rows]
        else:
            got, want = got[real], want[real]
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4, msg=name)


def test_capture_and_hooks_around_generate(lm):
    ids, _ = _prompts(lm)
    new = 4
    with capture(lm) as records:
        out = lm.generate(ids, new)
    layers = lm.config.num_layers
    assert len(records) == layers * new  # the prefill, then one record per layer and step
    with capture(lm) as full:
        lm(out[:, :-1])
    last = records[-layers:]  # the last step: one query, every key it attended
    for step, ref in zip(last, full, strict=True):
        Tk = step.weights.shape[-1]
        torch.testing.assert_close(step.weights[:, :, 0], ref.weights[:, :, -1, -Tk:])

    # a hook that changes the model steers generation as in a hand-written greedy loop
    def zero(z, name):
        z = z.clone()
        z[:, :, 0] = 0
        return z

    fwd_hooks = [("blocks.0.attn.hook_z", zero)]
    with hooks(lm, fwd_hooks):
        steered = lm.generate(ids, new)
    assert torch.equal(steered, run_with_hooks(lm.generate, ids, new, fwd_hooks=fwd_hooks))
    tokens = ids
    for _ in range(new):
        logits = run_with_hooks(lm, tokens, fwd_hooks=fwd_hooks)
        tokens = torch.cat([tokens, logits[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(steered, tokens)


def test_refusals(lm):
    ids, _ = _prompts(lm)
    with capture(lm), pytest.raises(ValueError, match="compiled steps, which carry no hooks"):
        lm.generate(ids, 2, compile=True)
    with pytest.raises(TypeError, match="returned a generator"):
        run_with_cache(lm.generate_stream, ids, 2)

    class Twice(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def twice(self, x):
            return self.inner(x), self.inner(x)

    with pytest.raises(ValueError, match="ran the model 2 times"):
        run_with_cache(Twice(lm).twice, ids)
    with pytest.raises(TypeError, match="bound method"):
        run_with_cache(lambda x: x, ids)
