"""patch(): fractions recovered against hand-built expectations. Clean and corrupted inputs differ
in one token (position K) of a causal model, and the metric reads the last position, so:
residual streams recover exactly 1 at the one position that carries the difference and exactly
0 elsewhere; heads recover exactly 0 before K; a head whose output projection is zeroed
recovers 0; each head's fraction equals the one computed by hand."""

import pytest
import torch

from multihead import CausalLM, LMConfig
from multihead.interpret import PatchResult, act_name, patch, run_with_cache, run_with_hooks

B, T, V, H, L, K = 2, 6, 37, 3, 2, 2
ANSWER = 5


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(3)
    cfg = LMConfig(vocab_size=V, dim=18, num_layers=L, num_heads=H, ffn_dim=28)
    model = CausalLM(cfg).eval()
    with torch.no_grad():  # head 1 of block 1 writes nothing: it cannot matter
        model.layers[1].attn.out_proj.weight[:, 6:12] = 0
    clean = torch.randint(0, V, (B, T))
    corrupted = clean.clone()
    corrupted[:, K] = (clean[:, K] + 1) % V
    return model, clean, corrupted


def metric(logits):
    return logits[:, -1, ANSWER].mean()


def test_fractions_match_hand_built_expectations(setup):
    model, clean, corrupted = setup
    result = patch(
        model, clean, corrupted, metric, head_positions=True, resid=("resid_pre", "resid_post")
    )
    assert isinstance(result, PatchResult)
    with torch.no_grad():
        assert result.clean == pytest.approx(float(metric(model(clean))))
        assert result.corrupted == pytest.approx(float(metric(model(corrupted))))
    pre, post = result.resid["resid_pre"], result.resid["resid_post"]
    assert pre.shape == post.shape == (L, T)
    # block 0 receives the embeddings: only position K differs, and it carries everything
    expected = torch.zeros(T)
    expected[K] = 1
    torch.testing.assert_close(pre[0], expected, atol=1e-5, rtol=0)
    # the last block's output is read at the last position only
    expected = torch.zeros(T)
    expected[-1] = 1
    torch.testing.assert_close(post[-1], expected, atol=1e-5, rtol=0)
    assert (pre[:, :K] == 0).all() and (post[:, :K] == 0).all()  # identical before K
    assert result.heads.shape == (L, H) and result.head_positions.shape == (L, H, T)
    assert (result.head_positions[:, :, :K] == 0).all()
    assert result.heads[1, 1] == 0 and (result.head_positions[1, 1] == 0).all()
    assert result.layer_names == ("blocks.0.attn.hook_z", "blocks.1.attn.hook_z")


def test_each_head_fraction_equals_the_hand_computation(setup):
    model, clean, corrupted = setup
    result = patch(model, clean, corrupted, metric)
    with torch.no_grad():
        _, cache = run_with_cache(model, clean, names=lambda n: n.endswith("hook_z"))
        m_clean, m_corrupted = float(metric(model(clean))), float(metric(model(corrupted)))
        for layer in range(L):
            for head in range(H):

                def from_clean(z, name, head=head):
                    z = z.clone()
                    z[:, :, head] = cache[name][:, :, head]
                    return z

                out = run_with_hooks(
                    model, corrupted, fwd_hooks=[(act_name("z", layer), from_clean)]
                )
                expected = (float(metric(out)) - m_corrupted) / (m_clean - m_corrupted)
                assert float(result.heads[layer, head]) == pytest.approx(expected, abs=1e-5)
    assert result.heads.abs().max() > 0.01  # some head carries part of the difference


def test_table_lists_the_largest_fractions(setup):
    model, clean, corrupted = setup
    result = patch(model, clean, corrupted, metric, resid="resid_pre")
    text = result.table(top=4, kind="resid_pre")
    lines = text.splitlines()
    assert lines[0].startswith("metric: clean") and lines[2].split() == [
        "patched",
        "(resid_pre)",
        "recovered",
    ]
    assert len(lines) == 4 + 4
    assert f"resid_pre L0 pos {K}" in text and "1.000" in text
    assert str(result) == result.table()


def test_bad_input(setup):
    model, clean, corrupted = setup
    with pytest.raises(ValueError, match="no difference to recover"):
        patch(model, clean, clean, metric)
    with pytest.raises(ValueError, match=r"clean \(2, 6\) and corrupted \(2, 5\)"):
        patch(model, clean, corrupted[:, :5], metric)
    with pytest.raises(ValueError, match="resid_mid"):
        patch(model, clean, corrupted, metric, resid="resid_mid")
    with pytest.raises(ValueError, match=r"metric must return a scalar.*\(2,\)"):
        patch(model, clean, corrupted, lambda logits: logits[:, -1, 0])


def test_table_keeps_heads_beside_larger_residual_entries():
    heads = torch.tensor([[0.01, -0.02], [0.03, 0.0]])
    resid = {"resid_pre": torch.full((2, 4), 0.9)}  # every residual entry outweighs every head
    result = PatchResult(1.0, 0.0, heads, None, resid, ("a", "b"))
    text = result.table(top=3)
    assert "patched (heads)" in text and "patched (resid_pre)" in text
    head_rows = [line for line in text.splitlines() if line.strip().startswith("L")]
    assert [r.split()[:2] for r in head_rows] == [["L1", "H0"], ["L0", "H1"], ["L0", "H0"]]
    assert text.count("resid_pre L") == 3
    only = result.table(kind="heads")
    assert "resid_pre" not in only and "L1 H0" in only
    assert result.sections() == ["heads", "resid_pre"]
    with pytest.raises(ValueError, match="kind must be one of"):
        result.table(kind="head_positions")
