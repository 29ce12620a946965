"""ModernBERT's configuration and config.json reader: alternating local (sliding window) and
global attention layers, each kind with its own RoPE base; GeGLU MLP; LayerNorm with optional
bias; no biases on the linears by default."""

from __future__ import annotations

from dataclasses import dataclass

from ...modules.feedforward import ACTIVATIONS
from ..fields import Fields

LAYER_TYPES = ("full_attention", "sliding_attention")


@dataclass(frozen=True)
class ModernBertConfig:
    """Field names as ModernBERT's config.json. `local_layers`: the indices of the sliding-window
    layers; a token there sees `local_attention // 2` tokens on each side (and itself)."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    hidden_act: str = "gelu"
    layer_norm_eps: float = 1e-5
    norm_bias: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    max_position_embeddings: int = 8192
    pad_token_id: int = 50283
    local_attention: int = 128
    local_layers: tuple[int, ...] = ()
    global_rope_theta: float = 160_000.0
    local_rope_theta: float = 10_000.0
    embedding_dropout: float = 0.0
    attention_dropout: float = 0.0
    mlp_dropout: float = 0.0

    def __post_init__(self) -> None:
        if self.hidden_act not in ACTIVATIONS:
            known = ", ".join(sorted(ACTIVATIONS))
            raise ValueError(f"unsupported hidden_activation {self.hidden_act!r}; known: {known}")
        if self.hidden_size % self.num_attention_heads != 0:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not divisible by "
                f"num_attention_heads {self.num_attention_heads}"
            )
        if any(not 0 <= i < self.num_hidden_layers for i in self.local_layers):
            raise ValueError(
                f"local_layers {self.local_layers} must be layer indices below "
                f"num_hidden_layers {self.num_hidden_layers}"
            )

    @property
    def max_length(self) -> int:
        """The longest sequence the model was trained for (RoPE has no table to outgrow)."""
        return self.max_position_embeddings

    @property
    def half_window(self) -> int:
        """Keys a local layer's query sees on each side: |q - k| <= local_attention // 2."""
        return self.local_attention // 2

    def is_local(self, layer: int) -> bool:
        return layer in self.local_layers


def _layer_types(f: Fields, num_layers: int) -> tuple[int, ...]:
    """Local layer indices, from transformers 5's `layer_types` or the Hub configs'
    `global_attn_every_n_layers` (layer i is global when i % n == 0)."""
    types = f.config.get("layer_types")
    if types is not None:
        if (
            not isinstance(types, list)
            or len(types) != num_layers
            or any(t not in LAYER_TYPES for t in types)
        ):
            raise ValueError(
                f"config.json (modernbert): layer_types must list {num_layers} values among "
                f"{LAYER_TYPES}, got {types!r}"
            )
        return tuple(i for i, t in enumerate(types) if t == "sliding_attention")
    every = f.int("global_attn_every_n_layers", 3)
    return tuple(i for i in range(num_layers) if i % every)


def _rope_theta(f: Fields, kind: str, legacy: str, default: float) -> float:
    """The RoPE base of one layer kind: rope_parameters[kind]['rope_theta'] (transformers 5)
    or the legacy key; both present must agree. Only the default (unscaled) RoPE is read."""
    params = f.config.get("rope_parameters") or {}
    entry = params.get(kind) if isinstance(params, dict) else None
    legacy_value = f.number(legacy, None)
    if entry is None:
        return default if legacy_value is None else legacy_value
    if not isinstance(entry, dict) or entry.get("rope_type", "default") != "default":
        raise ValueError(
            f"config.json (modernbert): rope_parameters[{kind!r}] = {entry!r} is not supported: "
            "only the default rope_type"
        )
    theta = entry.get("rope_theta", default if legacy_value is None else legacy_value)
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 1:
        raise ValueError(
            f"config.json (modernbert): rope_parameters[{kind!r}]['rope_theta'] must be a "
            f"number > 1, got {theta!r}"
        )
    if legacy_value is not None and float(theta) != legacy_value:
        raise ValueError(
            f"config.json (modernbert): {legacy} = {legacy_value} disagrees with "
            f"rope_parameters[{kind!r}]['rope_theta'] = {theta}"
        )
    return float(theta)


def modernbert_config(config: dict) -> ModernBertConfig:
    f = Fields(config, "modernbert")
    f.refuse("rope_scaling", lambda v: not v, "only the default (unscaled) RoPE is supported")
    f.refuse("quantization_config", lambda v: not v, "quantized weights are not supported")
    layers = f.int("num_hidden_layers")
    return ModernBertConfig(
        vocab_size=f.int("vocab_size"),
        hidden_size=f.int("hidden_size"),
        num_hidden_layers=layers,
        num_attention_heads=f.int("num_attention_heads"),
        intermediate_size=f.int("intermediate_size"),
        hidden_act=f.choice("hidden_activation", "gelu", ACTIVATIONS),
        layer_norm_eps=f.epsilon("norm_eps", 1e-5),
        norm_bias=f.flag("norm_bias", False),
        attention_bias=f.flag("attention_bias", False),
        mlp_bias=f.flag("mlp_bias", False),
        max_position_embeddings=f.int("max_position_embeddings", 8192),
        pad_token_id=f.int("pad_token_id", 50283, minimum=0),
        local_attention=f.int("local_attention", 128, minimum=2),
        local_layers=_layer_types(f, layers),
        global_rope_theta=_rope_theta(f, "full_attention", "global_rope_theta", 160_000.0),
        local_rope_theta=_rope_theta(f, "sliding_attention", "local_rope_theta", 10_000.0),
        embedding_dropout=f.probability("embedding_dropout"),
        attention_dropout=f.probability("attention_dropout"),
        mlp_dropout=f.probability("mlp_dropout"),
    )
