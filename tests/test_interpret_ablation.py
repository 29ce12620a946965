"""Head ablation by zero, mean and resample, per head and per position, checked against the
activations it should produce (read back through a cache inside the ablation) and against
head_gates."""

import pytest
import torch
from torch import nn

from multihead import CausalLM, LMConfig
from multihead.compat import replace_attention
from multihead.interpret import (
    ablate,
    act_name,
    head_gates,
    hooks,
    mean_ablation,
    resample_ablation,
    run_with_cache,
    run_with_hooks,
    zero_ablation,
)

B, T, V, H, D = 2, 7, 41, 5, 6


@pytest.fixture
def model():
    cfg = LMConfig(vocab_size=V, dim=H * D, num_layers=3, num_heads=H, ffn_dim=44)
    return CausalLM(cfg).eval()


def cache_under(model, fwd_hooks, ids, **kwargs):
    """Activations as the ablated forward computed them (the cache runs after the ablation)."""
    with torch.no_grad(), hooks(model, fwd_hooks):
        return run_with_cache(model, ids, **kwargs)


def test_zero_ablation_equals_gates_and_touches_only_its_heads(model):
    ids = torch.randint(0, V, (B, T))
    gates = torch.ones(3, H)
    gates[1, 3] = gates[1, 0] = gates[2, 4] = 0
    with torch.no_grad():
        _, plain = run_with_cache(model, ids)
        with head_gates(model, gates):
            gated = model(ids)
    out, c = cache_under(model, zero_ablation(model, [(1, 3), (2, 4), (1, 0)]), ids)
    assert torch.equal(out, gated)
    assert torch.equal(c["z", 0], plain["z", 0])  # layer 0 untouched
    assert (c["z", 1][:, :, [0, 3]] == 0).all() and (c["z", 2][:, :, 4] == 0).all()
    kept = [1, 2, 4]
    assert not (c["z", 1][:, :, kept] == 0).any()


def test_zero_ablation_at_chosen_positions(model):
    ids = torch.randint(0, V, (B, T))
    with torch.no_grad():
        plain_logits, plain = run_with_cache(model, ids)
    out, c = cache_under(model, zero_ablation(model, [(0, 2)], positions=[3, -1]), ids)
    z = c["z", 0][:, :, 2]  # (B, T, D)
    assert (z[:, [3, 6]] == 0).all()
    assert torch.equal(z[:, [0, 1, 2, 4, 5]], plain["z", 0][:, [0, 1, 2, 4, 5], 2])
    # causal: positions before the first ablated one compute exactly what they did
    torch.testing.assert_close(out[:, :3], plain_logits[:, :3], atol=0, rtol=0)
    assert not torch.allclose(out[:, 3], plain_logits[:, 3])
    # a boolean (B, T) mask: one position in the second example only
    where = torch.zeros(B, T, dtype=torch.bool)
    where[1, 4] = True
    _, c = cache_under(model, zero_ablation(model, [(0, 2)], positions=where), ids)
    assert (c["z", 0][1, 4, 2] == 0).all()
    assert torch.equal(c["z", 0][0], plain["z", 0][0])


def test_mean_ablation_uses_the_reference_mean(model):
    ids, reference = torch.randint(0, V, (B, T)), torch.randint(0, V, (3, 5))
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 0, 0, 0]])
    with torch.no_grad():
        _, ref = run_with_cache(model, reference, attention_mask=mask)
    z_ref = ref["z", 1][:, :, 4].double()  # (3, 5, D)
    real = mask.bool()
    expected = z_ref[real].mean(0)  # over the 10 real tokens
    fwd_hooks = mean_ablation(model, [(1, 4)], reference, reference_mask=mask, attention_mask=mask)
    _, c = cache_under(model, fwd_hooks, ids)
    torch.testing.assert_close(c["z", 1][:, :, 4].double(), expected.expand(B, T, D))
    # per position: the mean over examples, at each position; the length must match
    reference = torch.randint(0, V, (4, T))
    with torch.no_grad():
        _, ref = run_with_cache(model, reference)
    fwd_hooks = mean_ablation(model, [(1, 4)], reference, per_position=True)
    _, c = cache_under(model, fwd_hooks, ids)
    torch.testing.assert_close(c["z", 1][:, :, 4], ref["z", 1][:, :, 4].mean(0).expand(B, T, D))
    with pytest.raises(ValueError, match=r"does not broadcast.*\(2, 5, 1, 6\)"):
        run_with_hooks(model, ids[:, :5], fwd_hooks=fwd_hooks)


def test_resample_ablation_takes_the_other_inputs_values(model):
    ids, source = torch.randint(0, V, (B, T)), torch.randint(0, V, (B, T))
    with torch.no_grad():
        _, src = run_with_cache(model, source)
    with ablate(model, [(2, 1)], "resample", reference=source), torch.no_grad():
        _, c = run_with_cache(model, ids)
    assert torch.equal(c["z", 2][:, :, 1], src["z", 2][:, :, 1])
    assert not torch.equal(c["z", 2][:, :, 0], src["z", 2][:, :, 0])
    one = source[:1]  # a batch-1 source serves every example
    _, c = cache_under(model, resample_ablation(model, [(2, 1)], one), ids)
    torch.testing.assert_close(c["z", 2][:, :, 1], src["z", 2][:1, :, 1].expand(B, T, D))
    with pytest.raises(ValueError, match=r"blocks.2.attn.hook_z.*\(3, 7, 1, 6\)"):
        run_with_hooks(
            model, ids, fwd_hooks=resample_ablation(model, [(2, 1)], torch.randint(0, V, (3, T)))
        )


def test_ablation_on_the_drop_in():
    layer = nn.TransformerEncoderLayer(20, 5, 28, dropout=0.0, batch_first=True)
    model = replace_attention(nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)).eval()
    x = torch.randn(B, 6, 20)
    gates = torch.ones(2, 5)
    gates[1, 2] = 0
    with torch.no_grad():
        with head_gates(model, gates):
            expected = model(x)
        assert torch.equal(
            run_with_hooks(model, x, fwd_hooks=zero_ablation(model, [(1, 2)])), expected
        )


def test_bad_heads_and_methods(model):
    with pytest.raises(ValueError, match="layer 3 is out of range: the model has 3 layers"):
        zero_ablation(model, [(3, 0)])
    with pytest.raises(ValueError, match="head 5 is out of range: layer 0 has 5 heads"):
        zero_ablation(model, [(0, 5)])
    with pytest.raises(TypeError, match=r"\(layer, head\) pairs"):
        zero_ablation(model, [1, 2])
    with pytest.raises(ValueError, match="heads is empty"):
        zero_ablation(model, [])
    with pytest.raises(ValueError, match="unknown ablation method 'max'"):
        ablate(model, [(0, 0)], "max").__enter__()
    with pytest.raises(ValueError, match="mean ablation needs reference="):
        ablate(model, [(0, 0)], "mean").__enter__()
    with pytest.raises(TypeError, match="positions must be"):
        zero_ablation(model, [(0, 0)], positions=1.5)
    ids = torch.randint(0, V, (B, T))
    with pytest.raises(ValueError, match=r"positions \[9\] are out of range for 7 positions"):
        run_with_hooks(model, ids, fwd_hooks=zero_ablation(model, [(0, 0)], positions=[1, 9]))
    with pytest.raises(ValueError, match=r"reference_mask must be \(B, T\) = \(2, 7\)"):
        mean_ablation(model, [(0, 0)], ids, reference_mask=torch.ones(2, 6))
    assert act_name("z", 0) == zero_ablation(model, [(0, 0)])[0][0]
