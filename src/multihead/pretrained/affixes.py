"""The special tokens around every text: what a tokenizer.json adds itself, and the BOS token a
causal LM reads first.

Encoders' tokenizers add their own ([CLS] text [SEP], <s> text </s>). Decoders differ: Llama's
and Mistral's post-processors put <s> first, GPT-2's and Qwen2's add nothing, though GPT-2 was
trained on documents separated by <|endoftext|> and without it the first token of a text becomes
every head's sink. The rule here (TransformerLens' `prepend_bos` default):

- a tokenizer that puts tokens before the text keeps exactly those;
- otherwise, when config.json names a `bos_token_id` that the tokenizer knows, that token is put
  first (GPT-2: <|endoftext|>, id 50256);
- otherwise the text starts with its own first token, and that token is the sink.
"""

from __future__ import annotations

from typing import Any

from tokenizers import Tokenizer


def special_affixes(tokenizer: Tokenizer) -> tuple[list[int], list[int]]:
    """The ids the tokenizer's post-processor puts before and after every text: ([CLS], [SEP])
    for BERT, ([<s>], []) for Llama, ([], []) for GPT-2."""
    inner = tokenizer.encode("a", add_special_tokens=False)
    ids = tokenizer.post_process(inner).ids
    n = len(inner.ids)
    for i in range(len(ids) - n + 1):
        if ids[i : i + n] == inner.ids:
            return ids[:i], ids[i + n :]
    return [], []


def bos_token_id(tokenizer: Tokenizer, config: dict[str, Any]) -> int | None:
    """config.json's `bos_token_id` when it is one id the tokenizer knows, else None."""
    bos = config.get("bos_token_id")
    if isinstance(bos, bool) or not isinstance(bos, int):
        return None
    return bos if tokenizer.id_to_token(bos) is not None else None


def causal_affixes(tokenizer: Tokenizer, bos_id: int | None) -> tuple[list[int], list[int]]:
    """The special ids a causal LM's text gets before and after it (see the module's rule);
    `bos_id`: the model's BOS token (`bos_token_id`), or None."""
    prefix, suffix = special_affixes(tokenizer)
    if prefix or bos_id is None:
        return prefix, suffix
    if tokenizer.id_to_token(bos_id) is None:
        raise ValueError(f"bos_id {bos_id} is not a token of this tokenizer")
    return [bos_id], suffix
