"""Positional information: rotary (RoPE), ALiBi and absolute embeddings."""

from .absolute import LearnedPositions, SinusoidalPositions, sinusoidal_positions
from .alibi import ALiBi, alibi_bias, alibi_slopes
from .rope import RotaryEmbedding, apply_rope, rope_cos_sin, rope_frequencies
from .scheme import PositionScheme

__all__ = [
    "ALiBi",
    "LearnedPositions",
    "PositionScheme",
    "RotaryEmbedding",
    "SinusoidalPositions",
    "alibi_bias",
    "alibi_slopes",
    "apply_rope",
    "rope_cos_sin",
    "rope_frequencies",
    "sinusoidal_positions",
]
