"""AtP* in attribution_patch (Kramar et al. 2024): query/key nodes patched for real by patch()
(both engines, grouped-query keys per kv head), the QK fix against real patching where the
softmax saturates, and GradDrop on a model built so that a direct and an indirect effect
cancel. Real patch() is the reference throughout."""

import pytest
import torch
from torch import nn

from multihead import CausalLM, LMConfig
from multihead.interpret import attribution_patch, patch, run_with_cache, run_with_hooks

V = 29


def metric(logits):
    return (logits[:, -1, 3] - logits[:, -1, 8]).mean()


def pair(B=2, T=6, seed=0, at=(2, 5)):
    g = torch.Generator().manual_seed(seed)
    clean = torch.randint(0, V, (B, T), generator=g)
    corrupted = clean.clone()
    for pos in at:
        corrupted[:, pos] = (clean[:, pos] + 3 + pos) % V
    return clean, corrupted


def test_patch_query_and_key_nodes_on_both_engines_with_grouped_keys():
    """hook_q per query head, hook_k per kv head (GQA: 4 query heads read 2 kv heads); the
    batched engine equals the loop, and a key node patched is the same as the same kv head's
    key replaced by hand."""
    torch.manual_seed(0)
    cfg = LMConfig(
        vocab_size=V, dim=24, num_layers=2, num_heads=4, num_kv_heads=2, position="rope",
        norm="rmsnorm", mlp="swiglu", bias=False,
    )  # fmt: skip
    model = CausalLM(cfg, dtype=torch.float64).eval()
    with torch.no_grad():
        for block in model.layers:
            block.attn.in_proj.weight.mul_(4.0)  # sharper patterns: the keys matter
    clean, corrupted = pair()
    kwargs = dict(qk=("q", "k"), head_positions=True, heads=False)
    batched = patch(model, clean, corrupted, metric, engine="batched", **kwargs)
    loop = patch(model, clean, corrupted, metric, engine="loop", **kwargs)
    assert batched.qk["q"].shape == (2, 4) and batched.qk["k"].shape == (2, 2)
    assert batched.qk["q_positions"].shape == (2, 4, 6)
    assert batched.qk["k_positions"].shape == (2, 2, 6)
    for kind in ("q", "k", "q_positions", "k_positions"):
        torch.testing.assert_close(batched.qk[kind], loop.qk[kind], atol=1e-6, rtol=1e-6)
    assert batched.sections() == ["head_positions", "q", "k", "q_positions", "k_positions"]
    # by hand: kv head 1 of block 1 takes its clean key at position 5
    _, cache = run_with_cache(model, clean, names=["blocks.1.attn.hook_k"])

    def put(k, name):
        out = k.clone()
        out[:, 5, 1] = cache[name][:, 5, 1]
        return out

    out = run_with_hooks(model, corrupted, fwd_hooks=[("blocks.1.attn.hook_k", put)])
    fraction = (float(metric(out).detach()) - loop.corrupted) / (loop.clean - loop.corrupted)
    assert loop.qk["k_positions"][1, 1, 5] == pytest.approx(fraction, abs=1e-9)
    assert abs(fraction) > 0.005  # the key matters here
    assert "k L1 KV1 pos 5" in batched.table(kind="k_positions", top=24)
    # verify=k puts real fractions in place of the k largest q/k estimates (kv heads for k)
    estimate = attribution_patch(model, clean, corrupted, metric, **kwargs)
    checked = attribution_patch(model, clean, corrupted, metric, verify=3, **kwargs)
    for kind in ("q", "k", "q_positions", "k_positions"):
        top = estimate.qk[kind].flatten().abs().argsort(descending=True)[:3]
        got, want = checked.qk[kind].flatten()[top], loop.qk[kind].flatten()[top]
        torch.testing.assert_close(got, want.float(), atol=1e-6, rtol=1e-5)
    with pytest.raises(ValueError, match="qk names 'q' and/or 'k'"):
        patch(model, clean, corrupted, metric, qk="v")


def saturated_one_layer(scale=100.0, **options):
    """One attention-only block, no final norm: the logits are linear in the attention
    pattern, so the QK fix (exact pattern, linear after it) must equal real patching. The
    queries and keys are scaled 100x each, so that the softmax is saturated."""
    torch.manual_seed(0)
    cfg = LMConfig(
        vocab_size=V, dim=24, num_layers=1, num_heads=4, num_kv_heads=2, attention_only=True,
        bias=False, **({"position": "rope"} | options),
    )  # fmt: skip
    model = CausalLM(cfg, dtype=torch.float64).eval()
    model.norm_f = nn.Identity()
    with torch.no_grad():
        model.layers[0].attn.in_proj.weight[:36].mul_(scale)  # W_Q, W_K rows (24 + 2 * 6)
    return model


def test_qk_fix_equals_real_patching_where_the_softmax_saturates():
    model = saturated_one_layer()
    clean, corrupted = pair()
    _, cache = run_with_cache(model, corrupted, names=["blocks.0.attn.hook_pattern"])
    top = cache["blocks.0.attn.hook_pattern"][:, :, 1:].max(-1).values  # rows past the first
    assert (top > 0.99).float().mean() > 0.8  # saturated: one key takes nearly all the mass
    kwargs = dict(qk=("q", "k"), head_positions=True, heads=False)
    real = patch(model, clean, corrupted, metric, engine="loop", **kwargs)
    fixed = attribution_patch(model, clean, corrupted, metric, **kwargs)
    linear = attribution_patch(model, clean, corrupted, metric, qk_fix=False, **kwargs)
    for kind in ("q", "k", "q_positions", "k_positions"):
        # exact up to float64 rounding, divided by the metric's (small) difference
        torch.testing.assert_close(fixed.qk[kind], real.qk[kind], atol=1e-6, rtol=1e-6)
    # the linear estimate through the saturated softmax misses a node that matters (|real| >
    # 0.2 of the difference, estimated under a tenth of it), for queries and for keys
    for kind in ("q", "k"):
        missed = (real.qk[kind].abs() > 0.2) & (linear.qk[kind].abs() < 0.1 * real.qk[kind].abs())
        assert missed.any(), (real.qk[kind], linear.qk[kind])
    assert "QK fix" in fixed.table()


def test_qk_fix_recomputes_the_attention_as_run_alibi_softcap_window():
    """The recomputed pattern takes the call's bias (ALiBi), soft-cap and sliding window as
    the model ran them: still exact against real patching."""
    model = saturated_one_layer(10.0, position="alibi", attn_softcap=3.0, sliding_window=3)
    clean, corrupted = pair(at=(2, 4, 5))
    kwargs = dict(qk=("q", "k"), head_positions=True, heads=False)
    real = patch(model, clean, corrupted, metric, engine="loop", **kwargs)
    fixed = attribution_patch(model, clean, corrupted, metric, **kwargs)
    assert real.qk["k_positions"].abs().max() > 0.05
    for kind in ("q", "k", "q_positions", "k_positions"):
        torch.testing.assert_close(fixed.qk[kind], real.qk[kind], atol=1e-6, rtol=1e-6)


def cancelling_model():
    """Two attention-only blocks, no final norm, untied head. The metric's direction u (the
    head's rows 3 and 8) is chosen so that the first-order effect of patching head L0 H0
    cancels: its direct path to the logits and its path through block 1 sum to 0 in the
    gradient, while the real patch (through block 1's softmax) does not."""
    torch.manual_seed(0)
    cfg = LMConfig(
        vocab_size=V, dim=16, num_layers=2, num_heads=1, attention_only=True,
        position="rope", bias=False, tie_embeddings=False,
    )  # fmt: skip
    model = CausalLM(cfg, dtype=torch.float64).eval()
    model.norm_f = nn.Identity()
    with torch.no_grad():
        model.layers[1].attn.in_proj.weight[:32].mul_(3.0)  # block 1's W_Q, W_K: sharper
        model.layers[0].attn.out_proj.weight.mul_(10.0)  # L0 H0 writes loudly
    clean, corrupted = pair(B=1, T=5, seed=2, at=(1,))
    z, final = "blocks.0.attn.hook_z", "blocks.1.hook_resid_post"
    _, clean_cache = run_with_cache(model, clean, names=[z])
    _, corr_cache = run_with_cache(model, corrupted, names=[z, final])
    delta = (clean_cache[z] - corr_cache[z])[:, :, [0]]  # head 0's change (1, T, 1, D)

    def final_stream(t):
        seen = {}

        def fn(act, name):
            out = act.clone()
            out[:, :, [0]] = act[:, :, [0]] + t * delta
            return out

        def keep(act, name):
            seen["final"] = act

        run_with_hooks(model, corrupted, fwd_hooks=[(z, fn), (final, keep)])
        return seen["final"][0, -1]

    real_change = final_stream(1.0) - corr_cache[final][0, -1]  # (C,)
    jac = torch.autograd.functional.jacobian(
        lambda t: final_stream(t), torch.zeros((), dtype=torch.float64)
    )
    jac = jac.reshape(-1)  # d final / dt at t = 0 (C,): the first-order change
    u = real_change - (real_change @ jac) / (jac @ jac) * jac  # first order 0, real not
    with torch.no_grad():
        model.head.weight[3] = u
        model.head.weight[8] = 0.0
    return model, clean, corrupted


def test_grad_drop_finds_an_effect_whose_paths_cancel():
    model, clean, corrupted = cancelling_model()
    real = patch(model, clean, corrupted, metric, engine="loop")
    plain = attribution_patch(model, clean, corrupted, metric)
    dropped = attribution_patch(model, clean, corrupted, metric, grad_drop=True)
    assert abs(real.heads[0, 0]) > 0.5  # the patch matters (1.01 of the difference)
    assert abs(plain.heads[0, 0]) < 1e-6  # the gradient's paths cancel: plain AtP sees 0
    assert (dropped.heads >= 0).all()  # magnitudes
    assert dropped.heads[0, 0] > 0.5  # GradDrop finds it: block 1 dropped, the direct path
    # the head with nothing to cancel (the last block's, linear to the logits) is unchanged
    assert dropped.heads[1, 0] == pytest.approx(abs(float(real.heads[1, 0])), rel=1e-6)
    assert "GradDrop magnitudes" in dropped.table()


def test_grad_drop_is_the_mean_of_the_dropped_estimates():
    """Against its definition computed independently: for each block l, a fresh run whose
    block-l contributions are cut from the graph (detached in the forward), the plain estimate
    of every head from it, |.| summed over l and divided by L - 1."""
    torch.manual_seed(5)
    L = 3
    cfg = LMConfig(vocab_size=V, dim=18, num_layers=L, num_heads=3, position="rope", bias=False)
    model = CausalLM(cfg, dtype=torch.float64).eval()
    clean, corrupted = pair(seed=4)
    got = attribution_patch(
        model, clean, corrupted, metric, head_positions=True, qk="k", grad_drop=True
    )
    zs = [f"blocks.{i}.attn.hook_z" for i in range(L)]
    _, clean_cache = run_with_cache(model, clean, names=zs)
    real = patch(model, clean, corrupted, metric, heads=False)
    want = torch.zeros(L, 3, 6, dtype=torch.float64)
    for cut in range(L):
        leaves, acts = {}, {}

        def leaf(act, name, leaves=leaves, acts=acts):  # the gradient at z, every later path
            leaves[name] = torch.zeros_like(act, requires_grad=True)
            acts[name] = act.detach()
            return act + leaves[name]

        def detach(act, name):
            return act.detach()

        hooks = [(n, leaf) for n in zs]
        hooks += [(f"blocks.{cut}.hook_attn_out", detach), (f"blocks.{cut}.hook_mlp_out", detach)]
        with torch.enable_grad():
            value = metric(run_with_hooks(model, corrupted, fwd_hooks=hooks))
            grads = torch.autograd.grad(value, [leaves[n] for n in zs], allow_unused=True)
        for i, (n, g) in enumerate(zip(zs, grads, strict=True)):
            if g is None:
                continue
            est = ((clean_cache[n] - acts[n]) * g).sum((0, -1))  # (T, H)
            want[i] += (est.t() / (real.clean - real.corrupted)).abs()
    want /= L - 1
    torch.testing.assert_close(got.head_positions, want.float(), atol=1e-6, rtol=1e-5)
    assert got.qk["k"].shape == (L, 3) and (got.qk["k"] >= 0).all()
    with pytest.raises(ValueError, match="grad_drop needs a model of at least 2 blocks"):
        one = CausalLM(LMConfig(vocab_size=V, dim=18, num_layers=1, num_heads=3)).eval()
        attribution_patch(one, clean, corrupted, metric, grad_drop=True)
    with pytest.raises(ValueError, match="grad_drop must be True or False"):
        attribution_patch(model, clean, corrupted, metric, grad_drop="yes")
