"""patch(engine="batched") against the one-forward-per-patch engine (explicit patching through
hooks on the whole model): the same fractions for every head, every head at every position and
every residual position, on GPT-2 and Llama-layout models (RoPE, grouped-query, a sliding
window), with padding, and whatever the number of patches per forward."""

import pytest
import torch

from multihead import CausalLM, LMConfig
from multihead.interpret import patch

B, T, V, L, H = 2, 7, 41, 3, 3

CONFIGS = {
    "gpt2": dict(),
    "llama-window": dict(
        num_kv_heads=1, position="rope", norm="rmsnorm", mlp="swiglu", bias=False,
        tie_embeddings=False, sliding_window=4,
    ),
}  # fmt: skip


def metric(logits):
    return logits[:, -1, 3].mean() - logits[:, -1, 5].mean()


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def setup(request):
    torch.manual_seed(5)
    cfg = LMConfig(
        vocab_size=V, dim=24, num_layers=L, num_heads=H, ffn_dim=20, **CONFIGS[request.param]
    )
    model = CausalLM(cfg).eval()
    clean = torch.randint(0, V, (B, T))
    corrupted = clean.clone()
    corrupted[:, 2] = (clean[:, 2] + 7) % V
    corrupted[:, 4] = (clean[:, 4] + 3) % V
    return model, clean, corrupted


def assert_same(a, b):
    assert a.clean == pytest.approx(b.clean) and a.corrupted == pytest.approx(b.corrupted)
    torch.testing.assert_close(a.heads, b.heads, atol=1e-5, rtol=0)
    if b.head_positions is not None:
        torch.testing.assert_close(a.head_positions, b.head_positions, atol=1e-5, rtol=0)
    assert (a.head_positions is None) == (b.head_positions is None)
    assert a.resid.keys() == b.resid.keys()
    for name in a.resid:
        torch.testing.assert_close(a.resid[name], b.resid[name], atol=1e-5, rtol=0)


def test_batched_equals_one_by_one(setup):
    model, clean, corrupted = setup
    kwargs = dict(head_positions=True, resid=("resid_pre", "resid_post"))
    loop = patch(model, clean, corrupted, metric, engine="loop", **kwargs)
    assert loop.head_positions.abs().max() > 0.01  # the patches do matter
    for batch_size in (None, 4):  # all of a layer's patches in one forward, or chunks of 4
        fast = patch(
            model, clean, corrupted, metric, engine="batched", batch_size=batch_size, **kwargs
        )
        assert_same(fast, loop)
        assert (fast.head_positions[:, :, :2] == 0).all()  # nothing differs before position 2


def test_batched_with_padding(setup):
    model, clean, corrupted = setup
    mask = torch.ones(B, T, dtype=torch.long)
    mask[0, :2] = 0  # left padding in the first row
    kwargs = dict(resid="resid_pre", attention_mask=mask)
    loop = patch(model, clean, corrupted, metric, engine="loop", **kwargs)
    fast = patch(model, clean, corrupted, metric, engine="batched", batch_size=5, **kwargs)
    assert_same(fast, loop)


def test_engine_choice_is_checked(setup):
    model, clean, corrupted = setup
    with pytest.raises(ValueError, match="engine must be"):
        patch(model, clean, corrupted, metric, engine="fast")
    with pytest.raises(ValueError, match="batch_size"):
        patch(model, clean, corrupted, metric, batch_size=0)
    model.train()
    try:
        with pytest.raises(ValueError, match="training mode"):
            patch(model, clean, corrupted, metric, engine="batched")
    finally:
        model.eval()


def halve(x, name):
    return x / 2


def test_inside_a_users_hooks_context_both_engines_give_one_answer(setup):
    """A hooks() context that halves one residual stream (where the batched engine, running
    blocks on cached streams, disagreed with the loop by up to 1.29): "auto" gives the loop's
    answer, which is the manual patch under the same hook, and engine="batched" is refused
    naming the hook point."""
    from multihead.interpret import hooks, run_with_cache, run_with_hooks
    from multihead.interpret.ablation import replace_heads

    model, clean, corrupted = setup
    kwargs = dict(resid="resid_pre")
    point = "blocks.1.hook_resid_pre"
    free = patch(model, clean, corrupted, metric, engine="batched", **kwargs)
    with hooks(model, [(point, halve)]):
        auto = patch(model, clean, corrupted, metric, **kwargs)
        loop = patch(model, clean, corrupted, metric, engine="loop", **kwargs)
        with pytest.raises(
            ValueError, match=r"engine='batched' cannot run.*blocks\.1\.hook_resid_pre"
        ):
            patch(model, clean, corrupted, metric, engine="batched")
    assert_same(auto, loop)
    assert (auto.heads - free.heads).abs().max() > 1e-3  # the hook does change the answer
    # the loop's answer is the manual patch under the same hook (head L0 H1, resid_pre L2 pos 4)
    with torch.no_grad():
        with hooks(model, [(point, halve)]):
            _, cache = run_with_cache(model, clean)
        base = metric(run_with_hooks(model, corrupted, fwd_hooks=[(point, halve)]))
        full = metric(run_with_hooks(model, clean, fwd_hooks=[(point, halve)]))
        z = cache["blocks.0.attn.hook_z"][:, :, [1]]
        hooked = [(point, halve), ("blocks.0.attn.hook_z", replace_heads([1], z))]
        one = metric(run_with_hooks(model, corrupted, fwd_hooks=hooked))
    assert float((one - base) / (full - base)) == pytest.approx(float(loop.heads[0, 1]), abs=1e-5)
    # outside the context the batched engine runs again
    assert_same(patch(model, clean, corrupted, metric, **kwargs), free)
