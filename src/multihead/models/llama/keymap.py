"""Our CausalLM parameters <- Hugging Face LlamaForCausalLM / MistralForCausalLM /
Qwen2ForCausalLM keys (after the 'model.' prefix)."""

from __future__ import annotations

from ...modules.lm import LMConfig
from ..keymap import Rule, pair


def llama_key_map(config: LMConfig) -> list[Rule]:
    attn, mlp = "layers.{i}.self_attn", "layers.{i}.mlp"
    rules = [
        Rule("tok.weight", ("embed_tokens.weight",)),
        Rule("layers.{i}.norm1.weight", ("layers.{i}.input_layernorm.weight",)),
        # q, k and v rows stacked into one packed projection: one matmul per layer
        *pair(
            "layers.{i}.attn.in_proj",
            f"{attn}.",
            cat=("q_proj", "k_proj", "v_proj"),
            bias=bool(config.qkv_bias),
        ),
        *pair("layers.{i}.attn.out_proj", f"{attn}.o_proj", bias=bool(config.out_bias)),
        Rule("layers.{i}.norm2.weight", ("layers.{i}.post_attention_layernorm.weight",)),
        *pair("layers.{i}.ffn.gate", f"{mlp}.gate_proj", bias=bool(config.mlp_bias)),
        *pair("layers.{i}.ffn.up", f"{mlp}.up_proj", bias=bool(config.mlp_bias)),
        *pair("layers.{i}.ffn.down", f"{mlp}.down_proj", bias=bool(config.mlp_bias)),
        Rule("norm_f.weight", ("norm.weight",)),
    ]
    if not config.tie_embeddings:
        rules.append(Rule("head.weight", ("lm_head.weight",)))
    return rules


def llama_rename(key: str) -> str | None:
    return key.removeprefix("model.")


# RoPE tables some checkpoints carry; the LM head when tied (when not, its rule uses it).
LLAMA_IGNORED = (".rotary_emb.inv_freq", "lm_head.weight")
