"""The syntax scores on hand-made attention with known answers: word-level attention (sums
to a word, means from a word), both directions, ties, a causal model, the baseline, the
bootstrap; CoNLL-U reading and its errors; alignment; the spaCy Doc path; the shipped corpus."""

import numpy as np
import pytest

from multihead.interpret.syntax import (
    CorpusError,
    Sentence,
    best_offset,
    bootstrap_interval,
    parse_conllu,
    predictions,
    read_conllu,
    score_attention,
    shipped_corpus,
    word_attention,
)
from multihead.interpret.syntax.align import AlignmentError, token_words, word_tokens
from multihead.interpret.syntax.corpus import UD_RELATIONS
from multihead.interpret.syntax.scoring import attended_by, pairs, tally

# "the cat sat": the -> cat (det), cat -> sat (nsubj), sat root
SENT = Sentence(("the", "cat", "sat"), (2, 3, 0), ("det", "nsubj", "root"))


def test_word_attention_sums_to_a_word_and_averages_from_a_word():
    # tokens: [CLS] w0 w1a w1b w2 [SEP]; word 1 is two pieces
    rng = np.random.default_rng(0)
    a = rng.random((2, 3, 6, 6))  # L=2, H=3, T=6
    a /= a.sum(-1, keepdims=True)
    groups = [[1], [2, 3], [4]]
    got = word_attention(a, groups)
    assert got.shape == (2, 3, 3, 3)
    # by hand, one entry at a time
    want = np.zeros((2, 3, 3, 3))
    for i, qs in enumerate(groups):
        for j, ks in enumerate(groups):
            want[:, :, i, j] = sum(a[:, :, q, k] for q in qs for k in ks) / len(qs)
    np.testing.assert_allclose(got, want)
    # hand-computed numbers: word 1 (tokens 2, 3) to word 2 (token 4)
    m = np.zeros((1, 1, 6, 6))
    m[0, 0, 2, 4], m[0, 0, 3, 4], m[0, 0, 3, 2] = 0.2, 0.6, 0.3
    w = word_attention(m, groups)[0, 0]
    assert w[1, 2] == pytest.approx(0.4) and w[1, 1] == pytest.approx(0.15)


def test_special_tokens_are_never_the_prediction():
    a = np.zeros((1, 1, 5, 5))  # [CLS] the cat sat [SEP]
    a[..., :, 0] = 0.7  # most mass on [CLS]
    a[0, 0, 1, 2] = 0.2  # "the" -> "cat"
    a[0, 0, 1, 3] = 0.1
    w = word_attention(a, [[1], [2], [3]])
    assert predictions(w, causal=False)[0, 0, 0] == 1


def test_both_directions_on_known_heads():
    # head 0 attends dependent -> head; head 1 attends head -> dependent (sat -> cat)
    a = np.zeros((1, 2, 3, 3))
    # rows: the, cat, sat (queries); the diagonal never counts
    a[0, 0] = [[0, 0.6, 0.4], [0.3, 0, 0.7], [0.5, 0.2, 0.3]]  # the->cat, cat->sat, sat->the
    # the attends most to sat (itself left out), cat to the; "the" is attended most by cat,
    # "cat" by sat: head->dependent in the paper's sense (the transpose)
    a[0, 1] = [[0.5, 0.1, 0.4], [0.8, 0.1, 0.1], [0.1, 0.8, 0.1]]
    items = [(SENT, a, [[0], [1], [2]])] * 2
    result = score_attention(items, causal=False, min_count=1, resamples=50)
    by = {(r.relation, r.direction): r for r in result.rows}
    det_up, det_down = by["det", "dependent->head"], by["det", "head->dependent"]
    nsubj_up, nsubj_down = by["nsubj", "dependent->head"], by["nsubj", "head->dependent"]
    np.testing.assert_array_equal(det_up.per_head, [[1.0, 0.0]])
    np.testing.assert_array_equal(nsubj_up.per_head, [[1.0, 0.0]])
    np.testing.assert_array_equal(det_down.per_head, [[0.0, 1.0]])  # cat attends "the" most
    np.testing.assert_array_equal(nsubj_down.per_head, [[0.0, 1.0]])  # sat attends "cat" most
    assert (nsubj_down.layer, nsubj_down.head, nsubj_down.count) == (0, 1, 2)
    assert nsubj_down.ci == (1.0, 1.0)
    assert (det_up.baseline_offset, det_up.baseline_accuracy) == (1, 1.0)
    assert (det_down.baseline_offset, nsubj_down.baseline_offset) == (-1, -1)


def test_ties_go_to_the_first_word():
    a = np.zeros((1, 2, 3, 3))
    a[0, 0, 0] = [0.0, 0.5, 0.5]  # "the": cat and sat tie -> cat (first): right for det
    a[0, 1, 0] = [0.5, 0.0, 0.5]  # "the": itself left out -> sat: wrong
    a[0, :, 1] = [0.5, 0.0, 0.5]  # "cat": the and sat tie -> the: wrong for nsubj
    w = word_attention(a, [[0], [1], [2]])
    pred = predictions(w, causal=False)
    assert pred[0, 0, 0] == 1 and pred[0, 1, 0] == 2 and pred[0, 0, 1] == 0
    tallies, _ = tally([(SENT, w)], causal=False)
    np.testing.assert_array_equal(tallies["det", "dependent->head"].correct[0], [[1, 0]])
    np.testing.assert_array_equal(tallies["nsubj", "dependent->head"].correct[0], [[0, 0]])


def test_a_causal_model_scores_only_visible_pairs_and_candidates():
    # "sat the cat": cat (word 2) -> sat (0) visible; the (1) -> cat (2) is after it: dropped
    s = Sentence(("sat", "the", "cat"), (0, 3, 1), ("root", "det", "obj"))
    up, dropped = pairs(s, "dependent->head", causal=True)
    assert up == [(2, 0, "obj")] and dropped == 1
    down, dropped = pairs(s, "head->dependent", causal=True)
    assert down == [(2, 1, "det")] and dropped == 1
    assert len(pairs(s, "dependent->head", causal=False)[0]) == 2
    # a later word is never a candidate, however much weight it holds
    w = np.zeros((1, 1, 3, 3))
    w[0, 0, 0] = [0.1, 0.0, 0.9]
    w[0, 0, 1] = [0.3, 0.2, 0.5]
    # causal: only earlier words (the first word has none: -1); the word itself never
    assert predictions(w, causal=True)[0, 0].tolist() == [-1, 0, 0]
    assert predictions(w, causal=False)[0, 0].tolist() == [2, 2, 0]
    # the transpose: which later word attends to each word most (the last word: none)
    w[0, 0, 2] = [0.6, 0.4, 0.0]
    assert attended_by(w, causal=True)[0, 0].tolist() == [2, 2, -1]
    assert attended_by(w, causal=False)[0, 0].tolist() == [2, 2, 0]
    a = np.tril(np.ones((3, 3)))
    a /= a.sum(-1, keepdims=True)
    a = a[None, None]
    result = score_attention([(s, a, [[0], [1], [2]])], causal=True, min_count=1, resamples=20)
    assert result.dropped == {"dependent->head": 1, "head->dependent": 1}
    assert result.scored_pairs == {"dependent->head": 1, "head->dependent": 1}
    assert {(r.relation, r.direction) for r in result.rows} == {
        ("obj", "dependent->head"),
        ("det", "head->dependent"),
    }


def test_a_word_never_predicts_itself():
    """The paper's rule (attn_head_predictor zeroes the diagonal): a head that attends to the
    word itself predicts the most-attended other word."""
    w = np.zeros((1, 1, 3, 3))
    w[0, 0] = [[0.9, 0.04, 0.06], [0.1, 0.85, 0.05], [0.2, 0.3, 0.5]]
    assert predictions(w, causal=False)[0, 0].tolist() == [2, 0, 1]
    assert attended_by(w, causal=False)[0, 0].tolist() == [2, 2, 0]
    tallies, _ = tally([(SENT, w)], causal=False)
    np.testing.assert_array_equal(tallies["det", "dependent->head"].correct[0], [[0]])
    np.testing.assert_array_equal(tallies["nsubj", "dependent->head"].correct[0], [[0]])


def test_a_possessive_before_the_clitic_is_scored_from_the_clitic():
    """Clark et al.'s special case for poss: "Anna 's brother": the clitic's prediction (and
    offset) stands for the possessor's."""
    s = Sentence(
        ("Anna", "'s", "brother", "sings"), (3, 1, 4, 0), ("nmod:poss", "case", "nsubj", "root")
    )
    up = pairs(s, "dependent->head", causal=False)[0]
    assert (1, 2, "nmod:poss") in up and (1, 0, "case") in up
    w = np.zeros((1, 2, 4, 4))
    w[0, 0] = [[0, 0.1, 0.8, 0.1], [0.2, 0, 0.7, 0.1], [0, 0, 0, 1], [0, 0, 1, 0]]
    w[0, 1] = [[0, 0.1, 0.8, 0.1], [0.7, 0, 0.2, 0.1], [0, 0, 0, 1], [0, 0, 1, 0]]
    tallies, _ = tally([(s, w)], causal=False)
    # head 0: 's -> brother (right) though Anna -> brother too; head 1: 's -> Anna (wrong)
    np.testing.assert_array_equal(tallies["nmod:poss", "dependent->head"].correct[0], [[1, 0]])
    assert tallies["nmod:poss", "dependent->head"].offsets == [1]


def test_punctuation_and_root_are_not_scored():
    s = Sentence(("Go", "now", "!"), (0, 1, 1), ("root", "advmod", "punct"))
    assert pairs(s, "dependent->head", causal=False)[0] == [(1, 0, "advmod")]


def test_best_offset_and_its_ties():
    assert best_offset([1, 1, 2, -1]) == (1, 0.5)
    assert best_offset([2, -1, 3, -1, 2]) == (-1, 0.4)  # tie 2/-1: the nearer
    assert best_offset([1, -1]) == (-1, 0.5)  # tie at the same distance: the left one
    with pytest.raises(ValueError, match="at least one pair"):
        best_offset([])


def test_the_baseline_is_the_best_fixed_offset_predictor():
    """Against a direct search: every offset k predicts query + k for every pair."""
    rng = np.random.default_rng(1)
    offsets = rng.integers(-4, 5, size=200).tolist()
    k, acc = best_offset(offsets)
    brute = {c: np.mean([o == c for o in offsets]) for c in range(-6, 7)}
    assert acc == pytest.approx(max(brute.values())) and brute[k] == pytest.approx(acc)


def test_bootstrap_matches_a_loop_and_is_seeded():
    rng = np.random.default_rng(2)
    count = rng.integers(0, 6, size=40)
    correct = np.minimum(count, rng.integers(0, 6, size=40))
    lo, hi = bootstrap_interval(correct, count, resamples=300, seed=7)
    draws = np.random.default_rng(7).integers(0, 40, size=(300, 40))
    accs = [correct[d].sum() / count[d].sum() for d in draws]
    want = np.percentile(accs, [2.5, 97.5])
    assert (lo, hi) == pytest.approx(tuple(want))
    assert lo <= correct.sum() / count.sum() <= hi
    assert bootstrap_interval(correct, count, resamples=300, seed=7) == (lo, hi)
    assert bootstrap_interval(count, count) == (1.0, 1.0)


def test_min_count_and_relation_filter():
    a = np.eye(3)[None, None]
    items = [(SENT, a, [[0], [1], [2]])] * 3
    assert score_attention(items, causal=False, min_count=4).rows == []
    rows = score_attention(items, causal=False, min_count=3, relations=["det"]).rows
    assert {r.relation for r in rows} == {"det"}
    with pytest.raises(
        ValueError, match=r"relation 'obj' is not a label of the corpus; it has det nsubj root"
    ):
        score_attention(items, causal=False, relations=["obj"])


CONLLU = """# sent_id = a
# text = I cannot go.
1\tI\tI\tPRON\t_\t_\t4\tnsubj\t_\t_
2-3\tcannot\t_\t_\t_\t_\t_\t_\t_\t_
2\tcan\tcan\tAUX\t_\t_\t4\taux\t_\t_
3\tnot\tnot\tPART\t_\t_\t4\tadvmod\t_\t_
4\tgo\tgo\tVERB\t_\t_\t0\troot\t_\tSpaceAfter=No
4.1\twent\t_\t_\t_\t_\t_\t_\t_\t_
5\t.\t.\tPUNCT\t_\t_\t4\tpunct\t_\t_

"""


def test_conllu_multiword_tokens_and_empty_nodes():
    (s,) = parse_conllu(CONLLU)
    assert s.words == ("I", "can", "not", "go", ".")  # the empty node 4.1 is not a word
    assert s.heads == (4, 4, 4, 0, 4) and s.sent_id == "a"
    assert s.text == "I cannot go."  # the surface form, not "can not"
    assert s.word_spans() == [(0, 1), (2, 8), (2, 8), (9, 11), (11, 12)]
    # the multiword token's words share its tokens
    owners = token_words(s.text, s.word_spans(), [(0, 1), (2, 5), (5, 8), (9, 11), (11, 12)])
    assert word_tokens(owners, s.words, s.word_spans()) == [[0], [1, 2], [1, 2], [3], [4]]


BAD = [
    ("1\tHe\t_\t_\t_\t_\t0\troot\t_\n\n", r"line 1: 9 tab-separated columns"),
    ("1\tHe\t_\t_\t_\t_\tx\troot\t_\t_\n\n", r"line 1: HEAD 'x' is not a number"),
    ("# c\n1.a\tHe\t_\t_\t_\t_\t0\troot\t_\t_\n\n", r"line 2: ID '1.a'"),
    (
        "1\tA\t_\t_\t_\t_\t0\troot\t_\t_\n\n1\tB\t_\t_\t_\t_\t0\troot\t_\t_\n"
        "2\tC\t_\t_\t_\t_\t3\tdep\t_\t_\n3\tD\t_\t_\t_\t_\t2\tdep\t_\t_\n\n",
        r"sentence at line 3: the heads of words \[2, 3\] form a cycle",
    ),
    (
        "1\tA\t_\t_\t_\t_\t0\troot\t_\t_\n2\tB\t_\t_\t_\t_\t5\tdep\t_\t_\n\n",
        r"head 5, out of range 0..2",
    ),
    (
        "1\tA\t_\t_\t_\t_\t0\troot\t_\t_\n2\tB\t_\t_\t_\t_\t0\troot\t_\t_\n\n",
        r"2 roots \(words \[1, 2\]\)",
    ),
    ("1\tA\t_\t_\t_\t_\t1\troot\t_\t_\n\n", r"word 1 'A' is its own head"),
    (
        "1\tA\t_\t_\t_\t_\t0\troot\t_\t_\n3\tB\t_\t_\t_\t_\t1\tdep\t_\t_\n\n",
        r"ids must run 1, 2, 3...; found 3",
    ),
]


@pytest.mark.parametrize(("text", "message"), BAD)
def test_malformed_conllu_names_the_line_and_the_fault(text, message):
    with pytest.raises(CorpusError, match=message):
        parse_conllu(text, "bad.conllu")


def test_alignment_by_offsets_and_a_word_without_tokens():
    text = "the cats sat"
    spans = [(0, 3), (4, 8), (9, 12)]
    # [CLS] the cat ##s sat [SEP] (WordPiece offsets; specials have none)
    owners = token_words(text, spans, [None, (0, 3), (4, 7), (7, 8), (9, 12), None])
    assert owners == [None, 0, 1, 1, 2, None]
    # byte-level offsets that include the leading space: " cats" belongs to "cats"
    assert token_words(text, spans, [(0, 3), (3, 8), (8, 12)]) == [0, 1, 2]
    assert word_tokens(owners, ["the", "cats", "sat"], spans) == [[1], [2, 3], [4]]
    with pytest.raises(AlignmentError, match=r"maps 'cats' \(word 2\) to no token"):
        word_tokens([None, 0, None, 2], ["the", "cats", "sat"], spans)


def test_spacy_doc_path():
    spacy = pytest.importorskip("spacy")
    from spacy.tokens import Doc

    from multihead.interpret.syntax.spacy_docs import sentences_from_doc

    words = ["The", "dog", "chased", "a", "cat", "."]
    doc = Doc(
        spacy.vocab.Vocab(),
        words=words,
        spaces=[True, True, True, True, False, False],
        heads=[1, 2, 2, 4, 2, 2],
        deps=["det", "nsubj", "ROOT", "det", "dobj", "punct"],
    )
    (s,) = sentences_from_doc(doc)
    assert s.words == tuple(words) and s.heads == (2, 3, 0, 5, 3, 3)
    assert s.text == "The dog chased a cat."
    assert pairs(s, "dependent->head", causal=False)[0] == [
        (0, 1, "det"),
        (1, 2, "nsubj"),
        (3, 4, "det"),
        (4, 2, "dobj"),
    ]


def test_a_missing_spacy_pipeline_says_how_to_install_one():
    pytest.importorskip("spacy")
    from multihead.interpret.syntax.spacy_docs import ParserUnavailable, parse_texts

    with pytest.raises(
        ParserUnavailable, match=r"no spaCy pipeline named 'xx_none'.*spacy download"
    ):
        parse_texts(["A text."], "xx_none")


def test_the_shipped_corpus_is_a_valid_varied_treebank():
    path = shipped_corpus()
    header = path.read_text(encoding="utf-8").splitlines()[:12]
    assert any("CC0" in line for line in header) and any(
        "written for multihead" in line for line in header
    )
    sentences = read_conllu(path)  # checks one root, heads in range, no cycles
    assert len(sentences) >= 200
    assert len({s.sent_id for s in sentences}) == len(sentences)
    labels = {r for s in sentences for r in s.relations}
    assert {r.split(":")[0] for r in labels} <= UD_RELATIONS
    wanted = "det nsubj obj amod advmod nmod:poss case nmod obl aux cop conj cc mark compound "
    wanted += "nummod xcomp ccomp acl:relcl nsubj:pass aux:pass iobj advcl appos expl"
    assert set(wanted.split()) <= labels
    assert any(s.text.endswith("?") for s in sentences)  # questions
    assert any(
        len(p) > 0 and p[1] != p[2] for s in sentences for p in s.pieces
    )  # a multiword token
    for s in sentences:  # the root is the only word without a head; punctuation hangs on words
        assert s.relations[s.heads.index(0)] == "root"
    # each "# text =" line is the surface the words rebuild (spaces, multiword tokens)
    texts = [
        line[9:]
        for line in path.read_text(encoding="utf-8").splitlines()
        if line.startswith("# text = ")
    ]
    assert texts == [s.text for s in sentences]
