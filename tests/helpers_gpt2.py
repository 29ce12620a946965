"""Build small GPT-2 checkpoints on disk with Hugging Face `transformers` (random weights, no
download) and a real byte-level BPE tokenizer.json trained here with `tokenizers`, laid out as
GPT-2's: no post-processor token, <|endoftext|> the last id and config.json's bos_token_id."""

from __future__ import annotations

from pathlib import Path

import torch

CORPUS = [
    "The quick brown fox jumps over the lazy dog, and the dog sleeps.",
    "A cat sat on the mat. Stocks fell sharply today!",
    "I love green tea; rain is coming, so the river rises slowly in spring.",
    "Sentence one says that the water of the river rose slowly.",
    "Heads attend to earlier tokens: previous tokens, copies and sinks.",
]
EOT = "<|endoftext|>"


def write_tokenizer(directory: Path, vocab_size: int = 300) -> int:
    """A byte-level BPE tokenizer.json trained on CORPUS, <|endoftext|> added last (as in
    GPT-2). Returns the number of tokens."""
    from tokenizers import ByteLevelBPETokenizer

    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(CORPUS * 4, vocab_size=vocab_size, min_frequency=1)
    tok.add_special_tokens([EOT])
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    return tok.get_vocab_size()


def save_gpt2(
    directory: Path,
    *,
    n_layer: int = 2,
    n_head: int = 3,
    n_embd: int = 24,
    n_positions: int = 64,
    seed: int = 0,
    bos: bool = True,
    scale: float = 1.0,
    extra_vocab: int = 5,
):
    """Save a random GPT2LMHeadModel + tokenizer.json; returns the HF model (eval). The model's
    vocabulary is the tokenizer's plus `extra_vocab` unused rows (as padded vocabularies are);
    `bos=False` leaves bos_token_id out of config.json; `scale` multiplies the weights (sharper
    patterns)."""
    import transformers

    size = write_tokenizer(directory)
    eot = size - 1
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(
        vocab_size=size + extra_vocab,
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        n_positions=n_positions,
        bos_token_id=eot if bos else None,
        eos_token_id=eot,
        attn_implementation="eager",
    )
    model = transformers.GPT2LMHeadModel(cfg).eval()
    if scale != 1.0:
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(scale)
    model.save_pretrained(directory)
    return model


def write_sentencepiece_tokenizer(directory: Path, vocab_size: int = 90) -> dict[str, int]:
    """A Llama-style tokenizer.json (SentencePiece BPE: "▁" marks a word's start) whose
    post-processor puts <s> before every text, trained on CORPUS. Returns its special ids."""
    from tokenizers import SentencePieceBPETokenizer, processors

    tok = SentencePieceBPETokenizer()
    specials = ["<unk>", "<s>", "</s>"]
    tok.train_from_iterator(CORPUS * 4, vocab_size=vocab_size, special_tokens=specials)
    ids = {t: tok.token_to_id(t) for t in specials}
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", ids["<s>"])]
    )
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    return ids | {"size": tok.get_vocab_size()}
