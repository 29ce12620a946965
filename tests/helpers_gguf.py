"""Tiny GGUF files written the way llama.cpp's convert_hf_to_gguf.py writes them, from small
random Hugging Face models (no download): llama.cpp's tensor names and metadata keys, q/k rows
permuted for Llama and Mistral, GPT-2's Conv1D matrices transposed, every matrix quantised
with `gguf.quants` to the type asked for (norms and biases stay F32, as llama.cpp keeps them).
The tests read each file with multihead and with transformers' own GGUF loader."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType as Q

VOCAB, DIM, HEADS, KV_HEADS, FFN, LAYERS, POSITIONS = 96, 64, 4, 2, 96, 2, 64
# transformers' GGUF reader takes GPT-2's MLP width and position count from its defaults (4 x
# width, 1024), not from the metadata: the tiny GPT-2 has those, so both loaders agree
GPT2_FFN, GPT2_POSITIONS = 4 * DIM, 1024
QUANTISABLE = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1")
ARCHITECTURES = ("llama", "mistral", "qwen2", "gpt2")


def hf_model(arch: str, seed: int = 0) -> torch.nn.Module:
    import transformers

    torch.manual_seed(seed)
    if arch == "gpt2":
        config = transformers.GPT2Config(
            vocab_size=VOCAB, n_embd=DIM, n_head=HEADS, n_layer=LAYERS, n_positions=GPT2_POSITIONS,
            n_inner=GPT2_FFN, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        )  # fmt: skip
        return transformers.GPT2LMHeadModel(config).eval()
    kinds = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    }
    config_class, model_class = kinds[arch]
    config = config_class(
        vocab_size=VOCAB, hidden_size=DIM, intermediate_size=FFN, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=POSITIONS,
        rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )  # fmt: skip
    if arch == "mistral":
        config.sliding_window = None
    model = model_class(config).eval()
    with torch.no_grad():  # norms and biases away from their initial 1 and 0
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(torch.randn_like(p) * 0.1 + (1.0 if "norm" in name else 0.0))
    return model


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """convert_hf_to_gguf's rotary permutation of q/k rows (halves -> interleaved pairs)."""
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def _llama_tensors(arch: str, state: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    layer = {
        "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
        "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
    }  # fmt: skip
    out = {}
    for key, value in state.items():
        w = value.float().numpy()
        if key == "model.embed_tokens.weight":
            out["token_embd.weight"] = w
        elif key == "model.norm.weight":
            out["output_norm.weight"] = w
        elif key == "lm_head.weight":
            out["output.weight"] = w
        elif key.startswith("model.layers."):
            _, _, i, rest = key.split(".", 3)
            module, kind = rest.rsplit(".", 1)
            if arch != "qwen2" and module in ("self_attn.q_proj", "self_attn.k_proj"):
                w = _permute(w, HEADS if module.endswith("q_proj") else KV_HEADS)
            out[f"blk.{i}.{layer[module]}.{kind}"] = w
    return out


def _gpt2_tensors(state: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    layer = {
        "ln_1": "attn_norm", "attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output",
        "ln_2": "ffn_norm", "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down",
    }  # fmt: skip
    out = {}
    for key, value in state.items():
        w = value.float().numpy()
        if key.endswith((".attn.bias", ".attn.masked_bias")):
            continue
        if key == "transformer.wte.weight":
            out["token_embd.weight"] = w
            out["output.weight"] = w  # llama.cpp writes the tied head out
        elif key == "transformer.wpe.weight":
            out["position_embd.weight"] = w
        elif key.startswith("transformer.ln_f."):
            out[f"output_norm.{key.rsplit('.', 1)[1]}"] = w
        elif key.startswith("transformer.h."):
            _, _, i, rest = key.split(".", 3)
            module, kind = rest.rsplit(".", 1)
            if kind == "weight" and w.ndim == 2:
                w = w.T.copy()  # Conv1D (in, out) -> (out, in)
            out[f"blk.{i}.{layer[module]}.{kind}"] = w
    return out


def _metadata(w: gguf.GGUFWriter, arch: str, model: torch.nn.Module) -> None:
    w.add_block_count(LAYERS)
    w.add_context_length(GPT2_POSITIONS if arch == "gpt2" else POSITIONS)
    w.add_embedding_length(DIM)
    w.add_head_count(HEADS)
    if arch == "gpt2":
        w.add_feed_forward_length(GPT2_FFN)
        w.add_layer_norm_eps(model.config.layer_norm_epsilon)
        return
    w.add_feed_forward_length(FFN)
    w.add_head_count_kv(KV_HEADS)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(DIM // HEADS)


def add_tokenizer(w: gguf.GGUFWriter, model: str = "gpt2") -> None:
    """A byte-level vocabulary of VOCAB tokens: single printable bytes, a few merges."""
    tokens = [chr(c) for c in range(33, 33 + VOCAB - 3)] + ["ab", "abc", "<|end|>"]
    w.add_tokenizer_model(model)
    w.add_token_list(tokens)
    w.add_token_types([1] * (VOCAB - 1) + [3])
    w.add_token_merges(["a b", "ab c"])
    w.add_bos_token_id(VOCAB - 1)
    w.add_eos_token_id(VOCAB - 1)


def write_gguf(
    path: Path, arch: str, qtype: str = "F32", *, model: torch.nn.Module | None = None,
    tokenizer: str | None = "gpt2", edit=None,
) -> torch.nn.Module:  # fmt: skip
    """Writes `model` (default: a tiny random one) to `path` as llama.cpp would, matrices in
    `qtype`; `edit(writer, tensors)` may change metadata or tensors first. Returns the model."""
    model = model or hf_model(arch)
    state = model.state_dict()
    tensors = _gpt2_tensors(state) if arch == "gpt2" else _llama_tensors(arch, state)
    w = gguf.GGUFWriter(str(path), arch)
    _metadata(w, arch, model)
    if tokenizer is not None:
        add_tokenizer(w, tokenizer)
    if edit is not None:
        edit(w, tensors)
    kind = Q[qtype]
    for name, value in tensors.items():
        if value.ndim == 2 and kind != Q.F32:
            w.add_tensor(name, gguf.quants.quantize(value, kind), raw_dtype=kind)
        else:
            w.add_tensor(name, np.ascontiguousarray(value, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return model


def transformers_gguf(path: Path) -> torch.nn.Module:
    """transformers' own GGUF loading of `path` (dequantised by gguf), float32."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()
