"""config.json of Gemma (1), Gemma 2 and Gemma 3 text checkpoints (Hugging Face) -> LMConfig.

What the three share: RMSNorm with gain (1 + w), GeGLU (gelu_pytorch_tanh gate), embeddings
scaled by sqrt(hidden_size), a tied head. What differs is data the shared blocks read:
  gemma        pre-norms only; scale 1/sqrt(head_dim)
  gemma2       pre- and post-norms around attention and MLP; scale query_pre_attn_scalar**-0.5;
               attention and final-logit soft-capping; sliding window on every other layer
  gemma3_text  as gemma2, plus q/k RMSNorm per head; soft-caps usually off; windows by
               layer_types (or every sliding_window_pattern-th layer full, default 6); the
               windowed layers rotate with their own RoPE base (rope_local_base_freq, or
               rope_parameters["sliding_attention"]).
Defaults follow transformers 5's config classes.
"""

from __future__ import annotations

from ...modules.lm import LMConfig
from ..decoder_fields import decoder_sizes, full_layers, refuse_foreign_keys, rope
from ..fields import Fields

# model_type -> (hidden activation key, max_position_embeddings default, window pattern)
_KINDS = {
    "gemma": ("hidden_act", 8192, None),
    "gemma2": ("hidden_activation", 8192, 2),
    "gemma3_text": ("hidden_activation", 131072, 6),
}
GELU_TANH = ("gelu_pytorch_tanh", "gelu_fast", "gelu_new")  # (the same tanh approximation)


def _gemma3_rope(f: Fields, max_positions: int) -> tuple[dict, float]:
    """Gemma 3: the full layers' RoPE (LMConfig rope_theta/rope_scaling) and the windowed
    layers' base, from transformers 5's per-kind rope_parameters or transformers 4's keys."""
    params = f.config.get("rope_parameters")
    if isinstance(params, dict) and set(params) <= {"full_attention", "sliding_attention"}:
        local = params.get("sliding_attention") or {}
        kind = local.get("rope_type", "default")
        if kind != "default" or set(local) - {"rope_type", "rope_theta"}:
            raise ValueError(
                f"config.json ({f.model_type}): rope_parameters.sliding_attention = {local!r}: "
                "only the default RoPE type with a rope_theta is supported on windowed layers"
            )
        base = Fields(local, f"{f.model_type} rope_parameters.sliding_attention")
        full = dict(params.get("full_attention") or {})
        full.setdefault("rope_theta", 1_000_000.0)
        return rope(f, full, max_positions), base.number("rope_theta", 10_000.0, minimum=1.0)
    fields = rope(
        Fields({**f.config, "rope_theta": f.config.get("rope_theta", 1e6)}, f.model_type),
        None,
        max_positions,
    )
    return fields, f.number("rope_local_base_freq", 10_000.0, minimum=1.0)


def gemma_config(config: dict) -> LMConfig:
    model_type = config.get("model_type", "")
    act_key, positions, pattern = _KINDS[model_type]
    f = Fields(config, model_type)
    refuse_foreign_keys(f)
    f.refuse("quantization_config", lambda v: not v, "quantized weights are not supported")
    f.refuse("use_bidirectional_attention", lambda v: not v, "bidirectional attention")
    f.refuse("attention_bias", lambda v: not v, "attention biases (Gemma has none)")
    activation = f.choice(act_key, "gelu_pytorch_tanh", (*GELU_TANH, "gelu"))
    sizes = decoder_sizes(f, None, positions)
    layers = sizes["num_layers"]
    fields: dict = {
        **sizes,
        "mlp": "gated",
        "activation": "gelu_pytorch_tanh" if activation in GELU_TANH else "gelu",
        "norm_offset": 1.0,
        "embed_scale": True,
        "tie_embeddings": f.flag("tie_word_embeddings", True),
    }
    if model_type == "gemma":
        return LMConfig(**fields, **rope(f, None, sizes["max_positions"]))
    scalar = f.number("query_pre_attn_scalar", 256.0)
    fields.update(
        branch_norms="pre+post",
        attn_scale=scalar**-0.5,
        attn_softcap=f.number("attn_logit_softcapping", 50.0 if model_type == "gemma2" else None),
        final_softcap=f.number("final_logit_softcapping", 30.0 if model_type == "gemma2" else None),
        sliding_window=f.int("sliding_window", 4096),
    )
    if model_type == "gemma2":
        full = full_layers(f, layers, pattern)
        return LMConfig(
            **fields, full_attention_layers=full, **rope(f, None, sizes["max_positions"])
        )
    window_pattern = f.int("sliding_window_pattern", pattern)
    full = full_layers(f, layers, window_pattern)
    global_rope, local_theta = _gemma3_rope(f, sizes["max_positions"])
    return LMConfig(
        **fields,
        **global_rope,
        full_attention_layers=full,
        qk_norm="head",
        local_rope_theta=local_theta,
    )
