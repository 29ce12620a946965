"""RoPE, ALiBi and absolute positions."""

import math

import pytest
import torch

from multihead.positional import (
    LearnedPositions,
    RotaryEmbedding,
    SinusoidalPositions,
    alibi_bias,
    alibi_slopes,
    apply_rope,
    rope_cos_sin,
    rope_frequencies,
    sinusoidal_positions,
)


def test_rope_scores_depend_only_on_relative_position():
    D = 8
    inv = rope_frequencies(D)
    q, k = torch.randn(D, dtype=torch.float64), torch.randn(D, dtype=torch.float64)

    def score(i, j):
        ci, si = rope_cos_sin(torch.tensor([i]), inv, torch.float64)
        cj, sj = rope_cos_sin(torch.tensor([j]), inv, torch.float64)
        return (
            apply_rope(q.view(1, 1, 1, D), ci, si) * apply_rope(k.view(1, 1, 1, D), cj, sj)
        ).sum()

    assert score(5, 2) == pytest.approx(float(score(13, 10)), abs=1e-10)
    assert score(5, 2) == pytest.approx(float(score(3, 0)), abs=1e-10)
    assert score(5, 2) != pytest.approx(float(score(5, 3)), abs=1e-6)


def test_rope_hand_computed_and_norm_preserving():
    # D = 2: a plain 2-D rotation by position * 1 radian.
    x = torch.tensor([[[[1.0, 0.0]]]], dtype=torch.float64)
    cos, sin = rope_cos_sin(torch.tensor([1]), rope_frequencies(2), torch.float64)
    torch.testing.assert_close(
        apply_rope(x, cos, sin)[0, 0, 0],
        torch.tensor([math.cos(1), math.sin(1)], dtype=torch.float64),
    )
    rope = RotaryEmbedding(16)
    q, k = torch.randn(2, 3, 5, 16), torch.randn(2, 1, 5, 16)
    q2, _ = rope(q, k, torch.arange(5))
    torch.testing.assert_close(q2.norm(dim=-1), q.norm(dim=-1))
    # Per-row positions (B, T), and positions past the initial cache grow it.
    q3, _ = rope(q, k, torch.stack([torch.arange(5), torch.arange(5) + 3000]))
    torch.testing.assert_close(q3[0], q2[0])


def test_rope_rejects_odd_head_dim():
    with pytest.raises(ValueError, match="even head_dim, got 7"):
        RotaryEmbedding(7)


def test_alibi_slopes_as_in_the_paper():
    assert alibi_slopes(8).tolist() == pytest.approx([2 ** -(i + 1) for i in range(8)])
    s12 = alibi_slopes(12).tolist()
    assert s12[:8] == pytest.approx([2 ** -(i + 1) for i in range(8)])
    assert s12[8:] == pytest.approx([2**-0.5, 2**-1.5, 2**-2.5, 2**-3.5])
    assert len(alibi_slopes(5)) == 5
    with pytest.raises(ValueError):
        alibi_slopes(0)


def test_alibi_bias_bottom_right():
    b = alibi_bias(torch.tensor([0.5]), 2, 4)
    # queries at positions 2, 3; keys 0..3
    assert b[0, 0].tolist() == [[-1.0, -0.5, 0.0, -0.5], [-1.5, -1.0, -0.5, 0.0]]


def test_absolute_positions():
    table = sinusoidal_positions(10, 6)
    assert table[0].tolist() == [0, 1, 0, 1, 0, 1]
    assert table[3, 0] == pytest.approx(math.sin(3)) and table[3, 1] == pytest.approx(math.cos(3))
    assert table[3, 2] == pytest.approx(math.sin(3 / 10000 ** (2 / 6)))
    assert SinusoidalPositions(6, max_positions=4)(torch.arange(10)).shape == (10, 6)
    learned = LearnedPositions(8, 4)
    assert learned(torch.arange(8)).shape == (8, 4)
    with pytest.raises(ValueError, match=r"position 8 is past the position table \(8 positions\)"):
        learned(torch.arange(9))


def _hf_inv_freq(rope_parameters, seq_len=None, head_dim=16, max_positions=64):
    """transformers' inverse frequencies for a LlamaConfig with these rope_parameters."""
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = transformers.LlamaConfig(
        hidden_size=64,
        num_attention_heads=4,
        head_dim=head_dim,
        max_position_embeddings=max_positions,
        rope_parameters=rope_parameters,
    )
    kind = rope_parameters["rope_type"]
    inv, attention_factor = ROPE_INIT_FUNCTIONS[kind](config, "cpu", seq_len=seq_len)
    assert attention_factor == 1.0  # none of the three rescales attention
    return inv.double()


def test_rope_scaling_frequencies_match_transformers():
    from multihead.positional import RopeScaling, dynamic_ntk_frequencies, scaled_rope_frequencies

    plain = rope_frequencies(16, 500.0)
    linear = scaled_rope_frequencies(16, 500.0, RopeScaling("linear", 2.5))
    ref = _hf_inv_freq({"rope_type": "linear", "factor": 2.5, "rope_theta": 500.0})
    torch.testing.assert_close(linear, ref, rtol=1e-6, atol=0)
    torch.testing.assert_close(linear, plain / 2.5)

    llama3 = RopeScaling("llama3", 8.0, 32, low_freq_factor=1.0, high_freq_factor=4.0)
    ours = scaled_rope_frequencies(16, 50.0, llama3)
    ref = _hf_inv_freq(
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "rope_theta": 50.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        }
    )
    torch.testing.assert_close(ours, ref, rtol=1e-6, atol=0)
    plain = rope_frequencies(16, 50.0)
    kept, divided = ours == plain, torch.isclose(ours, plain / 8)
    assert kept.any() and divided.any() and (~kept & ~divided).any()  # all three bands

    dynamic = RopeScaling("dynamic", 3.0, 16)
    params = {"rope_type": "dynamic", "factor": 3.0, "rope_theta": 10000.0}
    for seq_len in (8, 16, 17, 40):
        ours = dynamic_ntk_frequencies(16, 10000.0, dynamic, torch.tensor(seq_len))
        ref = _hf_inv_freq(params, seq_len=torch.tensor(seq_len), max_positions=16)
        torch.testing.assert_close(ours, ref, rtol=2e-6, atol=0)
        if seq_len <= 16:
            assert torch.equal(ours, rope_frequencies(16, 10000.0))


def test_dynamic_rotary_embedding_scales_past_the_trained_length():
    from multihead.positional import RopeScaling

    plain = RotaryEmbedding(16)
    dynamic = RotaryEmbedding(16, scaling=RopeScaling("dynamic", 2.0, 10))
    q, k = torch.randn(1, 2, 10, 16), torch.randn(1, 1, 10, 16)
    for a, b in zip(plain(q, k, torch.arange(10)), dynamic(q, k, torch.arange(10)), strict=True):
        torch.testing.assert_close(a, b)  # within the trained length: plain RoPE
    late = torch.arange(10, 20)
    assert (plain(q, k, late)[0] - dynamic(q, k, late)[0]).abs().max() > 1e-3


def test_rope_scaling_is_validated():
    from multihead.positional import RopeScaling

    with pytest.raises(ValueError, match="kind must be one of"):
        RopeScaling("ntk-by-parts", 2.0)
    with pytest.raises(ValueError, match=r"factor must be a number >= 1, got 0\.5"):
        RopeScaling("linear", 0.5)
    with pytest.raises(ValueError, match="dynamic RoPE scaling needs original_max_positions"):
        RopeScaling("dynamic", 2.0)
    with pytest.raises(ValueError, match="0 < low_freq_factor < high_freq_factor"):
        RopeScaling("llama3", 8.0, 8192, low_freq_factor=4.0, high_freq_factor=1.0)
    with pytest.raises(TypeError, match="scaling must be a RopeScaling"):
        RotaryEmbedding(16, scaling={"rope_type": "linear"})
    with pytest.raises(ValueError, match="RoPE base must be a number > 1"):
        RotaryEmbedding(16, base=0.0)
