"""`multihead bench decode`: greedy decoding with the KV cache vs recomputation and Hugging
Face `generate`, on identical weights: random GPT-2-small-shaped ones, or a checkpoint
directory's (`--model DIR`, any model_type `load_causal_lm` reads)."""

from __future__ import annotations

import argparse

from .bench import add_common, add_device, apply_common, check_device, require
from .errors import UsageError
from .model_dir import CAUSAL_LM_TYPES, check_model
from .parsing import positive_int

NAME = "decode"
HELP = "greedy decoding with the KV cache vs recomputation and HF generate"
POSITIONS = 1024  # the position table of the GPT-2-small shape that bench.decode builds


def add_arguments(parser) -> None:
    parser.add_argument(
        "--model",
        metavar="DIR",
        help="a decoder checkpoint directory (config.json + weights; model_type "
        f"{', '.join(CAUSAL_LM_TYPES)}); default: random GPT-2-small weights",
    )
    parser.add_argument(
        "--batches", type=positive_int, nargs="+", default=[1, 8], help="batch sizes (default 1 8)"
    )
    parser.add_argument(
        "--new", type=positive_int, default=256, help="tokens to generate (default 256)"
    )
    parser.add_argument(
        "--prompt", type=positive_int, default=128, help="prompt length (default 128)"
    )
    parser.add_argument(
        "--repeats", type=positive_int, default=2, help="runs per contender (default 2)"
    )
    parser.add_argument(
        "--no-compile",
        action="store_true",
        help="leave out multihead's generate(compile=True) (its compilation takes a minute)",
    )
    parser.add_argument(
        "--no-hf-static",
        action="store_true",
        help="leave out Hugging Face's static-cache generate",
    )
    parser.add_argument(
        "--hf-compile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="compile Hugging Face's static-cache generate (default: on CUDA, as generate does)",
    )
    parser.add_argument(
        "--gguf",
        nargs="?",
        const="",
        metavar="FILE",
        help="instead: a quantized GGUF file (default SmolLM2-135M Q4_1) decoded packed vs "
        "dequantised float32, one process per engine (see --threads, --peer, --rounds)",
    )
    parser.add_argument(
        "--peer",
        choices=("llama.cpp",),
        help="with --gguf: also llama-cpp-python on the same file (build it yourself: pip install "
        "llama-cpp-python; never installed by multihead)",
    )
    parser.add_argument(
        "--peer-python",
        default=None,
        help="the Python that imports llama_cpp (default: this one)",
    )
    parser.add_argument(
        "--peer-repack",
        action="store_true",
        help="with --peer llama.cpp: keep llama.cpp's CPU weight repacking (extra buffer types, "
        "AMX) on; off by default because llama-cpp-python 0.3.36 crashes in it on CPUs that "
        "report AMX where the VM does not run it",
    )
    parser.add_argument(
        "--gguf-compiled",
        action="store_true",
        help="with --gguf: also both multihead engines under generate(compile=True) (decode)",
    )
    parser.add_argument("--rounds", type=positive_int, default=3, help="with --gguf (default 3)")
    parser.add_argument(
        "--prefill-only",
        action="store_true",
        help="with --gguf: time the prefill only (no decoding; 5 prefills per process, the "
        "range of the per-round ratios in the table): use with more --rounds",
    )
    parser.add_argument(
        "--prefill", type=positive_int, default=512, help="with --gguf: prefill tokens (512)"
    )
    add_device(parser)
    add_common(parser)


def _check_model_dir(name: str, total: int) -> None:
    """A decoder directory whose position table holds prompt + new tokens (no tokenizer
    needed: the prompts are random token ids)."""
    model = check_model(name, tokenizer=False)
    if model.model_type not in CAUSAL_LM_TYPES:
        raise model.error(
            f"`multihead bench decode` reads decoders (model_type "
            f"{', '.join(map(repr, CAUSAL_LM_TYPES))}); this model's config.json says "
            f"model_type {model.model_type!r}"
        )
    high = model.max_positions
    if high is not None and total > high:
        raise UsageError(
            f"--prompt + --new is {total}, more than the model's {high} positions "
            "(max_position_embeddings / n_positions in config.json)"
        )


def _run_gguf(args) -> int:
    from ..bench import quantized
    from .bench_load import _default_model

    if args.prefill_only and args.gguf_compiled:
        raise UsageError(
            "--prefill-only times no decoding and --gguf-compiled adds compiled decoders "
            "(whose prefill is the eager one): give one of them"
        )
    name = args.gguf or _default_model()
    model = check_model(name, tokenizer=False)
    if model.path.is_dir():
        raise UsageError(f"--gguf {name!r}: give a .gguf file")
    try:
        print(
            quantized.decode(
                model.path,
                threads=args.threads or 2,
                prompt=args.prompt,
                new=args.new,
                prefill=args.prefill,
                rounds=args.rounds,
                peer=args.peer,
                python=args.peer_python,
                repack=args.peer_repack,
                compiled=args.gguf_compiled,
                prefill_only=args.prefill_only,
            )
        )
    except RuntimeError as e:
        raise UsageError(str(e)) from None
    return 0


def run(args) -> int:
    if args.gguf is not None or args.peer is not None:
        return _run_gguf(args)
    for flag, given in (
        ("--prefill-only", args.prefill_only),
        ("--gguf-compiled", args.gguf_compiled),
    ):
        if given:  # (else the random GPT-2 bench would run, the flag unread)
            raise UsageError(f"{flag} is for the quantized bench: add --gguf [FILE]")
    require("transformers", NAME, "Hugging Face transformers")
    check_device(args)
    if args.new < 2:
        raise UsageError(
            f"--new must be at least 2 (steps are timed after the first), got {args.new}"
        )
    if args.model is not None:
        _check_model_dir(args.model, args.prompt + args.new)
    elif args.prompt + args.new > POSITIONS:
        raise UsageError(
            f"--prompt {args.prompt} + --new {args.new} is more than the model's {POSITIONS} "
            "positions"
        )
    apply_common(args)
    from ..bench import decode

    print(
        decode.run(
            batches=args.batches,
            prompt_len=args.prompt,
            new=args.new,
            repeats=args.repeats,
            model_dir=args.model,
            device=args.device,
            dtype=args.dtype,
            compile=not args.no_compile,
            hf_static=not args.no_hf_static,
            hf_compile=args.hf_compile,
        )
    )
    return 0
