"""config.json of Qwen3 checkpoints (Hugging Face Qwen3ForCausalLM) -> LMConfig.

Qwen2's layout (RMSNorm, SwiGLU, RoPE, grouped-query attention, a sliding window from
max_window_layers on when use_sliding_window, or as layer_types says) with an RMSNorm of q and
k over each head (one weight of head_dim shared by the heads), biases on q/k/v/o only with
attention_bias, head_dim 128 unless given. Defaults follow transformers 5's Qwen3Config.
"""

from __future__ import annotations

from ...modules.lm import LMConfig
from ..decoder_fields import decoder_sizes, full_layers, refuse_foreign_keys, rope
from ..fields import Fields


def qwen3_config(config: dict) -> LMConfig:
    f = Fields(config, "qwen3")
    refuse_foreign_keys(f)
    f.refuse("quantization_config", lambda v: not v, "quantized weights are not supported")
    f.choice("hidden_act", "silu", ("silu", "swish"))
    sizes = decoder_sizes(f, 32, 32768, head_dim_default=128)
    layers = sizes["num_layers"]
    window = f.int("sliding_window", 4096) if f.flag("use_sliding_window", False) else None
    if f.config.get("layer_types") is not None:
        full = full_layers(f, layers, None)
    else:
        full = tuple(range(min(f.int("max_window_layers", 28, minimum=0), layers)))
    bias = f.flag("attention_bias", False)
    return LMConfig(
        **sizes,
        **rope(f, None, sizes["max_positions"]),
        mlp="swiglu",
        activation="silu",
        tie_embeddings=f.flag("tie_word_embeddings", False),
        sliding_window=window,
        full_attention_layers=full if window is not None else (),
        qkv_bias=bias,
        out_bias=bias,
        mlp_bias=False,
        qk_norm="head",
    )
