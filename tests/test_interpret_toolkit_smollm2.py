"""Cache algebra and batched patching on real weights (the SmolLM2-135M GGUF): the full
decomposition sums to the final stream and, through the frozen final norm, to the logit
difference the model computed; the batched engine's head fractions equal explicit one-by-one
patching of those heads."""

import pytest
import torch

from multihead.interpret import act_name, patch, run_with_cache, run_with_hooks


@pytest.fixture(scope="module")
def pair(smollm2):
    ids = smollm2.to_tokens("When Mary and John went to the store, John gave a drink to")
    corrupted = smollm2.to_tokens("When Mary and John went to the store, Tom gave a drink to")
    assert ids.shape == corrupted.shape
    io, s = smollm2.to_single_token(" Mary"), smollm2.to_single_token(" John")
    return ids, corrupted, io, s


def test_decomposition_sums_to_the_logit_difference(smollm2, pair):
    ids, _, io, s = pair
    with torch.no_grad():
        logits, cache = run_with_cache(smollm2, ids)
    full = cache.get_full_resid_decomposition(pos_slice=-1)  # (n, 1, C)
    torch.testing.assert_close(full.sum(0), cache["resid_post", 29][:, -1], atol=2e-3, rtol=1e-5)
    attrs = cache.logit_attrs(full, torch.tensor([io]), torch.tensor([s]), pos_slice=-1)
    diff = logits[0, -1, io] - logits[0, -1, s]
    torch.testing.assert_close(attrs.sum(0)[0], diff, atol=2e-3, rtol=1e-4)  # no norm bias


def test_batched_head_patching_equals_explicit_patching(smollm2, pair):
    ids, corrupted, io, s = pair

    def metric(logits):
        return (logits[:, -1, io] - logits[:, -1, s]).mean()

    with torch.no_grad():
        result = patch(smollm2, ids, corrupted, metric, engine="batched")
        _, cache = run_with_cache(smollm2, ids, names=lambda n: n.endswith("hook_z"))
        for layer, head in ((23, 3), (29, 1), (5, 0)):
            name = act_name("z", layer)

            def from_clean(z, _, name=name, head=head):
                z = z.clone()
                z[:, :, head] = cache[name][:, :, head]
                return z

            out = run_with_hooks(smollm2, corrupted, fwd_hooks=[(name, from_clean)])
            expected = (float(metric(out)) - result.corrupted) / (result.clean - result.corrupted)
            assert float(result.heads[layer, head]) == pytest.approx(expected, abs=1e-5)
    assert result.heads.abs().max() > 0.1


def test_detect_head_reads_text_through_the_models_tokenizer(smollm2):
    from multihead.interpret import detect_head

    text = "The cat sat on the mat. The cat sat on the mat."
    with torch.no_grad():
        by_text = detect_head(smollm2, text, "induction_head")
        by_ids = detect_head(smollm2, smollm2.to_tokens(text), "induction_head")
    torch.testing.assert_close(by_text, by_ids)
    assert by_text.shape == (30, 9) and by_text.max() > 0.2  # SmolLM2's induction heads
