"""GGUF files of the RMSNorm + gated-MLP decoders (Gemma 1-3, Qwen3, OLMo 2) as llama.cpp's
converter writes them -> the config.json and Hugging Face keys their families read. Each
family's folder says what is its own (models/<family>/gguf.py); this holds what they share.

llama.cpp permutes no q/k rows for these architectures (they use its NEOX rotary layout)."""

from __future__ import annotations

from ..models.gguf.checkpoint import GGUFNames, Layout
from ..models.gguf.metadata import Metadata

# llama.cpp's per-layer tensor names -> Hugging Face's (after model.layers.{i}.)
LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}


def base_config(meta: Metadata, tensor_names: set[str], model_type: str) -> dict:
    """The config.json fields every one of these architectures writes alike."""
    heads = meta.get("attention.head_count")
    dim = meta.get("embedding_length")
    head_dim = meta.get("attention.key_length", dim // heads if heads else None)
    rotary = meta.get("rope.dimension_count", head_dim)
    if rotary != head_dim:
        raise ValueError(
            f"{meta.source}: {meta.arch}.rope.dimension_count {rotary} != head size "
            f"{head_dim} (RoPE on part of each head is not supported)"
        )
    return {
        "model_type": model_type,
        "hidden_size": dim,
        "intermediate_size": meta.get("feed_forward_length"),
        "num_hidden_layers": meta.get("block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": meta.get("attention.head_count_kv", heads),
        "head_dim": head_dim,
        "rms_norm_eps": meta.get("attention.layer_norm_rms_epsilon", kind=float),
        "max_position_embeddings": meta.get("context_length"),
        "vocab_size": meta.get("vocab_size", None) or meta.token_count(),
        "tie_word_embeddings": "output.weight" not in tensor_names,
    }


def rope_fields(meta: Metadata) -> dict:
    """rope_theta, and rope_scaling where the file has one (linear only)."""
    fields: dict = {"rope_theta": meta.get("rope.freq_base", 10000.0, kind=float)}
    kind = meta.get("rope.scaling.type", "none", kind=str)
    if kind not in ("none", "linear"):
        raise ValueError(
            f"{meta.source}: RoPE scaling {kind!r} ({meta.arch}.rope.scaling.type) is not "
            "supported from GGUF for this architecture; supported: none, linear"
        )
    if kind == "linear":
        fields["rope_scaling"] = {
            "rope_type": "linear",
            "factor": meta.get("rope.scaling.factor", kind=float),
        }
    return fields


def decoder_names(layer_names: dict[str, str], norm_shift: float = 0.0) -> GGUFNames:
    """GGUF tensor name -> (Hugging Face key, layout). `layer_names` overrides LAYER_NAMES
    (Gemma 1 and OLMo 2 place their norms differently); `norm_shift` is added to every norm
    weight (Gemma: -1, undoing the converter's + 1)."""
    names = {**LAYER_NAMES, **layer_names}

    def rename(name: str) -> tuple[str, Layout] | None:
        stem, _, kind = name.rpartition(".")  # kind: weight or bias
        parts = stem.split(".")
        shift = norm_shift if parts[-1].endswith("norm") else 0.0
        if len(parts) == 1 and parts[0] in GLOBAL_NAMES:
            return f"{GLOBAL_NAMES[parts[0]]}.{kind}", Layout(shift=shift)
        if len(parts) == 3 and parts[0] == "blk" and parts[2] in names:
            return f"model.layers.{parts[1]}.{names[parts[2]]}.{kind}", Layout(shift=shift)
        return name, Layout()  # not ours: the loader names it as unexpected

    return rename


# architectures whose files fuse q | k | v (and Phi-3's gate | up) into one tensor: the separate
# shapes below do not apply (their loaders split the fused tensors and check those)
FUSED_ARCHITECTURES = frozenset({"phi3", "gptneox"})


def check_tensor_shapes(meta: Metadata, config: dict, shapes: dict[str, tuple[int, ...]]) -> None:
    """A file whose metadata contradicts its tensors (a head count, the width, the MLP size):
    one error naming the file, the metadata key, the tensor and the shape it implies, before
    any weight is read. Reads the config.json fields of the Llama-named decoders; tensors a
    file does not have are not checked."""
    if "num_attention_heads" not in config or meta.arch in FUSED_ARCHITECTURES:
        return
    dim, heads = config["hidden_size"], config["num_attention_heads"]
    head_dim = config.get("head_dim") or dim // heads
    q_rows = heads * head_dim
    kv_rows = (config.get("num_key_value_heads") or heads) * head_dim
    ffn = config.get("intermediate_size")
    # tensor (per layer: blk.{i}.) -> (expected shape, the metadata keys that imply it)
    expected = {
        "attn_q": ((q_rows, dim), "attention.head_count x attention.key_length"),
        "attn_k": ((kv_rows, dim), "attention.head_count_kv x attention.key_length"),
        "attn_v": ((kv_rows, dim), "attention.head_count_kv x attention.key_length"),
        "attn_output": ((dim, q_rows), "embedding_length, attention.head_count x key_length"),
        "ffn_gate": ((ffn, dim), "feed_forward_length, embedding_length"),
        "ffn_up": ((ffn, dim), "feed_forward_length, embedding_length"),
        "ffn_down": ((dim, ffn), "embedding_length, feed_forward_length"),
    }
    arch = meta.arch
    for layer in range(config["num_hidden_layers"]):
        for stem, (shape, keys) in expected.items():
            name = f"blk.{layer}.{stem}.weight"
            got = shapes.get(name)
            if got is not None and None not in shape and tuple(got) != shape:
                values = ", ".join(
                    f"{arch}.{k.strip()} = {meta.values.get(f'{arch}.{k.strip()}')}"
                    for part in keys.split(",")
                    for k in part.split(" x ")
                )
                raise ValueError(
                    f"{meta.source}: GGUF metadata contradicts tensor {name} of shape "
                    f"{tuple(got)}: {values} expect shape {shape}"
                )
