"""ActivationCache algebra (accumulated_resid, decompose_resid, stack_head_results,
apply_ln_to_stack, logit_attrs, remove_batch_dim) on random GPT-2 (LayerNorm, learned positions,
biases) and Llama-layout (RMSNorm, RoPE, SwiGLU, grouped-query, no biases) models, in fp64: every
decomposition sums back to the residual stream the model computed, and through the frozen final
norm and the unembedding to the logits; per-head outputs equal the ones the model's hook_result
shows; the norm's frozen scale equals the one the model applied."""

import pytest
import torch

from multihead import CausalLM, LMConfig
from multihead.interpret import ActivationCache, act_name, run_with_cache

B, T, V, L, H = 2, 5, 37, 3, 3
TOL = dict(atol=1e-10, rtol=1e-9)
# RMSNorm computes in fp32 even for fp64 inputs (modules/norm.py): outputs of the model's own
# norms are compared at fp32's rounding.
NORM_TOL = dict(atol=1e-6, rtol=1e-6)

CONFIGS = {
    "gpt2": LMConfig(vocab_size=V, dim=24, num_layers=L, num_heads=H, ffn_dim=28),
    "llama": LMConfig(
        vocab_size=V,
        dim=24,
        num_layers=L,
        num_heads=H,
        ffn_dim=28,
        num_kv_heads=1,
        position="rope",
        norm="rmsnorm",
        mlp="swiglu",
        bias=False,
        tie_embeddings=False,
    ),
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def run(request):
    torch.manual_seed(11)
    model = CausalLM(CONFIGS[request.param], dtype=torch.float64).eval()
    with torch.no_grad():  # non-trivial norm weights and biases, so folding them matters
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.3)
    ids = torch.randint(0, V, (B, T))
    names = lambda n: True  # noqa: E731  (every point, hook_result included)
    with torch.no_grad():
        logits, cache = run_with_cache(model, ids, names=names)
    return request.param, model, ids, logits, cache


def test_decompose_resid_sums_to_every_stream(run):
    _, _, _, _, cache = run
    final = cache["resid_post", L - 1]
    parts, labels = cache.decompose_resid(return_labels=True)
    torch.testing.assert_close(parts.sum(0), final, **TOL)
    assert labels[-2:] == [f"{L - 1}_attn_out", f"{L - 1}_mlp_out"]
    for layer in range(L):
        torch.testing.assert_close(
            cache.decompose_resid(layer).sum(0), cache["resid_pre", layer], **TOL
        )
        mid = cache.decompose_resid(layer, mlp_input=True).sum(0)
        torch.testing.assert_close(mid, cache["resid_mid", layer], **TOL)
    attn = cache.decompose_resid(mode="attn").sum(0)
    mlp = cache.decompose_resid(mode="mlp", incl_embeds=False).sum(0)
    assert torch.allclose(attn + mlp, final)


def test_stack_head_results_equals_hooked_head_outputs(run):
    _, model, _, _, cache = run
    heads, labels = cache.stack_head_results(return_labels=True)
    assert heads.shape == (L * H, B, T, 24) and labels[:2] == ["L0H0", "L0H1"]
    # the model's own per-head outputs (hook_result), hooked explicitly
    hooked = torch.cat([cache["result", i].movedim(2, 0) for i in range(L)])
    # computed from hook_z alone, as a cache without hook_result must
    bare = ActivationCache({k: v for k, v in cache.items() if "hook_result" not in k}, model)
    torch.testing.assert_close(bare.stack_head_results(), hooked, **TOL)
    # each block's heads plus its output bias are its attn_out
    for i in range(L):
        bias = model.layers[i].attn.out_proj.bias
        total = heads[i * H : (i + 1) * H].sum(0) + (0 if bias is None else bias)
        torch.testing.assert_close(total, cache["attn_out", i], **TOL)
    with_rest = bare.stack_head_results(2, incl_remainder=True)
    assert with_rest.shape[0] == 2 * H + 1
    torch.testing.assert_close(with_rest.sum(0), cache["resid_pre", 2], **TOL)


def test_full_decomposition_sums_to_the_stream(run):
    _, _, _, _, cache = run
    parts, labels = cache.get_full_resid_decomposition(return_labels=True)
    assert labels[-1] == "bias" and f"L{L - 1}H{H - 1}" in labels
    torch.testing.assert_close(parts.sum(0), cache["resid_post", L - 1], **TOL)
    parts = cache.get_full_resid_decomposition(1, mlp_input=True)
    torch.testing.assert_close(parts.sum(0), cache["resid_mid", 1], **TOL)


def test_apply_ln_to_stack_freezes_the_norms_scale(run):
    kind, model, _, _, cache = run
    final = cache["resid_post", L - 1]
    normed = cache.apply_ln_to_stack(final[None])[0]
    b = getattr(model.norm_f, "bias", None)
    out = normed * model.norm_f.weight + (0 if b is None else b)
    torch.testing.assert_close(out, cache["normalized"], **NORM_TOL)
    # the frozen scale is linear: the normalised parts sum to the normalised stream
    parts = cache.apply_ln_to_stack(cache.decompose_resid())
    torch.testing.assert_close(parts.sum(0), normed, **TOL)
    # a block's norm: what its attention reads
    block = model.layers[1]
    x = cache.apply_ln_to_stack(cache["resid_pre", 1][None], 1)[0]
    b = getattr(block.norm1, "bias", None)
    torch.testing.assert_close(
        x * block.norm1.weight + (0 if b is None else b),
        block.norm1(cache["resid_pre", 1]),
        **NORM_TOL,
    )
    centred = parts.mean(-1).abs().max()
    assert (centred < 1e-12) == (kind == "gpt2")  # only LayerNorm centres


def test_accumulated_resid_is_the_logit_lens(run):
    _, model, _, _, cache = run
    stack, labels = cache.accumulated_resid(return_labels=True, incl_mid=True)
    assert labels == ["0_pre", "0_mid", "1_pre", "1_mid", "2_pre", "2_mid", "final_post"]
    torch.testing.assert_close(stack[2], cache["resid_pre", 1], **TOL)
    lens = cache.accumulated_resid(apply_ln=True)  # each stream normalised by its own stats
    w, b = model.norm_f.weight, getattr(model.norm_f, "bias", None)
    for i, name in enumerate([act_name("resid_pre", j) for j in range(L)]):
        expected = model.norm_f(cache[name])
        torch.testing.assert_close(lens[i] * w + (0 if b is None else b), expected, **NORM_TOL)
    upto = cache.accumulated_resid(1, mlp_input=True)
    assert upto.shape[0] == 3  # 0_pre, 1_pre, 1_mid
    torch.testing.assert_close(upto[2], cache["resid_mid", 1], **TOL)


def test_logit_attrs_sum_to_the_logits(run):
    _, model, _, logits, cache = run
    right = torch.randint(0, V, (B, T))
    wrong = torch.randint(0, V, (B, T))
    b = getattr(model.norm_f, "bias", None)
    w_u = model.head.weight
    for stack in (cache.decompose_resid(), cache.get_full_resid_decomposition()):
        attrs = cache.logit_attrs(stack, right)
        assert attrs.shape == (stack.shape[0], B, T)
        # the norm's bias is a constant term of its own
        const = 0 if b is None else (w_u[right] * b).sum(-1)
        expected = logits.gather(-1, right[..., None])[..., 0]
        torch.testing.assert_close(attrs.sum(0) + const, expected, **NORM_TOL)
        diff = cache.logit_attrs(stack, right, wrong)
        const = 0 if b is None else ((w_u[right] - w_u[wrong]) * b).sum(-1)
        expected = expected - logits.gather(-1, wrong[..., None])[..., 0]
        torch.testing.assert_close(diff.sum(0) + const, expected, **NORM_TOL)
    one = cache.logit_attrs(cache.decompose_resid(pos_slice=-1), right[:, -1], pos_slice=-1)
    torch.testing.assert_close(one, cache.logit_attrs(cache.decompose_resid(), right)[..., -1])


def test_attrs_toward_any_direction(run):
    _, _, _, _, cache = run
    probe = torch.randn(24, dtype=torch.float64)
    stack = cache.stack_head_results(apply_ln=True)
    got = cache.direction_attrs(stack, probe)
    assert got.shape == (L * H, B, T)
    torch.testing.assert_close(got, torch.einsum("nbtc,c->nbt", stack, probe), **TOL)
    per_seq = torch.randn(B, 24, dtype=torch.float64)
    expected = torch.einsum("nbtc,bc->nbt", stack, per_seq)
    torch.testing.assert_close(cache.direction_attrs(stack, per_seq), expected, **TOL)


def test_remove_batch_dim(run):
    _, model, ids, _, _ = run
    with torch.no_grad():
        _, one = run_with_cache(model, ids[:1])
    expected = one.stack_head_results(apply_ln=True)[:, 0]
    attrs = one.logit_attrs(one.decompose_resid(), ids[0, 0])[:, 0]
    assert one.remove_batch_dim() is one and one["resid_pre", 0].shape == (T, 24)
    torch.testing.assert_close(one.stack_head_results(apply_ln=True), expected, **TOL)
    torch.testing.assert_close(one.logit_attrs(one.decompose_resid(), ids[0, 0]), attrs, **TOL)
    with torch.no_grad():
        _, two = run_with_cache(model, ids)
    with pytest.raises(ValueError, match="batch of 1"):
        two.remove_batch_dim()


def test_bad_arguments(run):
    _, _, _, _, cache = run
    with pytest.raises(ValueError, match="layer must be in"):
        cache.accumulated_resid(L + 1)
    with pytest.raises(ValueError, match="mode"):
        cache.decompose_resid(mode="heads")
    with pytest.raises(ValueError, match="tokens must be ids"):
        cache.logit_attrs(cache.decompose_resid(), V)
    with pytest.raises(TypeError, match="model the cache was taken from"):
        ActivationCache({k: v for k, v in cache.items() if "result" not in k}).stack_head_results()


def test_the_scale_is_the_same_cached_or_recomputed(run):
    _, model, _, _, cache = run
    assert "ln_final.hook_scale" in cache and "blocks.1.ln2.hook_scale" in cache
    bare = ActivationCache({k: v for k, v in cache.items() if "hook_scale" not in k}, model)
    stack = cache.decompose_resid()
    for layer, mlp_input in ((None, False), (1, False), (1, True)):
        torch.testing.assert_close(
            bare.apply_ln_to_stack(stack, layer, mlp_input=mlp_input),
            cache.apply_ln_to_stack(stack, layer, mlp_input=mlp_input),
            **NORM_TOL,
        )


def test_a_parallel_block_s_mlp_input_is_the_block_input():
    """GPT-NeoX's parallel residual: ln2 reads resid_pre, not resid_mid (which holds the
    block's attention). mlp_input=True must decompose and normalise the stream ln2 reads,
    checked against ln2's own output, with the scale cached or recomputed."""
    config = LMConfig(
        vocab_size=V, dim=24, num_layers=L, num_heads=H, ffn_dim=28, position="rope",
        parallel_residual=True,
    )  # fmt: skip
    torch.manual_seed(12)
    model = CausalLM(config, dtype=torch.float64).eval()
    ids = torch.randint(0, V, (B, T))
    with torch.no_grad():
        _, cache = run_with_cache(model, ids, names=lambda n: True)
    bare = ActivationCache({k: v for k, v in cache.items() if "hook_scale" not in k}, model)
    norm2 = model.layers[1].norm2
    for c in (cache, bare):
        parts = c.decompose_resid(1, mlp_input=True)
        torch.testing.assert_close(parts.sum(0), cache["resid_pre", 1], **TOL)
        normed = c.apply_ln_to_stack(parts, 1, mlp_input=True).sum(0)
        torch.testing.assert_close(
            normed * norm2.weight + norm2.bias, cache["blocks.1.ln2.hook_normalized"], **NORM_TOL
        )
        full = c.get_full_resid_decomposition(1, mlp_input=True)
        torch.testing.assert_close(full.sum(0), cache["resid_pre", 1], **TOL)
    stack = cache.accumulated_resid(1, mlp_input=True)
    torch.testing.assert_close(stack[-1], cache["resid_pre", 1], **TOL)
