"""Syntax roles on one text (what `multihead inspect TEXT` adds when a spaCy pipeline is present):
for each dependency relation in the text and each direction, the heads whose most-attended other
word (Clark et al. 2019's rule, see `scoring`) is right most often, as hits out of the text's
pairs, beside the best fixed offset's hits.

The scoring is `scoring`'s (Clark-style word attention, special tokens never a prediction,
causal models scored only on pairs whose target comes first), applied to the whole text as the
model read it: every word of the text is a candidate, whichever sentence it is in. One text has
few pairs per relation, so many heads tie; among heads with the same hits, the one with more
word attention on the targets comes first. The best head and the best offset are both chosen
on this text; corpus-level figures with intervals come from `syntax_scores`.

Shapes: L layers, H heads, T tokens, W words."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .align import token_words, word_tokens
from .corpus import Sentence
from .scoring import DIRECTIONS, best_offset, pairs, tally, word_attention


@dataclass(frozen=True)
class TextRelation:
    """One relation in one direction on one text."""

    relation: str
    direction: str
    count: int  # scored pairs on this text
    hits: int  # the best head's: pairs whose most-attended word is the target
    heads: tuple[tuple[int, int], ...]  # (layer, head) of every head with `hits`, best first
    baseline_offset: int  # the fixed offset (target - query) right most often on this text
    baseline_hits: int
    per_head: np.ndarray  # (L, H) hits

    @property
    def margin(self) -> int:
        return self.hits - self.baseline_hits


@dataclass
class TextSyntax:
    parser: str  # the pipeline that parsed the text, as it was named
    sentence: Sentence  # the text's words, heads (0: a sentence's root) and labels
    rows: list[TextRelation]  # largest margin over the baseline first
    causal: bool = False
    scored_pairs: dict[str, int] = field(default_factory=dict)  # direction -> pairs scored
    dropped: dict[str, int] = field(default_factory=dict)  # direction -> pairs a causal mask hid

    def to_json(self) -> dict:
        """The `syntax` section of `inspect`'s JSON: layer/head 0-based; `heads` of a word
        1-based (0: root), as in CoNLL-U."""
        s = self.sentence
        return {
            "parser": self.parser,
            "words": [
                {"text": w, "head": h, "relation": r}
                for w, h, r in zip(s.words, s.heads, s.relations, strict=True)
            ],
            "causal": self.causal,
            "scored_pairs": self.scored_pairs,
            "dropped": self.dropped,
            "relations": [
                {
                    "relation": r.relation,
                    "direction": r.direction,
                    "count": r.count,
                    "hits": r.hits,
                    "heads": [list(h) for h in r.heads],
                    "baseline_offset": r.baseline_offset,
                    "baseline_hits": r.baseline_hits,
                    "per_head": r.per_head.astype(int).tolist(),
                }
                for r in self.rows
            ],
        }


def score_text(
    sentence: Sentence,
    attn: Any,
    groups: Sequence[Sequence[int]],
    *,
    causal: bool,
    parser: str = "",
) -> TextSyntax:
    """The pure part: one text's words (`sentence`: heads 0 for roots; punctuation and roots
    are not scored), its (L, H, T, T) attention and each word's token positions -> one row per
    (relation, direction) that has a scored pair."""
    if len(groups) != len(sentence):
        raise ValueError(f"groups has {len(groups)} words, sentence has {len(sentence)}")
    word_attn = word_attention(attn, groups)  # (L, H, W, W)
    tallies, dropped = tally([(sentence, word_attn)], causal)
    # attention on the target per pair, summed: orders heads that tie on hits
    mass: dict[tuple[str, str], np.ndarray] = {}
    for direction in DIRECTIONS:
        for q, t, rel in pairs(sentence, direction, causal)[0]:
            key = (rel, direction)
            mass[key] = mass.get(key, 0) + word_attn[:, :, q, t]
    rows = []
    for (rel, direction), t in tallies.items():
        hits = t.correct[0]  # (L, H): one sentence
        best = int(hits.max())
        ranked = sorted(
            zip(*np.nonzero(hits == best), strict=True),
            key=lambda lh: (-mass[rel, direction][lh], lh),
        )
        offset, _ = best_offset(t.offsets)
        rows.append(
            TextRelation(
                rel,
                direction,
                t.count[0],
                best,
                tuple((int(layer), int(head)) for layer, head in ranked),
                offset,
                Counter(t.offsets)[offset],
                hits.astype(int),
            )
        )
    rows.sort(key=lambda r: (-r.margin, -r.hits, r.relation, r.direction))
    scored = {d: sum(r.count for r in rows if r.direction == d) for d in DIRECTIONS}
    return TextSyntax(parser, sentence, rows, causal, scored, dropped)


def text_syntax(
    model,
    text: str,
    nlp: Callable[[str], Any],
    *,
    parser: str | None = None,
    max_tokens: int | None = None,
    attention=None,
) -> TextSyntax:
    """Syntax roles of every head of `model` (a Subject or SentenceEncoder) on `text`, parsed by
    `nlp` (a loaded spaCy pipeline with a parser: `spacy_docs.load_parser`).

    The text is cut to `token_limit(max_tokens)` tokens, as `analysis.analyze` cuts it, and only
    the part those tokens cover is parsed. `attention`: the text's (L, H, T, T) weights if
    already computed for these tokens (`Analysis.texts[0].attn`), to save a forward; `parser`:
    the pipeline's name as shown (default: from its meta)."""
    from ..analysis import attention_of
    from ..subject import as_subject
    from .spacy_docs import text_words

    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    if not callable(nlp):
        raise TypeError(f"nlp must be a spaCy pipeline (callable), got {type(nlp).__name__}")
    subject = as_subject(model)
    encoded = subject.encode(text, subject.token_limit(max_tokens))
    kept = len(encoded.ids) - len(subject.prefix) - len(subject.suffix)
    body = subject.tokenizer.encode(text, add_special_tokens=False)
    offsets = (
        [None] * len(subject.prefix) + list(body.offsets[:kept]) + [None] * len(subject.suffix)
    )
    doc = nlp(encoded.covered)
    if not doc.has_annotation("DEP"):
        raise ValueError("the spaCy pipeline gave the text no dependency parse")
    sentence, spans = text_words(doc)
    groups = word_tokens(token_words(encoded.covered, spans, offsets), sentence.words, spans)
    if attention is None:
        attention = attention_of(subject, encoded.ids)
    T = len(encoded.ids)
    if tuple(attention.shape[-2:]) != (T, T):
        raise ValueError(
            f"attention covers {tuple(attention.shape[-2:])} tokens but the text is {T} tokens "
            f"here: pass the weights of this text, model and max_tokens"
        )
    meta = getattr(nlp, "meta", {})  # a spaCy Language: {"lang": "en", "name": "core_web_sm"}
    name = parser or "_".join(str(meta[k]) for k in ("lang", "name") if meta.get(k))
    return score_text(
        sentence, attention.double().numpy(), groups, causal=subject.causal, parser=name
    )
