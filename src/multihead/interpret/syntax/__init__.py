"""Heads that know syntax: every head scored on every dependency relation of an annotated
corpus, against the best fixed-offset baseline, with bootstrap intervals (Clark et al. 2019).

  corpus     Sentence, CoNLL-U reading and tree checks, the shipped English corpus
  spacy_docs spaCy Docs (and a user's installed pipeline) -> Sentences
  align      words <-> tokens from the tokenizer's offsets
  scoring    word-level attention, predictions, tallies, baseline, bootstrap (pure)
  run        syntax_scores(model, sentences): the glue, and the JSON contract
  one_text   text_syntax(model, text, nlp): the same scores on one text (`inspect --parser`)
"""

from .align import AlignmentError
from .corpus import (
    CorpusError,
    Sentence,
    check_relations,
    check_tree,
    parse_conllu,
    read_conllu,
    shipped_corpus,
)
from .one_text import TextRelation, TextSyntax, score_text, text_syntax
from .run import SyntaxResult, encode_sentence, score_attention, syntax_scores
from .scoring import (
    DIRECTIONS,
    RelationScore,
    best_offset,
    bootstrap_interval,
    predictions,
    word_attention,
)

__all__ = [
    "DIRECTIONS",
    "AlignmentError",
    "CorpusError",
    "RelationScore",
    "Sentence",
    "SyntaxResult",
    "TextRelation",
    "TextSyntax",
    "best_offset",
    "bootstrap_interval",
    "check_relations",
    "check_tree",
    "encode_sentence",
    "parse_conllu",
    "predictions",
    "read_conllu",
    "score_attention",
    "score_text",
    "shipped_corpus",
    "syntax_scores",
    "text_syntax",
    "word_attention",
]
