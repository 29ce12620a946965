"""`multihead similarity A B`: the cosine similarity of two sentences' embeddings."""

from __future__ import annotations

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

    encoder = load_sentence_encoder(check_model(args.model), NAME)
    a, b = encoder.encode([args.a, args.b])
    cosine = float(np.dot(a, b) / max(float(np.linalg.norm(a) * np.linalg.norm(b)), 1e-12))
    print(f"{cosine:.4f}")
    return 0
