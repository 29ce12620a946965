"""Syntax roles on one text, the pure part on hand-made attention with known answers (hits,
ties ordered by attention on the targets, the baseline on the text, causal pairs, special
tokens), and the spaCy edge: a Doc as the words of one text (whitespace tokens, several
sentences), finding an installed English pipeline, and pipelines that cannot be used."""

import importlib.util
import sys

import numpy as np
import pytest
import spacy
from spacy.tokens import Doc

from multihead.interpret.syntax import Sentence
from multihead.interpret.syntax.one_text import score_text
from multihead.interpret.syntax.spacy_docs import (
    ParserUnavailable,
    english_pipeline,
    load_parser,
    text_words,
)

# two sentences read as one text: "the cat sat . a dog ran"; roots "sat" (3) and "ran" (7)
TEXT = Sentence(
    ("the", "cat", "sat", ".", "a", "dog", "ran"),
    (2, 3, 0, 3, 6, 7, 0),
    ("det", "nsubj", "root", "punct", "det", "nsubj", "ROOT"),
)
GROUPS = [[1], [2], [3], [4], [5], [6], [7]]  # token 0 is [CLS], token 8 [SEP]


def attention(rows_per_head):
    """(1, H, 9, 9): head h's query token q puts weight on key tokens as given, the rest on
    [CLS] (token 0), so that a special token holds the most mass of every row."""
    H = len(rows_per_head)
    a = np.zeros((1, H, 9, 9))
    a[0, :, :, 0] = 1.0
    for h, rows in enumerate(rows_per_head):
        for q, keys in rows.items():
            for k, w in keys.items():
                a[0, h, q, k] = w
            a[0, h, q, 0] = 1.0 - sum(keys.values())
    return a


def test_hits_ties_and_the_baseline_on_one_text():
    # head 1: each dependent looks at its head (the -> cat, cat -> sat, a -> dog, dog -> ran);
    # head 0: the same, but with less weight on the targets (ties on hits, and comes after it)
    # head 2: every word looks at the word before it (cat -> the, dog -> a: head->dependent)
    up = {1: {2: 0.4}, 2: {3: 0.4}, 5: {6: 0.4}, 6: {7: 0.4}}
    weak = {q: {k: 0.2 for k in keys} for q, keys in up.items()}
    before = {q: {q - 1: 0.3} for q in range(2, 8)}
    result = score_text(TEXT, attention([weak, up, before]), GROUPS, causal=False, parser="p")
    rows = {(r.relation, r.direction): r for r in result.rows}
    assert set(rows) == {
        (rel, d) for rel in ("det", "nsubj") for d in ("dependent->head", "head->dependent")
    }
    det_up = rows["det", "dependent->head"]
    assert (det_up.count, det_up.hits, det_up.heads) == (2, 2, ((0, 1), (0, 0)))
    # head 2: "the" attends to no other word, and the first other word (cat) wins the tie of
    # zeros (the word itself is never a candidate); "a" looks at "." (wrong)
    assert det_up.per_head.tolist() == [[2, 2, 1]]
    assert (det_up.baseline_offset, det_up.baseline_hits, det_up.margin) == (1, 2, 0)
    # head->dependent (the word attending most to the dependent): "cat" attends to "the" and
    # "dog" to "a" in head 2 alone; heads 0 and 1 send nothing to "the", and its first other
    # word (cat) wins their tie of zeros
    det_down = rows["det", "head->dependent"]
    assert (det_down.hits, det_down.heads, det_down.per_head.tolist()) == (
        2,
        ((0, 2),),
        [[1, 1, 2]],
    )
    # nsubj head->dependent: "sat" -> "cat" and "ran" -> "dog", also one to the left
    nsubj_down = rows["nsubj", "head->dependent"]
    assert (nsubj_down.hits, nsubj_down.heads) == (2, ((0, 2),))
    assert (nsubj_down.baseline_offset, nsubj_down.baseline_hits) == (-1, 2)
    # [CLS] holds the most weight of every row but is never a prediction; the punctuation and
    # the roots are not scored
    assert result.scored_pairs == {"dependent->head": 4, "head->dependent": 4}
    assert result.parser == "p" and not result.causal


def test_a_head_with_no_hits_and_the_row_order():
    # head 0 gets det (dependent->head) right once of twice; offset +1 gets both
    half = {1: {2: 0.5}, 5: {7: 0.5}, 6: {5: 0.5}}
    result = score_text(TEXT, attention([half]), GROUPS, causal=False)
    rows = {(r.relation, r.direction): r for r in result.rows}
    det_up = rows["det", "dependent->head"]
    assert (det_up.hits, det_up.baseline_hits, det_up.margin) == (1, 2, -1)
    zero = rows[
        "nsubj", "head->dependent"
    ]  # "sat" and "ran" look only at [CLS]: their first word wins
    assert zero.hits == 0 and zero.heads == ((0, 0),)
    margins = [r.margin for r in result.rows]
    assert margins == sorted(margins, reverse=True)


def test_a_causal_text_scores_only_pairs_whose_target_comes_first():
    a = np.tril(np.ones((9, 9)))[None, None]
    a = a / a.sum(-1, keepdims=True)
    result = score_text(TEXT, a, GROUPS, causal=True)
    # dependent->head: every head comes after its dependent here: nothing visible
    assert result.scored_pairs == {"dependent->head": 0, "head->dependent": 4}
    assert result.dropped == {"dependent->head": 4, "head->dependent": 0}
    assert {r.direction for r in result.rows} == {"head->dependent"}
    # head->dependent reads which later word attends to the dependent most: under uniform
    # causal rows the next word does (it shares its weight among the fewest tokens), and here
    # each dependent's head is the next word
    hits = {r.relation: (r.hits, r.count) for r in result.rows}
    assert hits == {"det": (2, 2), "nsubj": (2, 2)}


def test_mismatched_groups_are_refused():
    with pytest.raises(ValueError, match="groups has 2 words, sentence has 7"):
        score_text(TEXT, np.zeros((1, 1, 3, 3)), [[0], [1]], causal=False)


def test_a_doc_as_the_words_of_one_text():
    # "I saw  her.\nShe left." : a double space and a newline are whitespace tokens; "her"
    # hangs on the space token, which hangs on "saw"
    words = ["I", "saw", " ", "her", ".", "\n", "She", "left", "."]
    doc = Doc(
        spacy.vocab.Vocab(),
        words=words,
        spaces=[True, True, False, False, False, False, True, False, False],
        heads=[1, 1, 1, 2, 1, 4, 7, 7, 7],
        deps=["nsubj", "ROOT", "dep", "obj", "punct", "dep", "nsubj", "ROOT", "punct"],
    )
    assert doc.text == "I saw  her.\nShe left."
    sentence, spans = text_words(doc)
    assert sentence.words == ("I", "saw", "her", ".", "She", "left", ".")
    assert sentence.heads == (2, 0, 2, 2, 6, 0, 6)  # her -> saw, through the space
    assert sentence.relations == ("nsubj", "ROOT", "obj", "punct", "nsubj", "ROOT", "punct")
    assert [doc.text[s:e] for s, e in spans] == list(sentence.words)
    assert spans[2] == (7, 10)


def test_english_pipeline_is_found_without_importing_spacy(monkeypatch):
    real = importlib.util.find_spec
    installed: set[str] = set()

    def find_spec(name, *args):
        if name.startswith("en_core_web_"):
            return real("json") if name in installed else None  # any spec stands for "installed"
        return real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.setitem(sys.modules, "spacy", None)  # importing spaCy would now raise
    assert english_pipeline() is None
    installed.update({"en_core_web_lg", "en_core_web_md"})
    assert english_pipeline() == "en_core_web_md"  # the smallest installed
    installed.add("en_core_web_sm")
    assert english_pipeline() == "en_core_web_sm"


def test_pipelines_that_cannot_be_used(tmp_path):
    with pytest.raises(ParserUnavailable, match=r"'.*missing' is no spaCy pipeline: no such file"):
        load_parser(str(tmp_path / "missing"))
    with pytest.raises(
        ParserUnavailable, match=r"no spaCy pipeline could be loaded from .*nlp\.to_disk"
    ):
        load_parser(str(tmp_path))  # a directory, but no pipeline in it
    blank = tmp_path / "blank"
    spacy.blank("en").to_disk(blank)
    with pytest.raises(
        ParserUnavailable, match=r"has no dependency parser \(its components: none\)"
    ):
        load_parser(str(blank))
    with pytest.raises(
        ParserUnavailable,
        match=r"no spaCy pipeline named 'en_core_web_xl' .*download en_core_web_xl",
    ):
        load_parser("en_core_web_xl")
