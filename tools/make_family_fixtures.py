"""Write the committed test fixtures of the native Gemma 1-3, Qwen3 and OLMo 2 families:
tests/fixtures/families/<family>/ holds hf/ (config.json, model.safetensors and a tokenizer: a
SentencePiece model for Gemma, a byte-level BPE tokenizer.json for Qwen3 and OLMo 2, each
trained here on a small text) and f32.gguf, q8_0.gguf written from it by llama.cpp's own
convert_hf_to_gguf.py. The checkpoints are tests/helpers_families_core.py's "gguf" variants (fixed
seeds), so a rerun writes the same weights.

The converter pins its own transformers, so it runs in its own environment:
    python tools/make_family_fixtures.py --llama-cpp DIR --python VENV/bin/python [family ...]
(DIR: llama.cpp's source, e.g. the llama-cpp-python sdist's vendor/llama.cpp). It refuses a BPE
tokenizer it does not recognise by hash; tools/convert_with_known_pre.py runs it with the
pre-tokenizer named ("gpt-2": our tokenizers split as GPT-2 does).

Why committed files rather than conversion at test time: CI would need a second Python
environment with the converter's pinned transformers; the fixtures are 1.9 MB in all and the
tests read them in well under a second.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from helpers_families_core import CASES, FAMILIES, FIXTURES, build  # noqa: E402

TEXT = [
    "The quick brown fox jumps over the lazy dog.",
    "Attention heads read keys and write values into the residual stream.",
    "Sliding windows see the last few tokens; global layers see them all.",
    "Numbers 0 1 2 3 4 5 6 7 8 9 and punctuation: , . ; ! ? ( ) [ ] { }",
    "Gemma Qwen OLMo llama gguf tensors norms soft caps rotary bases",
] * 20


def sentencepiece_model(directory: Path, vocab: int) -> None:
    import sentencepiece as spm

    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(TEXT),
        model_prefix=str(directory / "tokenizer"),
        vocab_size=vocab,
        model_type="bpe",
        character_coverage=1.0,
        byte_fallback=False,
        normalization_rule_name="identity",  # (as Gemma's; no 240 KB NFKC table)
        pad_id=0,  # Gemma's special pieces, ids and spellings (so transformers' GemmaTokenizer
        eos_id=1,  # finds its <bos>, <eos> and <mask> in the vocabulary, adding none)
        bos_id=2,
        unk_id=3,
        pad_piece="<pad>",
        eos_piece="<eos>",
        bos_piece="<bos>",
        unk_piece="<unk>",
        user_defined_symbols=["<mask>"],
        minloglevel=2,
    )
    (directory / "tokenizer.vocab").unlink()


def bpe_tokenizer(directory: Path, vocab: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>"],
    )
    tokenizer.train_from_iterator(TEXT, trainer)
    assert tokenizer.get_vocab_size() == vocab, tokenizer.get_vocab_size()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|endoftext|>")
    fast.save_pretrained(directory)
    # transformers 5 names its class TokenizersBackend, which the converter's transformers 4
    # does not know; the class that reads tokenizer.json in both is PreTrainedTokenizerFast
    config = directory / "tokenizer_config.json"
    config.write_text(
        config.read_text().replace('"TokenizersBackend"', '"PreTrainedTokenizerFast"')
    )


def convert(llama_cpp: Path, python: str, hf: Path, out: Path, outtype: str) -> None:
    wrapper = ROOT / "tools" / "convert_with_known_pre.py"
    subprocess.run(
        [python, str(wrapper), str(llama_cpp), "gpt-2", str(hf), "--outtype", outtype,
         "--outfile", str(out)],
        check=True,
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama-cpp", type=Path, required=True)
    parser.add_argument("--python", required=True, help="the converter environment's python")
    parser.add_argument("families", nargs="*", default=list(FAMILIES))
    args = parser.parse_args()
    for family in args.families:
        target = FIXTURES / family
        shutil.rmtree(target, ignore_errors=True)
        hf = target / "hf"
        build(family, hf, variant="gguf", seed=0)
        vocab = CASES[family][1]
        if family.startswith("gemma"):
            sentencepiece_model(hf, vocab)
        else:
            bpe_tokenizer(hf, vocab)
        for outtype in ("f32", "q8_0"):
            convert(args.llama_cpp, args.python, hf, target / f"{outtype}.gguf", outtype)
        (hf / "generation_config.json").unlink(missing_ok=True)
        if family.startswith("gemma"):  # after converting (it reads tokenizer.model): the
            # SentencePiece model as transformers' tokenizer.json, for the directory loader
            from transformers import AutoTokenizer

            AutoTokenizer.from_pretrained(hf).save_pretrained(hf)
        print(family, sorted(p.name for p in target.rglob("*") if p.is_file()))


if __name__ == "__main__":
    main()
