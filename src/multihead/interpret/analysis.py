"""Run an inspectable model (an encoder or a causal LM, see `subject`) on texts and measure
its heads: the glue between a model and the pure metrics. Each text runs alone (no padding),
under `capture`.

What was measured travels with the result: how many tokens of each text were analysed (and
whether the rest was cut off), which roles come from the text and which from the
repeated-random-token probe, whether a text was too short to measure, whether the patterns are
causal (then metrics that would look at later tokens are listed in `undefined`), and which
tokens the sink metric measured."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from .capture import capture
from .intervals import bootstrap_mean_interval, offset_index, per_text_values
from .metrics import (
    CAUSAL_UNDEFINED,
    INDUCTION_OFFSETS,
    PREVIOUS_DISTANCES,
    SPECIAL_TOKENS,
    best_offset,
    copy_mass_by_offset,
    corpus_metrics,
)
from .roles import RULES, SOURCES, HeadRole, RoleRule, head_roles
from .subject import Subject, as_subject

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
    special: list[bool] | None = None  # which tokens are special (default: SPECIAL_TOKENS)
    sinks: list[int] | None = None  # the positions the sink metric measured (default: special)
    word_starts: list[bool] | None = None  # which tokens start a word (default: not "##")

    def __post_init__(self) -> None:
        if self.total_tokens < 0:
            self.total_tokens = len(self.tokens)
        if self.special is None:
            self.special = [t in SPECIAL_TOKENS for t in self.tokens]
        if self.word_starts is None:
            self.word_starts = [i == 0 or not t.startswith("##") for i, t in enumerate(self.tokens)]

    @property
    def truncated(self) -> bool:
        return self.total_tokens > len(self.tokens)

    @property
    def content_tokens(self) -> int:
        """Tokens other than special tokens ([CLS]/[SEP], BOS)."""
        return len(self.tokens) - sum(self.special or ())


@dataclass(frozen=True)
class ProbeInfo:
    """The repeated-random-token probe behind the duplicate and induction scores."""

    length: int
    trials: int
    seed: int
    prefix: tuple[str, ...] = ("[CLS]",)  # the special tokens around R filler R
    suffix: tuple[str, ...] = ("[SEP]",)

    def __str__(self) -> str:
        layout = " ".join([*self.prefix, "R filler R", *self.suffix])
        return (
            f"{self.trials} sequences {layout}, R = {self.length} random tokens; "
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
    kind: str = "encoder"  # "encoder" or "causal LM"
    causal: bool = False  # causal patterns: only the lower triangle (keys <= query) holds weight
    undefined: dict[str, str] = field(default_factory=dict)  # metric -> why it is n/a here
    sink_label: str = "[CLS]/[SEP]"  # the tokens the "special" (sink) metric measured
    # metric -> (low, high) (L, H): 95% bootstrap intervals of the mean over the texts (text
    # roles) or over the probe's trials (probe roles), when several texts were analysed; a role
    # is then given only where the low bound clears its threshold
    intervals: dict[str, tuple[Tensor, Tensor]] = field(default_factory=dict)

    @property
    def shape(self) -> tuple[int, int]:
        L, H = self.metrics["previous"].shape
        return L, H

    @property
    def text_measured(self) -> bool:
        """False when every text was too short for roles measured on the text."""
        return any(t.content_tokens >= MIN_CONTENT_TOKENS for t in self.texts)


def attention_of(subject: Subject, ids: list[int]) -> Tensor:
    """(L, H, T, T) weights of one unpadded token sequence, via `capture`."""
    with torch.inference_mode(), capture(subject.model, keep_qkv=False) as records:
        subject.run(ids)
    return torch.stack([r.weights[0] for r in records]).cpu()


def attention_of_batch(subject: Subject, batch: list[list[int]]) -> list[Tensor]:
    """(L, H, T_i, T_i) weights of each sequence of `batch`, from one padded forward (padding
    masked out as keys, so each equals the sequence's own forward up to rounding)."""
    with torch.inference_mode(), capture(subject.model, keep_qkv=False) as records:
        subject.run_batch(batch)
    stacked = torch.stack([r.weights for r in records]).cpu()  # (L, B, H, T, T)
    return [stacked[:, b, :, : len(ids), : len(ids)] for b, ids in enumerate(batch)]


def token_limit(model, max_tokens: int | None = None) -> int:
    """The number of tokens a text is cut to: the model's own length (256 for MiniLM and,
    by default, for causal LMs) unless `max_tokens` asks for another, up to its position table
    (512 for MiniLM)."""
    return as_subject(model).token_limit(max_tokens)


def text_attention(model, text: str, *, max_tokens: int | None = None) -> TextAttention:
    """Token strings and per-layer weights (L, H, T, T) of one text, via `capture`; the text is
    cut to `token_limit(model, max_tokens)` tokens (see `TextAttention.truncated`)."""
    subject = as_subject(model)
    return _text_attention(subject, text, subject.token_limit(max_tokens))


def _text_attention(subject: Subject, text: str, limit: int) -> TextAttention:
    encoded = subject.encode(text, limit)
    ids = encoded.ids
    attn = attention_of(subject, ids).float()  # (L, H, T, T)
    tokens = subject.token_strings(ids)
    return TextAttention(
        tokens,
        attn,
        encoded.covered,
        encoded.total,
        special=subject.special_mask(ids),
        sinks=subject.sinks(ids),
        word_starts=subject.word_starts(tokens),
    )


def copy_probe(
    model,
    *,
    length: int = 16,
    trials: int = 8,
    seed: int = 0,
    offsets: Sequence[int] = INDUCTION_OFFSETS,
    progress: Progress = _no_progress,
) -> dict[str, Tensor]:
    """Duplicate-token and induction scores (L, H) on R filler R between the model's special
    tokens ([CLS] ... [SEP]; BOS ... in a causal LM with one), R random tokens of its own
    vocabulary: "duplicate" (offset 0), "induction" (offset +1), and the best induction score
    over `offsets` ("induction_best") with the offset that gave it ("induction_offset"), each
    offset's score averaged over the trials first.

    The filler's length is random (1 .. length) in each trial, so a head attending at a fixed
    offset cannot score as an induction head by matching the period.
    """
    metrics, _ = _run_probe(as_subject(model), length, trials, seed, offsets, progress)
    return metrics


def _run_probe(
    subject: Subject,
    length: int,
    trials: int,
    seed: int,
    offsets: Sequence[int],
    progress: Progress,
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """`copy_probe`'s metrics, and the per-trial values (trials, L, H) of those giving roles."""
    if length < 2 or trials < 1:
        raise ValueError(f"the probe needs length >= 2 and trials >= 1, got {length}, {trials}")
    if length > probe_length(subject, length):
        raise ValueError(
            f"a probe of length {length} (R filler R: up to {3 * length} tokens plus the special "
            f"ones) does not fit the model's {subject.max_positions} positions; use length <= "
            f"{probe_length(subject, length)}"
        )
    rng = random.Random(seed)
    scanned = sorted({0, 1, *offsets})
    trials_ids, seconds = [], []
    for _ in range(trials):  # the same draws, in the same order, as one forward per trial took
        seq = subject.random_tokens(rng, length)
        filler = subject.random_tokens(rng, rng.randint(1, length))
        trials_ids.append([*subject.prefix, *seq, *filler, *seq, *subject.suffix])
        seconds.append(len(subject.prefix) + length + len(filler))
    first = len(subject.prefix)
    # every trial in one padded forward (8 sequences of up to 3 * length + 2 tokens)
    (patterns,) = [
        attention_of_batch(subject, trials_ids) for _ in progress(range(1), "random-token probe", 1)
    ]
    scans = torch.stack(
        [
            copy_mass_by_offset(attn, first, second, length, scanned)
            for attn, second in zip(patterns, seconds, strict=True)
        ]
    ).float()  # (trials, O, L, H)
    return _probe_metrics(scans, scanned, offsets)


def _probe_metrics(
    scans: Tensor, scanned: list[int], offsets: Sequence[int]
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Probe metrics from per-trial scans (trials, O, L, H): their means over trials, and
    the per-trial values (trials, L, H) of the metrics that give roles (for intervals)."""
    mean = scans.mean(0)  # (O, L, H)
    best, offset = best_offset(mean[[scanned.index(o) for o in offsets]], offsets)
    rows = torch.tensor([scanned.index(o) for o in offsets])[offset_index(offset, offsets)]
    per_trial = {
        "duplicate": scans[:, scanned.index(0)],
        "induction": scans[:, scanned.index(1)],
        "induction_best": scans.gather(1, rows[None, None].expand(len(scans), 1, *rows.shape))[
            :, 0
        ],
    }
    metrics = {
        "duplicate": mean[scanned.index(0)],
        "induction": mean[scanned.index(1)],
        "induction_best": best,
        "induction_offset": offset.float(),
    }
    return metrics, per_trial


def probe_length(subject, wanted: int = 16) -> int:
    """The longest R (at most `wanted`) whose longest probe, R filler R with a filler as long as
    R and the special tokens around it, fits the model's position table."""
    room = subject.max_positions - len(subject.prefix) - len(subject.suffix)
    return min(wanted, room // 3)


def _notes(items: list[TextAttention], limit: int, model_limit: int, special: str) -> list[str]:
    """Truncation and too-short warnings; `special` names the special tokens ("[CLS]/[SEP]")."""
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
    besides = f" besides {special}" if special else ""
    short = [x for x in items if x.content_tokens < MIN_CONTENT_TOKENS]
    if len(items) == 1 and short:
        n = short[0].content_tokens
        notes.append(
            f"too short to measure: the text has {n} token{'s' * (n != 1)}{besides}, "
            f"and roles measured on a text need at least {MIN_CONTENT_TOKENS}; only the "
            f"random-token probe's roles are given"
        )
    elif len(short) == len(items):
        notes.append(
            f"too short to measure: every text has fewer than {MIN_CONTENT_TOKENS} tokens"
            f"{besides}; only the random-token probe's roles are given"
        )
    elif short:
        notes.append(
            f"{len(short)} of {len(items)} texts have fewer than {MIN_CONTENT_TOKENS} tokens"
            f"{besides}; their special tokens weigh heavily in the means"
        )
    return notes


def analyze(
    model,
    texts: Sequence[str],
    *,
    probe: bool = True,
    max_tokens: int | None = None,
    progress: Progress | None = None,
    rules: Sequence[RoleRule] = RULES,
    previous_distances: Sequence[int] = PREVIOUS_DISTANCES,
    induction_offsets: Sequence[int] = INDUCTION_OFFSETS,
) -> Analysis:
    """Metrics of every head averaged over `texts`, plus the repeated-token probe, and roles.

    `model`: a `Subject` (`EncoderSubject`, `CausalLMSubject`, see `subject.load_subject`) or
    a `SentenceEncoder`. Each text is cut to `token_limit(model, max_tokens)` tokens;
    `Analysis.notes` says when that cut anything, or when the texts are too short for roles
    measured on them. For a causal LM the metrics leave out what a causal pattern cannot show
    (`Analysis.undefined`). Previous-token and induction roles come from scans over
    `previous_distances` and `induction_offsets` and say the offset that was measured; `rules`
    holds the role thresholds (see `roles.with_thresholds`). `progress(iterable, description,
    total)` wraps the loops (over texts, over probe trials).
    """
    if isinstance(texts, str) or not isinstance(texts, Sequence):
        raise TypeError(f"texts must be a sequence of strings, got {type(texts).__name__}")
    if not texts:
        raise ValueError("analyze needs at least one text")
    subject = as_subject(model)
    wrap = progress or _no_progress
    limit = subject.token_limit(max_tokens)
    items = [_text_attention(subject, text, limit) for text in wrap(texts, "texts", len(texts))]
    metrics = corpus_metrics(
        ((x.attn, x.tokens, x.sinks or [0]) for x in items),
        causal=subject.causal,
        previous_distances=previous_distances,
    )
    per_item: dict[str, Tensor] = {}
    if len(items) >= 2:  # per-text values of the text roles' metrics, for intervals
        per_item = per_text_values(items, subject.causal, previous_distances, metrics)
    probe_info = None
    notes = []
    length = probe_length(subject)
    if probe and length < 2:
        probe = False
        notes.append(
            f"the random-token probe was skipped: it needs at least "
            f"{6 + len(subject.prefix) + len(subject.suffix)}"
            f" positions and this model has {subject.max_positions}"
        )
    if probe:
        special = subject.token_strings([*subject.prefix, *subject.suffix])
        probe_info = ProbeInfo(
            length=length,
            trials=8,
            seed=0,
            prefix=tuple(special[: len(subject.prefix)]),
            suffix=tuple(special[len(subject.prefix) :]),
        )
        probe_metrics, per_trial = _run_probe(
            subject, probe_info.length, probe_info.trials, probe_info.seed, induction_offsets, wrap
        )
        metrics.update(probe_metrics)
        if len(items) >= 2:
            per_item.update(per_trial)
    result = Analysis(
        items,
        {k: v.float() for k, v in metrics.items()},
        [],
        probe_info,
        limit,
        _notes(items, limit, subject.max_positions, subject.special_label) + notes,
        kind=subject.kind,
        causal=subject.causal,
        undefined=dict(CAUSAL_UNDEFINED) if subject.causal else {},
        sink_label=subject.sink_label,
    )
    result.intervals = {k: bootstrap_mean_interval(v) for k, v in per_item.items()}
    sources = SOURCES if result.text_measured else tuple(s for s in SOURCES if s != "text")
    result.roles = head_roles(
        metrics, rules, sources=sources, sinks=subject.sink_label, intervals=result.intervals
    )
    return result
