"""Words to tokens from the tokenizer's character offsets, so WordPiece ("##"), byte-level
BPE ("Ġ") and SentencePiece ("▁") all align the same way: a token belongs to the word its
characters overlap most (spaces do not count; the first word on a tie); special tokens and
tokens of spaces belong to no word."""

from __future__ import annotations

from collections.abc import Sequence


class AlignmentError(ValueError):
    """A word the tokenizer maps to no token (e.g. characters its normaliser drops)."""


def token_words(
    text: str,
    word_spans: Sequence[tuple[int, int]],
    token_offsets: Sequence[tuple[int, int] | None],
) -> list[int | None]:
    """For each token (None offsets: a special token), the index of its word, or None."""
    out: list[int | None] = []
    for offsets in token_offsets:
        best, best_overlap = None, 0
        if offsets is not None:
            s, e = offsets
            for w, (ws, we) in enumerate(word_spans):
                lo, hi = max(s, ws), min(e, we)
                overlap = sum(1 for c in text[lo:hi] if not c.isspace()) if hi > lo else 0
                if overlap > best_overlap:
                    best, best_overlap = w, overlap
        out.append(best)
    return out


def word_tokens(
    owners: Sequence[int | None], words: Sequence[str], spans: Sequence[tuple[int, int]]
) -> list[list[int]]:
    """Token positions of each word; words that share a span (a multiword token's words) share
    its tokens. Raises AlignmentError when a word has no token."""
    by_word: list[list[int]] = [[] for _ in words]
    for t, w in enumerate(owners):
        if w is not None:
            by_word[w].append(t)
    for w, span in enumerate(spans):  # a multiword token's later words: the first one's tokens
        if not by_word[w]:
            twin = next((v for v in range(w) if spans[v] == span and by_word[v]), None)
            if twin is not None:
                by_word[w] = list(by_word[twin])
    missing = [f"{words[w]!r} (word {w + 1})" for w, ts in enumerate(by_word) if not ts]
    if missing:
        raise AlignmentError(f"the tokenizer maps {', '.join(missing)} to no token")
    return by_word
