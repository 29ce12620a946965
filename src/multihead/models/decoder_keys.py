"""The key map of the RMSNorm + gated-MLP decoders in Hugging Face's Llama naming (Gemma 1-3,
Qwen3, OLMo 2): one function of the config's data (where the norms sit, q/k norms, biases), not
a copy per family. Keys after the 'model.' prefix."""

from __future__ import annotations

from ..modules.lm import LMConfig
from .keymap import Rule, pair

# config.branch_norms -> our block's norm attribute -> the Hugging Face layer norm's name
NORM_KEYS = {
    "pre": {"norm1": "input_layernorm", "norm2": "post_attention_layernorm"},
    "pre+post": {
        "norm1": "input_layernorm",
        "norm1_post": "post_attention_layernorm",
        "norm2": "pre_feedforward_layernorm",
        "norm2_post": "post_feedforward_layernorm",
    },
    "post": {"norm1_post": "post_attention_layernorm", "norm2_post": "post_feedforward_layernorm"},
}


def decoder_key_map(config: LMConfig) -> list[Rule]:
    attn, mlp = "layers.{i}.self_attn", "layers.{i}.mlp"
    norms = NORM_KEYS[config.branch_norms]
    rules = [
        Rule("tok.weight", ("embed_tokens.weight",)),
        *(Rule(f"layers.{{i}}.{ours}.weight", (f"layers.{{i}}.{theirs}.weight",))
          for ours, theirs in norms.items()),
        # q, k and v rows stacked into one packed projection: one matmul per layer
        *pair(
            "layers.{i}.attn.in_proj",
            f"{attn}.",
            cat=("q_proj", "k_proj", "v_proj"),
            bias=bool(config.qkv_bias),
        ),
        *pair("layers.{i}.attn.out_proj", f"{attn}.o_proj", bias=bool(config.out_bias)),
        *pair("layers.{i}.ffn.gate", f"{mlp}.gate_proj", bias=bool(config.mlp_bias)),
        *pair("layers.{i}.ffn.up", f"{mlp}.up_proj", bias=bool(config.mlp_bias)),
        *pair("layers.{i}.ffn.down", f"{mlp}.down_proj", bias=bool(config.mlp_bias)),
        Rule("norm_f.weight", ("norm.weight",)),
    ]  # fmt: skip
    if config.qk_norm is not None:
        rules += [
            Rule(f"layers.{{i}}.attn.{n}.weight", (f"{attn}.{n}.weight",))
            for n in ("q_norm", "k_norm")
        ]
    if not config.tie_embeddings:
        rules.append(Rule("head.weight", ("lm_head.weight",)))
    return rules
