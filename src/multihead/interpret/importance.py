"""Head importance for a sentence encoder, through per-head gates (no weights are edited).

- ablation: 1 - cosine between the normal and the ablated sentence embedding, averaged over a
  corpus, for each head zeroed alone (or each layer's heads together);
- gradient (Michel et al. 2019): |d loss / d gate_h| averaged over batches, normalised per layer
  (L2). An embedding model has no task loss, so the loss is in-batch retrieval: each text's
  gated embedding must pick out its own ungated embedding among the batch's (cross-entropy over
  cosine similarities / 0.05, the temperature MiniLM-style models are trained with);
- pruning curve: heads removed in order of increasing importance, with the mean cosine to the
  unablated embeddings after each step.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from .gates import head_gates


def _batches(encoder, texts: Sequence[str], batch_size: int) -> list[tuple[Tensor, Tensor]]:
    ids = encoder.tokenize(list(texts))
    return [encoder.batch(ids[i : i + batch_size]) for i in range(0, len(ids), batch_size)]


def _embed(encoder, batches) -> Tensor:
    out = []
    for input_ids, mask in batches:
        hidden = encoder(input_ids, mask).last_hidden_state
        out.append(F.normalize(encoder.mean_pool(hidden, mask), dim=-1))
    return torch.cat(out)


def _shape(encoder) -> tuple[int, int]:
    return len(encoder.model.layers), encoder.model.config.num_attention_heads


def _cosine_drop(reference: Tensor, ablated: Tensor) -> float:
    return float((1 - (reference * ablated).sum(-1)).mean())


def ablation_importance(
    encoder, texts: Sequence[str], *, batch_size: int = 32, progress: bool = False
) -> Tensor:
    """(L, H): mean 1 - cos(normal, head-ablated) sentence embedding over `texts`."""
    L, H = _shape(encoder)
    batches = _batches(encoder, texts, batch_size)
    out = torch.zeros(L, H)
    heads = [(layer, head) for layer in range(L) for head in range(H)]
    if progress:
        from tqdm.auto import tqdm

        heads = tqdm(heads, desc="ablating heads", unit="head")
    with torch.inference_mode():
        reference = _embed(encoder, batches)
        for layer, head in heads:
            gates = torch.ones(L, H)
            gates[layer, head] = 0
            with head_gates(encoder, gates):
                out[layer, head] = _cosine_drop(reference, _embed(encoder, batches))
    return out


def layer_ablation_importance(encoder, texts: Sequence[str], *, batch_size: int = 32) -> Tensor:
    """(L,): mean 1 - cos when all heads of one layer are zeroed."""
    L, H = _shape(encoder)
    batches = _batches(encoder, texts, batch_size)
    out = torch.zeros(L)
    with torch.inference_mode():
        reference = _embed(encoder, batches)
        for layer in range(L):
            gates = torch.ones(L, H)
            gates[layer] = 0
            with head_gates(encoder, gates):
                out[layer] = _cosine_drop(reference, _embed(encoder, batches))
    return out


def gradient_importance(
    encoder, texts: Sequence[str], *, batch_size: int = 32, temperature: float = 0.05
) -> Tensor:
    """(L, H): |d loss / d gate| averaged over batches, each layer's row scaled to unit L2 norm."""
    L, H = _shape(encoder)
    batches = _batches(encoder, texts, batch_size)
    gates = torch.ones(L, H, requires_grad=True)
    total = torch.zeros(L, H)
    for input_ids, mask in batches:
        with torch.no_grad():
            target = _embed(encoder, [(input_ids, mask)])
        with torch.enable_grad(), head_gates(encoder, gates):
            gated = _embed(encoder, [(input_ids, mask)])
            logits = gated @ target.T / temperature  # (B, B): row i must pick column i
            loss = F.cross_entropy(logits, torch.arange(len(logits)))
            (grad,) = torch.autograd.grad(loss, gates)
        total += grad.abs()
    total /= len(batches)
    return total / total.norm(dim=1, keepdim=True).clamp_min(1e-12)


def pruning_curve(
    encoder, texts: Sequence[str], importance: Tensor, *, step: int = 1, batch_size: int = 32
) -> list[tuple[int, float]]:
    """[(heads removed, mean cosine to the unablated embeddings)], least important first."""
    L, H = importance.shape
    order = importance.flatten().argsort().tolist()
    batches = _batches(encoder, texts, batch_size)
    curve = [(0, 1.0)]
    gates = torch.ones(L * H)
    with torch.inference_mode():
        reference = _embed(encoder, batches)
        for removed in range(step, L * H + 1, step):
            gates[order[removed - step : removed]] = 0
            with head_gates(encoder, gates.view(L, H)):
                cos = (reference * _embed(encoder, batches)).sum(-1).mean()
            curve.append((removed, float(cos)))
    return curve
