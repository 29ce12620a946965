"""Hook points on multihead's own models: names (in the order they fire), shapes, and every
activation recomputed from the ones before it with textbook formulas (fp64), for CausalLM with
learned, RoPE and ALiBi positions and grouped-query heads, the Encoder/Decoder stacks with
cross-attention, a bare MultiHeadAttention, the torch drop-in inside nn.TransformerEncoder, and
cached decoding. Errors name the hook point."""

import math

import pytest
import torch
from torch import nn

from multihead import CausalLM, LMConfig, MultiHeadAttention
from multihead.compat import replace_attention
from multihead.hooked.hooks import BY_NAME_ONLY, ON_REQUEST
from multihead.interpret import act_name, hook_names, hooks, run_with_cache, run_with_hooks
from multihead.modules import EncoderDecoder, StackConfig

from conftest import assert_close


def by_predicate(model):
    """The names a predicate can select: all but the per-head attention inputs."""
    return [n for n in hook_names(model) if not n.endswith(BY_NAME_ONLY)]


CLOSE = dict(atol=1e-5, rtol=1e-4)
B, T, V = 2, 7, 53


def lm(position="learned", num_kv_heads=None, layers=2, heads=4, dim=24):
    cfg = LMConfig(
        vocab_size=V,
        dim=dim,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=num_kv_heads,
        ffn_dim=36,
        max_positions=32,
        position=position,
    )
    return CausalLM(cfg).eval()


def fired_names(model, *inputs, **kwargs):
    """Activation names in the order the forward pass showed them."""
    _, cache = run_with_cache(model, *inputs, names=lambda n: True, **kwargs)
    return list(cache)


def rope(x, positions, base=10000.0):
    """fp64 rotate-half RoPE of x (B, T, H, D): dimension i pairs with i + D/2."""
    D = x.shape[-1]
    freq = base ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    angle = positions.double()[:, None] * freq  # (T, D/2)
    cos, sin = angle.cos()[:, None], angle.sin()[:, None]  # (T, 1, D/2)
    x1, x2 = x.double().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def alibi(heads, tq, tk):
    """(H, Tq, Tk): -slope_h * |i - j| with the paper's slopes for a power-of-two head count."""
    slopes = torch.tensor(
        [2.0 ** (-8 * (h + 1) / heads) for h in range(heads)], dtype=torch.float64
    )
    i, j = torch.arange(tq)[:, None], torch.arange(tk)[None]
    return -slopes[:, None, None] * (i - j).abs().double()


@pytest.mark.parametrize("position", ["learned", "rope", "alibi"])
@pytest.mark.parametrize("kv_heads", [None, 2])
def test_causal_lm_activations_recomputed_by_hand(position, kv_heads):
    model = lm(position, kv_heads)
    ids = torch.randint(0, V, (B, T))
    with torch.no_grad():
        plain = model(ids)
        logits, c = run_with_cache(model, ids, names=lambda n: True)
    assert torch.equal(logits, plain)
    H, Hkv, D, C = 4, kv_heads or 4, 6, 24
    assert c["embed"].shape == (B, T, C)
    assert ("pos_embed" in c) == (position == "learned")
    resid = c["embed"] + c["pos_embed"] if position == "learned" else c["embed"]
    torch.testing.assert_close(c["embed"], model.tok.weight[ids])
    for i, block in enumerate(model.layers):
        attn = block.attn
        torch.testing.assert_close(c["resid_pre", i], resid)
        q, k, v = c["q", i], c["k", i], c["v", i]
        assert q.shape == (B, T, H, D) and k.shape == v.shape == (B, T, Hkv, D)
        x = block.norm1(c["resid_pre", i]).double()
        w, b = attn.in_proj.weight.double(), attn.in_proj.bias.double()
        qkv = x @ w.T + b  # (B, T, (H + 2 Hkv) D)
        assert_close(q, qkv[..., : H * D].view(B, T, H, D))
        assert_close(k, qkv[..., H * D : (H + Hkv) * D].view(B, T, Hkv, D))
        if position == "rope":
            assert_close(c["rot_q", i], rope(q, torch.arange(T)))
            assert_close(c["rot_k", i], rope(k, torch.arange(T)))
            q, k = c["rot_q", i], c["rot_k", i]
        else:
            assert ("rot_q", i) not in c
        # (B, T, H, D) -> (B, H, T, D); query head h reads kv head h // (H / Hkv)
        qh = q.double().transpose(1, 2)
        kh = k.double().transpose(1, 2).repeat_interleave(H // Hkv, dim=1)
        vh = v.double().transpose(1, 2).repeat_interleave(H // Hkv, dim=1)
        scores = qh @ kh.transpose(-1, -2) / math.sqrt(D)
        if position == "alibi":
            scores = scores + alibi(H, T, T)
        blocked = torch.ones(T, T, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(blocked, float("-inf"))
        assert c["attn_scores", i].shape == (B, H, T, T)
        assert_close(c["attn_scores", i], scores)
        pattern = scores.softmax(-1)
        assert_close(c["pattern", i], pattern)
        z = (pattern @ vh).transpose(1, 2)  # (B, H, T, D) -> (B, T, H, D)
        assert_close(c["z", i], z)
        out = z.reshape(B, T, H * D) @ attn.out_proj.weight.double().T + attn.out_proj.bias
        assert_close(c["attn_out", i], out)
        torch.testing.assert_close(c["resid_mid", i], resid + c["attn_out", i])
        mlp = block.ffn(block.norm2(c["resid_mid", i]))
        torch.testing.assert_close(c["mlp_out", i], mlp)
        torch.testing.assert_close(c["resid_post", i], c["resid_mid", i] + mlp)
        result = c[f"blocks.{i}.attn.hook_result"]
        assert result.shape == (B, T, H, C)
        resid = c["resid_post", i]
    torch.testing.assert_close(c["normalized"], model.norm_f(resid))
    torch.testing.assert_close(logits, c["normalized"] @ model.tok.weight.T)


def test_names_are_listed_in_the_order_they_fire():
    model = lm("rope")
    ids = torch.randint(0, V, (B, T))
    # a predicate selects every point but the per-head inputs (by name only)
    assert by_predicate(model) == fired_names(model, ids)
    learned = lm("learned")
    fired = fired_names(learned, ids)
    assert [n for n in by_predicate(learned) if "rot_" not in n] == fired
    assert fired[:3] == ["hook_embed", "hook_pos_embed", "blocks.0.hook_resid_pre"]
    assert fired[-3:] == ["ln_final.hook_scale", "ln_final.hook_normalized", "hook_logits"]
    _, default = run_with_cache(learned, ids)  # hook_result only when asked by name
    assert list(default) == [n for n in fired if not n.endswith(ON_REQUEST)]
    assert default.stack("pattern").shape == (2, B, 4, T, T)
    assert act_name("pattern", 1) == "blocks.1.attn.hook_pattern"
    assert act_name("resid_post", 0) == "blocks.0.hook_resid_post"
    assert act_name("z", 2, "cross_attn") == "blocks.2.cross_attn.hook_z"


def test_encoder_decoder_cross_attention_names_and_shapes():
    enc = StackConfig(dim=24, num_layers=2, num_heads=3, ffn_dim=40)
    dec = StackConfig(dim=24, num_layers=1, num_heads=4, ffn_dim=36)
    model = EncoderDecoder(31, enc, dec).eval()
    src, tgt = torch.randint(0, 31, (B, 5)), torch.randint(0, 31, (B, 6))
    src_mask = torch.tensor([[True] * 5, [True, True, True, False, False]])
    with torch.no_grad():
        plain = model(src, tgt, src_mask=src_mask)
        out, c = run_with_cache(model, src, tgt, src_mask=src_mask, names=lambda n: True)
    assert torch.equal(out, plain)
    assert [n for n in by_predicate(model) if "rot_" not in n] == list(c)
    assert c["encoder.blocks.1.attn.hook_pattern"].shape == (B, 3, 5, 5)
    assert c["decoder.blocks.0.attn.hook_pattern"].shape == (B, 4, 6, 6)
    cross = "decoder.blocks.0.cross_attn."
    assert c[cross + "hook_q"].shape == (B, 6, 4, 6)
    assert c[cross + "hook_k"].shape == c[cross + "hook_v"].shape == (B, 5, 4, 6)
    assert c[cross + "hook_pattern"].shape == (B, 4, 6, 5)
    assert c[cross + "hook_result"].shape == (B, 6, 4, 24)
    assert (c[cross + "hook_pattern"][1, ..., 3:] == 0).all()  # padded memory gets nothing
    memory = c["encoder.ln_final.hook_normalized"]
    block = model.decoder.layers[0]
    torch.testing.assert_close(
        c[cross + "hook_k"],
        block.cross_attn.in_proj(memory)[..., 24:48].view(B, 5, 4, 6),
        **CLOSE,
    )
    torch.testing.assert_close(
        c["decoder.blocks.0.hook_resid_mid_cross"],
        c["decoder.blocks.0.hook_resid_mid"] + c["decoder.blocks.0.hook_cross_attn_out"],
    )


def test_bare_attention_module_has_unprefixed_names():
    mha = MultiHeadAttention(20, 5, kdim=12, vdim=9).eval()
    x, kv = torch.randn(B, 3, 20), torch.randn(B, 8, 12)
    _, c = run_with_cache(mha, x, kv, torch.randn(B, 8, 9))
    assert list(c) == ["hook_q", "hook_k", "hook_v", "hook_attn_scores", "hook_pattern", "hook_z"]
    assert c["hook_pattern"].shape == (B, 5, 3, 8) and c["hook_z"].shape == (B, 3, 5, 4)


def test_drop_in_inside_torch_transformer_encoder():
    torch.manual_seed(1)
    layer = nn.TransformerEncoderLayer(20, 5, 28, dropout=0.0, batch_first=True)
    reference = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    model = replace_attention(
        nn.TransformerEncoder(
            nn.TransformerEncoderLayer(20, 5, 28, dropout=0.0, batch_first=True),
            2,
            enable_nested_tensor=False,
        )
    ).eval()
    model.load_state_dict(reference.state_dict())
    x = torch.randn(B, 6, 20)
    pad = torch.tensor([[False] * 6, [False] * 4 + [True] * 2])
    assert hook_names(model)[0] == "layers.0.self_attn.hook_q"
    with torch.no_grad():
        plain = model(x, src_key_padding_mask=pad)
        out, c = run_with_cache(model, x, src_key_padding_mask=pad)
        # torch's own module, on the input of layer 1, gives the per-head weights
        h0 = reference.layers[0](x, src_key_padding_mask=pad)
        _, w1 = reference.layers[1].self_attn(
            h0, h0, h0, key_padding_mask=pad, average_attn_weights=False
        )
    assert torch.equal(out, plain)
    assert c["layers.1.self_attn.hook_z"].shape == (B, 6, 5, 4)
    torch.testing.assert_close(c["layers.1.self_attn.hook_pattern"], w1, **CLOSE)
    torch.testing.assert_close(out, reference(x, src_key_padding_mask=pad), **CLOSE)


def test_cached_decoding_shows_the_same_activations_as_the_full_forward():
    model = lm("rope", 2)
    ids = torch.randint(0, V, (B, T))
    with torch.no_grad():
        _, full = run_with_cache(model, ids)
        caches = model.make_caches(B)
        model(ids[:, :-1], caches=caches)
        _, step = run_with_cache(model, ids[:, -1:], caches=caches)
    assert step["pattern", 1].shape == (B, 4, 1, T)  # one query, every cached key
    assert step["k", 1].shape == (B, 1, 2, 6)  # this call's key only
    for name in ("pattern", "z", "rot_q"):
        torch.testing.assert_close(
            step[name, 1],
            full[name, 1][:, :, -1:] if name == "pattern" else full[name, 1][:, -1:],
            **CLOSE,
        )
    torch.testing.assert_close(step["resid_post", 1], full["resid_post", 1][:, -1:], **CLOSE)


def test_generate_runs_under_hooks():
    model = lm("alibi")
    shapes = []
    prompt = torch.randint(0, V, (1, 4))
    with hooks(model, [("blocks.0.attn.hook_pattern", lambda p, n: shapes.append(p.shape))]):
        out = model.generate(prompt, 3)
    assert torch.equal(out, model.generate(prompt, 3))
    assert shapes == [(1, 4, 4, 4), (1, 4, 1, 5), (1, 4, 1, 6)]


def test_errors_name_the_hook_point():
    model = lm()
    ids = torch.randint(0, V, (B, T))
    with pytest.raises(
        ValueError, match=r"no hook point 'blocks.0.attn.hook_patern'.*hook_pattern"
    ):
        run_with_cache(model, ids, names="blocks.0.attn.hook_patern")
    with pytest.raises(ValueError, match=r"hook on blocks.1.attn.hook_z returned \(2, 7, 4\)"):
        run_with_hooks(model, ids, fwd_hooks=[(act_name("z", 1), lambda z, n: z[..., 0])])
    with pytest.raises(
        ValueError, match=r"returned torch.float64 on cpu.*\(torch.float32 on cpu\)"
    ):
        run_with_hooks(model, ids, fwd_hooks=[(act_name("z", 1), lambda z, n: z.double())])
    with pytest.raises(TypeError, match="fwd_hooks holds"):
        run_with_hooks(model, ids, fwd_hooks=[("blocks.0.attn.hook_z",)])
    with pytest.raises(TypeError, match="hook names must be strings"):
        run_with_cache(model, ids, names=[3])
    _, cache = run_with_cache(model, ids, names=["blocks.0.attn.hook_z"])
    with pytest.raises(
        KeyError, match=r"no activation 'blocks.1.attn.hook_z'.*blocks.0.attn.hook_z"
    ):
        cache["z", 1]
    with pytest.raises(KeyError, match="unknown activation"):
        act_name("bogus", 1)


def test_replacing_activations_changes_what_follows():
    """A replaced hook_pattern is the pattern used: uniform weights give the mean of the allowed
    values; replaced q changes scores; a replaced resid_post is what the next block gets."""
    model = lm(layers=2)
    ids = torch.randint(0, V, (B, T))
    causal_uniform = torch.ones(T, T).tril() / torch.arange(1, T + 1)[:, None]

    def uniform(pattern, name):
        return causal_uniform.expand_as(pattern).clone()

    with torch.no_grad(), hooks(model, [("blocks.1.attn.hook_pattern", uniform)]):
        _, c = run_with_cache(model, ids, names=lambda n: "blocks.1" in n)
    v = c["v", 1]  # (B, T, H, D)
    mean_of_values = v.cumsum(1) / torch.arange(1, T + 1)[None, :, None, None]
    torch.testing.assert_close(c["z", 1], mean_of_values, **CLOSE)
    torch.testing.assert_close(c["pattern", 1], causal_uniform.expand(B, 4, T, T))


def test_no_hooks_keep_the_fused_path_and_asking_costs_only_what_is_asked(monkeypatch):
    import multihead.modules.attend as attend_module
    from multihead.functional.backends import get_backend, register_backend

    eager_runs = []
    original = get_backend("eager")
    side = attend_module.eager_attention

    def counting_side(call, **kwargs):
        eager_runs.append(tuple(call.q.shape))
        return side(call, **kwargs)

    monkeypatch.setattr(attend_module, "eager_attention", counting_side)
    register_backend(
        "eager",
        lambda call: (eager_runs.append("backend"), original.run(call))[1],
        why_not=original.why_not,
        priority=original.priority,
        replace=True,
    )
    try:
        model = lm(layers=3)
        ids = torch.randint(0, V, (B, T))
        with torch.no_grad():
            model(ids)
            run_with_cache(model, ids, names=lambda n: not n.endswith(("pattern", "scores")))
            assert eager_runs == []  # no hook on the weights: every layer stays fused
            run_with_cache(model, ids, names=act_name("pattern", 1))
            assert eager_runs == [(B, 4, T, 6)]  # one side computation, for layer 1 only
    finally:
        register_backend(
            "eager",
            original.run,
            why_not=original.why_not,
            priority=original.priority,
            replace=True,
        )


def test_context_managers_refuse_a_compiled_model():
    """Calls of a compiled model inside the block would run its hook-free graphs: refused, where
    run_with_cache / run_with_hooks run the eager module themselves."""
    from multihead.interpret import ablate, capture, head_gates

    model = lm()
    compiled = torch.compile(model, backend="eager")
    ids = torch.randint(0, V, (B, T))
    for opening in (
        lambda: hooks(compiled, [("blocks.0.attn.hook_z", lambda z, n: None)]),
        lambda: head_gates(compiled, torch.ones(2, 4)),
        lambda: capture(compiled),
        lambda: ablate(compiled, [(0, 1)]),
    ):
        with pytest.raises(TypeError, match=r"torch.compile.*model._orig_mod"):
            opening().__enter__()
    seen = []
    run_with_hooks(compiled, ids, fwd_hooks=[("blocks.0.attn.hook_z", lambda z, n: seen.append(n))])
    assert seen == ["blocks.0.attn.hook_z"]


def test_a_replaced_pattern_is_used_as_given():
    """Weight a replaced pattern puts on a blocked (future) key is applied, as asked."""
    model = lm()
    ids = torch.randint(0, V, (B, T))
    last = torch.zeros(T, T)
    last[:, -1] = 1  # every query attends to the last token only

    def to_last(pattern, name):
        return last.expand_as(pattern).clone()

    with torch.no_grad(), hooks(model, [(act_name("pattern", 0), to_last)]):
        _, c = run_with_cache(model, ids, names=lambda n: n.startswith("blocks.0.attn"))
    torch.testing.assert_close(c["z", 0], c["v", 0][:, -1:].expand(B, T, 4, 6))
