"""Head importance, through per-head gates (no weights are edited), for any inspectable model:
what is measured is the subject's objective (see `objectives`), so the same functions serve an
encoder and a causal LM.

- ablation: the objective's change when a head is zeroed alone (or each layer's heads together),
  over a corpus: for a sentence encoder 1 - cosine between the normal and the ablated sentence
  embedding; for a causal LM the increase of the mean next-token loss (nats per token);
- gradient (Michel et al. 2019): |d loss / d gate_h| averaged over batches, normalised per layer
  (L2); the loss is next-token loss for a causal LM, and in-batch retrieval for a sentence
  encoder (an embedding model has no task loss);
- pruning curve: heads removed in order of increasing importance, with the objective's score
  after each step (mean cosine to the unablated embeddings; next-token loss).

`model`: a `Subject` or a `SentenceEncoder` (see `subject.as_subject`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .gates import head_gates
from .subject import as_subject


def ablation_importance(
    model, texts: Sequence[str], *, batch_size: int = 32, progress: bool = False
) -> Tensor:
    """(L, H): the objective's change over `texts` when each head alone is zeroed."""
    subject = as_subject(model)
    L, H = subject.num_layers, subject.num_heads
    objective = subject.objective
    batches = objective.batches(texts, batch_size)
    out = torch.zeros(L, H)
    heads = [(layer, head) for layer in range(L) for head in range(H)]
    if progress:
        from tqdm.auto import tqdm

        heads = tqdm(heads, desc="ablating heads", unit="head")
    with torch.inference_mode():
        reference = objective.outputs(batches)
        for layer, head in heads:
            gates = torch.ones(L, H)
            gates[layer, head] = 0
            with head_gates(subject.model, gates):
                ablated = objective.outputs(batches)
            out[layer, head] = objective.ablation_effect(reference, ablated)
    return out


def layer_ablation_importance(model, texts: Sequence[str], *, batch_size: int = 32) -> Tensor:
    """(L,): the objective's change when all heads of one layer are zeroed."""
    subject = as_subject(model)
    L, H = subject.num_layers, subject.num_heads
    objective = subject.objective
    batches = objective.batches(texts, batch_size)
    out = torch.zeros(L)
    with torch.inference_mode():
        reference = objective.outputs(batches)
        for layer in range(L):
            gates = torch.ones(L, H)
            gates[layer] = 0
            with head_gates(subject.model, gates):
                out[layer] = objective.ablation_effect(reference, objective.outputs(batches))
    return out


def gradient_importance(model, texts: Sequence[str], *, batch_size: int = 32) -> Tensor:
    """(L, H): |d loss / d gate| averaged over batches, each layer's row scaled to unit L2 norm."""
    subject = as_subject(model)
    L, H = subject.num_layers, subject.num_heads
    objective = subject.objective
    batches = objective.batches(texts, batch_size)
    gates = torch.ones(L, H, requires_grad=True, device=subject.device)
    total = torch.zeros(L, H)
    for batch in batches:
        with torch.enable_grad():
            loss = objective.loss(batch, lambda: head_gates(subject.model, gates))
            (grad,) = torch.autograd.grad(loss, gates)
        total += grad.abs().cpu()
    total /= len(batches)
    return total / total.norm(dim=1, keepdim=True).clamp_min(1e-12)


def pruning_curve(
    model, texts: Sequence[str], importance: Tensor, *, step: int = 1, batch_size: int = 32
) -> list[tuple[int, float]]:
    """[(heads removed, the objective's score)], least important first; the first point is the
    unablated model (score 1.0 for an encoder's cosine; its own loss for a causal LM)."""
    subject = as_subject(model)
    L, H = importance.shape
    if (L, H) != (subject.num_layers, subject.num_heads):
        raise ValueError(
            f"importance must have shape (layers, heads) = ({subject.num_layers}, "
            f"{subject.num_heads}), got {tuple(importance.shape)}"
        )
    objective = subject.objective
    order = importance.flatten().argsort().tolist()
    batches = objective.batches(texts, batch_size)
    gates = torch.ones(L * H)
    with torch.inference_mode():
        reference = objective.outputs(batches)
        curve = [(0, objective.score(reference, reference))]
        for removed in range(step, L * H + 1, step):
            gates[order[removed - step : removed]] = 0
            with head_gates(subject.model, gates.view(L, H)):
                curve.append((removed, objective.score(reference, objective.outputs(batches))))
    return curve
