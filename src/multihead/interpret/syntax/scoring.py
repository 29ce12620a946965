"""How well each head finds each dependency relation (Clark, Khandelwal, Levy & Manning 2019,
"What Does BERT Look At?"): pure functions of captured attention and annotated sentences.

The rule is the paper's (its code: github.com/clarkkev/attention-analysis, Syntax_Analysis.ipynb
`attn_head_predictor` / `evaluate_predictor`, bpe_utils.py `get_word_word_attention`):
- Word-level attention: attention *to* a word is the sum over its tokens, attention *from* a word
  the mean over its tokens; tokens of no word ([CLS]/[SEP]/BOS, other special tokens) are
  dropped, so they are never a prediction.
- A head predicts, for each word, the most-attended-to *other* word: the word's own column is
  left out (the paper zeroes the diagonal), the first on a tie (numpy's argmax).
- dependent->head: correct when the dependent's most-attended other word is its head.
  head->dependent (the paper's "transpose" mode): correct when the word that attends most to the
  dependent (the dependent itself left out) is its head.
- Possessives: for `poss` / `nmod:poss` when the next word is the clitic 's (or '), the clitic's
  prediction is scored in place of the possessor's (the paper's special case, section 4.2: the
  model puts the possessed noun's link on 's), and the baseline offset is counted from it.
A causal model's word sees only earlier words and itself: its candidates are the words before
it (dependent->head), or the words after the dependent that can see it (head->dependent); only
pairs whose target comes before the query are scored (dependent->head: heads before their
dependent) and the others are counted as dropped. A word with no candidate (the first word of a
causal model) predicts -1. The baseline is the best fixed offset: the one relative position
(target - query) most often right for the relation over the scored pairs.

Shapes: L layers, H heads, T tokens, W words, S sentences."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from .corpus import UNSCORED, Sentence

DIRECTIONS = ("dependent->head", "head->dependent")
POSSESSIVES = frozenset({"poss", "nmod:poss"})
CLITICS = frozenset({"'s", "'", "s'", "\u2019s", "\u2019"})  # \u2019: the typographic apostrophe


def word_attention(attn, word_tokens: Sequence[Sequence[int]]) -> np.ndarray:
    """(L, H, T, T) token attention -> (L, H, W, W) word attention (float64): row i, column j
    = the mean over word i's tokens of the summed attention on word j's tokens."""
    a = np.asarray(attn, dtype=np.float64)
    T, W = a.shape[-1], len(word_tokens)
    member = np.zeros((W, T))
    for w, tokens in enumerate(word_tokens):
        member[w, list(tokens)] = 1.0
    to_words = a @ member.T  # (L, H, T, T) @ (T, W) -> (L, H, T, W): sum over keys
    mean_rows = member / member.sum(1, keepdims=True)  # (W, T)
    return np.einsum("wt,lhtv->lhwv", mean_rows, to_words)  # (L, H, W, W): mean over queries


def _argmax_other(scores: np.ndarray, visible: np.ndarray) -> np.ndarray:
    """(L, H, W, W) scores, (W, W) visible candidates -> (L, H, W): the argmax over each row's
    visible columns other than the diagonal; -1 where a row has none."""
    W = scores.shape[-1]
    allowed = visible & ~np.eye(W, dtype=bool)
    best = np.where(allowed, scores, -np.inf).argmax(-1)
    return np.where(allowed.any(-1), best, -1)


def predictions(word_attn: np.ndarray, causal: bool) -> np.ndarray:
    """(L, H, W, W) -> (L, H, W): each word's most-attended other word (causal: among the words
    before it); -1 when there is none."""
    W = word_attn.shape[-1]
    visible = np.ones((W, W), dtype=bool)
    if causal:
        visible = np.tril(visible, k=-1)
    return _argmax_other(word_attn, visible)


def attended_by(word_attn: np.ndarray, causal: bool) -> np.ndarray:
    """(L, H, W, W) -> (L, H, W): for each word, the other word that attends to it most (the
    paper's transpose mode; causal: among the words after it); -1 when there is none."""
    W = word_attn.shape[-1]
    visible = np.ones((W, W), dtype=bool)
    if causal:
        visible = np.triu(visible, k=1)
    return _argmax_other(np.swapaxes(word_attn, -1, -2), visible)


def correct(pred: np.ndarray, by: np.ndarray, q: int, t: int, direction: str) -> np.ndarray:
    """(L, H) booleans: is the pair (query q, target t) right? `pred` / `by`: `predictions` /
    `attended_by` of one sentence."""
    if direction == "dependent->head":  # q: the dependent
        return pred[:, :, q] == t
    return by[:, :, t] == q  # q: the head, t: the dependent


def pairs(sentence: Sentence, direction: str, causal: bool) -> tuple[list[tuple], int]:
    """(query word, target word, relation) 0-based for every scored arc, and how many arcs the
    causal mask left out (0 for a bidirectional model). The dependent of a possessive followed by
    the clitic 's is the clitic (see the module docstring)."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    out, dropped = [], 0
    words = sentence.words
    for d, (h, rel) in enumerate(zip(sentence.heads, sentence.relations, strict=True)):
        if h == 0 or rel in UNSCORED:
            continue
        if rel in POSSESSIVES and d + 1 < len(words) and words[d + 1].lower() in CLITICS:
            d += 1
        q, t = (d, h - 1) if direction == "dependent->head" else (h - 1, d)
        if causal and t > q:
            dropped += 1
            continue
        out.append((q, t, rel))
    return out, dropped


@dataclass
class Tally:
    """One relation in one direction over a corpus: per sentence, the scored pairs, how many
    each head got right, and the offsets (target - query) of the pairs."""

    correct: list[np.ndarray]  # per sentence: (L, H) counts
    count: list[int]  # per sentence: scored pairs
    offsets: list[int]  # every scored pair's target - query


def tally(
    sentences: Iterable[tuple[Sentence, np.ndarray]], causal: bool
) -> tuple[dict[tuple[str, str], Tally], dict[str, int]]:
    """Counts over (sentence, (L, H, W, W) word attention) pairs: {(relation, direction):
    Tally} (a sentence without the relation counts 0 for it, so bootstraps see every
    sentence) and, per direction, how many arcs the causal mask left out."""
    local: list[dict[tuple[str, str], tuple[np.ndarray, int, list[int]]]] = []
    dropped = dict.fromkeys(DIRECTIONS, 0)
    shape = (0, 0)
    for sentence, word_attn in sentences:
        shape = word_attn.shape[:2]
        pred = predictions(word_attn, causal)  # (L, H, W)
        by = attended_by(word_attn, causal)  # (L, H, W)
        mine: dict[tuple[str, str], tuple[np.ndarray, int, list[int]]] = {}
        for direction in DIRECTIONS:
            scored, lost = pairs(sentence, direction, causal)
            dropped[direction] += lost
            for q, t, rel in scored:
                right, n, offsets = mine.get((rel, direction), (np.zeros(shape), 0, []))
                hit = correct(pred, by, q, t, direction)
                mine[(rel, direction)] = (right + hit, n + 1, [*offsets, t - q])
        local.append(mine)
    keys = sorted({key for mine in local for key in mine})
    none: tuple[np.ndarray, int, list[int]] = (np.zeros(shape), 0, [])
    tallies = {
        key: Tally(
            [m.get(key, none)[0] for m in local],
            [m.get(key, none)[1] for m in local],
            [o for m in local for o in m.get(key, none)[2]],
        )
        for key in keys
    }
    return tallies, dropped


def best_offset(offsets: Sequence[int]) -> tuple[int, float]:
    """The fixed relative position most often right, and its accuracy; on a tie the nearer
    offset, then the one to the left."""
    if not offsets:
        raise ValueError("best_offset needs at least one pair")
    counts = Counter(offsets)
    offset = min(counts, key=lambda k: (-counts[k], abs(k), k))
    return offset, counts[offset] / len(offsets)


def bootstrap_interval(
    correct: np.ndarray, count: np.ndarray, *, resamples: int = 1000, seed: int = 0
) -> tuple[float, float]:
    """95% percentile interval of sum(correct) / sum(count) over sentences resampled with
    replacement (numpy's seeded generator; the same seed gives the same interval)."""
    correct, count = np.asarray(correct, float), np.asarray(count, float)
    S = len(count)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, S, size=(resamples, S))  # (R, S) sentence indices
    weights = np.zeros((resamples, S))
    np.add.at(weights, (np.arange(resamples)[:, None], picks), 1.0)
    totals = weights @ count
    acc = np.divide(weights @ correct, totals, out=np.zeros(resamples), where=totals > 0)
    lo, hi = np.percentile(acc, [2.5, 97.5])
    return float(lo), float(hi)


@dataclass(frozen=True)
class RelationScore:
    relation: str
    direction: str
    count: int  # scored dependents
    layer: int
    head: int
    accuracy: float
    ci: tuple[float, float]
    baseline_offset: int
    baseline_accuracy: float
    per_head: np.ndarray  # (L, H) accuracies

    @property
    def margin(self) -> float:
        return self.accuracy - self.baseline_accuracy


def summarize(
    tallies: dict[tuple[str, str], Tally],
    *,
    min_count: int = 10,
    relations: Sequence[str] | None = None,
    resamples: int = 1000,
    seed: int = 0,
) -> list[RelationScore]:
    """One row per (relation, direction) with at least `min_count` scored pairs (of
    `relations`, if given): the best head (first in layer order on a tie), its bootstrap
    interval, and the baseline; strongest margin over the baseline first."""
    rows = []
    for (rel, direction), t in tallies.items():
        n = sum(t.count)
        if n < min_count or (relations is not None and rel not in relations):
            continue
        correct = np.stack(t.correct)  # (S, L, H)
        per_head = correct.sum(0) / n
        layer, head = np.unravel_index(int(per_head.argmax()), per_head.shape)
        ci = bootstrap_interval(
            correct[:, layer, head], np.array(t.count), resamples=resamples, seed=seed
        )
        offset, base = best_offset(t.offsets)
        rows.append(
            RelationScore(
                rel,
                direction,
                n,
                int(layer),
                int(head),
                float(per_head[layer, head]),
                ci,
                offset,
                base,
                per_head,
            )
        )
    rows.sort(key=lambda r: (-r.margin, r.relation, r.direction))
    return rows
