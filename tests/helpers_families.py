"""Tiny random checkpoints of the families GPT-NeoX (Pythia), Phi-3 and Llama 3.x, with
tokenizers trained here (byte-level BPE with `tokenizers`, SentencePiece with its own trainer),
saved by transformers, and converted to GGUF by llama.cpp's own convert_hf_to_gguf.py.

llama.cpp's converter and its tokenizer test vectors come from the llama-cpp-python sdist on
PyPI (pinned; .ci/run downloads and unpacks it): MULTIHEAD_LLAMA_CPP names its
vendor/llama.cpp folder. Without it the tests that need it skip, except under CI (CI set),
where they fail: CI always runs them."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

LLAMA_CPP_ENV = "MULTIHEAD_LLAMA_CPP"
LLAMA_CPP_VERSION = "0.3.36"  # the llama-cpp-python sdist .ci/run downloads

# text the tokenizers learn from and are checked on: unicode, digits, whitespace runs, code
CORPUS = [
    "The quick brown fox jumps over the lazy dog. The dog sleeps; the fox runs.",
    "Hello world! Hello, World? 12345 67 8 über naïve café déjà vu",
    "def f(x):\n    return x + 1\n\n\tindented\ttabs  and   spaces    here",
    "日本語のテキスト, 中文, 한국어 and emoji 🙂🦙 too",
    "When Mary and John went to the store, John gave a drink to Mary.",
]
CHECK_TEXTS = [
    "Hello world",
    "the lazy fox, the quick dog!",
    "  two leading spaces",
    " one leading space",
    "multiple   spaces\n\nnewlines\n",
    "\ttab\tseparated",
    "über 🙂 日本 unseen: ЖЖ ß",
    "12345 and 9876543",
    "",
    " ",
    "ends with space ",
]
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def llama_cpp_dir() -> Path:
    """vendor/llama.cpp of the llama-cpp-python sdist (skips the test without one, fails in CI)."""
    value = os.environ.get(LLAMA_CPP_ENV)
    if value and (Path(value) / "convert_hf_to_gguf.py").is_file():
        return Path(value)
    message = (
        f"{LLAMA_CPP_ENV} must name vendor/llama.cpp of the llama-cpp-python "
        f"{LLAMA_CPP_VERSION} sdist (see .ci/run); got {value!r}"
    )
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def bpe_tokenizer(directory: Path, style: str) -> int:
    """A byte-level BPE tokenizer trained on CORPUS, saved as transformers saves one; its size.
    style "llama3": Llama 3's split regex and special tokens; "gpt2": GPT-2's (GPT-NeoX)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    if style == "llama3":
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
        special = ["<|begin_of_text|>", "<|end_of_text|>"]
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        special = ["<|endoftext|>", "<|padding|>"]
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=360,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=special,
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 4, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=special[0], eos_token=special[1])
    fast.save_pretrained(directory)
    _compatible_tokenizer_config(directory)
    return tok.get_vocab_size()


def spm_model() -> bytes:
    """A SentencePiece BPE model trained here, as Llama 2's: byte fallback, digits split, the
    dummy prefix, whitespace kept, a control and a user-defined symbol."""
    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS * 4),
        model_writer=model,
        vocab_size=400,
        model_type="bpe",
        byte_fallback=True,
        character_coverage=1.0,
        split_digits=True,
        allow_whitespace_only_pieces=True,
        normalization_rule_name="identity",
        add_dummy_prefix=True,
        remove_extra_whitespaces=False,
        user_defined_symbols=["<user>"],
        control_symbols=["<ctrl>"],
        unk_id=0,
        bos_id=1,
        eos_id=2,
        minloglevel=2,
    )
    return model.getvalue()


def spm_tokenizer(directory: Path) -> int:
    """tokenizer.model (trained here) and the tokenizer_config.json of a Llama 2 repository."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tokenizer.model").write_bytes(spm_model())
    config = {"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>",
              "unk_token": "<unk>", "add_bos_token": True, "add_eos_token": False}  # fmt: skip
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    from transformers import AutoTokenizer  # and tokenizer.json, as published repositories have

    AutoTokenizer.from_pretrained(directory).save_pretrained(directory)
    config = json.loads((directory / "tokenizer_config.json").read_text())
    (directory / "tokenizer_config.json").write_text(
        json.dumps(config | {"tokenizer_class": "LlamaTokenizer"})
    )
    return 400


def _compatible_tokenizer_config(directory: Path) -> None:
    """transformers 5 writes tokenizer_class "TokenizersBackend", which the converter's
    transformers 4 cannot load: name the class both know."""
    path = directory / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    path.write_text(json.dumps(config))


def _random(model: torch.nn.Module) -> torch.nn.Module:
    with torch.no_grad():  # every weight random, norms around 1, biases away from 0
        for key, p in model.named_parameters():
            p.normal_(1.0 if "norm" in key else 0.0, 0.2)
    return model.eval()


COMMON = dict(hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
              max_position_embeddings=64, bos_token_id=None, eos_token_id=None,
              pad_token_id=None, tie_word_embeddings=False)  # fmt: skip
ORIGINAL = 16  # original_max_position_embeddings of the scaled RoPEs; tests run 40 positions

# name -> (transformers config class, config fields, tokenizer kind, llama.cpp pre-tokenizer)
FAMILIES: dict[str, tuple[str, dict, str, str | None]] = {
    "llama3": (
        "LlamaConfig",
        dict(intermediate_size=40, num_key_value_heads=2, rms_norm_eps=1e-5,
             rope_parameters={"rope_type": "llama3", "rope_theta": 50.0, "factor": 8.0,
                              "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                              "original_max_position_embeddings": ORIGINAL}),
        "llama3",
        "llama-bpe",
    ),
    "llama-spm": ("LlamaConfig", dict(intermediate_size=40, rms_norm_eps=1e-5), "spm", None),
    "gpt_neox-parallel": (
        "GPTNeoXConfig",
        dict(intermediate_size=72, rotary_pct=0.5, rotary_emb_base=10000.0,
             use_parallel_residual=True, layer_norm_eps=1e-5),
        "gpt2",
        "gpt-2",
    ),
    "gpt_neox-sequential": (
        "GPTNeoXConfig",
        dict(intermediate_size=72, rotary_pct=1.0, rotary_emb_base=10000.0,
             use_parallel_residual=False, layer_norm_eps=1e-5),
        "gpt2",
        "gpt-2",
    ),
    "phi3": (
        "Phi3Config",
        dict(intermediate_size=40, num_key_value_heads=2, rms_norm_eps=1e-5,
             partial_rotary_factor=0.5, original_max_position_embeddings=ORIGINAL,
             rope_parameters={"rope_type": "longrope", "rope_theta": 100.0,
                              "short_factor": [1.0, 1.3, 2.0], "long_factor": [2.0, 3.5, 6.0]}),
        "spm",
        None,
    ),
}  # fmt: skip


def save_family(directory: Path, name: str, seed: int = 0) -> torch.nn.Module:
    """The tiny checkpoint `name` with its tokenizer in `directory`; the transformers model."""
    import transformers

    cls, fields, tokenizer, _ = FAMILIES[name]
    directory.mkdir(parents=True, exist_ok=True)
    vocab = spm_tokenizer(directory) if tokenizer == "spm" else bpe_tokenizer(directory, tokenizer)
    special = {"bos_token_id": 1, "eos_token_id": 2} if tokenizer == "spm" else {}
    config = getattr(transformers, cls)(**(COMMON | fields | special), vocab_size=vocab)
    torch.manual_seed(seed)
    model = _random(transformers.AutoModelForCausalLM.from_config(config))
    model.save_pretrained(directory)
    raw = json.loads((directory / "config.json").read_text())
    if cls == "GPTNeoXConfig":  # the converter reads Pythia's own keys, as published
        raw |= {"rotary_pct": fields["rotary_pct"], "rotary_emb_base": fields["rotary_emb_base"]}
    (directory / "config.json").write_text(json.dumps(raw))
    return model


def convert(jobs: list[dict], work: Path) -> None:
    """Each job {"model", "outfile", "outtype", "pre"} through llama.cpp's converter."""
    root = llama_cpp_dir()
    (work / "jobs.json").write_text(json.dumps(jobs))
    # The converter pins transformers 4 (5 drops config keys it reads, e.g. Pythia's
    # rotary_pct): a Python with it (MULTIHEAD_CONVERT_PYTHON), or this one with transformers 4
    # installed apart (pip install --target) and put first on its path (CI: .ci/run)
    python = os.environ.get("MULTIHEAD_CONVERT_PYTHON", sys.executable)
    env = dict(os.environ)
    extra = os.environ.get("MULTIHEAD_CONVERT_PYTHONPATH")
    if extra:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (extra, env.get("PYTHONPATH")) if p)
    script = Path(__file__).with_name("llama_cpp_convert.py")
    done = subprocess.run(
        [python, str(script), str(root), str(work / "jobs.json")],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    if done.returncode:
        raise RuntimeError(f"llama.cpp's converter failed:\n{done.stderr[-4000:]}")
