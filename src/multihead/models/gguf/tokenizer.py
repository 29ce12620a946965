"""The tokenizer a GGUF file describes (tokenizer.ggml.*), rebuilt with `tokenizers`.

`tokenizer.ggml.model` "gpt2" is byte-level BPE (GPT-2, SmolLM2, Llama 3, Qwen2): the
vocabulary and merges as stored, GPT-2's byte-level pre-tokenizer (or the split regex that
`tokenizer.ggml.pre` names), control tokens (token_type 3) added as special tokens and
user-defined ones (4) as added tokens, so they stay whole. This is what transformers builds
from the same metadata; the tests compare ids on unicode, spaces and newlines, and on
llama.cpp's own vocabulary test files (models/ggml-vocab-*.gguf with .inp / .out).
SentencePiece vocabularies ("llama": Llama 2, Mistral, Phi-3, Gemma): see tokenizer_spm.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

from .metadata import Metadata
from .tokenizer_spm import spm_tokenizer

_CONTROL, _USER_DEFINED = 3, 4
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_DIGITS_THEN_GPT2 = "digits"  # every digit alone, then GPT-2's split (StarCoder, SmolLM)
# tokenizer.ggml.pre -> the regex its merges were learned with (others, e.g. gpt-2, phi-2,
# mpt, olmo, default: GPT-2's)
_SPLITS = {
    "llama3": _LLAMA3_SPLIT,
    "llama-v3": _LLAMA3_SPLIT,
    "llama-bpe": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT,
    "dbrx": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT,
    "deepseek-r1-qwen": _QWEN2_SPLIT,
    "stablelm2": _QWEN2_SPLIT,
    "starcoder": _DIGITS_THEN_GPT2,
    "refact": _DIGITS_THEN_GPT2,
    "smollm": _DIGITS_THEN_GPT2,
}
# pre-tokenizers whose words found whole in the vocabulary skip the merges (llama.cpp's
# ignore_merges; Llama 3's tokenizer.json says "ignore_merges": true)
_WHOLE_WORDS = ("llama3", "llama-v3", "llama-bpe")
MODELS = ("gpt2", "llama")  # tokenizer.ggml.model: byte-level BPE, SentencePiece


@dataclass(frozen=True)
class TokenizerParts:
    """What a `ModelTokenizer` is built from."""

    tokenizer: Tokenizer
    bos_id: int | None
    eos_id: int | None
    pad_id: int | None
    add_bos: bool
    name: str


@lru_cache(maxsize=1)
def _byte_alphabet() -> dict[int, str]:
    """GPT-2's printable spelling of the 256 byte values."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    spelling = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in spelling:
            spelling[b] = chr(256 + extra)
            extra += 1
    return spelling


def _byte_level(meta: Metadata, tokens: list[str]) -> Tokenizer:
    spelling = _byte_alphabet()
    alphabet = set(spelling.values())
    # a token spelled outside the byte alphabet is respelled from its UTF-8 bytes
    types = meta.values.get("tokenizer.ggml.token_type") or []
    vocab: dict[str, int] = {}
    for i, token in enumerate(tokens):
        if not set(token) <= alphabet:
            if i < len(types) and types[i] == _USER_DEFINED:  # added as spelt (MPT's "  ")
                vocab.setdefault(token, i)
            token = "".join(spelling[b] for b in token.encode("utf-8"))
        vocab.setdefault(token, i)
    merges = meta.values.get("tokenizer.ggml.merges") or []
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    pre = meta.values.get("tokenizer.ggml.pre", "")
    try:
        bpe = models.BPE(
            vocab,
            pairs,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            ignore_merges=pre in _WHOLE_WORDS,
        )
    except Exception as e:  # `tokenizers` raises a bare Exception for a merge it refuses
        raise ValueError(
            f"{meta.source}: tokenizer.ggml.merges does not fit tokenizer.ggml.tokens "
            f"(tokenizers refuses it: {e})"
        ) from None
    tokenizer = Tokenizer(bpe)
    split = _SPLITS.get(pre)
    if split is None:
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    elif split == _DIGITS_THEN_GPT2:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    else:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    tokenizer.decoder = decoders.ByteLevel()
    control = [
        AddedToken(t, normalized=False, special=True)
        for t, kind in zip(tokens, types, strict=False)
        if kind == _CONTROL and set(t) <= alphabet
    ]
    user = [
        AddedToken(t, normalized=False, special=False)
        for t, kind in zip(tokens, types, strict=False)
        if kind == _USER_DEFINED and t in vocab
    ]
    if control:
        tokenizer.add_special_tokens(control)
    if user:
        tokenizer.add_tokens(user)
    return tokenizer


def check_gguf_tokenizer(meta: Metadata) -> None:
    """Refuses, without building anything, a tokenizer `gguf_tokenizer` cannot rebuild (or
    its absence: a tool that turns text into ids needs one)."""
    tokens = meta.values.get("tokenizer.ggml.tokens")
    if tokens is None:
        raise ValueError(f"{meta.source} carries no tokenizer (tokenizer.ggml.tokens)")
    kind = meta.values.get("tokenizer.ggml.model")
    if kind not in MODELS:
        raise ValueError(
            f"{meta.source}: tokenizer.ggml.model {kind!r} is not supported; multihead rebuilds "
            "byte-level BPE ('gpt2') and SentencePiece ('llama') tokenizers from GGUF files"
        )
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        raise ValueError(f"{meta.source}: tokenizer.ggml.tokens must be a list of strings")
    merges = meta.values.get("tokenizer.ggml.merges", [])
    if not isinstance(merges, list):
        raise ValueError(f"{meta.source}: tokenizer.ggml.merges must be a list of strings")
    for i, merge in enumerate(merges):
        if not isinstance(merge, str) or len(merge.split(" ")) != 2:
            raise ValueError(
                f"{meta.source}: tokenizer.ggml.merges[{i}] is {merge!r}; a merge is two "
                "tokens separated by one space"
            )
    types = meta.values.get("tokenizer.ggml.token_type", [])
    if not isinstance(types, list) or not all(isinstance(t, int) for t in types):
        raise ValueError(f"{meta.source}: tokenizer.ggml.token_type must be a list of integers")
    for key, value in sorted(meta.values.items()):
        # bos, eos, unknown, seperator (llama.cpp's spelling), padding, cls, mask, eot, fim_...
        if key.startswith("tokenizer.ggml.") and key.endswith("_token_id"):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{meta.source}: {key} must be an integer, got {value!r}")
            if not 0 <= value < len(tokens):
                raise ValueError(
                    f"{meta.source}: {key} is {value}, outside the vocabulary "
                    f"({len(tokens)} tokens, ids 0 .. {len(tokens) - 1})"
                )


def gguf_tokenizer(meta: Metadata) -> TokenizerParts | None:
    """The file's tokenizer, or None when it carries none (no tokenizer.ggml.tokens)."""
    tokens = meta.values.get("tokenizer.ggml.tokens")
    if tokens is None:
        return None
    check_gguf_tokenizer(meta)

    def token_id(key: str) -> int | None:  # checked by check_gguf_tokenizer
        value = meta.values.get(f"tokenizer.ggml.{key}")
        return value if isinstance(value, int) else None

    add_bos = meta.values.get("tokenizer.ggml.add_bos_token")
    spm = meta.values.get("tokenizer.ggml.model") == "llama"
    if not isinstance(add_bos, bool):  # llama.cpp's default: SentencePiece vocabularies add it
        add_bos = spm
    return TokenizerParts(
        tokenizer=spm_tokenizer(meta, tokens) if spm else _byte_level(meta, tokens),
        bos_id=token_id("bos_token_id"),
        eos_id=token_id("eos_token_id"),
        pad_id=token_id("padding_token_id"),
        add_bos=add_bos,
        name=str(meta.values.get("general.name", "")),
    )
