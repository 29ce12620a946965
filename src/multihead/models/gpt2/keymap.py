"""Our CausalLM parameters <- Hugging Face GPT2LMHeadModel keys (after 'transformer.')."""

from __future__ import annotations

from ...modules.lm import LMConfig
from ..keymap import Rule, pair

GPT2_KEY_MAP: list[Rule] = [
    Rule("tok.weight", ("wte.weight",)),
    Rule("pos.weight", ("wpe.weight",)),
    *pair("layers.{i}.norm1", "h.{i}.ln_1"),
    # Conv1D stores (in, out): transposed into nn.Linear's (out, in). c_attn is already q|k|v.
    *pair("layers.{i}.attn.in_proj", "h.{i}.attn.c_attn", transpose=True),
    *pair("layers.{i}.attn.out_proj", "h.{i}.attn.c_proj", transpose=True),
    *pair("layers.{i}.norm2", "h.{i}.ln_2"),
    *pair("layers.{i}.ffn.fc1", "h.{i}.mlp.c_fc", transpose=True),
    *pair("layers.{i}.ffn.fc2", "h.{i}.mlp.c_proj", transpose=True),
    *pair("norm_f", "ln_f"),
]
# Causal-mask buffers of older checkpoints; the LM head when tied to the embedding (when it is
# not, its rule uses it).
GPT2_IGNORED = (".attn.bias", ".attn.masked_bias", "lm_head.weight")


def gpt2_key_map(config: LMConfig) -> list[Rule]:
    if config.tie_embeddings:
        return GPT2_KEY_MAP
    return [*GPT2_KEY_MAP, Rule("head.weight", ("lm_head.weight",))]


def gpt2_rename(key: str) -> str | None:
    return key.removeprefix("transformer.")
