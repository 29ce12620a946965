"""Text in, text out: the methods a model gets from the tokenizer it carries, with
TransformerLens' names and meanings (`to_tokens`, `to_str_tokens`, `to_string`,
`to_single_token`, and `run_with_cache`, `run_with_hooks`, `ablate`, `patch` that take text as
well as ids).

`model.tokenizer` is a `multihead.models.text.ModelTokenizer` (None when the checkpoint came
without one: every text input then raises a ValueError that says so). It is a plain attribute,
not a module: the model stays an `nn.Module` with all of its hook points and state_dict.

BOS: `prepend_bos=None` (the default everywhere) puts the BOS token first exactly when the
model was trained with it (Llama-family: yes; GPT-2: no; BERT-family encoders: their own
[CLS] ... [SEP]); True / False force it, as in TransformerLens.

Padding: a list of texts of different lengths is padded with the tokenizer's pad id (its EOS,
else 0, when it has none) on `padding_side` ("right" by default, "left" for generation); the
methods that run the model pass the matching `attention_mask` (1 = token, 0 = padding)
themselves. `to_tokens(..., return_mask=True)` returns it beside the ids.

Shapes: tokens (B, T) int64, mask (B, T) int64.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from ..hooked.ablation import ablate
from ..hooked.hooks import run_with_cache, run_with_hooks
from ..hooked.patching import patch
from ..modules.generation import generate

if TYPE_CHECKING:
    from .text import ModelTokenizer

PADDING_SIDES = ("right", "left")


def is_text(x: object) -> bool:
    """A str or a non-empty list/tuple of str."""
    return isinstance(x, str) or (
        isinstance(x, (list, tuple)) and bool(x) and all(isinstance(t, str) for t in x)
    )


class TextMethods:
    """Mixed into models that can carry a tokenizer (`CausalLM`, `SentenceEncoder`)."""

    tokenizer: ModelTokenizer | None = None

    # -- what the host model provides ------------------------------------------------------

    def _text_max_length(self) -> int | None:
        """The longest input the model reads (texts are cut to it with `truncate=True`)."""
        return None

    def _text_device(self) -> torch.device:
        assert isinstance(self, nn.Module)
        first = next(self.parameters(), None)
        return torch.device("cpu") if first is None else first.device

    # -- text -> ids -------------------------------------------------------------------------

    def _tokenizer(self, what: str) -> ModelTokenizer:
        if self.tokenizer is None:
            raise ValueError(
                f"{what} got text, but this {type(self).__name__} carries no tokenizer "
                "(model.tokenizer is None): pass token ids, or set model.tokenizer = "
                "ModelTokenizer.from_dir(...)"
            )
        return self.tokenizer

    def to_tokens(
        self,
        input: str | Sequence[str],
        prepend_bos: bool | None = None,
        padding_side: str | None = None,
        move_to_device: bool = True,
        truncate: bool = True,
        *,
        return_mask: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """(B, T) int64 token ids of a text (B = 1) or a list of texts, padded to the longest
        on `padding_side` ("right" unless "left"). `prepend_bos`: None = as the model was
        trained (see the module docstring). `truncate`: cut each text to the model's length
        (special tokens kept). `return_mask`: also the (B, T) attention mask, 1 = token."""
        tokenizer = self._tokenizer("to_tokens")
        side = padding_side or "right"
        if side not in PADDING_SIDES:
            raise ValueError(f"padding_side must be 'right' or 'left', got {padding_side!r}")
        texts = [input] if isinstance(input, str) else input
        if not is_text(texts):
            raise TypeError(
                f"input must be a str or a non-empty list of str, got {type(input).__name__}"
            )
        limit = self._text_max_length() if truncate else None
        rows = tokenizer.encode(list(texts), prepend_bos, max_length=limit)
        T = max(len(r) for r in rows)
        if T == 0:
            raise ValueError("input has no tokens (empty text and no special tokens)")
        pad = next((i for i in (tokenizer.pad_id, tokenizer.eos_id) if i is not None), 0)
        ids = torch.full((len(rows), T), pad, dtype=torch.long)
        mask = torch.zeros((len(rows), T), dtype=torch.long)
        for b, row in enumerate(rows):
            cols = slice(0, len(row)) if side == "right" else slice(T - len(row), T)
            ids[b, cols] = torch.tensor(row, dtype=torch.long)
            mask[b, cols] = 1
        if move_to_device:
            device = self._text_device()
            ids, mask = ids.to(device), mask.to(device)
        return (ids, mask) if return_mask else ids

    def to_str_tokens(
        self, input: Any, prepend_bos: bool | None = None, padding_side: str | None = None
    ) -> list[str] | list[list[str]]:
        """Each token as text. A str, a 1-D tensor / list of ids, or a (1, T) tensor -> a list
        of strings; a list of texts -> a list of lists (each text alone, unpadded)."""
        tokenizer = self._tokenizer("to_str_tokens")
        if isinstance(input, (list, tuple)) and input and all(isinstance(t, str) for t in input):
            return [self.to_str_tokens(t, prepend_bos, padding_side) for t in input]  # type: ignore[return-value]
        if isinstance(input, str):
            ids: Any = tokenizer.encode(input, prepend_bos, max_length=self._text_max_length())
        elif isinstance(input, Tensor):
            if input.dim() == 2 and input.shape[0] == 1:
                input = input[0]
            if input.dim() > 1:
                raise ValueError(
                    f"to_str_tokens takes one sequence: a (T,) or (1, T) tensor, got "
                    f"{tuple(input.shape)} (call it per row)"
                )
            ids = input
        else:
            ids = input
        return tokenizer.token_strings(ids)

    def to_string(self, tokens: Any) -> str | list[str]:
        """Text of token ids: (T,) -> str, (B, T) -> one str per row (special tokens kept)."""
        return self._tokenizer("to_string").decode(tokens)

    def to_single_token(self, string: str) -> int:
        """The id of a string that is exactly one token (no BOS), else ValueError."""
        ids = self._tokenizer("to_single_token").encode(string, False, append_eos=False)
        if len(ids) != 1:
            raise ValueError(f"{string!r} is {len(ids)} tokens, not one: {ids}")
        return ids[0]

    def _ids_and_mask(
        self,
        input: Any,
        attention_mask: Tensor | None,
        prepend_bos: bool | None,
        padding_side: str | None,
        what: str,
    ) -> tuple[Any, Tensor | None]:
        """Text -> (ids, mask or None when nothing is padded); anything else passes through."""
        if not is_text(input):
            return input, attention_mask
        if attention_mask is not None:
            raise ValueError(f"{what}: attention_mask is made from the text; pass ids with it")
        ids, mask = self.to_tokens(input, prepend_bos, padding_side, return_mask=True)
        return ids, (None if bool(mask.all()) else mask)

    def generate_text(
        self,
        input: str | Sequence[str],
        max_new_tokens: int,
        *,
        prepend_bos: bool | None = None,
        return_type: str = "input",
        **kwargs: Any,
    ) -> Any:
        """Generate from text prompts (a list is left-padded, with its mask): the prompt plus
        the new text, a str per prompt (a list for a list), or the (B, P + new) ids with
        `return_type="tokens"`. Generation stops at the tokenizer's EOS unless `eos` is given
        (None: never), as TransformerLens' stop_at_eos; the text ends with the first EOS.
        Greedy unless `temperature` > 0 (TransformerLens samples by default). The BOS put
        first (see `prepend_bos`) is not part of the text. Other keywords: `generate`'s."""
        tokenizer = self._tokenizer("generate")
        if return_type not in ("input", "str", "tokens"):
            raise ValueError(f"return_type must be 'input', 'str' or 'tokens', got {return_type!r}")
        ids, mask = self.to_tokens(input, prepend_bos, "left", return_mask=True)
        kwargs.setdefault("eos", tokenizer.eos_id)
        if not bool(mask.all()):
            kwargs["attention_mask"] = mask
        out = generate(self, ids, max_new_tokens, **kwargs)  # type: ignore[arg-type]
        if return_type == "tokens":
            return out
        P = ids.shape[1]
        bos = tokenizer.add_bos if prepend_bos is None else prepend_bos
        texts = []
        for b, row in enumerate(out.tolist()):
            start = P - int(mask[b].sum()) + (1 if bos else 0)  # the real prompt, BOS left out
            new = row[P:]
            eos = kwargs["eos"]
            if eos is not None and eos in new:
                new = new[: new.index(eos) + 1]
            texts.append(str(tokenizer.decode(row[start:P] + new)))
        return texts[0] if isinstance(input, str) else texts

    # -- the interpret toolkit on text ----------------------------------------------------

    def _call_kwargs(self, input: Any, kwargs: dict[str, Any], what: str) -> tuple[Any, dict]:
        ids, mask = self._ids_and_mask(
            input,
            kwargs.pop("attention_mask", None),
            kwargs.pop("prepend_bos", None),
            kwargs.pop("padding_side", None),
            what,
        )
        if mask is not None:
            kwargs["attention_mask"] = mask
        return ids, kwargs

    def run_with_cache(
        self, input: Any, *args: Any, names_filter: Any = None, **kwargs: Any
    ) -> tuple[Any, Any]:
        """(output, ActivationCache) of one forward on text or ids (see
        `multihead.interpret.run_with_cache`; `names_filter` is its `names`). Text keywords:
        `prepend_bos`, `padding_side`."""
        ids, kwargs = self._call_kwargs(input, kwargs, "run_with_cache")
        return run_with_cache(self, ids, *args, names=names_filter, **kwargs)  # type: ignore[arg-type]

    def run_with_hooks(
        self, input: Any, *args: Any, fwd_hooks: Sequence = (), **kwargs: Any
    ) -> Any:
        """The output of one forward on text or ids with `fwd_hooks` (see
        `multihead.interpret.run_with_hooks`)."""
        ids, kwargs = self._call_kwargs(input, kwargs, "run_with_hooks")
        return run_with_hooks(self, ids, *args, fwd_hooks=fwd_hooks, **kwargs)  # type: ignore[arg-type]

    @contextmanager
    def ablate(self, heads: Any, method: str = "zero", **kwargs: Any) -> Iterator[None]:
        """`multihead.interpret.ablate(self, heads, method, ...)`; `reference` may be text."""
        reference = kwargs.pop("reference", None)
        if is_text(reference):
            reference, kwargs = self._call_kwargs(reference, kwargs, "ablate")
            if "attention_mask" in kwargs:
                kwargs["reference_mask"] = kwargs["attention_mask"]
        with ablate(self, heads, method, reference=reference, **kwargs):  # type: ignore[arg-type]
            yield

    def patch(self, clean: Any, corrupted: Any, metric: Any, **kwargs: Any) -> Any:
        """`multihead.interpret.patch(self, clean, corrupted, metric, ...)`; clean and
        corrupted may be texts (they must tokenise to the same number of tokens)."""
        prepend_bos = kwargs.pop("prepend_bos", None)
        pair = []
        for name, x in (("clean", clean), ("corrupted", corrupted)):
            if is_text(x):
                x, mask = self._ids_and_mask(x, None, prepend_bos, None, "patch")
                if mask is not None:
                    raise ValueError(f"patch: the {name} texts tokenise to different lengths")
            pair.append(x)
        a, b = pair
        if isinstance(a, Tensor) and isinstance(b, Tensor) and a.shape != b.shape:
            raise ValueError(
                f"patch: clean {tuple(a.shape)} and corrupted {tuple(b.shape)} token ids differ "
                "in shape (patching aligns positions); make the texts the same number of tokens"
            )
        return patch(self, a, b, metric, **kwargs)  # type: ignore[arg-type]
