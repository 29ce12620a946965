"""Interventions that must agree with each other: zeroing a head through hook_z, through
head_gates and through its slice of the output projection; per-head results summing to the
attention output; patched patterns doing what the formula says; patching the clean run's
activations into a corrupted run giving the clean run back."""

import pytest
import torch
from torch import nn

from multihead import CausalLM, LMConfig
from multihead.compat import replace_attention
from multihead.interpret import act_name, head_gates, hooks, run_with_cache, run_with_hooks
from multihead.pretrained import BertConfig, BertEncoder

CLOSE = dict(atol=1e-5, rtol=1e-4)
B, T, V, H = 2, 7, 47, 5


def lm(position="learned"):
    cfg = LMConfig(vocab_size=V, dim=30, num_layers=3, num_heads=H, ffn_dim=44, position=position)
    return CausalLM(cfg).eval()


def bert():
    return BertEncoder(BertConfig(V, 30, 3, H, 44, max_position_embeddings=32)).eval()


def output(x):
    return x if isinstance(x, torch.Tensor) else x[0]


def zero_head(head):
    def fn(z, name):  # z (B, T, H, D)
        z = z.clone()
        z[:, :, head] = 0
        return z

    return fn


@pytest.mark.parametrize("make", [lm, bert], ids=["causal-lm", "bert"])
@pytest.mark.parametrize("layer, head", [(0, 3), (2, 1)])
def test_zeroing_a_head_three_ways(make, layer, head):
    model = make()
    ids = torch.randint(0, V, (B, T))
    gates = torch.ones(3, H)
    gates[layer, head] = 0
    D = 30 // H
    with torch.no_grad():
        hooked = output(
            run_with_hooks(model, ids, fwd_hooks=[(act_name("z", layer), zero_head(head))])
        )
        with head_gates(model, gates):
            gated = output(model(ids))
        plain = output(model(ids))
        block = (model.layers if hasattr(model, "layers") else model.blocks)[layer]
        block.attn.out_proj.weight[:, head * D : (head + 1) * D] = 0
        weights_zeroed = output(model(ids))
    assert torch.equal(hooked, gated)  # z * 0 and a zeroed slice feed the same projection
    torch.testing.assert_close(hooked, weights_zeroed, **CLOSE)
    assert not torch.allclose(hooked, plain, atol=1e-3)  # the head mattered


def test_per_head_results_sum_to_the_attention_output():
    model = lm()
    ids = torch.randint(0, V, (B, T))
    names = lambda n: n.endswith(("hook_result", "hook_attn_out"))  # noqa: E731
    with torch.no_grad():
        plain = model(ids)
        out, cache = run_with_cache(model, ids, names=names)
    assert torch.equal(out, plain)  # reading hook_result changes nothing
    for i, block in enumerate(model.layers):
        summed = (
            cache["result", i].sum(dim=2) + block.attn.out_proj.bias
        )  # (B, T, H, C) -> (B, T, C)
        torch.testing.assert_close(summed, cache["attn_out", i], **CLOSE)


def test_replacing_hook_result_is_what_the_block_adds():
    """A hook that edits hook_result changes the output by exactly the edited contribution."""
    model = lm()
    ids = torch.randint(0, V, (B, T))

    def drop_head_2(result, name):
        result = result.clone()
        result[:, :, 2] = 0
        return result

    with torch.no_grad():
        by_result = run_with_hooks(model, ids, fwd_hooks=[(act_name("result", 1), drop_head_2)])
        by_z = run_with_hooks(model, ids, fwd_hooks=[(act_name("z", 1), zero_head(2))])
    torch.testing.assert_close(by_result, by_z, **CLOSE)


def test_one_hot_pattern_copies_the_value_it_points_at():
    """Every query attends only to the previous token (the first to itself): z at t is v at t-1."""
    model = lm()
    ids = torch.randint(0, V, (B, T))
    previous = torch.zeros(T, T)
    previous[0, 0] = 1
    previous[torch.arange(1, T), torch.arange(T - 1)] = 1

    def to_previous(pattern, name):
        return previous.expand_as(pattern).clone()

    with torch.no_grad(), hooks(model, [(act_name("pattern", 0), to_previous)]):
        _, c = run_with_cache(model, ids, names=lambda n: n.startswith("blocks.0.attn"))
    v = c["v", 0]  # (B, T, H, D)
    torch.testing.assert_close(c["z", 0][:, 1:], v[:, :-1])
    torch.testing.assert_close(c["z", 0][:, 0], v[:, 0])


@pytest.mark.parametrize("make", [lambda: lm("rope"), bert], ids=["causal-lm-rope", "bert"])
def test_patching_every_activation_from_the_clean_run_recovers_it(make):
    model = make()
    clean, corrupted = torch.randint(0, V, (B, T)), torch.randint(0, V, (B, T))
    with torch.no_grad():
        clean_out, cache = run_with_cache(model, clean)
        corrupted_out = output(model(corrupted))

        def from_clean(activation, name):
            return cache[name]

        patched = run_with_hooks(model, corrupted, fwd_hooks=[(lambda n: n in cache, from_clean)])
        # The first residual stream alone carries everything that follows.
        first = run_with_hooks(model, corrupted, fwd_hooks=[(act_name("resid_pre", 0), from_clean)])
    assert not torch.allclose(output(clean_out), corrupted_out, atol=1e-2)
    assert torch.equal(output(patched), output(clean_out))
    assert torch.equal(output(first), output(clean_out))


def test_drop_in_head_ablation_and_gates_agree():
    layer = nn.TransformerEncoderLayer(20, 5, 28, dropout=0.0, batch_first=True)
    model = replace_attention(nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)).eval()
    x = torch.randn(B, 6, 20)
    gates = torch.ones(2, 5)
    gates[1, 4] = 0
    with torch.no_grad():
        hooked = run_with_hooks(model, x, fwd_hooks=[("layers.1.self_attn.hook_z", zero_head(4))])
        with head_gates(model, gates):
            gated = model(x)
        model.layers[1].self_attn.out_proj.weight[:, 16:] = 0
        zeroed = model(x)
    assert torch.equal(hooked, gated)
    torch.testing.assert_close(hooked, zeroed, **CLOSE)
