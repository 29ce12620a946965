"""`multihead.CausalLM`: the network (`multihead.modules.lm.CausalLM`) with the tokenizer it
carries, so that it reads and writes text: `to_tokens`, `to_str_tokens`, `to_string`,
`forward("text")`, `generate("text")`, and `run_with_cache`, `run_with_hooks`, `ablate`, `patch`
on text or ids (see `text_methods.py`). Every loader builds this class; the network below it
knows nothing of tokenizers or of the interpretability toolkit.

Shapes: input_ids (B, T) -> logits (B, T, V).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..hook_points import caches_as
from ..modules import lm
from ..modules.quantized.linear import weight_like
from .text_methods import TextMethods, is_text


class CausalLM(lm.CausalLM, TextMethods):
    """A causal LM that takes text where it takes token ids (see `multihead.modules.lm.CausalLM`
    for the network and its hook points). `tokenizer`: the ModelTokenizer it carries (set by
    the loaders; None: ids only)."""

    def forward(self, input_ids: Any, *, attention_mask: Tensor | None = None, **kwargs: Any):
        """Logits (B, T, V) (see the network's `forward`); `input_ids` may be text (a str or a
        list, see `to_tokens`; padding gets its mask)."""
        if is_text(input_ids):
            input_ids, attention_mask = self._ids_and_mask(
                input_ids, attention_mask, None, None, "forward"
            )
        return super().forward(input_ids, attention_mask=attention_mask, **kwargs)

    @caches_as("positions")
    def generate(self, prompt_ids: Any, max_new_tokens: int, **kwargs: Any) -> Any:
        """(B, P + new): the prompts followed by the generated tokens (see generate_stream).
        Text prompts give text back (see `TextMethods.generate_text`)."""
        if is_text(prompt_ids):
            return self.generate_text(prompt_ids, max_new_tokens, **kwargs)
        return super().generate(prompt_ids, max_new_tokens, **kwargs)

    def _text_max_length(self) -> int | None:
        return self.config.max_positions if self.config.positions_bounded() else None

    def _text_device(self) -> torch.device:
        return weight_like(self.tok).device
