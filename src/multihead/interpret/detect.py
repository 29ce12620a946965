"""Head detectors on any input, as TransformerLens's `detect_head`: how much of each head's
attention follows a template (previous token, duplicate token, induction, sink, or your own).

    scores = detect_head(model, ids, "induction_head")          # (L, H); ids (T,) or (B, T)
    scores = detect_head(model, ids, my_pattern, cache=cache)   # a (T, T) or (B, T, T) template
    head_scores(cache.stack("pattern"), induction_pattern(ids))  # the same, a pure function

Scores (per sequence, then averaged over the batch, as TransformerLens averages a list):
- "mul" (default): sum(A * P) / sum(A) over the (T, T) pattern A of a head and the template P:
  the share of the head's attention that falls where the template has weight.
- "abs": 1 - sum(|A - P|) / T: how close the pattern is to the template (1 = identical; the
  template must be causal, lower-triangular). TransformerLens rounds it to 3 decimals; we do not.
`exclude_bos` zeroes the first key's column and `exclude_current_token` the diagonal (of A for
"mul", of |A - P| for "abs") before scoring, as TransformerLens does.

Templates (B, T, T), float, 1 where a query i should attend to key j:
previous token (j = i - 1), duplicate token (j < i holds the same token), induction (j - 1 < i
holds the token i holds: attend to what followed its earlier occurrence), sink (j in `positions`).

Shapes: patterns (L, B, H, T, T) (a cache's `stack("pattern")`); scores (L, H).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ..hooked.hooks import run_with_cache, unwrap

TEMPLATES = ("previous_token_head", "duplicate_token_head", "induction_head", "sink")
Heads = Sequence[tuple[int, int]] | Mapping[int, Sequence[int]] | None


def _ids(tokens: Tensor) -> Tensor:
    if (
        not isinstance(tokens, Tensor)
        or tokens.dtype.is_floating_point
        or tokens.dim()
        not in (
            1,
            2,
        )
    ):
        got = tuple(tokens.shape) if isinstance(tokens, Tensor) else type(tokens).__name__
        raise ValueError(f"tokens must be token ids (T,) or (B, T), got {got}")
    return tokens if tokens.dim() == 2 else tokens[None]


def previous_token_pattern(T: int, *, device: Any = None) -> Tensor:
    """(T, T): query i attends to key i - 1 (row 0 is empty)."""
    return torch.eye(T, device=device).roll(-1, dims=1).tril()


def duplicate_token_pattern(tokens: Tensor) -> Tensor:
    """(B, T, T): query i attends to every earlier key holding the same token."""
    ids = _ids(tokens)
    same = (ids[:, :, None] == ids[:, None, :]).float()  # (B, T, T)
    return same.tril(-1)


def induction_pattern(tokens: Tensor) -> Tensor:
    """(B, T, T): query i attends to key j when key j - 1 holds query i's token (j <= i)."""
    dup = duplicate_token_pattern(tokens)
    shifted = torch.zeros_like(dup)
    shifted[:, :, 1:] = dup[:, :, :-1]  # column j takes column j - 1
    return shifted.tril()


def sink_pattern(T: int, positions: Sequence[int] = (0,), *, device: Any = None) -> Tensor:
    """(T, T): every query attends to the keys at `positions` (default the first token)."""
    pattern = torch.zeros(T, T, device=device)
    pattern[:, list(positions)] = 1
    return pattern.tril()


def template(name: str, tokens: Tensor) -> Tensor:
    """The named template for `tokens` (B, T) -> (B, T, T)."""
    ids = _ids(tokens)
    B, T = ids.shape
    if name == "previous_token_head":
        return previous_token_pattern(T, device=ids.device).expand(B, T, T)
    if name == "duplicate_token_head":
        return duplicate_token_pattern(ids)
    if name == "induction_head":
        return induction_pattern(ids)
    if name == "sink":
        return sink_pattern(T, device=ids.device).expand(B, T, T)
    raise ValueError(f"detection_pattern must be one of {TEMPLATES} or a tensor, got {name!r}")


def head_scores(
    patterns: Tensor,
    detection_pattern: Tensor,
    *,
    exclude_bos: bool = False,
    exclude_current_token: bool = False,
    error_measure: str = "mul",
) -> Tensor:
    """Every head's score against `detection_pattern` (T, T) or (B, T, T): `patterns`
    (L, B, H, T, T) -> (L, H), each sequence scored alone, then averaged over B."""
    if error_measure not in ("mul", "abs"):
        raise ValueError(f"error_measure must be 'mul' or 'abs', got {error_measure!r}")
    if patterns.dim() != 5 or patterns.shape[-1] != patterns.shape[-2]:
        raise ValueError(f"patterns must be (L, B, H, T, T), got {tuple(patterns.shape)}")
    B, T = patterns.shape[1], patterns.shape[-1]
    p = detection_pattern.to(patterns.device, patterns.dtype)
    if p.dim() == 2:
        p = p[None]
    if p.dim() != 3 or p.shape[-2:] != (T, T) or p.shape[0] not in (1, B):
        raise ValueError(
            f"detection_pattern must be (T, T) or (B, T, T) = ({B}, {T}, {T}), got "
            f"{tuple(detection_pattern.shape)}"
        )
    p = p[None, :, None]  # (1, B or 1, 1, T, T)
    keep = torch.ones(T, T, dtype=torch.bool, device=patterns.device)
    if exclude_bos:
        keep[:, 0] = False
    if exclude_current_token:
        keep.fill_diagonal_(False)
    if error_measure == "mul":
        a = patterns * keep
        per_sequence = (a * p).sum((-2, -1)) / a.sum((-2, -1))  # (L, B, H)
    else:
        if (p.triu(1) != 0).any():
            raise ValueError("error_measure='abs' needs a causal (lower-triangular) template")
        diff = (patterns - p).abs() * keep
        per_sequence = 1 - diff.sum((-2, -1)) / T
    return per_sequence.mean(1)


def _select(scores: Tensor, heads: Heads) -> Tensor:
    """Scores of the listed heads; -1 elsewhere (TransformerLens's convention)."""
    if heads is None:
        return scores
    pairs = (
        [(layer, h) for layer, hs in heads.items() for h in hs]
        if isinstance(heads, Mapping)
        else list(heads)
    )
    out = torch.full_like(scores, -1.0)
    L, H = scores.shape
    for layer, h in pairs:
        if not (0 <= layer < L and 0 <= h < H):
            raise ValueError(f"heads: ({layer}, {h}) is not a head of a ({L}, {H}) model")
        out[layer, h] = scores[layer, h]
    return out


def detect_head(
    model: nn.Module,
    seq: Tensor | str | Sequence[str],
    detection_pattern: str | Tensor,
    heads: Heads = None,
    cache: Mapping[str, Tensor] | None = None,
    *,
    exclude_bos: bool = False,
    exclude_current_token: bool = False,
    error_measure: str = "mul",
) -> Tensor:
    """TransformerLens's `detect_head`, batched: each head's score (L, H) on `seq` (token ids
    (T,) or (B, T), or text when the model can tokenize it: `model.to_tokens`) against a named
    template (`TEMPLATES`) or a (T, T) / (B, T, T) tensor. `heads`: [(layer, head)] or
    {layer: [heads]} to score (others -1). `cache`: a cache of this input's patterns (else the
    model is run once). See the module docstring for the scores."""
    lm = unwrap(model)
    if isinstance(seq, str) or (isinstance(seq, Sequence) and not isinstance(seq, Tensor)):
        to_tokens = getattr(lm, "to_tokens", None)
        if to_tokens is None:
            raise TypeError(
                f"seq is text, but {type(lm).__name__} has no tokenizer (to_tokens): pass ids"
            )
        seq = to_tokens(seq)
    ids = _ids(seq)  # type: ignore[arg-type]
    if cache is None:
        with torch.no_grad():
            _, cache = run_with_cache(lm, ids, names=lambda n: n.endswith("attn.hook_pattern"))
    layers: list[Tensor] = []
    while f"blocks.{len(layers)}.attn.hook_pattern" in cache:
        layers.append(cache[f"blocks.{len(layers)}.attn.hook_pattern"])
    if not layers:
        raise ValueError("the cache holds no blocks.{i}.attn.hook_pattern")
    patterns = torch.stack(layers)  # (L, B, H, T, T)
    if patterns.dim() == 4:  # a cache without its batch dimension
        patterns = patterns[:, None]
    if patterns.shape[1] != ids.shape[0] or patterns.shape[-1] != ids.shape[-1]:
        raise ValueError(
            f"the cache's patterns {tuple(patterns.shape)} are not of seq {tuple(ids.shape)}"
        )
    if isinstance(detection_pattern, str):
        detection = template(detection_pattern, ids.to(patterns.device))
    else:
        detection = detection_pattern
    scores = head_scores(
        patterns.float(),
        detection,
        exclude_bos=exclude_bos,
        exclude_current_token=exclude_current_token,
        error_measure=error_measure,
    )
    return _select(scores, heads)
