"""The toolkit on each native family (Gemma 1-3, Qwen3, OLMo 2; tests/helpers_families_core.py):
hook names and where q/k norms and soft-capping sit, per-head weights, process_weights_,
ablation, patching, attribution patching, direct logit attribution and the logit lens, each
against an independent computation where one is cheap."""

from __future__ import annotations

import math

import pytest
import torch

import multihead
from helpers_families_core import FAMILIES, FIXTURES, build, token_ids
from multihead.cli import main
from multihead.interpret import (
    ablate,
    attribution_patch,
    direct_logit_attribution,
    logit_lens,
    patch,
    run_with_cache,
    run_with_hooks,
)


@pytest.fixture(scope="module", params=FAMILIES)
def family_model(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp(request.param) / "model"
    build(request.param, directory, seed=5)
    model = multihead.load(str(directory))
    return request.param, directory, model, token_ids(model.config.vocab_size, seed=2)


def test_hook_points_and_where_norms_and_caps_sit(family_model):
    """hook_q / hook_k: the projections (ln1.hook_normalized @ W_Q + b_Q, TransformerLens'
    identity); attn.q_norm / k_norm: then the q/k norms; hook_rot_q / hook_rot_k: then RoPE;
    hook_attn_scores: rot_q . rot_k * scale, soft-capped, blocked keys at -inf (as
    TransformerLens applies its attn_scores_soft_cap before the hook); hook_pattern: their
    softmax."""
    _, _, model, ids = family_model
    with torch.no_grad():
        logits, cache = run_with_cache(model, ids)
    c = model.config
    for i, block in enumerate(model.blocks):
        a = block.attn
        resid = cache[f"blocks.{i}.hook_resid_pre"]
        attn_in = resid if block.norm1 is None else cache[f"blocks.{i}.ln1.hook_normalized"]
        q = torch.einsum("btc,hcd->bthd", attn_in, a.W_Q) + a.b_Q
        torch.testing.assert_close(cache[f"blocks.{i}.attn.hook_q"], q, atol=1e-5, rtol=1e-5)
        has_qk_norm = f"blocks.{i}.attn.q_norm.hook_normalized" in cache
        assert has_qk_norm == (c.qk_norm is not None)
        assert (f"blocks.{i}.ln1_post.hook_normalized" in cache) == (c.branch_norms != "pre")
        q, k = cache[f"blocks.{i}.attn.hook_rot_q"], cache[f"blocks.{i}.attn.hook_rot_k"]
        k = k.repeat_interleave(c.num_heads // c.num_kv_heads, dim=2)
        scale = c.attn_scale or c.head_dim**-0.5
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
        if c.attn_softcap is not None:
            scores = torch.tanh(scores / c.attn_softcap) * c.attn_softcap
        T = ids.shape[1]
        window = c.window(i) or T
        pos = torch.arange(T)
        allowed = (pos[None, :] <= pos[:, None]) & (pos[:, None] - pos[None, :] < window)
        scores = scores.masked_fill(~allowed, -math.inf)
        torch.testing.assert_close(
            cache[f"blocks.{i}.attn.hook_attn_scores"], scores, atol=1e-4, rtol=1e-5
        )
        pattern = torch.softmax(scores, dim=-1)
        torch.testing.assert_close(
            cache[f"blocks.{i}.attn.hook_pattern"], pattern, atol=1e-5, rtol=0
        )
    # hook_logits is the model's output, after the final soft-cap
    torch.testing.assert_close(cache["hook_logits"], logits)
    if c.final_softcap is not None:
        assert logits.abs().max() < c.final_softcap


def test_weights_and_process_weights(family_model):
    _, directory, model, ids = family_model
    c = model.config
    assert model.W_Q.shape == (c.num_layers, c.num_heads, c.dim, c.head_dim)
    assert model.W_K.shape == model.W_Q.shape  # (grouped heads repeated, as TransformerLens)
    assert model.W_O.shape == (c.num_layers, c.num_heads, c.head_dim, c.dim)
    assert model.W_U.shape == (c.dim, c.vocab_size) and model.W_E.shape == (c.vocab_size, c.dim)
    with torch.no_grad():
        before = model(ids)
    folded = multihead.load(str(directory))
    capped = c.final_softcap is not None
    if capped:  # a shift of the logits does not pass through tanh: refused by name
        with pytest.raises(ValueError, match="final_softcap"):
            folded.process_weights_(center_unembed=True)
    with pytest.warns(UserWarning, match="RMSNorm"):
        folded.process_weights_(center_unembed=not capped)
    with torch.no_grad():
        after = folded(ids)
    if capped:
        torch.testing.assert_close(after, before, atol=1e-4, rtol=0)
    else:  # center_unembed shifts each position's logits by a constant
        torch.testing.assert_close(after.log_softmax(-1), before.log_softmax(-1), atol=1e-4, rtol=0)
    block = folded.blocks[0]
    if block.norm1 is not None:  # the pre-norms (Gemma's 1 + w included) were folded away
        assert block.norm1.weight is None
    if block.norm1_post is not None:  # norms after a branch stay: no reader to fold into
        assert block.norm1_post.weight is not None


def test_ablation_patching_and_attribution(family_model):
    _, _, model, ids = family_model
    corrupted = ids.flip(-1)
    target = ids[:, -1]

    def metric(logits):
        return logits[:, -1].gather(-1, target[:, None]).mean()

    with torch.no_grad():
        base = model(ids)
        with ablate(model, [(1, 0)]):  # layer 1, head 0
            ablated = model(ids)

        def zero(z, hook):
            z = z.clone()
            z[:, :, 0] = 0
            return z

        manual = run_with_hooks(model, ids, fwd_hooks=[("blocks.1.attn.hook_z", zero)])
    torch.testing.assert_close(ablated, manual)
    assert (ablated - base).abs().max() > 1e-3
    result = patch(model, ids, corrupted, metric)
    L, H = model.config.num_layers, model.config.num_heads
    assert result.heads.shape == (L, H) and torch.isfinite(result.heads).all()
    estimate = attribution_patch(model, ids, corrupted, metric)
    assert estimate.heads.shape == (L, H) and torch.isfinite(estimate.heads).all()


def test_direct_logit_attribution_sums_to_the_logit(family_model):
    """Heads' results (through a frozen ln1_post where the family has one), biases, MLPs and
    the embedding sum to the target's logit (before the final soft-cap)."""
    _, _, model, ids = family_model
    targets = ids.roll(-1, dims=1)
    dla = direct_logit_attribution(model, ids, targets)
    with torch.no_grad():
        h = model.hidden_states(ids)
        pre_cap = torch.nn.functional.linear(h, model.head.weight)
    want = pre_cap.gather(-1, targets[..., None])[..., 0]
    torch.testing.assert_close(dla.logit, want, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(dla.total(), want, atol=1e-3, rtol=1e-4)


def test_logit_lens_last_layer_is_the_model(family_model):
    _, _, model, ids = family_model
    lens = logit_lens(model, ids, keep_logits=True)
    with torch.no_grad():
        logits = model(ids)
    torch.testing.assert_close(lens.logits[-1], logits, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_cli_inspect(family, tmp_path, capsys):
    """`multihead inspect --model DIR` on each family's fixture checkpoint with its tokenizer
    (Gemma's SentencePiece model also as transformers' tokenizer.json)."""
    directory = FIXTURES / family / "hf"
    out = tmp_path / "r.html"
    text = "The quick brown fox jumps over the lazy dog. The quick brown fox"
    code = main(["inspect", text, "--model", str(directory), "-o", str(out), "--parser", "none"])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    config = multihead.load(str(directory)).config
    assert f"causal LM, {config.num_layers} layers x {config.num_heads} heads" in printed.out
    assert out.stat().st_size > 0


@pytest.mark.parametrize("family", ["gemma", "qwen3"])
def test_cache_decomposition_sums_to_the_logit(family, tmp_path):
    """Pre-norm families: the full decomposition sums to the final stream and, through the
    final norm (Gemma's 1 + w gain) and the head, to the logit; post-norm families refuse it by
    name (heads' results do not sum through ln1_post)."""
    build(family, tmp_path / "m", seed=5)
    model = multihead.load(str(tmp_path / "m"))
    ids = token_ids(model.config.vocab_size)
    with torch.no_grad():
        logits, cache = run_with_cache(model, ids)
        full = cache.get_full_resid_decomposition(pos_slice=-1)  # (n, B, C)
        final = cache["resid_post", model.config.num_layers - 1][:, -1]
        torch.testing.assert_close(full.sum(0), final, atol=1e-4, rtol=1e-5)
        target = ids[:, 0]
        attrs = cache.logit_attrs(full, target, pos_slice=-1)  # (n, B)
    want = logits[:, -1].gather(-1, target[:, None])[:, 0]
    torch.testing.assert_close(attrs.sum(0), want, atol=1e-3, rtol=1e-4)


def test_cache_decomposition_refuses_post_norm_blocks(tmp_path):
    build("olmo2", tmp_path / "m", seed=5)
    model = multihead.load(str(tmp_path / "m"))
    _, cache = run_with_cache(model, token_ids(model.config.vocab_size))
    with pytest.raises(ValueError, match=r"blocks\.0\.ln1_post normalises the attention output"):
        cache.get_full_resid_decomposition()
