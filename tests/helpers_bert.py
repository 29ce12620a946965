"""Build small BERT checkpoints on disk with Hugging Face `transformers` (random weights, no
download), in the layouts load_encoder must read."""

from __future__ import annotations

from pathlib import Path

import torch

VOCAB = [
    "[PAD]",
    "[UNK]",
    "[CLS]",
    "[SEP]",
    "[MASK]",
    *"abcdefghijklmnopqrstuvwxyz",
    "the",
    "cat",
    "sat",
    "on",
    "mat",
    "dog",
    "##s",
    "##ing",
    "run",
    "fast",
    ".",
    ",",
    "!",
]


def small_config(**overrides):
    from transformers import BertConfig

    cfg = dict(
        vocab_size=len(VOCAB),
        hidden_size=24,
        num_hidden_layers=2,
        num_attention_heads=3,
        intermediate_size=40,
        max_position_embeddings=64,
        type_vocab_size=2,
        hidden_act="gelu",
        layer_norm_eps=1e-12,
    )
    cfg.update(overrides)
    return BertConfig(**cfg)


def write_tokenizer(directory: Path) -> None:
    from tokenizers import BertWordPieceTokenizer

    (directory / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    tok = BertWordPieceTokenizer(str(directory / "vocab.txt"), lowercase=True)
    tok.enable_padding(length=32)  # fixed padding, as real tokenizer.json files may carry
    tok.save(str(directory / "tokenizer.json"))


def save_bert(directory: Path, *, cls="BertModel", safetensors=True, seed=0, **overrides):
    """Save a randomly initialised HF model + tokenizer; returns the HF model (eval)."""
    import transformers

    torch.manual_seed(seed)
    model = getattr(transformers, cls)(small_config(**overrides)).eval()
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory, safe_serialization=safetensors)
    write_tokenizer(directory)
    return model
