"""Dependency-annotated sentences: the one structure every analysis in `syntax` reads, and
CoNLL-U reading (the Universal Dependencies format) at the edge.

A `Sentence` holds syntactic words with 1-based heads (0 = the root) and relation labels, and
the surface text the words were written as (which words have a space after them), so a
tokenizer can see the sentence as it was written. CoNLL-U multiword tokens (`1-2 doesn't`)
are written as their surface form, their syntactic words sharing its characters; empty nodes
(`1.1`, enhanced dependencies only) are not words of the basic tree and are left out."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

# The UD v2 universal relations (subtypes like nsubj:pass add ":something" to one of these).
_UD = """acl advcl advmod amod appos aux case cc ccomp clf compound conj cop csubj dep det
discourse dislocated expl fixed flat goeswith iobj list mark nmod nsubj nummod obj obl orphan
parataxis punct reparandum root vocative xcomp"""
UD_RELATIONS = frozenset(_UD.split())
# Relations never scored: punctuation attaches by convention, not by grammar; the root has no
# head word. spaCy's English labels name them "punct" and "ROOT".
UNSCORED = frozenset({"punct", "root", "ROOT"})


class CorpusError(ValueError):
    """A corpus that cannot be read: the message names the line (or sentence) and the fault."""


@dataclass(frozen=True)
class Sentence:
    words: tuple[str, ...]
    heads: tuple[int, ...]  # 1-based index of each word's head; 0 = the root
    relations: tuple[str, ...]
    # Surface text pieces: (text, first word, last word, space after); one per word unless a
    # multiword token covers several words.
    pieces: tuple[tuple[str, int, int, bool], ...] = field(default=())
    sent_id: str = ""

    def __post_init__(self) -> None:
        if not self.pieces:
            pieces = tuple((w, i, i, True) for i, w in enumerate(self.words))
            object.__setattr__(self, "pieces", pieces)

    def __len__(self) -> int:
        return len(self.words)

    @property
    def text(self) -> str:
        return "".join(t + (" " if space else "") for t, _, _, space in self.pieces).rstrip()

    def word_spans(self) -> list[tuple[int, int]]:
        """Each word's (start, end) characters in `text`; the words of a multiword token share
        its span."""
        spans: list[tuple[int, int]] = [(0, 0)] * len(self.words)
        at = 0
        for t, first, last, space in self.pieces:
            for w in range(first, last + 1):
                spans[w] = (at, at + len(t))
            at += len(t) + (1 if space else 0)
        return spans


def check_tree(words, heads, relations, where: str) -> None:
    """Heads in range, exactly one root, no cycles; `where` names the sentence in errors."""
    n = len(words)
    if n == 0:
        raise CorpusError(f"{where}: a sentence with no words")
    if not len(heads) == len(relations) == n:
        raise CorpusError(f"{where}: {n} words but {len(heads)} heads, {len(relations)} labels")
    for i, h in enumerate(heads):
        if not 0 <= h <= n:
            raise CorpusError(
                f"{where}: word {i + 1} {words[i]!r} has head {h}, out of range 0..{n}"
            )
        if h == i + 1:
            raise CorpusError(f"{where}: word {i + 1} {words[i]!r} is its own head")
    roots = [i + 1 for i, h in enumerate(heads) if h == 0]
    if len(roots) != 1:
        raise CorpusError(f"{where}: {len(roots)} roots (words {roots}), a tree has exactly one")
    for start in range(1, n + 1):
        seen: set[int] = set()
        node = start
        while node != 0:
            if node in seen:
                raise CorpusError(f"{where}: the heads of words {sorted(seen)} form a cycle")
            seen.add(node)
            node = heads[node - 1]


_ID = re.compile(r"^(\d+|\d+-\d+|\d+\.\d+)$")


def _check_lines(text: str, name: str) -> None:
    """Column counts and IDs, with line numbers (the conllu package reports neither)."""
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        cols = line.split("\t")
        if len(cols) != 10:
            raise CorpusError(
                f"{name}, line {number}: {len(cols)} tab-separated columns, CoNLL-U has 10 "
                f"(ID FORM LEMMA UPOS XPOS FEATS HEAD DEPREL DEPS MISC)"
            )
        if not _ID.match(cols[0]):
            raise CorpusError(f"{name}, line {number}: ID {cols[0]!r} is not N, N-M or N.M")
        if "-" not in cols[0] and "." not in cols[0] and not cols[6].isdigit():
            raise CorpusError(f"{name}, line {number}: HEAD {cols[6]!r} is not a number")


def _block_starts(text: str) -> list[int]:
    """The line number where each sentence block starts."""
    starts, inside = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip() and not inside:
            starts.append(number)
        inside = bool(line.strip())
    return starts


def parse_conllu(text: str, name: str = "<string>") -> list[Sentence]:
    """Sentences of a CoNLL-U document (checked: ten columns, IDs, heads in range, one root,
    no cycles; errors name the line or the sentence's first line)."""
    import conllu

    _check_lines(text, name)
    blocks = [b for b in re.split(r"\n\s*\n", text) if b.strip()]
    starts = _block_starts(text)
    out = []
    for block, start in zip(blocks, starts, strict=True):
        if all(line.startswith("#") for line in block.strip().splitlines()):
            continue  # a comment-only block: the file's header
        try:
            (tokens,) = conllu.parse(block + "\n\n")
        except conllu.exceptions.ParseException as e:
            raise CorpusError(f"{name}, sentence at line {start}: {e}") from None
        out.append(_sentence(tokens, f"{name}, sentence at line {start}"))
    return out


def _sentence(tokens, where: str) -> Sentence:
    words: list[str] = []
    heads: list[int] = []
    relations: list[str] = []
    pieces: list[tuple[str, int, int, bool]] = []
    covered_to = 0  # the last word id a multiword token covers
    for tok in tokens:
        tid = tok["id"]
        space = (tok["misc"] or {}).get("SpaceAfter") != "No"
        if isinstance(tid, tuple) and tid[1] == "-":  # multiword token: its surface form
            first, last = tid[0], tid[2]
            pieces.append((tok["form"], first - 1, last - 1, space))
            covered_to = last
            continue
        if isinstance(tid, tuple):  # empty node (1.1): not in the basic tree
            continue
        if tid != len(words) + 1:
            raise CorpusError(f"{where}: word ids must run 1, 2, 3...; found {tid}")
        if tok["head"] is None:
            raise CorpusError(f"{where}: word {tid} {tok['form']!r} has no HEAD")
        words.append(tok["form"])
        heads.append(int(tok["head"]))
        relations.append(str(tok["deprel"]))
        if tid > covered_to:
            pieces.append((tok["form"], tid - 1, tid - 1, space))
    check_tree(words, heads, relations, where)
    sent_id = tokens.metadata.get("sent_id", "")
    return Sentence(tuple(words), tuple(heads), tuple(relations), tuple(pieces), sent_id)


def read_conllu(path: str | Path) -> list[Sentence]:
    """Sentences of a CoNLL-U file (UTF-8)."""
    path = Path(path)
    return parse_conllu(path.read_text(encoding="utf-8"), str(path))


def shipped_corpus() -> Path:
    """The English corpus that ships with multihead (CC0, written for it; see its header)."""
    return Path(__file__).with_name("data") / "en_multihead.conllu"
