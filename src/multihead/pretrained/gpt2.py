"""GPT-2 checkpoints (Hugging Face GPT2LMHeadModel layout, safetensors or .bin) into CausalLM."""

from __future__ import annotations

from pathlib import Path

import torch

from ..modules.lm import CausalLM, LMConfig
from .files import read_json, read_weights
from .keymap import Rule, convert_state_dict


def gpt2_config(config: dict) -> LMConfig:
    if config.get("model_type") != "gpt2":
        archs = ", ".join(config.get("architectures") or []) or "none listed"
        raise ValueError(
            f"unsupported architecture: model_type {config.get('model_type')!r} "
            f"(architectures: {archs}); load_causal_lm reads GPT-2 checkpoints (model_type 'gpt2')"
        )
    missing = [
        k for k in ("vocab_size", "n_embd", "n_layer", "n_head", "n_positions") if k not in config
    ]
    if missing:
        raise ValueError(f"config.json lacks {', '.join(missing)}")
    return LMConfig(
        vocab_size=config["vocab_size"],
        dim=config["n_embd"],
        num_layers=config["n_layer"],
        num_heads=config["n_head"],
        ffn_dim=config.get("n_inner") or 4 * config["n_embd"],
        max_positions=config["n_positions"],
        norm_eps=config.get("layer_norm_epsilon", 1e-5),
        activation=config.get("activation_function", "gelu_new"),
        tie_embeddings=config.get("tie_word_embeddings", True),
    )


def _pair(target: str, source: str, transpose: bool = False) -> list[Rule]:
    return [
        Rule(f"{target}.weight", (f"{source}.weight",), transpose),
        Rule(f"{target}.bias", (f"{source}.bias",)),
    ]


GPT2_KEY_MAP: list[Rule] = [
    Rule("tok.weight", ("wte.weight",)),
    Rule("pos.weight", ("wpe.weight",)),
    *_pair("layers.{i}.norm1", "h.{i}.ln_1"),
    # Conv1D stores (in, out): transposed into nn.Linear's (out, in). c_attn is already q|k|v.
    *_pair("layers.{i}.attn.in_proj", "h.{i}.attn.c_attn", transpose=True),
    *_pair("layers.{i}.attn.out_proj", "h.{i}.attn.c_proj", transpose=True),
    *_pair("layers.{i}.norm2", "h.{i}.ln_2"),
    *_pair("layers.{i}.ffn.fc1", "h.{i}.mlp.c_fc", transpose=True),
    *_pair("layers.{i}.ffn.fc2", "h.{i}.mlp.c_proj", transpose=True),
    *_pair("norm_f", "ln_f"),
]
# Causal-mask buffers of older checkpoints; the LM head when tied to the embedding.
GPT2_IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias")


def load_gpt2_weights(model: CausalLM, checkpoint: dict[str, torch.Tensor]) -> None:
    state = {k.removeprefix("transformer."): v for k, v in checkpoint.items()}
    state = {k: v for k, v in state.items() if not k.endswith(GPT2_IGNORED_SUFFIXES)}
    rules = list(GPT2_KEY_MAP)
    if model.config.tie_embeddings:
        state.pop("lm_head.weight", None)  # the same tensor as wte
        rules.append(Rule("head.weight", ("wte.weight",)))
    else:
        rules.append(Rule("head.weight", ("lm_head.weight",)))
    expected = {k: v.shape for k, v in model.state_dict().items()}
    converted = convert_state_dict(
        state, rules, num_layers=model.config.num_layers, expected=expected
    )
    with torch.no_grad():
        model.load_state_dict(converted, strict=True)


def load_causal_lm(path: str | Path) -> CausalLM:
    """A GPT-2 checkpoint directory (config.json + model.safetensors or pytorch_model.bin)."""
    model_dir = Path(path)
    if not model_dir.is_dir():
        raise FileNotFoundError(f"model directory {str(model_dir)!r} does not exist")
    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(f"model directory {str(model_dir)!r} lacks config.json")
    # init=False: every weight comes from the checkpoint, so initialising them is wasted work.
    model = CausalLM(gpt2_config(read_json(model_dir / "config.json")), init=False)
    load_gpt2_weights(model, read_weights(model_dir))
    return model.eval()
