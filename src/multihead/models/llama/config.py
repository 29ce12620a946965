"""config.json of Llama, Mistral and Qwen2 checkpoints (Hugging Face) -> LMConfig.

The three share one layout (RMSNorm, SwiGLU, RoPE, grouped-query attention) and differ in a few
fields: Llama's attention_bias / mlp_bias; Mistral's sliding_window on every layer; Qwen2's
q/k/v bias (no output bias) and its sliding window on the layers from max_window_layers on
(when use_sliding_window), or as layer_types says. Defaults follow transformers' config
classes. RoPE settings (either spelling, every scaling type): see models/rope_config.py.
"""

from __future__ import annotations

from ...modules.lm import LMConfig
from ..decoder_fields import attention_geometry
from ..fields import Fields
from ..rope_config import rope_settings, rotary_fraction

# model_type -> (num_key_value_heads default (None: num_attention_heads), max_position_embeddings)
DEFAULTS = {
    "llama": (None, 2048),
    "mistral": (8, 4096 * 32),
    "qwen2": (32, 32768),
    "phi3": (None, 4096),
}
PARTIAL_ROTARY = ("phi3",)  # families whose RoPE may rotate part of each head


def _qwen2_windows(f: Fields, num_layers: int) -> tuple[int | None, tuple[int, ...]]:
    """Qwen2: (window, layers without it). transformers 5: the window applies only with
    use_sliding_window, on the layers layer_types marks "sliding_attention", by default those
    from max_window_layers on."""
    window = f.int("sliding_window", 4096) if f.flag("use_sliding_window", False) else None
    types = f.config.get("layer_types")
    if types is not None:
        kinds = ("full_attention", "sliding_attention")
        if not isinstance(types, list) or len(types) != num_layers or set(types) - set(kinds):
            raise ValueError(
                f"config.json (qwen2): layer_types must list {num_layers} entries of "
                f"{' or '.join(kinds)}, got {types!r}"
            )
        full = tuple(i for i, t in enumerate(types) if t == "full_attention")
    else:
        full = tuple(range(min(f.int("max_window_layers", 28, minimum=0), num_layers)))
    return window, full


def llama_family_config(config: dict) -> LMConfig:
    model_type = config.get("model_type", "")
    kv_default, positions_default = DEFAULTS[model_type]
    f = Fields(config, model_type)
    f.refuse("quantization_config", lambda v: not v, "quantized weights are not supported")
    f.choice("hidden_act", "silu", ("silu", "swish"))  # SwiGLU's gate
    # GPT-NeoX's keys in a config of this family: a config mixing families
    f.refuse("use_parallel_residual", lambda v: not v, "parallel attention and MLP (GPT-NeoX)")
    f.refuse("rotary_pct", lambda v: v == 1, "GPT-NeoX's rotary_pct (here: partial_rotary_factor)")
    dim, heads, kv_heads, head_dim = attention_geometry(f, kv_default)
    layers = f.int("num_hidden_layers")
    max_positions = f.int("max_position_embeddings", positions_default)
    partial = model_type in PARTIAL_ROTARY
    theta, scaling = rope_settings(f, max_positions, partial=partial)
    rotary = int(head_dim * rotary_fraction(f)) if partial else head_dim
    if rotary < 2 or rotary % 2:
        raise ValueError(
            f"config.json ({model_type}): partial_rotary_factor rotates {rotary} of head size "
            f"{head_dim}; RoPE needs an even number, at least 2"
        )
    window: int | None = None
    full: tuple[int, ...] = ()
    qkv_bias = out_bias = mlp_bias = False
    if model_type == "llama":
        qkv_bias = out_bias = f.flag("attention_bias", False)
        mlp_bias = f.flag("mlp_bias", False)
    elif model_type in ("mistral", "phi3"):  # phi3: its fused q|k|v and gate|up, see view.py
        window = f.int("sliding_window", None)
    else:  # qwen2: q/k/v biases, none on the output projection or the MLP
        qkv_bias = True
        window, full = _qwen2_windows(f, layers)
    return LMConfig(
        vocab_size=f.int("vocab_size"),
        dim=dim,
        num_layers=layers,
        num_heads=heads,
        ffn_dim=f.int("intermediate_size"),
        num_kv_heads=kv_heads,
        max_positions=max_positions,
        position="rope",
        norm="rmsnorm",
        norm_eps=f.epsilon("rms_norm_eps", 1e-6),
        mlp="swiglu",
        activation="silu",
        bias=False,
        dropout=0.0,
        tie_embeddings=f.flag("tie_word_embeddings", False),
        head_dim=head_dim,
        rope_theta=theta,
        rope_scaling=scaling,
        sliding_window=window,
        full_attention_layers=full,
        qkv_bias=qkv_bias,
        out_bias=out_bias,
        mlp_bias=mlp_bias,
        attn_dropout=f.probability("attention_dropout"),
        rotary_dim=None if rotary == head_dim else rotary,
    )
