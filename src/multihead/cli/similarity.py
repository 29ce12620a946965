"""`multihead similarity A B`: the cosine similarity of two sentences' embeddings."""

from __future__ import annotations

from .errors import UsageError
from .inputs import check_text_argument
from .model_dir import DEFAULT_MODEL, check_model, load_sentence_encoder

NAME = "similarity"
HELP = "cosine similarity of two sentences"


def add_arguments(parser) -> None:
    parser.add_argument("a", help="first sentence")
    parser.add_argument("b", help="second sentence")
    parser.add_argument(
        "--model", default=DEFAULT_MODEL, help=f"model directory or name (default {DEFAULT_MODEL})"
    )


def run(args) -> int:
    import numpy as np

    for what, text in (("A", args.a), ("B", args.b)):
        check_text_argument(text, what)
        if not text.strip():  # as `embed ''`: an empty sentence has no meaning to compare
            raise UsageError(f"{what} is empty; give two sentences to compare")
    encoder = load_sentence_encoder(check_model(args.model), NAME)
    a, b = encoder.encode([args.a, args.b])
    cosine = float(np.dot(a, b) / max(float(np.linalg.norm(a) * np.linalg.norm(b)), 1e-12))
    print(f"{cosine:.4f}")
    return 0
