"""What every decoder family shares once its weights are loaded into a CausalLM."""

from __future__ import annotations

from torch import nn

from ..modules.lm import CausalLM, LMConfig


def tied_head(config: LMConfig) -> dict[str, str]:
    """The output head is the embedding matrix when tied: one tensor under two keys."""
    return {"head.weight": "tok.weight"} if config.tie_embeddings else {}


def finish_causal_lm(model: nn.Module) -> None:
    """Tie the head again (loading with assign=True gives each key its own Parameter) and lay
    the matrices out as CausalLM keeps them for decoding."""
    assert isinstance(model, CausalLM)
    if model.config.tie_embeddings and isinstance(model.head, nn.Linear):  # (not packed)
        model.head.weight = model.tok.weight
    model._column_major_weights()
