"""Hostile CoNLL-U (issue 40): multiword ranges inside the sentence, before their words and not
overlapping; FORM as the format defines it (universaldependencies.org/format.html: no field
empty, FORM may hold spaces but not only whitespace, nor start or end with it); a tree check
linear in the sentence's length; every error naming the file, the sentence and the line. And
`multihead syntax --relations` refusing a label the corpus does not have."""

from __future__ import annotations

import re
import time

import pytest

from multihead.cli import main
from multihead.interpret.syntax import CorpusError, check_relations, check_tree, parse_conllu


def row(i, form, head, rel="dep"):
    return f"{i}\t{form}\t_\t_\t_\t_\t{head}\t{rel}\t_\t_"


def mwt(first, last, form):
    return f"{first}-{last}\t{form}\t_\t_\t_\t_\t_\t_\t_\t_"


GOOD_HEAD = ["# sent_id = a", row(1, "A", 0, "root"), row(2, "B", 1), "", "# sent_id = b"]


def refused(lines, *fragments):
    text = "\n".join(GOOD_HEAD + lines) + "\n\n"
    with pytest.raises(CorpusError) as e:
        parse_conllu(text, "bad.conllu")
    message = str(e.value)
    assert message.startswith("bad.conllu, sentence at line 5"), message  # file, sentence
    for fragment in fragments:
        assert fragment in message, message
    return message


def test_overlapping_multiword_ranges_are_refused():
    lines = [mwt(1, 2, "xy"), row(1, "x", 0, "root"), mwt(2, 3, "yz"), row(2, "y", 1)]
    lines += [row(3, "z", 1)]
    refused(lines, "line 8:", "1-2", "2-3", "overlap")


def test_multiword_range_past_the_sentence_is_refused():
    lines = [row(1, "x", 0, "root"), mwt(2, 4, "yz"), row(2, "y", 1), row(3, "z", 1)]
    refused(lines, "line 7:", "2-4", "3 words")


def test_multiword_range_after_its_first_word_is_refused():
    lines = [row(1, "x", 0, "root"), row(2, "y", 1), mwt(2, 3, "yz"), row(3, "z", 1)]
    refused(lines, "line 8:", "2-3", "before word 2")


def test_backwards_multiword_range_is_refused():
    lines = [mwt(2, 1, "xy"), row(1, "x", 0, "root"), row(2, "y", 1)]
    refused(lines, "line 6:", "2-1")


@pytest.mark.parametrize("form", ["   ", " x", "x "])
def test_form_of_whitespace_is_refused_by_the_format_rule(form):
    lines = [row(1, "x", 0, "root"), row(2, form, 1)]
    refused(lines, "line 7:", "FORM", repr(form))


def test_form_with_inner_spaces_is_allowed():
    (s,) = parse_conllu(row(1, "New York", 0, "root") + "\n\n", "ok.conllu")
    assert s.words == ("New York",)


def test_word_errors_name_the_line():
    refused([row(1, "x", 0, "root"), row(2, "y", 9)], "line 7:", "head 9")
    refused([row(1, "x", 0, "root"), row(2, "y", 2)], "line 7:", "its own head")


def test_a_cycle_names_its_lines():
    lines = [row(1, "x", 0, "root"), row(2, "y", 3), row(3, "z", 2)]
    refused(lines, "form a cycle", "lines 7, 8")


def test_tree_check_is_linear():
    """100,000 words: a chain (word i's head is i + 1), the worst case of the old walk from every
    word to the root (quadratic: 1.85 s at 8,000 words). Counted, not timed: every head is
    looked up a bounded number of times."""

    class Counting(list):
        reads = 0

        def __getitem__(self, i):
            Counting.reads += 1
            return super().__getitem__(i)

    n = 100_000
    heads = Counting([i + 2 for i in range(n - 1)] + [0])
    words = ["w"] * n
    start = time.perf_counter()
    check_tree(words, heads, ["dep"] * n, "long")
    assert Counting.reads <= 3 * n, Counting.reads
    assert time.perf_counter() - start < 10  # generous; the quadratic walk took hours


def test_a_long_sentence_parses():
    n = 20_000  # through the parser too (conllu's own parse dominates; kept small for CI)
    lines = [row(i + 1, "w", i + 2 if i < n - 1 else 0) for i in range(n)]
    (s,) = parse_conllu("\n".join(lines) + "\n\n", "long.conllu")
    assert len(s) == n


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "c.conllu"
    path.write_text(
        "\n".join([row(1, "The", 2, "det"), row(2, "cat", 3, "nsubj"), row(3, "sat", 0, "root")])
        + "\n\n"
    )
    return path


def test_misspelt_relation_is_refused_with_a_suggestion(corpus, capsys, monkeypatch):
    def never(*a, **k):
        raise AssertionError("the model was loaded before --relations was checked")

    monkeypatch.setattr("multihead.cli.syntax.load_subject", never)
    argv = ["syntax", str(corpus), "--relations", "det", "nsbj"]
    assert main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("multihead: error: --relations"), err
    assert "'nsbj'" in err[0] and "did you mean 'nsubj'" in err[0]
    assert re.search(r"det nsubj root", err[0]), err[0]


def test_check_relations_names_the_unknown_label():
    with pytest.raises(ValueError, match=r"'nsbj'.*did you mean 'nsubj'"):
        check_relations(["det", "nsbj"], ["det", "nsubj"])
    check_relations(["det"], ["det", "nsubj"])  # known: no error
