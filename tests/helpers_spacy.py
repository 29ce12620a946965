"""A real spaCy pipeline for the tests, trained here (no download): spacy.blank("en") with a
`parser` component, a few epochs on sentences of the shipped corpus, saved with nlp.to_disk.
It is a toy parser (it has seen 150 sentences); the tests compare multihead against the Docs
it produces, never against a gold parse."""

from __future__ import annotations

import random
from pathlib import Path

TRAINING_SENTENCES = 150
EPOCHS = 8


def train_parser(directory: Path) -> Path:
    """Train, save to `directory` and return it."""
    import spacy
    from spacy.tokens import Doc
    from spacy.training import Example

    from multihead.interpret.syntax import read_conllu, shipped_corpus

    spacy.util.fix_random_seed(0)
    nlp = spacy.blank("en")
    nlp.add_pipe("parser")
    examples = []
    for s in read_conllu(shipped_corpus())[:TRAINING_SENTENCES]:
        spaces = [True] * len(s.words)
        for _, _, last, space in s.pieces:  # a multiword token's space follows its last word
            spaces[last] = space
        doc = Doc(nlp.vocab, words=list(s.words), spaces=spaces)
        heads = [
            h - 1 if h else i for i, h in enumerate(s.heads)
        ]  # spaCy: the root is its own head
        examples.append(Example.from_dict(doc, {"heads": heads, "deps": list(s.relations)}))
    optimizer = nlp.initialize(lambda: examples)
    rng = random.Random(0)
    for _ in range(EPOCHS):
        rng.shuffle(examples)
        for start in range(0, len(examples), 16):
            nlp.update(examples[start : start + 16], sgd=optimizer)
    nlp.to_disk(directory)
    return directory
