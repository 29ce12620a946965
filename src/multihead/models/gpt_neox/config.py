"""config.json of GPT-NeoX checkpoints (Pythia; Hugging Face GPTNeoXConfig) -> LMConfig.

Pre-norm LayerNorm blocks with biases, a GELU MLP, RoPE on the first rotary_pct of each head
(transformers 5: partial_rotary_factor), base rotary_emb_base (or rope_theta), attention and
MLP in parallel when use_parallel_residual (the default), an untied output head (embed_out).
Defaults follow transformers' GPTNeoXConfig.
"""

from __future__ import annotations

from ...modules.feedforward import ACTIVATIONS
from ...modules.lm import LMConfig
from ..fields import Fields
from ..rope_config import rope_settings, rotary_fraction


def _same(f: Fields, key: str, legacy: str) -> dict:
    """The config with Pythia's legacy key `legacy` read as `key` (both given and different:
    refused)."""
    config = dict(f.config)
    if legacy in config:
        value = config.pop(legacy)
        if key in config and config[key] != value:
            raise ValueError(
                f"config.json ({f.model_type}): {legacy} {value!r} and {key} {config[key]!r} "
                "disagree; give one"
            )
        config[key] = value
    return config


def gpt_neox_config(config: dict) -> LMConfig:
    f = Fields(config, "gpt_neox")
    f.refuse("quantization_config", lambda v: not v, "quantized weights are not supported")
    f = Fields(_same(f, "rope_theta", "rotary_emb_base"), "gpt_neox")
    f = Fields(_same(f, "partial_rotary_factor", "rotary_pct"), "gpt_neox")
    dim, heads = f.int("hidden_size"), f.int("num_attention_heads")
    if dim % heads:
        raise ValueError(
            f"config.json (gpt_neox): hidden_size {dim} is not divisible by num_attention_heads "
            f"{heads}"
        )
    head_dim = dim // heads
    # keys of other families that would change the computation: a config mixing families
    f.refuse("num_key_value_heads", lambda v: v == heads, "GPT-NeoX has one k/v per query head")
    f.refuse("head_dim", lambda v: v == head_dim, "GPT-NeoX's head size is hidden_size / heads")
    f.refuse("rms_norm_eps", lambda v: False, "GPT-NeoX uses LayerNorm (layer_norm_eps)")
    f.refuse("sliding_window", lambda v: v is None, "GPT-NeoX attends to every earlier token")
    fraction = rotary_fraction(f, default=0.25)  # transformers' default rotary_pct
    rotary = int(head_dim * fraction)
    if rotary < 2 or rotary % 2:
        raise ValueError(
            f"config.json (gpt_neox): partial_rotary_factor {fraction:g} of head size {head_dim} "
            f"rotates {rotary} values; RoPE needs an even number, at least 2"
        )
    max_positions = f.int("max_position_embeddings", 2048)
    theta, scaling = rope_settings(f, max_positions, partial=True)
    resid = f.probability("hidden_dropout")
    bias = f.flag("attention_bias", True)
    return LMConfig(
        vocab_size=f.int("vocab_size"),
        dim=dim,
        num_layers=f.int("num_hidden_layers"),
        num_heads=heads,
        ffn_dim=f.int("intermediate_size"),
        max_positions=max_positions,
        position="rope",
        norm="layernorm",
        norm_eps=f.epsilon("layer_norm_eps", 1e-5),
        mlp="gelu",
        activation=f.choice("hidden_act", "gelu", ACTIVATIONS),
        bias=True,
        qkv_bias=bias,
        out_bias=bias,
        dropout=resid,
        attn_dropout=f.probability("attention_dropout"),
        tie_embeddings=f.flag("tie_word_embeddings", False),
        rope_theta=theta,
        rope_scaling=scaling,
        rotary_dim=rotary,
        parallel_residual=f.flag("use_parallel_residual", True),
    )
