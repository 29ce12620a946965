"""`multihead bench embed`: sentence embeddings, multihead vs sentence-transformers and ONNX
Runtime on the same model directory."""

from __future__ import annotations

from .bench import add_common, add_device, apply_common, check_device, require
from .model_dir import DEFAULT_MODEL, check_model
from .parsing import positive_int

NAME = "embed"
HELP = "sentence embeddings: multihead vs sentence-transformers and ONNX Runtime, same model"


def add_arguments(parser) -> None:
    parser.add_argument(
        "--model", default=DEFAULT_MODEL, help=f"model directory or name (default {DEFAULT_MODEL})"
    )
    parser.add_argument(
        "--sentences", type=positive_int, default=2000, help="corpus size (default 2000)"
    )
    parser.add_argument(
        "--batch-size",
        type=positive_int,
        default=32,
        help="encode's batch_size, both encoders (default 32)",
    )
    parser.add_argument(
        "--repeats", type=positive_int, default=3, help="runs per encoder (default 3)"
    )
    parser.add_argument(
        "--texts",
        choices=("short", "long", "both"),
        default="both",
        help="short sentences (~13 tokens), long texts (~241 tokens) or both (default both)",
    )
    parser.add_argument(
        "--no-onnx",
        action="store_true",
        help="leave out the ONNX Runtime peer (it exports the model first, ~10-30 s)",
    )
    add_device(parser)
    add_common(parser)


def run(args) -> int:
    require("sentence_transformers", NAME, "sentence-transformers")
    check_device(args)
    check_model(args.model)
    apply_common(args)
    from ..bench import embed

    print(
        embed.run(
            args.model,
            n=args.sentences,
            batch_size=args.batch_size,
            repeats=args.repeats,
            device=args.device,
            dtype=args.dtype,
            corpora=("short", "long") if args.texts == "both" else (args.texts,),
            onnx=not args.no_onnx,
        )
    )
    return 0
