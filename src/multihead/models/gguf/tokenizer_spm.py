"""SentencePiece BPE vocabularies in GGUF (`tokenizer.ggml.model` "llama": Llama 1/2, Mistral,
Phi-3, Gemma 1-3), rebuilt with `tokenizers` as transformers' LlamaTokenizer / GemmaTokenizer
builds them from a tokenizer.model:

- the pieces and their scores; the merges are every split of a normal piece into two pieces of
  the vocabulary, ranked by the merged piece's score (SentencePiece BPE merges the
  highest-scoring pair first), within a piece by the ids of its halves;
- spaces become "▁" and, when tokenizer.ggml.add_space_prefix (default true; Gemma: false),
  each stretch of text gets a "▁" in front (the dummy prefix), as SentencePiece itself and
  llama.cpp do, and as llama.cpp's test vectors (ggml-vocab-llama-spm.gguf.out) expect: also
  before text that starts with a space, and after a special token. (transformers 5 builds its
  LlamaTokenizer from a tokenizer.model with a Metaspace pre-tokenizer that skips the prefix
  when the text starts with a space: those inputs differ there, by one "▁".)
- byte fallback: a character outside the vocabulary becomes its UTF-8 bytes' <0xNN> pieces,
  or, where the vocabulary has none, the unknown piece (tokenizer.ggml.unknown_token_id, else
  the one piece of token_type 2), consecutive unknowns fused into one as SentencePiece does;
- control tokens (token_type 3) are special added tokens, user-defined ones (4) added tokens,
  so both stay whole.
"""

from __future__ import annotations

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers

from .metadata import Metadata

_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6
SPACE = "\u2581"


def _merges(tokens: list[str], scores: list[float], types: list[int]) -> list[tuple[str, str]]:
    ids = {t: i for i, t in reversed(list(enumerate(tokens)))}  # the first id of a piece
    ranked: list[tuple[float, int, int, int, str, str]] = []
    for i, piece in enumerate(tokens):
        if types[i] not in (_NORMAL, _USER_DEFINED) or len(piece) < 2:
            continue
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in ids and right in ids:
                ranked.append((-scores[i], i, ids[left], ids[right], left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def spm_tokenizer(meta: Metadata, tokens: list[str]) -> Tokenizer:
    """The `tokenizers` Tokenizer of a GGUF SentencePiece vocabulary (see the module doc)."""
    n = len(tokens)
    scores = meta.values.get("tokenizer.ggml.scores")
    types = meta.values.get("tokenizer.ggml.token_type")
    for key, value in (("scores", scores), ("token_type", types)):
        if not isinstance(value, list) or len(value) != n:
            got = len(value) if isinstance(value, list) else value
            raise ValueError(
                f"{meta.source}: tokenizer.ggml.{key} must list one value per token ({n}), "
                f"got {got!r}"
            )
    assert isinstance(scores, list) and isinstance(types, list)
    vocab: dict[str, int] = {}
    for i, token in enumerate(tokens):
        vocab.setdefault(token, i)
    unknown = meta.values.get("tokenizer.ggml.unknown_token_id")
    if not isinstance(unknown, int):  # (Gemma GGUFs name none: SentencePiece's unk piece)
        marked = [i for i, kind in enumerate(types) if kind == _UNKNOWN]
        unknown = marked[0] if len(marked) == 1 else None
    unk = tokens[unknown] if isinstance(unknown, int) and 0 <= unknown < n else None
    bpe = models.BPE(
        vocab,
        _merges(tokens, [float(s) for s in scores], types),
        unk_token=unk,
        fuse_unk=True,
        byte_fallback=True,
    )
    tokenizer = Tokenizer(bpe)
    prefix = meta.values.get("tokenizer.ggml.add_space_prefix", True)
    spaces = normalizers.Replace(" ", SPACE)
    tokenizer.normalizer = (
        normalizers.Sequence([normalizers.Prepend(SPACE), spaces]) if prefix else spaces
    )
    steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if prefix:
        steps.append(decoders.Strip(" ", 1, 0))
    tokenizer.decoder = decoders.Sequence(steps)
    special = [
        AddedToken(t, normalized=False, special=True)
        for t, kind in zip(tokens, types, strict=True)
        if kind in (_CONTROL, _UNKNOWN)
    ]
    user = [
        AddedToken(t, normalized=False, special=False)
        for t, kind in zip(tokens, types, strict=True)
        if kind == _USER_DEFINED
    ]
    if special:
        tokenizer.add_special_tokens(special)
    if user:
        tokenizer.add_tokens(user)
    return tokenizer
