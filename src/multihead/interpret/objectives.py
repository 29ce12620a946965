"""What head importance measures, per kind of model: the quantity an ablation changes and the
loss a gradient is taken of. `interpret.importance` runs either without asking which it holds.

- `EmbeddingObjective` (sentence encoders): outputs are the normalised sentence embeddings; an
  ablation's effect is 1 - cosine to the unablated embedding; the loss is in-batch retrieval
  (an embedding model has no task loss: each text's gated embedding must pick out its own
  ungated one among the batch's, cross-entropy over cosine similarities / temperature).
- `NextTokenObjective` (causal LMs): outputs are the next-token losses of every predicted
  token (nats); an ablation's effect is the increase of their mean; the loss is their mean.

Shapes: input_ids and attention_mask (B, T); embeddings (B, C); logits (B, T, V).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..pretrained.encoder import SentenceEncoder

# A context manager factory that switches head gates on (see `importance.gradient_importance`).
Gated = Callable[[], AbstractContextManager[Any]]


@dataclass(frozen=True)
class Batch:
    input_ids: Tensor  # (B, T), right-padded
    attention_mask: Tensor  # (B, T), 1 = token


def pad_right(ids: Sequence[Sequence[int]], pad_id: int = 0) -> Batch:
    """Token ids of several texts, right-padded to the longest, with their mask."""
    T = max(len(x) for x in ids)
    input_ids = np.full((len(ids), T), pad_id, dtype=np.int64)
    mask = np.zeros((len(ids), T), dtype=np.int64)
    for row, x in enumerate(ids):
        input_ids[row, : len(x)] = x
        mask[row, : len(x)] = 1
    return Batch(torch.from_numpy(input_ids), torch.from_numpy(mask))


class EmbeddingObjective:
    """Importance through a sentence encoder's embedding (a `SentenceEncoder`)."""

    effect = "1 - cosine between the normal and the head-ablated sentence embedding"
    score_name = "mean cosine to the unablated embeddings"
    loss_name = "in-batch retrieval loss"

    def __init__(self, encoder: SentenceEncoder, temperature: float = 0.05) -> None:
        self.encoder = encoder
        self.temperature = temperature  # MiniLM-style models are trained with 0.05

    def batches(self, texts: Sequence[str], batch_size: int) -> list[Batch]:
        ids = self.encoder.tokenize(list(texts))
        return [
            Batch(*self.encoder.batch(ids[i : i + batch_size]))
            for i in range(0, len(ids), batch_size)
        ]

    def outputs(self, batches: Sequence[Batch]) -> Tensor:
        """(N, C) unit-length sentence embeddings, under whatever gates are active."""
        out = []
        device = self.encoder.device
        for b in batches:
            ids, mask = b.input_ids.to(device), b.attention_mask.to(device)
            hidden = self.encoder(ids, mask).last_hidden_state
            out.append(F.normalize(self.encoder.pool(hidden, mask), dim=-1))  # its own pooling
        return torch.cat(out).cpu()

    def ablation_effect(self, reference: Tensor, outputs: Tensor) -> float:
        return float((1 - (reference * outputs).sum(-1)).mean())

    def score(self, reference: Tensor, outputs: Tensor) -> float:
        return float((reference * outputs).sum(-1).mean())

    def loss(self, batch: Batch, gated: Gated) -> Tensor:
        """The retrieval loss of the gated embeddings against the ungated ones; `gated()` is a
        context manager that switches the gates on."""
        with torch.no_grad():
            target = self.outputs([batch])
        with gated():
            mine = self.outputs([batch])
        logits = mine @ target.T / self.temperature  # (B, B): row i must pick column i
        return F.cross_entropy(logits, torch.arange(len(logits)))


class NextTokenObjective:
    """Importance through a causal LM's next-token loss (a `CausalLM`); texts are tokenised by
    `tokenize` (the subject's: BOS first where the model has one, cut to its token limit)."""

    effect = "increase of the next-token loss (nats per token) when the head is zeroed"
    score_name = "next-token loss (nats per token)"
    loss_name = "next-token loss"

    def __init__(self, model: nn.Module, tokenize: Callable[[str], list[int]]) -> None:
        self.model = model
        self.tokenize = tokenize

    def batches(self, texts: Sequence[str], batch_size: int) -> list[Batch]:
        ids = [self.tokenize(t) for t in texts]
        if all(len(x) < 2 for x in ids):
            raise ValueError(
                "the texts give no next-token pair: each is one token long (with BOS, if any)"
            )
        return [pad_right(ids[i : i + batch_size]) for i in range(0, len(ids), batch_size)]

    def _token_losses(self, batch: Batch) -> Tensor:
        """(n,) the loss of every predicted token of the batch (padding left out)."""
        device = next(self.model.parameters()).device
        ids, mask = batch.input_ids.to(device), batch.attention_mask.to(device)
        logits = self.model(ids, attention_mask=mask)[:, :-1]  # (B, T-1, V): predicts ids[:, 1:]
        valid = mask[:, 1:].bool()  # right padding: a real target has a real token before it
        losses = F.cross_entropy(logits.float().transpose(1, 2), ids[:, 1:], reduction="none")
        return losses[valid]  # (B, T-1) -> (n,)

    def outputs(self, batches: Sequence[Batch]) -> Tensor:
        return torch.cat([self._token_losses(b) for b in batches]).cpu()

    def ablation_effect(self, reference: Tensor, outputs: Tensor) -> float:
        return float(outputs.mean() - reference.mean())

    def score(self, reference: Tensor, outputs: Tensor) -> float:
        return float(outputs.mean())

    def loss(self, batch: Batch, gated: Gated) -> Tensor:
        with gated():
            return self._token_losses(batch).mean()
