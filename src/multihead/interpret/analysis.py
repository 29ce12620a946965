"""Run a pretrained encoder on texts and measure its heads: the glue between a model and the
pure metrics. Each text runs alone (no padding), under `capture`.

What was measured travels with the result: how many tokens of each text were analysed (and
whether the rest was cut off), which roles come from the text and which from the
repeated-random-token probe, and whether a text was too short to measure."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from tokenizers import Tokenizer
from torch import Tensor

from .capture import capture
from .metrics import SPECIAL_TOKENS, copy_scores, corpus_metrics
from .roles import SOURCES, HeadRole, head_roles

# Fewer real tokens than this (besides [CLS]/[SEP]) and the text-based metrics mostly measure
# the special tokens: with "Hi" ([CLS] hi [SEP]) every head looks like a sink.
MIN_CONTENT_TOKENS = 5

# Wraps one loop of the analysis: (iterable, description, total) -> iterable, e.g. tqdm.
Progress = Callable[[Iterable[Any], str, int], Iterable[Any]]


def _no_progress(items: Iterable[Any], desc: str, total: int) -> Iterable[Any]:
    return items


@dataclass
class TextAttention:
    tokens: list[str]
    attn: Tensor  # (L, H, T, T)
    text: str = ""  # the part of the text that the tokens cover (all of it unless truncated)
    total_tokens: int = -1  # the whole text's token count, special tokens included

    def __post_init__(self) -> None:
        if self.total_tokens < 0:
            self.total_tokens = len(self.tokens)

    @property
    def truncated(self) -> bool:
        return self.total_tokens > len(self.tokens)

    @property
    def content_tokens(self) -> int:
        """Tokens other than [CLS]/[SEP]-style special tokens."""
        return sum(t not in SPECIAL_TOKENS for t in self.tokens)


@dataclass(frozen=True)
class ProbeInfo:
    """The repeated-random-token probe behind the duplicate and induction scores."""

    length: int
    trials: int
    seed: int

    def __str__(self) -> str:
        return (
            f"{self.trials} sequences [CLS] R filler R [SEP], R = {self.length} random tokens; "
            f"the same for every text"
        )


@dataclass
class Analysis:
    texts: list[TextAttention]
    metrics: dict[str, Tensor]  # name -> (L, H)
    roles: list[list[list[HeadRole]]]
    probe: ProbeInfo | None = None
    max_tokens: int = 0  # the token limit each text was cut to
    notes: list[str] = field(default_factory=list)  # truncation and too-short warnings

    @property
    def shape(self) -> tuple[int, int]:
        L, H = self.metrics["previous"].shape
        return L, H

    @property
    def text_measured(self) -> bool:
        """False when every text was too short for roles measured on the text."""
        return any(t.content_tokens >= MIN_CONTENT_TOKENS for t in self.texts)


def _attention_of(encoder, ids: list[int]) -> Tensor:
    """(L, H, T, T) weights of one unpadded token sequence, via `capture`."""
    with torch.inference_mode(), capture(encoder, keep_qkv=False) as records:
        encoder(torch.tensor([ids]))
    return torch.stack([r.weights[0] for r in records])


def token_limit(encoder, max_tokens: int | None = None) -> int:
    """The number of tokens a text is cut to: the encoder's own length (256 for MiniLM) unless
    `max_tokens` asks for another, up to its position table (512)."""
    if max_tokens is None:
        return encoder.max_seq_length
    limit = encoder.max_position_limit
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
        raise TypeError(f"max_tokens must be an int, got {type(max_tokens).__name__}")
    if not 3 <= max_tokens <= limit:
        raise ValueError(f"max_tokens must be in [3, {limit}] for this model, got {max_tokens}")
    return max_tokens


def _private_tokenizer(encoder) -> Tokenizer:
    """A copy of the encoder's tokenizer that this analysis may reconfigure freely (the shared
    one's truncation must not change under a concurrent `encode`)."""
    tokenizer = Tokenizer.from_str(encoder.tokenizer.to_str())
    tokenizer.no_padding()
    return tokenizer


def _tokenize(tokenizer: Tokenizer, text: str, limit: int) -> tuple[list[int], int, str]:
    """Token ids cut to `limit`, the whole text's token count, and the part of the text the
    kept tokens cover."""
    tokenizer.no_truncation()
    total = len(tokenizer.encode(text).ids)
    tokenizer.enable_truncation(max_length=limit)
    kept = tokenizer.encode(text)
    if total <= limit:
        return kept.ids, total, text
    pairs = zip(kept.offsets, kept.special_tokens_mask, strict=True)
    ends = [end for (_, end), special in pairs if not special]
    return kept.ids, total, text[: max(ends, default=0)]


def text_attention(encoder, text: str, *, max_tokens: int | None = None) -> TextAttention:
    """Token strings and per-layer weights (L, H, T, T) of one text, via `capture`; the text is
    cut to `token_limit(encoder, max_tokens)` tokens (see `TextAttention.truncated`)."""
    limit = token_limit(encoder, max_tokens)
    ids, total, covered = _tokenize(_private_tokenizer(encoder), text, limit)
    return _text_attention(encoder, ids, total, covered)


def _text_attention(encoder, ids: list[int], total: int, covered: str) -> TextAttention:
    attn = _attention_of(encoder, ids).float()  # (L, H, T, T)
    tokens = [encoder.tokenizer.id_to_token(i) or f"<{i}>" for i in ids]
    return TextAttention(tokens, attn, covered, total)


def copy_probe(
    encoder,
    *,
    length: int = 16,
    trials: int = 8,
    seed: int = 0,
    progress: Progress = _no_progress,
) -> tuple[Tensor, Tensor]:
    """Duplicate-token and induction scores (L, H) on [CLS] R filler R [SEP], R random tokens.

    The filler's length is random (1 .. length) in each trial, so a head attending at a fixed
    offset cannot score as an induction head by matching the period.
    """
    rng = random.Random(seed)
    tok = encoder.tokenizer
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    vocab = tok.get_vocab_size()
    # ordinary word pieces only: skip the reserved/special block at the start of BERT vocabularies
    low = min(1000, vocab // 2)
    dup_total: Tensor | int = 0
    ind_total: Tensor | int = 0
    for _ in progress(range(trials), "random-token probe", trials):
        seq = [rng.randrange(low, vocab) for _ in range(length)]
        filler = [rng.randrange(low, vocab) for _ in range(rng.randint(1, length))]
        ids = [cls_id, *seq, *filler, *seq, sep_id]
        attn = _attention_of(encoder, ids)
        dup, ind = copy_scores(attn, 1, 1 + length + len(filler), length)
        dup_total = dup_total + dup
        ind_total = ind_total + ind
    return dup_total / trials, ind_total / trials  # type: ignore[return-value]


def _notes(items: list[TextAttention], limit: int, model_limit: int) -> list[str]:
    notes = []
    cut = [x for x in items if x.truncated]
    more = f" (the model reads up to {model_limit})" if limit < model_limit else ""
    if len(items) == 1 and cut:
        x = cut[0]
        notes.append(
            f"truncated: analysed the first {len(x.tokens)} of {x.total_tokens} tokens; "
            f"the rest of the text was not analysed{more}"
        )
    elif cut:
        notes.append(
            f"truncated: {len(cut)} of {len(items)} texts were longer than {limit} tokens{more}; "
            f"only their first {limit} tokens were analysed"
        )
    short = [x for x in items if x.content_tokens < MIN_CONTENT_TOKENS]
    if len(items) == 1 and short:
        n = short[0].content_tokens
        notes.append(
            f"too short to measure: the text has {n} token{'s' * (n != 1)} besides [CLS]/[SEP], "
            f"and roles measured on a text need at least {MIN_CONTENT_TOKENS}; only the "
            f"random-token probe's roles are given"
        )
    elif len(short) == len(items):
        notes.append(
            f"too short to measure: every text has fewer than {MIN_CONTENT_TOKENS} tokens "
            f"besides [CLS]/[SEP]; only the random-token probe's roles are given"
        )
    elif short:
        notes.append(
            f"{len(short)} of {len(items)} texts have fewer than {MIN_CONTENT_TOKENS} tokens "
            f"besides [CLS]/[SEP]; their special tokens weigh heavily in the means"
        )
    return notes


def analyze(
    encoder,
    texts: Sequence[str],
    *,
    probe: bool = True,
    max_tokens: int | None = None,
    progress: Progress | None = None,
) -> Analysis:
    """Metrics of every head averaged over `texts`, plus the repeated-token probe, and roles.

    Each text is cut to `token_limit(encoder, max_tokens)` tokens; `Analysis.notes` says when
    that cut anything, or when the texts are too short for roles measured on them.
    `progress(iterable, description, total)` wraps the loops (over texts, over probe trials).
    """
    if isinstance(texts, str) or not isinstance(texts, Sequence):
        raise TypeError(f"texts must be a sequence of strings, got {type(texts).__name__}")
    if not texts:
        raise ValueError("analyze needs at least one text")
    wrap = progress or _no_progress
    limit = token_limit(encoder, max_tokens)
    tokenizer = _private_tokenizer(encoder)
    items = []
    for text in wrap(texts, "texts", len(texts)):
        items.append(_text_attention(encoder, *_tokenize(tokenizer, text, limit)))
    metrics = corpus_metrics((x.attn, x.tokens) for x in items)
    probe_info = None
    if probe:
        probe_info = ProbeInfo(length=16, trials=8, seed=0)
        metrics["duplicate"], metrics["induction"] = copy_probe(
            encoder,
            length=probe_info.length,
            trials=probe_info.trials,
            seed=probe_info.seed,
            progress=wrap,
        )
    result = Analysis(
        items,
        {k: v.float() for k, v in metrics.items()},
        [],
        probe_info,
        limit,
        _notes(items, limit, encoder.max_position_limit),
    )
    sources = SOURCES if result.text_measured else tuple(s for s in SOURCES if s != "text")
    result.roles = head_roles(metrics, sources=sources)
    return result
