"""What the RMSNorm + gated-MLP + RoPE decoder families (Gemma 1-3, Qwen3, OLMo 2) read alike
from config.json: sizes and heads, RoPE, windows per layer; and the check that a config does not
carry another family's keys. Each family's folder adds what is its own (models/<family>/config.py).
"""

from __future__ import annotations

from typing import Any

from .fields import Fields
from .rope_config import rope_settings

LAYER_KINDS = ("full_attention", "sliding_attention")

# Keys that belong to one family and change its computation: a config of another model_type
# that carries one was written for (or edited from) that family, and is refused by name.
OWN_KEYS: dict[str, frozenset[str]] = {
    "gemma2": frozenset({"attn_logit_softcapping", "final_logit_softcapping"}),
    "gemma2+": frozenset({"query_pre_attn_scalar"}),
    "gemma3_text": frozenset({"rope_local_base_freq", "sliding_window_pattern"}),
    "gpt_neox": frozenset({"rotary_pct", "use_parallel_residual"}),
    "phi3": frozenset({"original_max_position_embeddings"}),
}
# which of those each family reads (the rest are foreign to it)
READS: dict[str, frozenset[str]] = {
    "gemma": frozenset(),
    "gemma2": OWN_KEYS["gemma2"] | OWN_KEYS["gemma2+"],
    "gemma3_text": OWN_KEYS["gemma2"] | OWN_KEYS["gemma2+"] | OWN_KEYS["gemma3_text"],
    "qwen3": frozenset(),
    "olmo2": frozenset(),
}


def refuse_foreign_keys(f: Fields) -> None:
    """A config that mixes keys of two families: one error naming the key, the family it
    belongs to and what the model_type expects (no such key)."""
    reads = READS[f.model_type]
    for owner, keys in OWN_KEYS.items():
        for key in sorted(keys - reads):
            if f.config.get(key) is not None:
                family = owner.rstrip("+")
                raise ValueError(
                    f"config.json ({f.model_type}): {key} = {f.config[key]!r} is a {family} "
                    f"setting, which model_type {f.model_type!r} does not have (expected: no "
                    f"{key}); is the model_type right?"
                )


def attention_geometry(
    f: Fields, kv_default: int | None, head_dim_default: int | None = None
) -> tuple[int, int, int, int]:
    """hidden_size, num_attention_heads, num_key_value_heads (default `kv_default`, else the
    heads) and head_dim (default `head_dim_default`, else hidden_size / heads), checked against
    each other; RoPE needs an even head_dim."""
    mt = f.model_type
    dim, heads = f.int("hidden_size"), f.int("num_attention_heads")
    if heads > dim:
        raise ValueError(
            f"config.json ({mt}): num_attention_heads {heads} exceeds hidden_size {dim}"
        )
    kv_heads = f.int("num_key_value_heads", kv_default or heads)
    if heads % kv_heads:
        raise ValueError(
            f"config.json ({mt}): num_key_value_heads {kv_heads} must divide "
            f"num_attention_heads {heads}"
        )
    head_dim = f.int("head_dim", head_dim_default)
    if head_dim is None:
        if dim % heads:
            raise ValueError(
                f"config.json ({mt}): hidden_size {dim} is not divisible by num_attention_heads "
                f"{heads} and no head_dim is given"
            )
        head_dim = dim // heads
    if head_dim % 2:
        raise ValueError(f"config.json ({mt}): RoPE needs an even head_dim, got {head_dim}")
    return dim, heads, kv_heads, head_dim


def decoder_sizes(
    f: Fields, kv_default: int | None, positions_default: int, head_dim_default: int | None = None
) -> dict[str, Any]:
    """vocab_size, dim, num_layers, num_heads, num_kv_heads, head_dim, ffn_dim,
    max_positions, norm_eps, checked against each other."""
    dim, heads, kv_heads, head_dim = attention_geometry(f, kv_default, head_dim_default)
    return {
        "vocab_size": f.int("vocab_size"),
        "dim": dim,
        "num_layers": f.int("num_hidden_layers"),
        "num_heads": heads,
        "num_kv_heads": kv_heads,
        "head_dim": head_dim,
        "ffn_dim": f.int("intermediate_size"),
        "max_positions": f.int("max_position_embeddings", positions_default),
        "norm_eps": f.epsilon("rms_norm_eps", 1e-6),
        "position": "rope",
        "norm": "rmsnorm",
        "bias": False,
        "dropout": 0.0,
        "attn_dropout": f.probability("attention_dropout"),
    }


def rope(f: Fields, params: dict | None, max_positions: int) -> dict[str, Any]:
    """rope_theta and rope_scaling from the config (or from `params`, one layer kind's
    entry of a per-kind rope_parameters, Gemma 3), as LMConfig fields."""
    if params is not None:
        f = Fields({"rope_parameters": params}, f.model_type)
    theta, scaling = rope_settings(f, max_positions)
    return {"rope_theta": theta, "rope_scaling": scaling}


def full_layers(f: Fields, num_layers: int, pattern: int | None) -> tuple[int, ...]:
    """The layers without the sliding window: from `layer_types`, else every `pattern`-th
    (layer i is full when (i + 1) % pattern == 0: Gemma 2 pattern 2, Gemma 3 pattern 6);
    pattern None: every layer is windowed."""
    types = f.config.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != num_layers or set(types) - set(LAYER_KINDS):
            raise ValueError(
                f"config.json ({f.model_type}): layer_types must list {num_layers} entries of "
                f"{' or '.join(LAYER_KINDS)}, got {types!r}"
            )
        return tuple(i for i, t in enumerate(types) if t == "full_attention")
    if pattern is None:
        return ()
    return tuple(i for i in range(num_layers) if (i + 1) % pattern == 0)
