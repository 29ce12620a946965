"""spaCy at the edge: a parsed `Doc` -> `Sentence`s (one per `doc.sents`, labels as the pipeline
names them: ClearNLP-style for spaCy's English models, "ROOT" and "punct" unscored), a whole Doc
as the words of one text (`text_words`, for `inspect`), plain text parsed by a pipeline the
user installed or saved, and finding an installed English pipeline without importing spaCy.
spaCy is an optional extra: pip install 'multihead[syntax]'."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path

from .corpus import Sentence, check_tree

# spaCy's English pipelines, smallest first: the one `inspect` uses when none is named.
ENGLISH_PIPELINES = ("en_core_web_sm", "en_core_web_md", "en_core_web_lg", "en_core_web_trf")


def how_to_get_one(example: str = "en_core_web_sm") -> str:
    """How to get a pipeline, for error messages."""
    return (
        f"install one with python -m spacy download {example}, or give a directory written "
        f"by nlp.to_disk"
    )


class ParserUnavailable(RuntimeError):
    """spaCy or the named pipeline is not installed; the message says how to get it."""


def sentences_from_doc(doc) -> list[Sentence]:
    """One Sentence per sentence of a parsed Doc (a Doc built with words/heads/deps counts as
    one sentence when it has no sentence boundaries)."""
    spans = (
        list(doc.sents)
        if doc.has_annotation("SENT_START") or doc.has_annotation("DEP")
        else [doc[:]]
    )
    out = []
    for number, span in enumerate(spans, 1):
        start = span.start
        words = [t.text for t in span]
        heads = [0 if t.head.i == t.i else t.head.i - start + 1 for t in span]
        relations = [t.dep_ or "dep" for t in span]
        pieces = tuple((t.text, i, i, bool(t.whitespace_)) for i, t in enumerate(span))
        check_tree(words, heads, relations, f"spaCy sentence {number}")
        out.append(Sentence(tuple(words), tuple(heads), tuple(relations), pieces))
    return out


def text_words(doc) -> tuple[Sentence, list[tuple[int, int]]]:
    """A parsed Doc as the words of one text, the way a model reads it whole: one `Sentence`
    over all of `doc.sents` (each sentence's root has head 0, so it is a forest, not one tree;
    each sentence is checked as a tree) and each word's (start, end) characters in `doc.text`.

    spaCy makes tokens of extra spaces and newlines; no model token covers them, so they are
    not words here, and an arc that ends on one goes on to that token's head."""
    sentences_from_doc(doc)  # raises CorpusError unless every sentence is a tree

    def space(t) -> bool:  # the text, not `is_space`: a bare Vocab has no lexical attributes
        return t.text.isspace()

    words = [t for t in doc if not space(t)]
    index = {t.i: n for n, t in enumerate(words)}
    heads = []
    for t in words:
        head = t.head
        while space(head) and head.head.i != head.i:  # through whitespace to a word
            head = head.head
        heads.append(0 if head.i == t.i or space(head) else index[head.i] + 1)
    following = [t.i + 1 < len(doc) and space(doc[t.i + 1]) for t in words]
    pieces = tuple(
        (t.text, n, n, bool(t.whitespace_) or after)
        for n, (t, after) in enumerate(zip(words, following, strict=True))
    )
    sentence = Sentence(
        tuple(t.text for t in words),
        tuple(heads),
        tuple(t.dep_ or "dep" for t in words),
        pieces,
    )
    return sentence, [(t.idx, t.idx + len(t.text)) for t in words]


def english_pipeline() -> str | None:
    """The first of spaCy's English pipelines that is installed, or None; found by
    `importlib.util.find_spec`, which imports neither spaCy nor the pipeline (so a command
    that looks for one starts no slower when there is none)."""
    return next((name for name in ENGLISH_PIPELINES if importlib.util.find_spec(name)), None)


def load_parser(name: str):
    """The spaCy pipeline `name` (an installed package, or a directory written by
    `nlp.to_disk`: what `spacy.load` accepts) with a dependency parser, or ParserUnavailable
    saying what is missing and how to get it."""
    try:
        import spacy
    except ImportError:
        raise ParserUnavailable(
            "parsing text needs spaCy: pip install 'multihead[syntax]', then a pipeline, "
            "e.g. python -m spacy download en_core_web_sm"
        ) from None
    is_path = Path(name).exists() or "/" in name or "\\" in name
    try:
        nlp = spacy.load(name)
    except (OSError, ValueError) as e:  # missing or unreadable; a bad config.cfg (ValueError)
        if is_path and not Path(name).exists():
            raise ParserUnavailable(
                f"{name!r} is no spaCy pipeline: no such file or directory; {how_to_get_one()}"
            ) from None
        if is_path:
            raise ParserUnavailable(
                f"no spaCy pipeline could be loaded from {name!r} ({_first_line(e)}); "
                f"{how_to_get_one()}"
            ) from None
        if spacy.util.is_package(name):  # installed (spacy.load's test); its data is not usable
            raise ParserUnavailable(
                f"the spaCy pipeline {name!r} is installed but could not be loaded "
                f"({_first_line(e)}); reinstall it with python -m spacy download {name}"
            ) from None
        installed = sorted(spacy.util.get_installed_models())
        have = f"installed: {', '.join(installed)}" if installed else "none is installed"
        example = name if name.startswith(("en_", "de_")) else "en_core_web_sm"
        raise ParserUnavailable(
            f"no spaCy pipeline named {name!r} ({have}); {how_to_get_one(example)}"
        ) from None
    if not any("token.dep" in nlp.get_pipe_meta(p).assigns for p in nlp.pipe_names):
        raise ParserUnavailable(
            f"the spaCy pipeline {name!r} has no dependency parser (its components: "
            f"{', '.join(nlp.pipe_names) or 'none'})"
        )
    return nlp


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def parse_texts(texts: Sequence[str], parser: str) -> list[Sentence]:
    """Plain texts parsed by the spaCy pipeline `parser` (a name or a directory)."""
    nlp = load_parser(parser)
    return [s for doc in nlp.pipe(texts) for s in sentences_from_doc(doc)]
