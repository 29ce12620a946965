"""config.json of Llama, Mistral and Qwen2 checkpoints (Hugging Face) -> LMConfig.

The three share one layout (RMSNorm, SwiGLU, RoPE, grouped-query attention) and differ in a few
fields: Llama's attention_bias / mlp_bias; Mistral's sliding_window on every layer; Qwen2's
q/k/v bias (no output bias) and its sliding window on the layers from max_window_layers on
(when use_sliding_window), or as layer_types says. Defaults follow transformers' config
classes. RoPE settings come as rope_theta + rope_scaling (transformers 4) or rope_parameters
(transformers 5).
"""

from __future__ import annotations

from ...modules.lm import LMConfig
from ...positional import RopeScaling
from ..fields import Fields

# model_type -> (num_key_value_heads default (None: num_attention_heads), max_position_embeddings)
DEFAULTS = {"llama": (None, 2048), "mistral": (8, 4096 * 32), "qwen2": (32, 32768)}
ROPE_KEYS = {
    "rope_type",
    "type",
    "rope_theta",
    "factor",
    "original_max_position_embeddings",
    "low_freq_factor",
    "high_freq_factor",
    "partial_rotary_factor",
}


# RoPE base: above 1 (a base of 1 rotates every pair at the same speed), at most 1e12 (released
# models use 1e4 .. 1e8). Scaling factors: context multipliers in [1, 1e4].
THETA_RANGE = (1.0, 1e12)
MAX_FACTOR = 1e4


def _rope_params(f: Fields) -> tuple[dict, str]:
    """The RoPE object and its key; both spellings present and different is an error."""
    scaling, parameters = f.config.get("rope_scaling"), f.config.get("rope_parameters")
    if scaling and parameters and scaling != parameters:
        raise ValueError(
            f"config.json ({f.model_type}): rope_scaling {scaling!r} and rope_parameters "
            f"{parameters!r} disagree; give one"
        )
    params = scaling or parameters or {}
    if not isinstance(params, dict):
        raise ValueError(f"config.json ({f.model_type}): rope_scaling must be an object")
    return params, "rope_scaling" if scaling else "rope_parameters"


def _theta(f: Fields, p: Fields, where: str) -> float:
    """rope_theta from the RoPE object or the top level; both present and different is an
    error, not a silent choice."""
    low, high = THETA_RANGE
    inner = p.number("rope_theta", None, positive=False, minimum=low, maximum=high)
    outer = f.number("rope_theta", None, positive=False, minimum=low, maximum=high)
    if inner is not None and outer is not None and inner != outer:
        raise ValueError(
            f"config.json ({f.model_type}): rope_theta {outer:g} disagrees with "
            f"{where}.rope_theta {inner:g}; give one"
        )
    theta = inner if inner is not None else outer
    return 10000.0 if theta is None else theta


def rope_settings(f: Fields, max_positions: int) -> tuple[float, RopeScaling | None]:
    """(rope_theta, scaling) from either spelling; unknown types and keys refused by name,
    numbers range-checked, contradicting spellings refused."""
    params, where = _rope_params(f)
    unknown = sorted(set(params) - ROPE_KEYS)
    if unknown:
        raise ValueError(
            f"config.json ({f.model_type}): {where} field(s) {', '.join(unknown)} are not "
            "supported (per-layer RoPE parameters, YaRN or LongRoPE settings?)"
        )
    p = Fields(params, f"{f.model_type} {where}")
    p.refuse("partial_rotary_factor", lambda v: v == 1, "RoPE on part of each head")
    f.refuse("partial_rotary_factor", lambda v: v == 1, "RoPE on part of each head")
    theta = _theta(f, p, where)
    kind = params.get("rope_type", params.get("type", "default"))
    if "rope_type" in params and "type" in params and params["type"] != kind:
        raise ValueError(
            f"config.json ({f.model_type}): {where} rope_type {kind!r} and type "
            f"{params['type']!r} disagree"
        )
    if kind == "default":
        return theta, None
    if kind not in ("linear", "dynamic", "llama3"):
        raise ValueError(
            f"config.json ({f.model_type}): RoPE type {kind!r} is not supported; multihead "
            "implements default, linear, dynamic and llama3"
        )
    factor = p.number("factor", minimum=1.0, maximum=MAX_FACTOR)
    if kind == "linear":
        return theta, RopeScaling("linear", factor, None)
    if kind == "dynamic":  # grows past max_position_embeddings, as transformers does
        return theta, RopeScaling("dynamic", factor, max_positions)
    low = p.number("low_freq_factor", maximum=MAX_FACTOR)
    high = p.number("high_freq_factor", maximum=MAX_FACTOR)
    if not low < high:  # the wavelength bands between them would be empty or reversed
        raise ValueError(
            f"config.json ({f.model_type}): {where} low_freq_factor {low:g} must be below "
            f"high_freq_factor {high:g}"
        )
    return theta, RopeScaling(
        "llama3",
        factor,
        p.int("original_max_position_embeddings", max_positions),
        low_freq_factor=low,
        high_freq_factor=high,
    )


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
    dim, heads, layers = (
        f.int("hidden_size"),
        f.int("num_attention_heads"),
        f.int("num_hidden_layers"),
    )
    if heads > dim:  # every released model has far fewer heads than channels
        raise ValueError(
            f"config.json ({model_type}): num_attention_heads {heads!r} exceeds hidden_size {dim}"
        )
    kv_heads = f.int("num_key_value_heads", kv_default or heads)
    if heads % kv_heads:
        raise ValueError(
            f"config.json ({model_type}): num_key_value_heads {kv_heads} must divide "
            f"num_attention_heads {heads}"
        )
    head_dim = f.int("head_dim", None)
    if head_dim is None:
        if dim % heads:
            raise ValueError(
                f"config.json ({model_type}): hidden_size {dim} is not divisible by "
                f"num_attention_heads {heads} and no head_dim is given"
            )
        head_dim = dim // heads
    if head_dim % 2:
        raise ValueError(f"config.json ({model_type}): RoPE needs an even head_dim, got {head_dim}")
    max_positions = f.int("max_position_embeddings", positions_default)
    theta, scaling = rope_settings(f, max_positions)
    window: int | None = None
    full: tuple[int, ...] = ()
    qkv_bias = out_bias = mlp_bias = False
    if model_type == "llama":
        qkv_bias = out_bias = f.flag("attention_bias", False)
        mlp_bias = f.flag("mlp_bias", False)
    elif model_type == "mistral":
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
    )
