"""Dependency-annotated sentences: the one structure every analysis in `syntax` reads, and
CoNLL-U reading (the Universal Dependencies format) at the edge.

A `Sentence` holds syntactic words with 1-based heads (0 = the root) and relation labels, and
the surface text the words were written as (which words have a space after them), so a
tokenizer can see the sentence as it was written. CoNLL-U multiword tokens (`1-2 doesn't`)
are written as their surface form, their syntactic words sharing its characters; empty nodes
(`1.1`, enhanced dependencies only) are not words of the basic tree and are left out."""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
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


def check_tree(words, heads, relations, where: str, lines: Sequence[int] | None = None) -> None:
    """Heads in range, exactly one root, no cycles, in time linear in the words; `where` names
    the sentence in errors, `lines` (when given) each word's line."""
    n = len(words)
    if n == 0:
        raise CorpusError(f"{where}: a sentence with no words")
    if not len(heads) == len(relations) == n:
        raise CorpusError(f"{where}: {n} words but {len(heads)} heads, {len(relations)} labels")

    def at(i: int) -> str:  # where word i (0-based) is
        return where if lines is None else f"{where}, line {lines[i]}"

    for i, h in enumerate(heads):
        if not 0 <= h <= n:
            raise CorpusError(
                f"{at(i)}: word {i + 1} {words[i]!r} has head {h}, out of range 0..{n}"
            )
        if h == i + 1:
            raise CorpusError(f"{at(i)}: word {i + 1} {words[i]!r} is its own head")
    roots = [i + 1 for i, h in enumerate(heads) if h == 0]
    if len(roots) != 1:
        raise CorpusError(f"{where}: {len(roots)} roots (words {roots}), a tree has exactly one")
    # Each word is walked towards the root once: a walk stops at a word an earlier walk
    # reached the root from (state 2); meeting a word of the current walk (state 1) is a cycle.
    state = [0] * (n + 1)
    state[0] = 2
    for start in range(1, n + 1):
        path, node = [], start
        while state[node] == 0:
            state[node] = 1
            path.append(node)
            node = heads[node - 1]
        if state[node] == 1:
            cycle = sorted(path[path.index(node) :])
            where_lines = (
                "" if lines is None else f" (lines {', '.join(str(lines[w - 1]) for w in cycle)})"
            )
            raise CorpusError(f"{where}: the heads of words {cycle} form a cycle{where_lines}")
        for w in path:
            state[w] = 2


def check_relations(asked: Sequence[str], known: Sequence[str]) -> None:
    """Every asked relation label is one of `known` (exact); ValueError naming the unknown
    ones, a close match for each, and the known labels."""
    known = sorted(set(known))
    unknown = [r for r in asked if r not in known]
    if not unknown:
        return
    parts = []
    for label in unknown:
        close = difflib.get_close_matches(label, known, n=1)
        parts.append(f"{label!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    raise ValueError(
        f"relation {', '.join(parts)} is not a label of the corpus; it has {' '.join(known)}"
    )


_ID = re.compile(r"^(\d+|\d+-\d+|\d+\.\d+)$")


def _check_line(line: str, where: str) -> None:
    """Column count, ID, HEAD and FORM of one word line (the conllu package names no line).
    FORM follows universaldependencies.org/format.html: no field is empty; FORM (and LEMMA)
    may hold spaces, but a FORM of whitespace alone, or starting or ending with it, is not
    a form (UD's validator refuses it)."""
    cols = line.split("\t")
    if len(cols) != 10:
        raise CorpusError(
            f"{where}: {len(cols)} tab-separated columns, CoNLL-U has 10 "
            f"(ID FORM LEMMA UPOS XPOS FEATS HEAD DEPREL DEPS MISC)"
        )
    if not _ID.match(cols[0]):
        raise CorpusError(f"{where}: ID {cols[0]!r} is not N, N-M or N.M")
    if "-" in cols[0]:
        first, last = (int(x) for x in cols[0].split("-"))
        if not 0 < first < last:
            raise CorpusError(f"{where}: multiword range {cols[0]} does not run forwards")
    form = cols[1]
    if not form.strip() or form != form.strip():
        raise CorpusError(
            f"{where}: FORM {form!r} is empty or starts or ends with whitespace (CoNLL-U "
            "fields must not be empty; a FORM may hold spaces only between characters)"
        )
    if "-" not in cols[0] and "." not in cols[0] and not cols[6].isdigit():
        raise CorpusError(f"{where}: HEAD {cols[6]!r} is not a number")


def _blocks(text: str) -> list[tuple[int, list[tuple[int, str]]]]:
    """Each sentence block: its first line's number, and its lines with their numbers."""
    blocks: list[tuple[int, list[tuple[int, str]]]] = []
    current: list[tuple[int, str]] = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            current.append((number, line))
        elif current:
            blocks.append((current[0][0], current))
            current = []
    if current:
        blocks.append((current[0][0], current))
    return blocks


def parse_conllu(text: str, name: str = "<string>") -> list[Sentence]:
    """Sentences of a CoNLL-U document (checked: ten columns, IDs, FORMs, multiword ranges,
    heads in range, one root, no cycles; errors name the file, the sentence (by its first
    line) and the line)."""
    import conllu

    out = []
    for start, block in _blocks(text):
        where = f"{name}, sentence at line {start}"
        words = [(number, line) for number, line in block if not line.startswith("#")]
        if not words:
            continue  # a comment-only block: the file's header
        for number, line in words:
            _check_line(line, f"{where}, line {number}")
        try:
            (tokens,) = conllu.parse("\n".join(line for _, line in block) + "\n\n")
        except conllu.exceptions.ParseException as e:
            raise CorpusError(f"{where}: {e}") from None
        out.append(_sentence(tokens, where, [number for number, _ in words]))
    return out


def _sentence(tokens, where: str, lines: list[int]) -> Sentence:
    words: list[str] = []
    heads: list[int] = []
    relations: list[str] = []
    word_lines: list[int] = []
    pieces: list[tuple[str, int, int, bool]] = []
    ranges: list[tuple[int, int, int]] = []  # (first, last, line) of each multiword token
    covered_to = 0  # the last word id a multiword token covers
    for tok, line in zip(tokens, lines, strict=True):
        tid = tok["id"]
        here = f"{where}, line {line}"
        space = (tok["misc"] or {}).get("SpaceAfter") != "No"
        if isinstance(tid, tuple) and tid[1] == "-":  # multiword token: its surface form
            first, last = tid[0], tid[2]
            if first <= covered_to:
                f0, l0, _ = ranges[-1]
                raise CorpusError(f"{here}: multiword ranges {f0}-{l0} and {first}-{last} overlap")
            if first != len(words) + 1:
                raise CorpusError(
                    f"{here}: multiword range {first}-{last} must come just before word "
                    f"{first} (after word {len(words)})"
                )
            ranges.append((first, last, line))
            pieces.append((tok["form"], first - 1, last - 1, space))
            covered_to = last
            continue
        if isinstance(tid, tuple):  # empty node (1.1): not in the basic tree
            continue
        if tid != len(words) + 1:
            raise CorpusError(f"{here}: word ids must run 1, 2, 3...; found {tid}")
        if tok["head"] is None:
            raise CorpusError(f"{here}: word {tid} {tok['form']!r} has no HEAD")
        words.append(tok["form"])
        heads.append(int(tok["head"]))
        relations.append(str(tok["deprel"]))
        word_lines.append(line)
        if tid > covered_to:
            pieces.append((tok["form"], tid - 1, tid - 1, space))
    for first, last, line in ranges:
        if last > len(words):
            raise CorpusError(
                f"{where}, line {line}: multiword range {first}-{last} reaches past the "
                f"sentence's {len(words)} words"
            )
    check_tree(words, heads, relations, where, word_lines)
    sent_id = tokens.metadata.get("sent_id", "")
    return Sentence(tuple(words), tuple(heads), tuple(relations), tuple(pieces), sent_id)


def read_conllu(path: str | Path) -> list[Sentence]:
    """Sentences of a CoNLL-U file (UTF-8)."""
    path = Path(path)
    return parse_conllu(path.read_text(encoding="utf-8"), str(path))


def shipped_corpus() -> Path:
    """The English corpus that ships with multihead (CC0, written for it; see its header)."""
    return Path(__file__).with_name("data") / "en_multihead.conllu"
