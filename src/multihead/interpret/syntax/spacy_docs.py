"""spaCy at the edge: a parsed `Doc` -> `Sentence`s (one per `doc.sents`, labels as the pipeline
names them: ClearNLP-style for spaCy's English models, "ROOT" and "punct" unscored), and plain
text parsed by a pipeline the user installed. spaCy is an optional extra:
pip install 'multihead[syntax]'."""

from __future__ import annotations

from collections.abc import Sequence

from .corpus import Sentence, check_tree


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


def load_parser(name: str):
    """The installed spaCy pipeline `name`, or ParserUnavailable saying how to install it."""
    try:
        import spacy
    except ImportError:
        raise ParserUnavailable(
            "parsing plain text needs spaCy: pip install 'multihead[syntax]', then a pipeline, "
            "e.g. python -m spacy download en_core_web_sm"
        ) from None
    try:
        return spacy.load(name)
    except OSError:
        installed = sorted(spacy.util.get_installed_models())
        have = f"installed: {', '.join(installed)}" if installed else "none is installed"
        example = name if name.startswith(("en_", "de_")) else "en_core_web_sm"
        raise ParserUnavailable(
            f"no spaCy pipeline named {name!r} ({have}); install one with "
            f"python -m spacy download {example}"
        ) from None


def parse_texts(texts: Sequence[str], parser: str) -> list[Sentence]:
    """Plain texts parsed by the installed pipeline `parser` into Sentences."""
    nlp = load_parser(parser)
    if "parser" not in nlp.pipe_names:
        raise ParserUnavailable(f"the spaCy pipeline {parser!r} has no dependency parser")
    return [s for doc in nlp.pipe(texts) for s in sentences_from_doc(doc)]
