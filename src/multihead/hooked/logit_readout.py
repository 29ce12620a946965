"""How a causal LM turns its final residual stream into logits, as direct logit attribution
(`multihead.interpret.attribution`) reads it; a bridged model builds one too (`multihead.bridge`),
so the record sits below both."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass(frozen=True)
class LogitReadout:
    """How a causal LM turns its final residual stream into logits, as DLA reads it: a final
    norm (centred for LayerNorm, not for RMSNorm; `eps`; its effective per-channel `weight`
    and `bias`), the unembedding (V, C) with its optional bias, times `logit_scale`. A native
    `CausalLM` gives it from its modules; another model gives it by a `logit_readout()` method
    (a bridged transformers model: `multihead.bridge`), and then `check_sum` asks DLA to
    verify that the components add up to the model's logit, and to refuse when they do not
    (an architecture whose branches are scaled or normalised before they join the stream)."""

    centred: bool
    eps: float
    weight: Tensor | None
    bias: Tensor | None
    unembed: Tensor  # (V, C)
    unembed_bias: Tensor | None  # (V,)
    logit_scale: float
    has_pos: bool
    out_biases: list[Tensor | None]  # each layer's output-projection bias (C,)
    check_sum: bool = False
    name: str = ""  # the architecture, as errors name it
