"""Positional information: rotary (RoPE), ALiBi, relative position buckets and absolute
embeddings."""

from .absolute import LearnedPositions, SinusoidalPositions, sinusoidal_positions
from .alibi import ALiBi, alibi_bias, alibi_slopes
from .relative import RelativePositionBias, SharedPosition, relative_position_bucket
from .rope import (
    RopeScaling,
    RotaryEmbedding,
    apply_rope,
    dynamic_ntk_frequencies,
    linear_scaled_frequencies,
    llama3_scaled_frequencies,
    rope_cos_sin,
    rope_frequencies,
    scaled_rope_frequencies,
    yarn_scaled_frequencies,
)
from .scheme import PositionScheme

__all__ = [
    "ALiBi",
    "LearnedPositions",
    "PositionScheme",
    "RelativePositionBias",
    "RopeScaling",
    "RotaryEmbedding",
    "SharedPosition",
    "SinusoidalPositions",
    "alibi_bias",
    "alibi_slopes",
    "apply_rope",
    "dynamic_ntk_frequencies",
    "linear_scaled_frequencies",
    "llama3_scaled_frequencies",
    "relative_position_bucket",
    "rope_cos_sin",
    "rope_frequencies",
    "scaled_rope_frequencies",
    "sinusoidal_positions",
    "yarn_scaled_frequencies",
]
