"""Small random Llama / Mistral / Qwen2 checkpoints saved by Hugging Face `transformers` (no
download), one per feature load_causal_lm must implement."""

from __future__ import annotations

from pathlib import Path

import torch

VOCAB = 96
BASE = dict(
    vocab_size=VOCAB,
    hidden_size=48,
    intermediate_size=40,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)

# name -> (model_type, config overrides)
CASES: dict[str, tuple[str, dict]] = {
    "llama": ("llama", {}),
    "llama-head-dim-biases": (
        "llama",
        dict(head_dim=16, attention_bias=True, mlp_bias=True, rms_norm_eps=1e-5),
    ),
    "llama-mqa-tied": ("llama", dict(num_key_value_heads=1, tie_word_embeddings=True)),
    "llama-theta-linear": (
        "llama",
        dict(rope_parameters={"rope_type": "linear", "factor": 2.5, "rope_theta": 500.0}),
    ),
    "llama-dynamic": (
        "llama",
        dict(
            max_position_embeddings=16,
            rope_parameters={"rope_type": "dynamic", "factor": 3.0, "rope_theta": 10000.0},
        ),
    ),
    "llama3": (
        "llama",
        dict(
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 50.0,  # small, so all three bands of the ramp hold frequencies
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            }
        ),
    ),
    "llama-yarn": (
        "llama",
        dict(
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 100.0,  # small, so the ramp between kept and divided is wide
                "factor": 4.0,
                "beta_fast": 8.0,
                "beta_slow": 0.5,
                "original_max_position_embeddings": 8,  # the tests run 13..21 positions
            }
        ),
    ),
    "mistral-window": ("mistral", dict(sliding_window=5, head_dim=16)),
    "qwen2": ("qwen2", {}),
    "qwen2-window": (
        "qwen2",
        dict(num_hidden_layers=3, use_sliding_window=True, sliding_window=5, max_window_layers=1),
    ),
}


def hf_config(name: str, **overrides):
    import transformers

    model_type, case = CASES[name]
    cls = {
        "llama": transformers.LlamaConfig,
        "mistral": transformers.MistralConfig,
        "qwen2": transformers.Qwen2Config,
    }[model_type]
    return cls(**(BASE | case | overrides))


def save_causal(directory: Path, name: str, *, seed: int = 0, dtype=None, **kwargs):
    """Save a random model of case `name`; returns the HF model (eval, fp32 unless `dtype`).
    kwargs: config overrides, `max_shard_size` (for save_pretrained) and `torch_bin=True`
    (pytorch_model.bin, the state dict torch.save wrote in transformers 4, instead of
    safetensors, which transformers 5 always writes)."""
    import transformers

    save = {k: kwargs.pop(k) for k in ("max_shard_size",) if k in kwargs}
    torch_bin = kwargs.pop("torch_bin", False)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(hf_config(name, **kwargs)).eval()
    with torch.no_grad():  # every weight random, biases and norms included (init zeros / ones)
        for key, p in model.named_parameters():
            p.normal_(1.0 if "norm" in key else 0.0, 0.2)
    if dtype is not None:
        model = model.to(dtype)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory, **save)
    if torch_bin:
        torch.save(model.state_dict(), directory / "pytorch_model.bin")
        (directory / "model.safetensors").unlink()
    return model


def load_hf(directory: Path):
    """A fresh transformers model from `directory` (dynamic RoPE keeps state between calls)."""
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(directory).eval()
