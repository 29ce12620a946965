"""GGUF tokenizers rebuilt by multihead against llama.cpp's own tokenizer test vectors: the
models/ggml-vocab-NAME.gguf files of the llama-cpp-python sdist (vocabulary only) with their
.inp (inputs separated by a __ggml_vocab_test__ line) and .out (the ids the source model's
Hugging Face tokenizer gave, one line of space-separated ids per input): SentencePiece (Llama 2,
Phi-3) and every byte-level BPE pre-tokenizer of the families multihead reads."""

from __future__ import annotations

import pytest

from helpers_families import llama_cpp_dir
from multihead.models.gguf.metadata import Metadata
from multihead.models.gguf.reader import GGUFFile
from multihead.models.gguf.tokenizer import gguf_tokenizer

MARKER = "\n__ggml_vocab_test__\n"
# name -> (tokenizer.ggml.model, tokenizer.ggml.pre): what each file exercises
VOCABS = {
    "llama-spm": ("llama", "default"),  # Llama 2 / Mistral: SentencePiece BPE, byte fallback
    "phi-3": ("llama", "default"),  # SentencePiece with control and user-defined tokens
    "gpt-2": ("gpt2", "gpt-2"),  # GPT-2's split (Pythia's tokenizer splits the same way)
    "llama-bpe": ("gpt2", "llama-bpe"),  # Llama 3: its split, words found whole skip merges
    "qwen2": ("gpt2", "qwen2"),  # Qwen2 / Qwen3: digits one at a time
    "mpt": ("gpt2", "mpt"),  # user-defined whitespace-run tokens
    "starcoder": ("gpt2", "starcoder"),  # digits split first (SmolLM's "smollm" too)
    "refact": ("gpt2", "refact"),
}


@pytest.mark.parametrize("name", list(VOCABS))
def test_ids_equal_llama_cpp_test_vectors(name):
    models = llama_cpp_dir() / "models"
    path = models / f"ggml-vocab-{name}.gguf"
    file = GGUFFile(path)
    meta = Metadata(file.metadata, repr(str(path)))
    values = meta.values
    assert (values["tokenizer.ggml.model"], values["tokenizer.ggml.pre"]) == VOCABS[name]
    parts = gguf_tokenizer(meta)
    assert parts is not None
    inputs = (models / f"{path.name}.inp").read_text(encoding="utf-8").split(MARKER)
    outputs = (models / f"{path.name}.out").read_text(encoding="utf-8").split("\n")
    inputs[-1] = inputs[-1].removesuffix("\n__ggml_vocab_test__\n")
    assert len(inputs) >= 40 and len(outputs) >= len(inputs)
    wrong = []
    for text, line in zip(inputs, outputs, strict=False):
        want = [int(i) for i in line.split()]
        got = parts.tokenizer.encode(text, add_special_tokens=False).ids
        if got != want:
            wrong.append(f"{text!r}: {got} != {want}")
    assert not wrong, "\n".join(wrong[:5])
    spm = values["tokenizer.ggml.model"] == "llama"
    assert parts.add_bos == (spm or bool(values.get("tokenizer.ggml.add_bos_token")))
