"""What `analyze`, importance, the reports and the CLI inspect: a model with its tokenizer behind
one small interface, so none of them asks which kind of model it holds.

  EncoderSubject   a `SentenceEncoder` (BERT, RoBERTa, DistilBERT): bidirectional; its
                   tokenizer's own [CLS] text [SEP]; importance through the sentence embedding.
  CausalLMSubject  a `CausalLM` (GPT-2, Llama, Mistral, Qwen2), or a bridged transformers causal
                   LM (`multihead.bridge`: same config sizes and call), + its tokenizer.json: causal
                   (only the lower triangle of a pattern means anything); BOS first where the
                   model has one (the rule is in `multihead.pretrained.affixes`); importance
                   through next-token loss.

Shared rules: a text's special tokens are those its tokenizer (or the BOS rule) puts around it
(and any literal [CLS]/<s>-style token inside); the sinks whose mass the "special" metric
measures are those tokens, or the first token when there are none. Tokens are shown as the
vocabulary spells them for WordPiece ("##ing" marks a piece inside a word) and as the text they
stand for otherwise (" quick" for byte-level "Ġquick" or SentencePiece "▁quick").
`as_subject(x)` accepts a subject or a `SentenceEncoder`; `load_subject(path)` reads a model
directory.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from tokenizers import Tokenizer, models
from torch import nn

from ..models import CAUSAL_LM_FAMILIES, ENCODER_FAMILIES
from ..models.text import check_encodable
from ..modules.lm import CausalLM
from ..pretrained.affixes import bos_token_id, causal_affixes
from ..pretrained.encoder import SentenceEncoder
from ..pretrained.tokenizer import read_tokenizer
from .metrics import SPECIAL_TOKENS
from .objectives import EmbeddingObjective, NextTokenObjective

ENCODER_TYPES = tuple(ENCODER_FAMILIES)  # config.json model_type values read by load_encoder
CAUSAL_DEFAULT_TOKENS = 256  # a causal LM's default cut: reports stay small (MiniLM's length)


@dataclass(frozen=True)
class EncodedText:
    ids: list[int]  # special tokens included, cut to the limit
    total: int  # the whole text's token count, special tokens included
    covered: str  # the part of the text that the kept tokens cover


class Subject(ABC):
    """The shared part: tokenisation with a private copy of the tokenizer (no truncation or
    padding, so concurrent users of the model's own tokenizer are not disturbed), special
    tokens, sinks, the token limit. Subclasses set the model-specific attributes below."""

    kind: ClassVar[str]  # "encoder" or "causal LM", as printed
    causal: ClassVar[bool]
    model: nn.Module  # what capture, hooks and head_gates attach to
    num_layers: int
    num_heads: int
    vocab_size: int  # the model's embedding rows: every id must be below it
    max_positions: int  # the longest text the model reads
    default_tokens: int  # the cut when none is asked for
    objective: EmbeddingObjective | NextTokenObjective  # what importance measures

    def __init__(self, tokenizer: Tokenizer, prefix: list[int], suffix: list[int]) -> None:
        self.tokenizer = Tokenizer.from_str(tokenizer.to_str())
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()
        self.prefix, self.suffix = list(prefix), list(suffix)
        self._wordpiece = isinstance(self.tokenizer.model, models.WordPiece)
        literal = (tokenizer.token_to_id(t) for t in SPECIAL_TOKENS)
        self.special_ids = frozenset([*prefix, *suffix, *(i for i in literal if i is not None)])
        size = tokenizer.get_vocab_size(with_added_tokens=True)
        if size > self.vocab_size:
            raise ValueError(
                f"the tokenizer has {size} tokens but the model's vocabulary holds "
                f"{self.vocab_size}: they do not belong together"
            )

    # -- tokens ----------------------------------------------------------------------------

    def token_limit(self, max_tokens: int | None = None) -> int:
        """The number of tokens a text is cut to: `default_tokens` unless `max_tokens` asks for
        another, up to the model's position table."""
        if max_tokens is None:
            return self.default_tokens
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
            raise TypeError(f"max_tokens must be an int, got {type(max_tokens).__name__}")
        low = len(self.prefix) + len(self.suffix) + 1
        if not low <= max_tokens <= self.max_positions:
            raise ValueError(
                f"max_tokens must be in [{low}, {self.max_positions}] for this model, "
                f"got {max_tokens}"
            )
        return max_tokens

    def encode(self, text: str, limit: int | None = None) -> EncodedText:
        """Token ids with the special tokens around them, the text cut to `limit` tokens
        (default `token_limit()`), special tokens kept."""
        limit = self.token_limit(limit)
        body = self.tokenizer.encode(check_encodable(text), add_special_tokens=False)
        room = limit - len(self.prefix) - len(self.suffix)
        total = len(body.ids) + len(self.prefix) + len(self.suffix)
        kept = body.ids[:room]
        ends = [end for _, end in body.offsets[: len(kept)]]
        covered = text if len(kept) == len(body.ids) else text[: max(ends, default=0)]
        ids = [*self.prefix, *kept, *self.suffix]
        too_big = [i for i in ids if i >= self.vocab_size]
        if too_big:
            raise ValueError(
                f"token ids {too_big[:5]} are past the model's vocabulary ({self.vocab_size})"
            )
        return EncodedText(ids, total, covered)

    def token_strings(self, ids: list[int]) -> list[str]:
        """How each token is shown: WordPiece tokens as spelled ("##s"); others as the text
        they stand for, leading space included (a piece of a character keeps its raw form)."""
        raw = [self.tokenizer.id_to_token(i) or f"<{i}>" for i in ids]
        if self._wordpiece:
            return raw
        # Decoders drop a leading space at the start of a text (SentencePiece's "▁the" -> "the"):
        # decode each token after an "a" and cut the "a" off again.
        out = []
        anchor = self.tokenizer.token_to_id("a")
        lead = self.tokenizer.decode([anchor]) if anchor is not None else ""
        for i, spelled in zip(ids, raw, strict=True):
            pair = [i] if anchor is None else [anchor, i]
            text = self.tokenizer.decode(pair, skip_special_tokens=False)
            text = text[len(lead) :] if text.startswith(lead) else text
            out.append(spelled if not text or "\ufffd" in text else text)
        return out

    def special_mask(self, ids: list[int]) -> list[bool]:
        return [i in self.special_ids for i in ids]

    def sinks(self, ids: list[int]) -> list[int]:
        """Positions whose mass the "special" metric measures: the special tokens, or the first
        token when there are none."""
        return [p for p, i in enumerate(ids) if i in self.special_ids] or [0]

    @property
    def special_label(self) -> str:
        """The special tokens around a text, as a note names them ("[CLS]/[SEP]"), or ""."""
        names = dict.fromkeys(self.token_strings([*self.prefix, *self.suffix]))
        return "/".join(names)

    @property
    def sink_label(self) -> str:
        """How a sink role names its tokens."""
        return self.special_label or "the first token"

    def word_starts(self, tokens: list[str]) -> list[bool]:
        """Which tokens start a word (the report's "merge word pieces" joins the others to the
        word before): WordPiece marks continuations with "##"; other tokens carry their leading
        space, so a token continues a word when it goes on from letters or digits."""
        if self._wordpiece:
            return [i == 0 or not t.startswith("##") for i, t in enumerate(tokens)]
        starts = []
        for i, t in enumerate(tokens):
            before = tokens[i - 1] if i else ""
            joins = bool(t) and t[0].isalnum() and bool(before) and before[-1].isalnum()
            starts.append(i == 0 or not joins)
        return starts

    # -- running ---------------------------------------------------------------------------

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @abstractmethod
    def run(self, ids: list[int]) -> None:
        """Run the model on one unpadded token sequence (inside `capture` or hooks)."""

    def run_batch(self, batch: list[list[int]]) -> None:
        """Run several token sequences in one forward (inside `capture` or hooks): right-padded
        to the longest, the padding masked out as keys, so each sequence's rows and columns of
        the patterns are its own (padding rows are not meaningful)."""
        width = max(len(ids) for ids in batch)
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        mask = torch.zeros(len(batch), width, dtype=torch.long)
        for b, seq in enumerate(batch):  # (B, T): right padding
            ids[b, : len(seq)] = torch.tensor(seq)
            mask[b, : len(seq)] = 1
        self._run_padded(ids.to(self.device), mask.to(self.device))

    @abstractmethod
    def _run_padded(self, ids: torch.Tensor, mask: torch.Tensor) -> None:
        """One forward over right-padded ids (B, T) with their 0/1 padding mask (B, T)."""

    @abstractmethod
    def random_tokens(self, rng: random.Random, n: int) -> list[int]:
        """n ordinary tokens of the model's vocabulary, for the random-token probe."""

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.num_layers} layers x {self.num_heads} heads, "
            f"special {self.special_label or 'none'})"
        )


class EncoderSubject(Subject):
    """A sentence encoder: every token sees every token."""

    kind = "encoder"
    causal = False

    def __init__(self, encoder: SentenceEncoder) -> None:
        self.model = self.encoder = encoder
        config = encoder.model.config
        self.num_layers = len(encoder.model.layers)
        self.num_heads = config.num_attention_heads
        self.vocab_size = config.vocab_size
        self.max_positions = encoder.max_position_limit
        self.default_tokens = encoder.max_seq_length
        super().__init__(encoder.tokenizer.tokenizer, *encoder.special_ids)
        self.objective = EmbeddingObjective(encoder)

    def run(self, ids: list[int]) -> None:
        self.encoder(torch.tensor([ids], device=self.device))

    def _run_padded(self, ids: torch.Tensor, mask: torch.Tensor) -> None:
        self.encoder(ids, mask)

    def random_tokens(self, rng: random.Random, n: int) -> list[int]:
        # BERT vocabularies start with a reserved/special block ([unusedN]): skip it
        vocab = self.tokenizer.get_vocab_size()
        low = min(1000, vocab // 2)
        return [rng.randrange(low, vocab) for _ in range(n)]


class CausalLMSubject(Subject):
    """A causal LM: token i sees tokens 0..i. `bos_id`: the model's BOS token (config.json's
    `bos_token_id`), put first when the tokenizer adds nothing before a text; None: no BOS."""

    kind = "causal LM"
    causal = True

    def __init__(self, model: CausalLM, tokenizer: Tokenizer, *, bos_id: int | None) -> None:
        self.model = model
        config = model.config
        self.num_layers = config.num_layers
        self.num_heads = config.num_heads
        self.vocab_size = config.vocab_size
        self.max_positions = config.max_positions
        self.default_tokens = min(CAUSAL_DEFAULT_TOKENS, config.max_positions)
        super().__init__(tokenizer, *causal_affixes(tokenizer, bos_id))
        self.objective = NextTokenObjective(model, lambda text: self.encode(text).ids)
        added = set(self.tokenizer.get_added_tokens_decoder())
        self._ordinary = [i for i in range(self.tokenizer.get_vocab_size()) if i not in added]

    def run(self, ids: list[int]) -> None:
        self.model(torch.tensor([ids], device=self.device), last_only=True)

    def _run_padded(self, ids: torch.Tensor, mask: torch.Tensor) -> None:
        self.model(ids, attention_mask=mask, last_only=True)

    def random_tokens(self, rng: random.Random, n: int) -> list[int]:
        return [rng.choice(self._ordinary) for _ in range(n)]


def as_subject(model: Any) -> Subject:
    """A subject as it is; a `SentenceEncoder` wrapped as an `EncoderSubject`; a CausalLM that
    carries its tokenizer (`multihead.load(...)`'s: `model.tokenizer` set) as a `CausalLMSubject`
    that reads texts as `load_subject` reads the same file (its BOS first). A CausalLM without
    one needs it given: `CausalLMSubject(model, tokenizer, bos_id=...)` or `load_subject`."""
    if isinstance(model, Subject):
        return model
    if isinstance(model, SentenceEncoder):
        return EncoderSubject(model)
    if isinstance(model, CausalLM):
        carried = getattr(model, "tokenizer", None)
        if carried is not None:
            # as load_subject reads the same file: the BOS first unless the tokenizer adds one
            return CausalLMSubject(model, carried.tokenizer, bos_id=carried.bos_id)
        raise TypeError(
            "this CausalLM carries no tokenizer (model.tokenizer is None): pass "
            "CausalLMSubject(model, tokenizer, bos_id=...), load_subject(model_dir), or set "
            "model.tokenizer"
        )
    raise TypeError(
        f"expected a SentenceEncoder or a Subject (EncoderSubject, CausalLMSubject), "
        f"got {type(model).__name__}"
    )


def load_subject(
    path: str | Path,
    *,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> Subject:
    """The inspectable model in a Hugging Face directory (config.json, weights, tokenizer.json)
    or a GGUF file, named as `multihead.models.source.resolve_model` reads names: an encoder
    for model_type in ENCODER_TYPES, else a causal LM (`load_causal_lm` says which model
    types it reads). `dtype`, `device`: as the loaders take them."""
    from ..models.checkpoint import read_json
    from ..models.source import resolve_model
    from ..pretrained import load_causal_lm, load_encoder
    from ..pretrained.files import resolve_model_dir

    source = resolve_model(path)
    if source.is_gguf:  # a decoder whose tokenizer is in its metadata
        return _gguf_subject(source.path, dtype, device)
    model_dir = resolve_model_dir(source.path)
    config = read_json(model_dir / "config.json")
    if config.get("model_type") in ENCODER_TYPES:
        return EncoderSubject(load_encoder(model_dir, dtype=dtype, device=device))
    if config.get("model_type") in CAUSAL_LM_FAMILIES:
        model: nn.Module = load_causal_lm(model_dir, dtype=dtype, device=device)
    else:  # no native family: the one resolver's fallback, the bridge
        from ..pretrained.auto import load

        model = load(model_dir, dtype=dtype, device=device)
        if not getattr(model.config, "causal", False):
            raise ValueError(
                f"{str(model_dir)!r}: model_type {config.get('model_type')!r} is not a causal "
                "LM; inspection reads BERT-family encoders and causal LMs"
            )
    tokenizer = read_tokenizer(model_dir)
    return CausalLMSubject(model, tokenizer, bos_id=bos_token_id(tokenizer, config))  # type: ignore[arg-type]


def _gguf_subject(
    path: Path, dtype: torch.dtype | None, device: torch.device | str | None
) -> CausalLMSubject:
    """A GGUF file as `multihead.load` reads it (the one resolver: a native architecture as a
    `CausalLM`, any other through the bridge, or its error), with the tokenizer its metadata
    holds: the native reader's, or transformers' reading (its fast tokenizer's backend)."""
    from ..pretrained.auto import load

    model: Any = load(path, dtype=dtype, device=device)
    missing = ValueError(f"{str(path)!r} carries no tokenizer (tokenizer.ggml.*)")
    if isinstance(model, CausalLM):
        carried: Any = model.tokenizer  # a GGUFTokenizer
        if carried is None:
            raise missing
        return CausalLMSubject(model, carried.tokenizer, bos_id=carried.bos_id)
    if not getattr(model.config, "causal", False):
        raise ValueError(
            f"{str(path)!r}: architecture {getattr(model.hf.config, 'model_type', None)!r} is "
            "not a causal LM; inspection reads BERT-family encoders and causal LMs"
        )
    hf_tokenizer = getattr(model, "tokenizer", None)
    if hf_tokenizer is None:
        raise missing
    tokenizer = getattr(hf_tokenizer, "backend_tokenizer", None)
    if not isinstance(tokenizer, Tokenizer):
        raise ValueError(
            f"{str(path)!r}: transformers read its tokenizer as {type(hf_tokenizer).__name__}, "
            "which has no fast (tokenizers) backend; inspection needs one"
        )
    config = {"bos_token_id": getattr(model.hf.config, "bos_token_id", None)}
    return CausalLMSubject(model, tokenizer, bos_id=bos_token_id(tokenizer, config))
