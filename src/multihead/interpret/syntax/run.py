"""`syntax_scores`: run a model on annotated sentences and score every head on every relation
(the glue between a model and the pure functions of `scoring`). Each sentence runs alone, whole:
one longer than the model's limit is skipped and counted, never cut; a sentence with a word the
tokenizer maps to no token is skipped and counted with the reason."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .align import AlignmentError, token_words, word_tokens
from .corpus import Sentence, check_relations
from .scoring import (
    DIRECTIONS,
    RelationScore,
    attended_by,
    predictions,
    summarize,
    tally,
    word_attention,
)

Progress = Callable[[Iterable[Any], str, int], Iterable[Any]]


@dataclass
class SyntaxResult:
    model: str
    sentences: list[Sentence]  # the scored sentences
    rows: list[RelationScore]  # strongest margin over the baseline first
    shape: tuple[int, int]  # (L, H)
    causal: bool = False
    skipped: dict[str, list[str]] = field(default_factory=dict)  # reason -> sentence names
    dropped: dict[str, int] = field(default_factory=dict)  # direction -> arcs left out
    scored_pairs: dict[str, int] = field(default_factory=dict)  # direction -> arcs scored
    predicted: list[np.ndarray] = field(default_factory=list)  # per sentence: (L, H, W)
    attended: list[np.ndarray] = field(default_factory=list)  # per sentence: (L, H, W)
    word_tokens: list[list[list[int]]] = field(default_factory=list)  # per sentence

    @property
    def words(self) -> int:
        return sum(len(s) for s in self.sentences)

    def to_json(self) -> dict:
        """The JSON contract: model, sentences, words, relations (layer/head 0-based, count =
        scored dependents), per_head {relation: {direction: L x H accuracies}}."""
        per_head: dict[str, dict[str, list]] = {}
        for r in self.rows:
            per_head.setdefault(r.relation, {})[r.direction] = np.round(r.per_head, 6).tolist()
        return {
            "model": self.model,
            "sentences": len(self.sentences),
            "words": self.words,
            "relations": [
                {
                    "relation": r.relation,
                    "direction": r.direction,
                    "count": r.count,
                    "layer": r.layer,
                    "head": r.head,
                    "accuracy": round(r.accuracy, 6),
                    "ci": [round(r.ci[0], 6), round(r.ci[1], 6)],
                    "baseline_offset": r.baseline_offset,
                    "baseline_accuracy": round(r.baseline_accuracy, 6),
                }
                for r in self.rows
            ],
            "per_head": per_head,
        }


def score_attention(
    items: Sequence[tuple[Sentence, Any, Sequence[Sequence[int]]]],
    *,
    causal: bool,
    model: str = "",
    min_count: int = 10,
    relations: Sequence[str] | None = None,
    resamples: int = 1000,
    seed: int = 0,
) -> SyntaxResult:
    """The pure part: (sentence, (L, H, T, T) attention, each word's token positions) triples
    -> scores. `relations`: only these labels (exact); `min_count`: fewer scored pairs and a
    relation is left out."""
    if not items:
        raise ValueError("no sentences to score")
    sentences, attns, groups = zip(*items, strict=True)
    word_attns = [word_attention(a, g) for a, g in zip(attns, groups, strict=True)]
    tallies, dropped = tally(zip(sentences, word_attns, strict=True), causal)
    if relations is not None:
        check_relations(relations, [r for s in sentences for r in s.relations])
    rows = summarize(
        tallies, min_count=min_count, relations=relations, resamples=resamples, seed=seed
    )
    scored = {d: sum(sum(t.count) for (_, dd), t in tallies.items() if dd == d) for d in DIRECTIONS}
    return SyntaxResult(
        model,
        list(sentences),
        rows,
        word_attns[0].shape[:2],
        causal,
        dropped=dropped,
        scored_pairs=scored,
        predicted=[predictions(w, causal).astype(np.int32) for w in word_attns],
        attended=[attended_by(w, causal).astype(np.int32) for w in word_attns],
        word_tokens=[[list(t) for t in g] for g in groups],
    )


def encode_sentence(subject, sentence: Sentence) -> tuple[list[int], list[list[int]]]:
    """Token ids (the model's special tokens around the text) and each word's token positions.
    Raises AlignmentError when a word gets no token."""
    text = sentence.text
    body = subject.tokenizer.encode(text, add_special_tokens=False)
    ids = [*subject.prefix, *body.ids, *subject.suffix]
    offsets = [None] * len(subject.prefix) + list(body.offsets) + [None] * len(subject.suffix)
    spans = sentence.word_spans()
    owners = token_words(text, spans, offsets)
    return ids, word_tokens(owners, sentence.words, spans)


def syntax_scores(
    model,
    sentences: Sequence[Sentence],
    *,
    name: str = "",
    min_count: int = 10,
    relations: Sequence[str] | None = None,
    max_tokens: int | None = None,
    resamples: int = 1000,
    seed: int = 0,
    batch_size: int = 16,
    progress: Progress | None = None,
) -> SyntaxResult:
    """Every head of `model` (a Subject or SentenceEncoder) scored on every relation of
    `sentences`. Sentences longer than `token_limit(max_tokens)` tokens are skipped and counted
    in `SyntaxResult.skipped`, as are sentences with a word that maps to no token. Sentences
    run `batch_size` at a time, right-padded with the padding masked out as keys."""
    from ..analysis import attention_of_batch
    from ..subject import as_subject

    subject = as_subject(model)
    limit = subject.token_limit(max_tokens)
    wrap = progress or (lambda items, desc, total: items)
    skipped: dict[str, list[str]] = {}
    encoded = []
    for number, sentence in enumerate(sentences, 1):
        label = sentence.sent_id or f"sentence {number}"
        try:
            ids, groups = encode_sentence(subject, sentence)
        except AlignmentError as e:
            skipped.setdefault(f"a word maps to no token ({e})", []).append(label)
            continue
        if len(ids) > limit:
            skipped.setdefault(f"longer than the model's {limit} tokens", []).append(label)
            continue
        encoded.append((sentence, ids, groups))
    items = []
    chunks = [encoded[i : i + batch_size] for i in range(0, len(encoded), batch_size)]
    for chunk in wrap(chunks, "sentence batches", len(chunks)):
        patterns = attention_of_batch(subject, [ids for _, ids, _ in chunk])
        for (sentence, _, groups), attn in zip(chunk, patterns, strict=True):
            items.append((sentence, attn.double().numpy(), groups))
    if not items:
        reasons = "; ".join(f"{len(v)} {k}" for k, v in skipped.items())
        raise ValueError(f"no sentence could be scored ({reasons or 'the corpus is empty'})")
    result = score_attention(
        items,
        causal=subject.causal,
        model=name,
        min_count=min_count,
        relations=relations,
        resamples=resamples,
        seed=seed,
    )
    result.skipped = skipped
    return result
