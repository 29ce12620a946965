"""Positional information: rotary (RoPE), ALiBi and absolute embeddings."""

from .absolute import LearnedPositions, SinusoidalPositions, sinusoidal_positions
from .alibi import ALiBi, alibi_bias, alibi_slopes
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
)
from .scheme import PositionScheme

__all__ = [
    "ALiBi",
    "LearnedPositions",
    "PositionScheme",
    "RopeScaling",
    "RotaryEmbedding",
    "SinusoidalPositions",
    "alibi_bias",
    "alibi_slopes",
    "apply_rope",
    "dynamic_ntk_frequencies",
    "linear_scaled_frequencies",
    "llama3_scaled_frequencies",
    "rope_cos_sin",
    "rope_frequencies",
    "scaled_rope_frequencies",
    "sinusoidal_positions",
]
