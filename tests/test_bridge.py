"""The bridge is exact: on tiny random checkpoints of every listed architecture, a bridged
model's logits equal transformers' eager run (the independent peer), its patterns equal
transformers' output_attentions, and zeroing a head's hook_z equals zeroing that head's slice of
the output projection's input in the eager model. A padded batch is compared on its real rows."""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("transformers")

from helpers_bridge import ARCHITECTURES, tiny, tiny_t5
from multihead.bridge import wrap
from multihead.interpret import (
    direct_logit_attribution,
    hook_names,
    run_with_cache,
    run_with_hooks,
)

B, T, PAD = 2, 9, 3  # row 1 is left-padded by PAD tokens
ATOL = 1e-5


def _inputs(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, 96, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, :PAD] = 0
    return ids, mask


def _real(x: torch.Tensor, query_dim: int) -> list[torch.Tensor]:
    """Row 0 whole; row 1 without its padded query positions."""
    return [x[0], x[1].narrow(query_dim - 1, PAD, T - PAD)]


def _close(a: torch.Tensor, b: torch.Tensor, query_dim: int) -> None:
    for x, y in zip(_real(a, query_dim), _real(b, query_dim), strict=True):
        torch.testing.assert_close(x, y, atol=ATOL, rtol=1e-4)


@pytest.fixture(scope="module", params=sorted(ARCHITECTURES))
def pair(request):
    """(name, transformers eager model, the same weights bridged)."""
    ref = tiny(request.param)
    return request.param, ref, wrap(copy.deepcopy(ref))


def test_logits_equal_transformers_eager(pair):
    _, ref, bridged = pair
    ids, mask = _inputs()
    with torch.no_grad():
        expected = ref(ids, attention_mask=mask).logits
        got = bridged(ids, attention_mask=mask)
    _close(got, expected, 1)
    assert type(bridged.hf).__name__ == type(ref).__name__
    assert bridged.hf.config._attn_implementation == "multihead"


def test_patterns_equal_output_attentions(pair):
    name, ref, bridged = pair
    ids, mask = _inputs()
    with torch.no_grad():
        expected = ref(ids, attention_mask=mask, output_attentions=True).attentions
        _, cache = run_with_cache(bridged, ids, attention_mask=mask)
        returned = bridged.hf(ids, attention_mask=mask, output_attentions=True).attentions
    for layer, want in enumerate(expected):
        pattern = cache["pattern", layer]  # (B, H, Tq, Tk)
        if name == "gpt_oss":  # the sink is key column 0 of the hook's pattern
            assert pattern.shape[-1] == T + 1
            pattern = pattern[..., 1:]
        _close(pattern, want, 2)
        _close(returned[layer], want, 2)  # output_attentions through the bridge too


def test_zeroing_a_heads_z_is_zeroing_its_slice_of_the_output_projection(pair):
    _, ref, bridged = pair
    ids, mask = _inputs()
    layer, head = 1, 2
    attn = bridged.attention(layer)
    H = bridged.config.num_heads
    # the reference: transformers' eager model, the head's slice of o_proj's input zeroed
    out_proj = dict(ref.named_modules())[
        next(n for n, m in bridged.hf.named_modules() if m is _out_proj(attn))
    ]
    width = out_proj.in_features // H

    def zero_slice(module, args):
        x = args[0].clone()
        x[..., head * width : (head + 1) * width] = 0
        return (x,)

    handle = out_proj.register_forward_pre_hook(zero_slice)
    try:
        with torch.no_grad():
            expected = ref(ids, attention_mask=mask).logits
    finally:
        handle.remove()

    def zero_head(z, hook_name):
        z = z.clone()
        z[:, :, head] = 0
        return z

    with torch.no_grad():
        got = run_with_hooks(
            bridged, ids, attention_mask=mask,
            fwd_hooks=[(f"blocks.{layer}.attn.hook_z", zero_head)],
        )  # fmt: skip
        plain = bridged(ids, attention_mask=mask)
    _close(got, expected, 1)
    assert (got - plain).abs().max() > 1e-4  # the head mattered


# DLA refuses these: the final stream is not embed + heads + biases + MLPs (post-norms, residual
# multipliers, learned positions outside hook_embed), the final norm hides its eps (OLMo), or
# the final soft-cap is not linear (Gemma 2)
DLA_REFUSED = {"olmo", "olmo2", "opt", "granite", "gemma2", "gemma3"}


def test_the_stream_hooks_are_per_token_and_chain(pair):
    name, _, bridged = pair
    ids, mask = _inputs()
    with torch.no_grad():
        _, cache = run_with_cache(bridged, ids, attention_mask=mask)
    for i in range(2):
        for point in ("resid_pre", "attn_out", "mlp_out", "resid_post"):
            assert cache[point, i].shape == (B, T, 32), (name, point)
        if f"blocks.{i}.hook_resid_mid" in cache:
            assert cache["resid_mid", i].shape == (B, T, 32)
    torch.testing.assert_close(cache["resid_post", 0], cache["resid_pre", 1])


def test_replacing_resid_mid_replaces_the_stream(pair):
    """Layer 0's hook_resid_mid replaced by another input's, at every position: from there on
    the run is that input's run, so the logits are its logits (the MLP reads the replacement
    and the layer's output carries it)."""
    name, _, bridged = pair
    if "blocks.0.hook_resid_mid" not in hook_names(bridged):
        assert name in ("phi", "cohere", "gpt_neox")  # parallel blocks: no such stream
        return
    ids, mask = _inputs()
    other = torch.randint(4, 96, (B, T), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        want, cache = run_with_cache(bridged, other, attention_mask=mask)
        got = run_with_hooks(
            bridged, ids, attention_mask=mask,
            fwd_hooks=[("blocks.0.hook_resid_mid", lambda x, n: cache["resid_mid", 0])],
        )  # fmt: skip
        plain = bridged(ids, attention_mask=mask)
    _close(got, want, 1)
    assert (plain - want).abs().max() > 1e-3


def test_direct_logit_attribution_adds_up_or_is_refused(pair):
    name, _, bridged = pair
    ids, mask = _inputs()
    targets = torch.tensor([5, 9])
    if name in DLA_REFUSED:
        with pytest.raises(ValueError, match=type(bridged.hf).__name__):
            direct_logit_attribution(bridged, ids, targets, attention_mask=mask)
        return
    dla = direct_logit_attribution(bridged, ids, targets, against=targets.flip(0))
    with torch.no_grad():
        logits = bridged(ids)
    want = logits[:, :, 5] - logits[:, :, 9]
    want = torch.stack([want[0], -want[1]])
    torch.testing.assert_close(dla.logit, want)
    torch.testing.assert_close(dla.total(), want, atol=1e-4, rtol=1e-4)
    assert dla.heads.shape == (2, 4, B, T)


def _out_proj(attn):
    from multihead.bridge.discover import OUT_PROJ_NAMES

    return next(getattr(attn, n) for n in OUT_PROJ_NAMES if hasattr(attn, n))


def test_t5_encoder_decoder():
    """T5: bidirectional encoder with padding, causal decoder, cross-attention, relative
    position bias passed to the attention function."""
    ref = tiny_t5()
    bridged = wrap(copy.deepcopy(ref))
    ids, mask = _inputs()
    mask = mask.flip(1)  # right padding for the encoder
    dec = torch.randint(4, 96, (B, 5), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = ref(ids, attention_mask=mask, decoder_input_ids=dec, output_attentions=True)
        got, cache = run_with_cache(bridged, ids, attention_mask=mask, decoder_input_ids=dec)
    torch.testing.assert_close(got, want.logits, atol=ATOL, rtol=1e-4)
    real = mask.bool()
    for layer in range(2):
        enc = cache[f"encoder.blocks.{layer}.attn.hook_pattern"]
        for b in range(B):  # real query rows
            torch.testing.assert_close(
                enc[b][:, real[b]], want.encoder_attentions[layer][b][:, real[b]], atol=ATOL, rtol=0
            )
        dec_pattern = cache[f"decoder.blocks.{layer}.attn.hook_pattern"]
        torch.testing.assert_close(dec_pattern, want.decoder_attentions[layer], atol=ATOL, rtol=0)
        cross = cache[f"decoder.blocks.{layer}.cross_attn.hook_pattern"]
        torch.testing.assert_close(cross, want.cross_attentions[layer], atol=ATOL, rtol=0)
    with torch.no_grad():  # no padding: the masks are skipped, each module's is_causal rules
        plain = bridged(ids, decoder_input_ids=dec)
        torch.testing.assert_close(
            plain, ref(ids, decoder_input_ids=dec).logits, atol=ATOL, rtol=1e-4
        )
    # the decoder's stream: resid_pre + attention sublayer = resid_mid (T5 adds inside it)
    assert cache["decoder.blocks.1.hook_resid_mid_cross"].shape == (B, 5, 32)
