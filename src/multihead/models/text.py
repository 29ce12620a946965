"""`ModelTokenizer`: the tokenizer a model was trained with, and the special tokens it put
around every text (BOS policy), so that text becomes the ids the model expects.

The `tokenizers.Tokenizer` is used raw: text is split without its post-processor, and the
special tokens are placed here from three fields (`bos_id` with `add_bos`, `eos_id` with
`add_eos`). One rule for every source (a Hugging Face directory, GGUF metadata):

  - Llama-family checkpoints trained with `<s>` first: add_bos=True (tokenizer_config.json's
    add_bos_token, GGUF's tokenizer.ggml.add_bos_token);
  - GPT-2 style byte-level BPE trained on raw text: add_bos=False (`prepend_bos=True` still
    puts `bos_id` first when asked, as TransformerLens does for GPT-2);
  - BERT-family encoders: their own template, [CLS] text [SEP] (<s> text </s> for RoBERTa and
    MPNet): bos_id = [CLS], eos_id = [SEP], add_bos = add_eos = True.

`from_dir` reads the policy as transformers' AutoTokenizer does: tokenizer_config.json's
add_bos_token / add_eos_token when either is given, else the single-text template of
tokenizer.json's post-processor. Only single texts are handled (no sentence pairs).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, overload

from tokenizers import Tokenizer

_CONFIG = "tokenizer_config.json"
_SPECIALS = "special_tokens_map.json"
_PROBE = "a b"  # any text: only the special tokens around it are read


class ModelTokenizer:
    """A tokenizer plus its BOS/EOS policy.

    `tokenizer`: used raw (its post-processor, padding and truncation are not used; a copy is
    kept, the caller's object is not changed). `bos_id` / `eos_id` / `pad_id`: special ids (None
    when the model has none). `add_bos` / `add_eos`: whether the model saw `bos_id` before /
    `eos_id` after every text in training (the defaults of `encode`). `name`: for messages.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        bos_id: int | None = None,
        eos_id: int | None = None,
        pad_id: int | None = None,
        add_bos: bool = False,
        name: str = "",
        add_eos: bool = False,
    ) -> None:
        if not isinstance(tokenizer, Tokenizer):
            raise TypeError(
                f"tokenizer must be a tokenizers.Tokenizer, got {type(tokenizer).__name__}"
            )
        size = tokenizer.get_vocab_size(with_added_tokens=True)
        for arg, value in (("bos_id", bos_id), ("eos_id", eos_id), ("pad_id", pad_id)):
            if value is not None and not (isinstance(value, int) and 0 <= value < size):
                raise ValueError(f"{arg} must be an id in [0, {size}), got {value!r}")
        if add_bos and bos_id is None:
            raise ValueError("add_bos=True needs bos_id")
        if add_eos and eos_id is None:
            raise ValueError("add_eos=True needs eos_id")
        raw = Tokenizer.from_str(tokenizer.to_str())  # a private copy: settings below are ours
        raw.no_padding()
        raw.no_truncation()
        self._tokenizer = raw
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.pad_id = pad_id
        self.add_bos = bool(add_bos)
        self.add_eos = bool(add_eos)
        self.name = name

    @classmethod
    def from_dir(cls, path: str | Path) -> ModelTokenizer:
        """The tokenizer of a Hugging Face model directory (tokenizer.json, with
        tokenizer_config.json and special_tokens_map.json when present)."""
        directory = Path(path).expanduser()
        file = directory / "tokenizer.json"
        if not file.is_file():
            raise FileNotFoundError(f"{str(directory)!r} has no tokenizer.json")
        try:
            tokenizer = Tokenizer.from_file(str(file))
        except Exception as e:  # the Rust side raises its own exception type
            raise ValueError(f"cannot read {str(file)!r} as a tokenizer: {e}") from None
        tokenizer.no_padding()  # the probe below must see the template only
        tokenizer.no_truncation()
        config = _read_json(directory / _CONFIG)
        specials = _read_json(directory / _SPECIALS) | {
            k: v for k, v in config.items() if k.endswith("_token") and v is not None
        }
        ids = {
            role: _token_id(tokenizer, specials.get(f"{role}_token"), file)
            for role in ("bos", "eos", "pad")
        }
        # config.json's ids (GPT-2 names <|endoftext|> there only) when the tokenizer names none
        model_config = _read_json(directory / "config.json")
        for role in ("bos", "eos", "pad"):
            value = model_config.get(f"{role}_token_id")
            if ids[role] is None and isinstance(value, int) and not isinstance(value, bool):
                ids[role] = value if tokenizer.id_to_token(value) is not None else None
        if "add_bos_token" in config or "add_eos_token" in config:
            # the flags say what the model was trained with (transformers 4's Llama tokenizer
            # rebuilt its template from them; transformers 5 keeps tokenizer.json's)
            add_bos = bool(config.get("add_bos_token")) and ids["bos"] is not None
            add_eos = bool(config.get("add_eos_token")) and ids["eos"] is not None
        else:
            prefix, suffix = _template(tokenizer, file)
            add_bos, add_eos = bool(prefix), bool(suffix)
            ids["bos"] = prefix[0] if prefix else ids["bos"]
            ids["eos"] = suffix[0] if suffix else ids["eos"]
        return cls(
            tokenizer,
            bos_id=ids["bos"],
            eos_id=ids["eos"],
            pad_id=ids["pad"],
            add_bos=add_bos,
            add_eos=add_eos,
            name=str(config.get("name_or_path") or directory.name),
        )

    @classmethod
    def from_tokenizer(
        cls, tokenizer: Tokenizer, *, pad_id: int | None = None, name: str = ""
    ) -> ModelTokenizer:
        """A tokenizer whose post-processor says the policy (its single-text template: BERT's
        [CLS] $A [SEP], Llama's <s> $A, GPT-2's none)."""
        probe = Tokenizer.from_str(tokenizer.to_str())
        probe.no_padding()
        probe.no_truncation()
        prefix, suffix = _template(probe, Path(name or "tokenizer"))
        return cls(
            tokenizer,
            bos_id=prefix[0] if prefix else None,
            eos_id=suffix[0] if suffix else None,
            pad_id=pad_id,
            add_bos=bool(prefix),
            add_eos=bool(suffix),
            name=name,
        )

    @property
    def tokenizer(self) -> Tokenizer:
        """The raw `tokenizers.Tokenizer` (no post-processor use, no padding, no truncation)."""
        return self._tokenizer

    @property
    def vocab_size(self) -> int:
        return int(self._tokenizer.get_vocab_size(with_added_tokens=True))

    @overload
    def encode(  # type: ignore[overload-overlap]  # a str is also a Sequence[str]
        self,
        texts: str,
        prepend_bos: bool | None = None,
        *,
        append_eos: bool | None = None,
        max_length: int | None = None,
    ) -> list[int]: ...
    @overload
    def encode(
        self,
        texts: Sequence[str],
        prepend_bos: bool | None = None,
        *,
        append_eos: bool | None = None,
        max_length: int | None = None,
    ) -> list[list[int]]: ...
    def encode(
        self,
        texts: str | Sequence[str],
        prepend_bos: bool | None = None,
        *,
        append_eos: bool | None = None,
        max_length: int | None = None,
    ) -> list[int] | list[list[int]]:
        """Ids of one text (a list) or of several (a list per text). `prepend_bos` /
        `append_eos`: None = as the model was trained (`add_bos` / `add_eos`). `max_length`:
        each text cut on the right to that many ids, its special tokens kept."""
        single = isinstance(texts, str)
        batch = [check_encodable(texts)] if isinstance(texts, str) else _text_list(texts)
        bos = self.add_bos if prepend_bos is None else bool(prepend_bos)
        eos = self.add_eos if append_eos is None else bool(append_eos)
        if bos and self.bos_id is None:
            raise ValueError(f"prepend_bos=True but tokenizer {self.name!r} has no BOS token")
        if eos and self.eos_id is None:
            raise ValueError(f"append_eos=True but tokenizer {self.name!r} has no EOS token")
        head = [self.bos_id] if bos and self.bos_id is not None else []
        tail = [self.eos_id] if eos and self.eos_id is not None else []
        room = None
        if max_length is not None:
            ok = isinstance(max_length, int) and not isinstance(max_length, bool)
            room = max_length - len(head) - len(tail) if ok else -1
            if room < 0:
                raise ValueError(
                    f"max_length must be an int of at least the {len(head) + len(tail)} special "
                    f"tokens, got {max_length!r}"
                )
        encodings = self._tokenizer.encode_batch(batch, add_special_tokens=False)
        ids = [head + e.ids[:room] + tail for e in encodings]
        return ids[0] if single else ids

    def decode(self, ids: Any, *, skip_special_tokens: bool = False) -> str | list[str]:
        """Text of one id sequence (a str), or a list of texts for a batch (nested lists or a
        2-D tensor). Special tokens are kept unless `skip_special_tokens`."""
        rows = _id_rows(ids)
        if rows is None:
            return str(self._tokenizer.decode(_ids(ids), skip_special_tokens=skip_special_tokens))
        return list(self._tokenizer.decode_batch(rows, skip_special_tokens=skip_special_tokens))

    def token_strings(self, ids: Any) -> list[str]:
        """Each id decoded alone (TransformerLens's to_str_tokens: byte-level "Ġthe" reads
        " the"; a piece of a multi-byte character reads "\\ufffd")."""
        return [self._tokenizer.decode([i], skip_special_tokens=False) for i in _ids(ids)]

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary entry (e.g. "Ġthe"), None for an id outside the vocabulary."""
        return self._tokenizer.id_to_token(token_id)

    def token_to_id(self, token: str) -> int | None:
        return self._tokenizer.token_to_id(token)

    def __repr__(self) -> str:
        return (
            f"ModelTokenizer({self.name!r}, vocab_size={self.vocab_size}, bos_id={self.bos_id}, "
            f"eos_id={self.eos_id}, pad_id={self.pad_id}, add_bos={self.add_bos}, "
            f"add_eos={self.add_eos})"
        )


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read {str(path)!r} as JSON: {e}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{str(path)!r} must hold a JSON object, got {type(value).__name__}")
    return value


def _token_id(tokenizer: Tokenizer, token: Any, file: Path) -> int | None:
    """The id of a special token written as a string or as {"content": ...} (AddedToken)."""
    if isinstance(token, dict):
        token = token.get("content")
    if token is None:
        return None
    if not isinstance(token, str):
        raise ValueError(f"special token {token!r} next to {str(file)!r} is not a string")
    return tokenizer.token_to_id(token)


def _template(tokenizer: Tokenizer, file: Path) -> tuple[list[int], list[int]]:
    """The special ids tokenizer.json's post-processor puts before and after a single text."""
    encoding = tokenizer.encode(_PROBE, add_special_tokens=True)
    mask = encoding.special_tokens_mask
    plain = len(tokenizer.encode(_PROBE, add_special_tokens=False).ids)
    lead = next((i for i, m in enumerate(mask) if not m), len(mask))
    prefix, suffix = encoding.ids[:lead], encoding.ids[lead + plain :]
    if len(prefix) > 1 or len(suffix) > 1 or lead + plain + len(suffix) != len(mask):
        raise ValueError(
            f"the post-processor of {str(file)!r} puts {prefix} before and {suffix} after a "
            "text: only one special token on each side is supported"
        )
    return prefix, suffix


def check_encodable(text: str, what: str = "text") -> str:
    """`text` if it can be written as UTF-8 (what a tokenizer reads); ValueError naming the
    lone surrogate (a half of a UTF-16 pair, e.g. '\\ud800') that makes it not text."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(
            f"{what} holds {text[e.start]!r} at index {e.start}, a lone surrogate: not text a "
            "tokenizer can read (decode its bytes with errors='replace' first)"
        ) from None
    return text


def _text_list(texts: Any) -> list[str]:
    if isinstance(texts, (bytes, bytearray)) or not isinstance(texts, Sequence):
        raise TypeError(f"texts must be a str or a list of str, got {type(texts).__name__}")
    bad = [type(t).__name__ for t in texts if not isinstance(t, str)]
    if bad:
        raise TypeError(f"texts must be a str or a list of str, got an item of type {bad[0]}")
    for i, t in enumerate(texts):
        check_encodable(t, f"texts[{i}]")
    return list(texts)


def _ids(ids: Any) -> list[int]:
    values = ids.tolist() if hasattr(ids, "tolist") else ids
    if isinstance(values, int):
        return [values]
    if not isinstance(values, Sequence) or not all(isinstance(i, int) for i in values):
        raise TypeError("ids must be an int, a list of ints or a 1-D integer tensor")
    return list(values)


def _id_rows(ids: Any) -> list[list[int]] | None:
    """Rows of a batch (nested sequences or a 2-D tensor); None for a single sequence."""
    values = ids.tolist() if hasattr(ids, "tolist") else ids
    if isinstance(values, Sequence) and values and isinstance(values[0], Sequence):
        return [_ids(row) for row in values]
    return None
