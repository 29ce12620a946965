"""Every RoPE scaling kind the families' published configs use, against transformers' own rotary
embedding classes (which call transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS and its
dynamic / longrope updates): the config read by multihead, the cos/sin (attention factor
included) at positions before and past original_max_position_embeddings; and the config's
bad input."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from multihead.models.fields import Fields  # noqa: E402
from multihead.models.rope_config import rope_settings, rotary_fraction  # noqa: E402
from multihead.positional import RotaryEmbedding  # noqa: E402

HEAD, ORIGINAL, LONGEST = 16, 16, 64
# ten per-pair divisors of longrope, away from 1 (both sets matter), for the 8 pairs of HEAD 16
SHORT = [1.0, 1.1, 1.3, 1.2, 1.7, 2.0, 2.5, 3.0]
LONG = [1.5, 2.0, 2.2, 3.1, 4.0, 6.0, 7.5, 9.0]

CASES = {
    "linear": ("llama", {"rope_type": "linear", "factor": 2.5, "rope_theta": 500.0}),
    "dynamic": ("llama", {"rope_type": "dynamic", "factor": 3.0, "rope_theta": 500.0}),
    "llama3": (
        "llama",
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": ORIGINAL,
            "rope_theta": 50.0,  # small: frequencies in all three bands of the ramp
        },
    ),
    "yarn": (
        "llama",
        {
            "rope_type": "yarn",
            "factor": 4.0,
            "rope_theta": 100.0,
            "beta_fast": 8.0,
            "beta_slow": 0.5,
            "original_max_position_embeddings": ORIGINAL,
        },
    ),
    "yarn-untruncated-mscale": (
        "llama",
        {
            "rope_type": "yarn",
            "factor": 4.0,
            "rope_theta": 100.0,
            "truncate": False,
            "mscale": 0.8,
            "mscale_all_dim": 0.3,
            "original_max_position_embeddings": ORIGINAL,
        },
    ),
    "longrope": (
        "phi3",
        {"rope_type": "longrope", "short_factor": SHORT, "long_factor": LONG, "rope_theta": 100.0},
    ),
    "partial-neox": ("gpt_neox", {"rope_type": "default", "rope_theta": 50.0}),
    "partial-neox-linear": ("gpt_neox", {"rope_type": "linear", "factor": 2.0, "rope_theta": 50.0}),
}


def _hf(model_type: str, params: dict):
    """(transformers config, its rotary embedding module)."""
    common = dict(hidden_size=4 * HEAD, num_attention_heads=4, max_position_embeddings=LONGEST)
    if model_type == "llama":
        config = transformers.LlamaConfig(**common, head_dim=HEAD, rope_parameters=dict(params))
        return config, transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(config)
    if model_type == "phi3":
        config = transformers.Phi3Config(
            **common, original_max_position_embeddings=ORIGINAL, rope_parameters=dict(params)
        )
        return config, transformers.models.phi3.modeling_phi3.Phi3RotaryEmbedding(config)
    config = transformers.GPTNeoXConfig(
        **common, rope_parameters=dict(params) | {"partial_rotary_factor": 0.5}
    )
    return config, transformers.models.gpt_neox.modeling_gpt_neox.GPTNeoXRotaryEmbedding(config)


def _ours(config) -> RotaryEmbedding:
    raw = config.to_dict()
    f = Fields(raw, raw["model_type"])
    theta, scaling = rope_settings(f, raw["max_position_embeddings"], partial=True)
    rotary = int(HEAD * rotary_fraction(f))
    return RotaryEmbedding(HEAD, base=theta, scaling=scaling, rotary_dim=rotary)


@pytest.mark.parametrize("name", sorted(CASES))
def test_cos_sin_equal_transformers_before_and_past_the_original_length(name):
    model_type, params = CASES[name]
    config, _ = _hf(model_type, params)
    ours = _ours(config)
    plain = RotaryEmbedding(HEAD, base=params["rope_theta"], rotary_dim=ours.rotary_dim)
    x = torch.zeros(1, 1, 1, HEAD)
    # one call per length (dynamic and longrope choose from the call's largest position): within
    # the original length, just past it, far past it (dynamic grows past max_position_embeddings,
    # LONGEST); and a decoding step alone
    for positions in (torch.arange(10), torch.arange(ORIGINAL + 3), torch.arange(3 * ORIGINAL),
                      torch.arange(LONGEST + 9), torch.tensor([[40, 41, 42]])):  # fmt: skip
        _, rotary = _hf(model_type, params)  # fresh: transformers' dynamic RoPE keeps state
        ids = positions if positions.dim() == 2 else positions[None]
        ref_cos, ref_sin = rotary(x, ids)
        cos, sin = ours.cos_sin(ids, torch.float32)
        torch.testing.assert_close(cos, ref_cos, atol=1e-5, rtol=0)  # fp32 angles up to ~80 rad
        torch.testing.assert_close(sin, ref_sin, atol=1e-5, rtol=0)  # fp32 angles up to ~80 rad
    # the scaling changes the rotation at the long length (a test that could not fail otherwise)
    far = torch.arange(LONGEST + 9)[None]
    if name != "partial-neox":
        changed = ours.cos_sin(far, torch.float32)[1] - plain.cos_sin(far, torch.float32)[1]
        assert changed.abs().max() > 1e-2


def test_partial_rotary_leaves_the_rest_of_each_head_unchanged():
    config, _ = _hf(*CASES["partial-neox"])
    rope = _ours(config)
    assert rope.rotary_dim == HEAD // 2
    q, k = torch.randn(2, 3, 5, HEAD), torch.randn(2, 1, 5, HEAD)
    q2, k2 = rope(q, k, torch.arange(5) + 7)
    assert torch.equal(q2[..., HEAD // 2 :], q[..., HEAD // 2 :])
    assert torch.equal(k2[..., HEAD // 2 :], k[..., HEAD // 2 :])
    assert not torch.allclose(q2[..., : HEAD // 2], q[..., : HEAD // 2])
    # the rotated part equals transformers' partial rotary of the whole head
    from transformers.models.gpt_neox.modeling_gpt_neox import apply_rotary_pos_emb

    _, rotary = _hf(*CASES["partial-neox"])
    cos, sin = rotary(q, (torch.arange(5) + 7)[None])
    ref_q, ref_k = apply_rotary_pos_emb(q, k, cos, sin)
    torch.testing.assert_close(q2, ref_q, atol=1e-6, rtol=0)
    torch.testing.assert_close(k2, ref_k, atol=1e-6, rtol=0)


def _settings(config: dict):
    return rope_settings(Fields(config, "llama"), 64)


def test_both_spellings_with_equal_values_load():
    # a Llama 3.1 config.json as published (rope_scaling + rope_theta) re-saved by transformers 5
    # (rope_parameters holding the same numbers and rope_theta)
    scaling = {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
               "original_max_position_embeddings": 8192, "rope_type": "llama3"}  # fmt: skip
    config = {"rope_theta": 500000.0, "rope_scaling": scaling,
              "rope_parameters": scaling | {"rope_theta": 500000.0}}  # fmt: skip
    theta, rule = _settings(config)
    assert theta == 500000.0 and rule is not None and rule.kind == "llama3"
    assert rule.factor == 8.0 and rule.original_max_positions == 8192
    # transformers 4's "type" and 5's "rope_type" are one key
    old = {"type": "linear", "factor": 2.0}
    assert _settings({"rope_scaling": old, "rope_parameters": {"rope_type": "linear",
                      "factor": 2.0, "rope_theta": 10.0}})[1].factor == 2.0  # fmt: skip


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            {"rope_scaling": {"rope_type": "llama3", "factor": 8.0},
             "rope_parameters": {"rope_type": "llama3", "factor": 4.0}},
            r"rope_scaling.factor 8.0 and rope_parameters.factor 4.0 disagree",
        ),
        (
            {"rope_scaling": {"type": "linear", "factor": 2.0},
             "rope_parameters": {"rope_type": "dynamic", "factor": 2.0}},
            r"rope_scaling.rope_type 'linear' and rope_parameters.rope_type 'dynamic' disagree",
        ),
        (
            {"rope_theta": 1e4, "rope_parameters": {"rope_type": "default", "rope_theta": 5e5}},
            r"rope_theta 10000 disagrees with rope_parameters.rope_theta 500000",
        ),
        (
            {"rope_parameters": {"rope_type": "proportional", "factor": 2.0}},
            r"config.json \(llama\): rope_parameters.rope_type 'proportional' is not supported",
        ),
        (
            {"rope_scaling": {"type": "ntk", "factor": 2.0}},
            r"config.json \(llama\): rope_scaling.rope_type 'ntk' is not supported",
        ),
        (
            {"rope_parameters": {"rope_type": "longrope", "short_factor": [1.0],
                                 "long_factor": "x"}},
            r"long_factor must be a list of positive numbers",
        ),
        ({"rope_parameters": {"rope_type": "yarn", "factor": 2.0, "truncate": "yes"}},
         r"rope_parameters.truncate must be true or false"),
    ],
)  # fmt: skip
def test_rope_config_errors_name_the_key_and_values(config, message):
    with pytest.raises(ValueError, match=message):
        _settings(config)


def test_longrope_factors_must_cover_the_rotated_width():
    f = Fields({"rope_parameters": {"rope_type": "longrope", "short_factor": [1.0] * 3,
                "long_factor": [1.0] * 3}, "original_max_position_embeddings": 8}, "phi3")  # fmt: skip
    theta, scaling = rope_settings(f, 32)
    with pytest.raises(
        ValueError, match="short_factor holds 3 numbers, the rotated width 16 needs 8"
    ):
        RotaryEmbedding(16, base=theta, scaling=scaling)
