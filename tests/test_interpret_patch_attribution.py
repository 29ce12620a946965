"""attribution_patch(): the gradient estimate of every patch, from one forward and one backward.
Where the metric is linear in the patched activation (an attention-only model without a final
norm, read by a logit difference: its last block's heads and stream reach the logits linearly),
the estimate equals real patching exactly; elsewhere it has patch()'s shapes and is exactly 0
where the clean and corrupted activations agree."""

import pytest
import torch
from torch import nn

from multihead import CausalLM, LMConfig
from multihead.interpret import attribution_patch, patch

B, T, V, L, H = 2, 6, 29, 2, 3


def metric(logits):
    return (logits[:, -1, 3] - logits[:, -1, 8]).mean()


def pair(seed=0):
    g = torch.Generator().manual_seed(seed)
    clean = torch.randint(0, V, (B, T), generator=g)
    corrupted = clean.clone()
    corrupted[:, 3] = (clean[:, 3] + 5) % V
    return clean, corrupted


def test_exact_where_the_metric_is_linear_in_the_activation():
    torch.manual_seed(2)
    cfg = LMConfig(vocab_size=V, dim=18, num_layers=L, num_heads=H, attention_only=True)
    model = CausalLM(cfg, dtype=torch.float64).eval()
    model.norm_f = nn.Identity()  # logits = final stream @ W_U^T: linear in the last block
    clean, corrupted = pair()
    kwargs = dict(head_positions=True, resid="resid_post")
    approx = attribution_patch(model, clean, corrupted, metric, **kwargs)
    exact = patch(model, clean, corrupted, metric, **kwargs)
    assert approx.clean == pytest.approx(exact.clean) and approx.corrupted == exact.corrupted
    last = L - 1
    torch.testing.assert_close(approx.resid["resid_post"][last], exact.resid["resid_post"][last])
    torch.testing.assert_close(approx.head_positions[last], exact.head_positions[last])
    # all positions of a head at once is the sum of the single positions (linear)
    torch.testing.assert_close(approx.heads[last], exact.heads[last])
    assert exact.head_positions[last].abs().max() > 0.01
    # the first block reaches the logits through softmax: an estimate, not the value
    assert not torch.allclose(approx.head_positions[0], exact.head_positions[0])


def test_shapes_and_zeros_on_a_full_model():
    torch.manual_seed(4)
    cfg = LMConfig(
        vocab_size=V, dim=18, num_layers=L, num_heads=H, num_kv_heads=1, position="rope",
        norm="rmsnorm", mlp="swiglu", bias=False,
    )  # fmt: skip
    model = CausalLM(cfg).eval()
    clean, corrupted = pair(1)
    approx = attribution_patch(
        model, clean, corrupted, metric, head_positions=True, resid=("resid_pre", "resid_post")
    )
    assert approx.heads.shape == (L, H) and approx.head_positions.shape == (L, H, T)
    assert approx.resid["resid_pre"].shape == approx.resid["resid_post"].shape == (L, T)
    assert (approx.head_positions[..., :3] == 0).all()  # the inputs agree before position 3
    assert approx.head_positions[..., 3:].abs().sum() > 0
    assert not any(p.grad is not None for p in model.parameters())  # no gradients left behind
    with pytest.raises(ValueError, match="differentiable"):
        attribution_patch(model, clean, corrupted, lambda out: metric(out).detach())


def test_verify_puts_real_patches_in_place_of_the_top_estimates():
    """verify=k: the k entries with the largest |estimate| of each kind are real patch()
    fractions (the loop engine, an independent path), the others the estimate; resid warns."""
    torch.manual_seed(4)
    cfg = LMConfig(vocab_size=V, dim=18, num_layers=L, num_heads=H, position="rope", bias=False)
    model = CausalLM(cfg, dtype=torch.float64).eval()
    clean, corrupted = pair(1)
    kwargs = dict(head_positions=True, resid="resid_pre")
    with pytest.warns(UserWarning, match="residual stream is a poor screen"):
        plain = attribution_patch(model, clean, corrupted, metric, **kwargs)
    with pytest.warns(UserWarning, match="residual stream"):
        checked = attribution_patch(model, clean, corrupted, metric, verify=4, **kwargs)
    real = patch(model, clean, corrupted, metric, engine="loop", **kwargs)
    for kind in ("heads", "head_positions"):
        est, got, want = getattr(plain, kind), getattr(checked, kind), getattr(real, kind)
        top = est.flatten().abs().argsort(descending=True)[:4]
        rest = torch.ones(est.numel(), dtype=torch.bool)
        rest[top] = False
        torch.testing.assert_close(got.flatten()[top], want.flatten()[top])
        assert torch.equal(got.flatten()[rest], est.flatten()[rest])
        assert not torch.allclose(est.flatten()[top], want.flatten()[top])  # it did change
    est, got = plain.resid["resid_pre"], checked.resid["resid_pre"]
    top = est.flatten().abs().argsort(descending=True)[:4]
    torch.testing.assert_close(got.flatten()[top], real.resid["resid_pre"].flatten()[top])
    with pytest.raises(ValueError, match="verify must be a non-negative int"):
        attribution_patch(model, clean, corrupted, metric, verify=-1)
