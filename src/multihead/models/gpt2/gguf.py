"""GPT-2 from GGUF (llama.cpp's names and metadata) -> the config.json and Hugging Face keys
that `gpt2_config` and `gpt2_key_map` read. llama.cpp stores Conv1D matrices transposed to
(out, in); they go back to Conv1D's (in, out) here, which the key map transposes again."""

from __future__ import annotations

from ..gguf.checkpoint import GGUFNames, Layout
from ..gguf.metadata import Metadata

_LAYER = {
    "attn_norm": ("ln_1", False),
    "attn_qkv": ("attn.c_attn", True),
    "attn_output": ("attn.c_proj", True),
    "ffn_norm": ("ln_2", False),
    "ffn_up": ("mlp.c_fc", True),
    "ffn_down": ("mlp.c_proj", True),
}
_GLOBAL = {
    "token_embd": "transformer.wte",
    "position_embd": "transformer.wpe",
    "output_norm": "transformer.ln_f",
    "output": "lm_head",
}


def gpt2_gguf_config(meta: Metadata, tensor_names: set[str]) -> dict:
    return {
        "model_type": "gpt2",
        "n_embd": meta.get("embedding_length"),
        "n_head": meta.get("attention.head_count"),
        "n_layer": meta.get("block_count"),
        "n_inner": meta.get("feed_forward_length", None),
        "n_positions": meta.get("context_length"),
        "layer_norm_epsilon": meta.get("attention.layer_norm_epsilon", kind=float),
        "vocab_size": meta.get("vocab_size", None) or meta.token_count(),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "activation_function": "gelu_new",
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
    }


def gpt2_gguf_names(meta: Metadata, config: dict) -> GGUFNames:
    def rename(name: str) -> tuple[str, Layout] | None:
        stem, _, kind = name.rpartition(".")
        parts = stem.split(".")
        if len(parts) == 1 and parts[0] in _GLOBAL:
            return f"{_GLOBAL[parts[0]]}.{kind}", Layout()
        if len(parts) == 3 and parts[0] == "blk" and parts[2] in _LAYER:
            module, conv1d = _LAYER[parts[2]]
            return f"transformer.h.{parts[1]}.{module}.{kind}", Layout(transpose=conv1d)
        return name, Layout()

    return rename
