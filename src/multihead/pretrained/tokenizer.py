"""Tokenisation with the `tokenizers` library from tokenizer.json.

tokenizer.json files often carry fixed padding (all-MiniLM-L6-v2's pads every text to 128) and a
truncation length that is not the model's: both are switched off here, so padding never reaches
the attention or the pooling, and the shared tokenizer holds no per-call state: `encode_ids`
truncates each call to its own length (concurrent calls with different lengths cannot affect
each other).
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, normalizers

from ..models.text import check_encodable


def read_tokenizer(model_dir: Path) -> Tokenizer:
    """tokenizer.json as it is, its own padding and truncation switched off."""
    path = model_dir / "tokenizer.json"
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as e:  # the Rust side raises its own exception type
        raise ValueError(f"cannot read {str(path)!r} as a tokenizer: {e}") from None
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


def load_tokenizer(model_dir: Path, *, lowercase: bool = False) -> Tokenizer:
    """`lowercase`: sentence-transformers' do_lower_case, a Lowercase step before the
    tokenizer's own normaliser (as sentence-transformers adds it)."""
    tokenizer = read_tokenizer(model_dir)
    if lowercase and not _lowercases(tokenizer.normalizer):
        steps = [normalizers.Lowercase()]
        if tokenizer.normalizer is not None:
            steps.append(tokenizer.normalizer)
        tokenizer.normalizer = normalizers.Sequence(steps)
    return tokenizer


def _lowercases(normalizer: normalizers.Normalizer | None) -> bool:
    return normalizer is not None and normalizer.normalize_str("A") == "a"


def encode_ids(tokenizer: Tokenizer, texts: list[str], max_length: int) -> list[list[int]]:
    """Token ids per text with the tokenizer's special tokens, truncated on the right to
    `max_length` (specials kept), as the tokenizer's own truncation does, without changing
    the tokenizer."""
    for i, text in enumerate(texts):
        check_encodable(text, f"texts[{i}]")
    room = max_length - tokenizer.num_special_tokens_to_add(False)
    if room < 0:
        raise ValueError(
            f"max_seq_length {max_length} is shorter than the "
            f"{tokenizer.num_special_tokens_to_add(False)} special tokens the tokenizer adds"
        )
    ids = []
    for encoding in tokenizer.encode_batch(texts, add_special_tokens=False):
        if len(encoding.ids) > room:
            encoding.truncate(room)
        ids.append(tokenizer.post_process(encoding).ids)
    return ids


def pad_id(tokenizer: Tokenizer, default: int = 0) -> int:
    for token in ("[PAD]", "<pad>"):
        token_id = tokenizer.token_to_id(token)
        if token_id is not None:
            return token_id
    return default
