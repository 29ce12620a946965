"""Head metrics: pure functions of attention weights (nothing here runs a model).

Shapes: `attn` is (L, H, T, T) for one text: layer, head, query, key; rows sum to 1. Padding
is excluded by passing each text's own (L, H, T, T) (see `corpus_metrics`). `tokens` are the T
token strings. Every per-head metric returns an (L, H) tensor.
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Iterable, Sequence

import torch
from torch import Tensor

SPECIAL_TOKENS = frozenset({"[CLS]", "[SEP]", "<s>", "</s>", "[PAD]", "<pad>"})


def is_punctuation(token: str) -> bool:
    """True for tokens made only of punctuation (WordPiece '##' stripped)."""
    text = token.removeprefix("##")
    return bool(text) and all(unicodedata.category(c).startswith("P") for c in text)


def _check(attn: Tensor) -> Tensor:
    if attn.dim() != 4 or attn.shape[-1] != attn.shape[-2]:
        raise ValueError(f"attn must have shape (L, H, T, T), got {tuple(attn.shape)}")
    return attn.double()


def diagonal_mass(attn: Tensor, offset: int) -> Tensor:
    """Mean weight a query i puts on key i + offset, over the queries that have one."""
    a = _check(attn)
    T = a.shape[-1]
    if T <= abs(offset):
        return a.new_zeros(a.shape[:2])
    return a.diagonal(offset=offset, dim1=-2, dim2=-1).mean(-1)


def previous_token(attn: Tensor) -> Tensor:
    return diagonal_mass(attn, -1)


def next_token(attn: Tensor) -> Tensor:
    return diagonal_mass(attn, 1)


def same_token(attn: Tensor) -> Tensor:
    return diagonal_mass(attn, 0)


def offset_share(attn: Tensor) -> tuple[Tensor, Tensor]:
    """For each head, the most common offset (argmax key - query) and the share of queries whose
    strongest key is at that offset. A head is *positional* when the share is >= 0.9."""
    a = _check(attn)
    L, H, T, _ = a.shape
    offsets = a.argmax(-1) - torch.arange(T)  # (L, H, T), in [-(T-1), T-1]
    counts = torch.zeros(L, H, 2 * T - 1, dtype=torch.long)
    counts.scatter_add_(-1, offsets + T - 1, torch.ones_like(offsets))
    best = counts.argmax(-1)
    share = counts.gather(-1, best[..., None])[..., 0].double() / T
    return share, best - (T - 1)


def column_mass(attn: Tensor, columns: Tensor) -> Tensor:
    """Mean over queries of the total weight on the keys where `columns` (T,) is True."""
    a = _check(attn)
    return (a * columns.to(a.dtype)).sum(-1).mean(-1)


def special_mass(attn: Tensor, tokens: Sequence[str], special=SPECIAL_TOKENS) -> Tensor:
    return column_mass(attn, torch.tensor([t in special for t in tokens]))


def punctuation_mass(attn: Tensor, tokens: Sequence[str]) -> Tensor:
    return column_mass(attn, torch.tensor([is_punctuation(t) for t in tokens]))


def entropy(attn: Tensor) -> tuple[Tensor, Tensor]:
    """Mean row entropy in nats, and normalised by log T (1 = uniform over all keys)."""
    a = _check(attn)
    nats = -(a * a.clamp_min(1e-30).log()).sum(-1).mean(-1)
    T = a.shape[-1]
    return nats, nats / math.log(T) if T > 1 else torch.zeros_like(nats)


def confidence(
    attn: Tensor, tokens: Sequence[str] | None = None, *, exclude_special: bool = False
) -> Tensor:
    """Mean of each row's largest weight. With `exclude_special`, special-token columns and rows
    are dropped and rows renormalised first (so a [CLS]-sink head is not 'confident')."""
    a = _check(attn)
    if exclude_special:
        if tokens is None:
            raise ValueError("exclude_special=True needs the tokens")
        keep = torch.tensor([t not in SPECIAL_TOKENS for t in tokens])
        if not keep.any():
            return a.new_zeros(a.shape[:2])
        a = a[..., keep, :][..., keep]
        a = a / a.sum(-1, keepdim=True).clamp_min(1e-30)
    return a.max(-1).values.mean(-1)


def js_distance(attn: Tensor) -> Tensor:
    """(L*H, L*H) Jensen-Shannon distance between heads (base 2, in [0, 1]), averaged over
    query rows; head index = layer * H + head."""
    a = _check(attn)
    L, H, T, _ = a.shape
    p = a.reshape(L * H, T, T)

    def kl(x: Tensor, y: Tensor) -> Tensor:
        return (x * (x.clamp_min(1e-30).log2() - y.clamp_min(1e-30).log2())).sum(-1)

    out = torch.empty(L * H, L * H, dtype=a.dtype)
    for i in range(L * H):  # one row at a time bounds memory at (L*H, T, T)
        m = 0.5 * (p[i] + p)
        js = 0.5 * kl(p[i].expand_as(p), m) + 0.5 * kl(p, m)
        out[i] = js.clamp_min(0).mean(-1).sqrt()
    return out


def rollout(attn: Tensor, residual: float = 0.5) -> Tensor:
    """Attention rollout (Abnar & Zuidema 2020): (T, T), row i = how much each input token
    flows into output token i, through head-averaged attention plus the residual stream."""
    a = _check(attn)
    T = a.shape[-1]
    eye = torch.eye(T, dtype=a.dtype)
    flow = eye
    for layer in a.mean(1):  # (T, T) per layer, heads averaged
        step = residual * eye + (1 - residual) * layer
        step = step / step.sum(-1, keepdim=True)
        flow = step @ flow
    return flow


def copy_scores(attn: Tensor, first: int, second: int, n: int) -> tuple[Tensor, Tensor]:
    """Duplicate-token and induction scores on a text holding a random token sequence of length
    n at `first` and again at `second`: for a query at second + t, the mean weight on
    first + t (the same token earlier: duplicate) and on first + t + 1 (the token that
    followed it: induction)."""
    a = _check(attn)
    t = torch.arange(n)
    dup = a[:, :, second + t, first + t].mean(-1)
    t = t[:-1]
    ind = a[:, :, second + t, first + t + 1].mean(-1) if n > 1 else torch.zeros_like(dup)
    return dup, ind


def head_metrics(attn: Tensor, tokens: Sequence[str]) -> dict[str, Tensor]:
    """Every per-head metric of one text: name -> (L, H)."""
    if len(tokens) != attn.shape[-1]:
        raise ValueError(f"{len(tokens)} tokens for attention over {attn.shape[-1]} positions")
    share, offset = offset_share(attn)
    nats, normalised = entropy(attn)
    return {
        "previous": previous_token(attn),
        "next": next_token(attn),
        "self": same_token(attn),
        "positional": share,
        "positional_offset": offset.double(),
        "special": special_mass(attn, tokens),
        "punctuation": punctuation_mass(attn, tokens),
        "entropy": nats,
        "entropy_norm": normalised,
        "confidence": confidence(attn),
        "confidence_content": confidence(attn, tokens, exclude_special=True),
    }


def corpus_metrics(texts: Iterable[tuple[Tensor, Sequence[str]]]) -> dict[str, Tensor]:
    """`head_metrics` averaged over texts (each its own unpadded (L, H, T, T) and tokens).
    The positional offset is the most common one across texts."""
    totals: dict[str, Tensor] = {}
    offsets = []
    count = 0
    for attn, tokens in texts:
        m = head_metrics(attn, tokens)
        offsets.append(m.pop("positional_offset"))
        for k, v in m.items():
            totals[k] = totals.get(k, 0) + v
        count += 1
    if count == 0:
        raise ValueError("corpus_metrics needs at least one text")
    out = {k: v / count for k, v in totals.items()}
    out["positional_offset"] = torch.stack(offsets).mode(0).values
    return out


METRIC_NAMES = (
    "previous",
    "next",
    "self",
    "positional",
    "positional_offset",
    "special",
    "punctuation",
    "entropy",
    "entropy_norm",
    "confidence",
    "confidence_content",
    "duplicate",
    "induction",
)
