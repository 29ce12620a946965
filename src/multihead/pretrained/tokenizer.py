"""Tokenisation with the `tokenizers` library from tokenizer.json.

tokenizer.json files often carry fixed padding (all-MiniLM-L6-v2's pads every text to 128) and a
truncation length that is not the model's: both are switched off here, so padding never reaches
the attention or the pooling; batches are padded by the encoder, with a key mask.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer


def load_tokenizer(model_dir: Path, max_length: int) -> Tokenizer:
    path = model_dir / "tokenizer.json"
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as e:  # the Rust side raises its own exception type
        raise ValueError(f"cannot read {str(path)!r} as a tokenizer: {e}") from None
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=max_length)
    return tokenizer


def pad_id(tokenizer: Tokenizer, default: int = 0) -> int:
    for token in ("[PAD]", "<pad>"):
        token_id = tokenizer.token_to_id(token)
        if token_id is not None:
            return token_id
    return default
