"""Head metrics: pure functions of attention weights (nothing here runs a model).

Shapes: `attn` is (L, H, T, T) for one text: layer, head, query, key; rows sum to 1. Padding
is excluded by passing each text's own (L, H, T, T) (see `corpus_metrics`). `tokens` are the T
token strings. Every per-head metric returns an (L, H) tensor.

Causal patterns (`causal=True`): only the lower triangle can hold weight, and query 0 sees only
itself (its one weight is 1, whatever the head does), so metrics that average over queries leave
it out (`choice_rows`), and attention to later tokens (`next_token`) is undefined, not 0.
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Iterable, Sequence

import torch
from torch import Tensor

from ..metric_names import METRIC_NAMES  # noqa: F401  (re-exported: the metrics computed here)

SPECIAL_TOKENS = frozenset({"[CLS]", "[SEP]", "<s>", "</s>", "[PAD]", "<pad>"})


def is_punctuation(token: str) -> bool:
    """True for tokens made only of punctuation (WordPiece '##' and surrounding whitespace,
    as in decoded byte-level tokens like " ,", stripped)."""
    text = token.strip().removeprefix("##")
    return bool(text) and all(unicodedata.category(c).startswith("P") for c in text)


def _check(attn: Tensor) -> Tensor:
    if attn.dim() != 4 or attn.shape[-1] != attn.shape[-2]:
        raise ValueError(f"attn must have shape (L, H, T, T), got {tuple(attn.shape)}")
    return attn.double()


def choice_rows(T: int, causal: bool = False) -> Tensor:
    """(T,) bool: the queries whose weights say something about the head: all of them, or in a
    causal pattern all but query 0 (which can attend only to itself)."""
    rows = torch.ones(T, dtype=torch.bool)
    if causal:
        rows[:1] = False
    return rows


def _row_mean(values: Tensor, rows: Tensor) -> Tensor:
    """(L, H, T) per-query values -> (L, H) mean over the queries where `rows` (T,) is True
    (zeros when there are none)."""
    if not bool(rows.any()):
        return values.new_zeros(values.shape[:2])
    return values[..., rows].mean(-1)


def diagonal_mass(attn: Tensor, offset: int, *, causal: bool = False) -> Tensor:
    """Mean weight a query i puts on key i + offset, over the queries that have one (with
    `causal`, over the queries that have a choice: query 0 is left out; offset > 0 is refused,
    a causal head never attends to a later key)."""
    a = _check(attn)
    if causal and offset > 0:
        raise ValueError(
            f"offset {offset} looks at later tokens, which a causal head never attends to: "
            f"the metric is undefined (not 0) for causal attention"
        )
    T = a.shape[-1]
    if T <= abs(offset):
        return a.new_zeros(a.shape[:2])
    diagonal = a.diagonal(offset=offset, dim1=-2, dim2=-1)  # (L, H, T - |offset|)
    if causal and offset == 0:
        diagonal = diagonal[..., 1:]  # query 0 attends to itself by construction
        if diagonal.shape[-1] == 0:
            return a.new_zeros(a.shape[:2])
    return diagonal.mean(-1)


def previous_token(attn: Tensor, distance: int = 1) -> Tensor:
    """Mean weight a query i puts on key i - `distance` (1: the previous token)."""
    return diagonal_mass(attn, -distance)


def next_token(attn: Tensor) -> Tensor:
    return diagonal_mass(attn, 1)


def same_token(attn: Tensor, *, causal: bool = False) -> Tensor:
    return diagonal_mass(attn, 0, causal=causal)


def offset_share(attn: Tensor, *, causal: bool = False) -> tuple[Tensor, Tensor]:
    """For each head, the most common offset (argmax key - query) and the share of queries whose
    strongest key is at that offset (over `choice_rows`). A head is *positional* when the share
    is >= 0.9."""
    a = _check(attn)
    L, H, T, _ = a.shape
    rows = choice_rows(T, causal)
    if not bool(rows.any()):
        zeros = a.new_zeros(L, H)
        return zeros, zeros.long()
    offsets = (a.argmax(-1) - torch.arange(T))[..., rows]  # (L, H, rows), in [-(T-1), T-1]
    counts = torch.zeros(L, H, 2 * T - 1, dtype=torch.long)
    counts.scatter_add_(-1, offsets + T - 1, torch.ones_like(offsets))
    best = counts.argmax(-1)
    share = counts.gather(-1, best[..., None])[..., 0].double() / offsets.shape[-1]
    return share, best - (T - 1)


def column_mass(attn: Tensor, columns: Tensor, *, rows: Tensor | None = None) -> Tensor:
    """Mean over queries (those where `rows` (T,) is True, default all) of the total weight on
    the keys where `columns` (T,) is True."""
    a = _check(attn)
    per_query = (a * columns.to(a.dtype)).sum(-1)  # (L, H, T)
    return per_query.mean(-1) if rows is None else _row_mean(per_query, rows)


def special_mass(attn: Tensor, tokens: Sequence[str], special=SPECIAL_TOKENS) -> Tensor:
    return column_mass(attn, torch.tensor([t in special for t in tokens]))


def punctuation_mass(attn: Tensor, tokens: Sequence[str]) -> Tensor:
    return column_mass(attn, torch.tensor([is_punctuation(t) for t in tokens]))


def entropy(attn: Tensor, *, causal: bool = False) -> tuple[Tensor, Tensor]:
    """Mean row entropy in nats, and normalised by log T (1 = uniform over all keys). With
    `causal`, query i can see i + 1 keys: its entropy is normalised by log(i + 1), and query 0
    (no choice) is left out of both means."""
    a = _check(attn)
    per_query = -(a * a.clamp_min(1e-30).log()).sum(-1)  # (L, H, T)
    T = a.shape[-1]
    if not causal:
        nats = per_query.mean(-1)
        return nats, nats / math.log(T) if T > 1 else torch.zeros_like(nats)
    rows = choice_rows(T, causal)
    visible = torch.arange(1, T + 1, dtype=a.dtype).log().clamp_min(1e-30)  # log(i + 1)
    return _row_mean(per_query, rows), _row_mean(per_query / visible, rows)


def confidence(
    attn: Tensor,
    tokens: Sequence[str] | None = None,
    *,
    exclude_special: bool = False,
    causal: bool = False,
    keep: Sequence[bool] | None = None,
) -> Tensor:
    """Mean of each row's largest weight. With `exclude_special`, special-token columns and rows
    (or those where `keep` is False) are dropped and rows renormalised first (so a [CLS]-sink
    head is not 'confident'). With `causal`, the first remaining query (no choice) is left out."""
    a = _check(attn)
    if exclude_special:
        if keep is None and tokens is None:
            raise ValueError("exclude_special=True needs the tokens")
        kept = torch.tensor(
            list(keep) if keep is not None else [t not in SPECIAL_TOKENS for t in tokens or ()],
            dtype=torch.bool,
        )
        if not kept.any():
            return a.new_zeros(a.shape[:2])
        a = a[..., kept, :][..., kept]
        a = a / a.sum(-1, keepdim=True).clamp_min(1e-30)
    return _row_mean(a.max(-1).values, choice_rows(a.shape[-1], causal))


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


def copy_mass(attn: Tensor, first: int, second: int, n: int, offset: int) -> Tensor:
    """On a text holding a sequence of n tokens at `first` and again at `second`: for a query at
    second + t, the mean weight on key first + t + offset, over the t whose key lies inside the
    first copy (0 <= t + offset < n). offset 0 is the duplicate-token score, +1 the induction
    score (the token that followed the earlier copy); a circuit whose layer-0 head reads a
    token further back shows up at a larger offset. (L, H); zeros when no t qualifies."""
    a = _check(attn)
    T = a.shape[-1]
    if not (0 <= first and first + n <= second and second + n <= T):
        raise ValueError(
            f"copies of {n} tokens at {first} and {second} do not fit {T} positions in order"
        )
    t = torch.arange(max(0, -offset), min(n, n - offset))
    if t.numel() == 0:
        return a.new_zeros(a.shape[:2])
    return a[:, :, second + t, first + t + offset].mean(-1)


def copy_scores(attn: Tensor, first: int, second: int, n: int) -> tuple[Tensor, Tensor]:
    """Duplicate-token and induction scores on a text holding a random token sequence of length
    n at `first` and again at `second`: for a query at second + t, the mean weight on
    first + t (the same token earlier: duplicate) and on first + t + 1 (the token that
    followed it: induction)."""
    return copy_mass(attn, first, second, n, 0), copy_mass(attn, first, second, n, 1)


# Offsets scanned for induction, in order of preference on ties: the textbook +1 first.
INDUCTION_OFFSETS = (1, 2, 3, 4, 5, -1, -2, -3)
PREVIOUS_DISTANCES = (1, 2, 3, 4)


def copy_mass_by_offset(
    attn: Tensor, first: int, second: int, n: int, offsets: Sequence[int] = INDUCTION_OFFSETS
) -> Tensor:
    """`copy_mass` at each offset: (O, L, H). Average these over texts, then `best_offset`."""
    return torch.stack([copy_mass(attn, first, second, n, o) for o in offsets])


def previous_by_distance(attn: Tensor, distances: Sequence[int] = PREVIOUS_DISTANCES) -> Tensor:
    """`previous_token` at each distance: (O, L, H)."""
    return torch.stack([previous_token(attn, d) for d in distances])


def best_offset(scores: Tensor, offsets: Sequence[int]) -> tuple[Tensor, Tensor]:
    """Per head, the largest of `scores` (O, L, H) over its first axis and the offset that gave
    it: ((L, H) values, (L, H) long offsets). Ties go to the earlier offset in `offsets`."""
    if scores.dim() != 3 or scores.shape[0] != len(offsets) or len(offsets) == 0:
        raise ValueError(
            f"scores must have shape (O, L, H) with O = {len(offsets)} offsets, "
            f"got {tuple(scores.shape)}"
        )
    # argmax returns the first maximum on CPU; make it explicit with a descending tie-break.
    order = torch.arange(len(offsets), 0, -1, dtype=scores.dtype).view(-1, 1, 1)
    best_value = scores.max(0).values
    index = ((scores == best_value) * order).argmax(0)
    return best_value, torch.tensor(list(offsets))[index]


def sink_mass(attn: Tensor, positions: Sequence[int] = (0,)) -> Tensor:
    """Mean weight on the sink keys at `positions` (default: the first token, a BOS token in a
    causal model), over the queries that are not sinks themselves (a causal query 0 can only
    attend to itself). (L, H); zeros when every position is a sink."""
    a = _check(attn)
    T = a.shape[-1]
    sinks = torch.zeros(T, dtype=torch.bool)
    for p in positions:
        if not -T <= p < T:
            raise ValueError(f"sink position {p} is outside {T} positions")
        sinks[p] = True
    rows = ~sinks
    if not rows.any():
        return a.new_zeros(a.shape[:2])
    return a[:, :, rows][..., sinks].sum(-1).mean(-1)


def aligned_mass(attn: Tensor, aligned: Tensor) -> Tensor:
    """Mean weight each query puts on its aligned key: `attn` (L, H, Tq, Tk) (cross-attention:
    Tq and Tk may differ), `aligned` (Tq,) the key index of each query, -1 for a query with no
    aligned key (excluded). For sequence reversal, query t aligns with key n - 1 - t. (L, H);
    zeros when no query has an aligned key."""
    if attn.dim() != 4:
        raise ValueError(f"attn must have shape (L, H, Tq, Tk), got {tuple(attn.shape)}")
    Tq, Tk = attn.shape[-2:]
    if aligned.shape != (Tq,):
        raise ValueError(f"aligned must have shape (Tq,) = ({Tq},), got {tuple(aligned.shape)}")
    if bool(((aligned < -1) | (aligned >= Tk)).any()):
        raise ValueError(f"aligned key indices must lie in [-1, {Tk - 1}], got {aligned.tolist()}")
    rows = (aligned >= 0).nonzero()[:, 0]
    if rows.numel() == 0:
        return attn.new_zeros(attn.shape[:2], dtype=torch.float64)
    return attn.double()[:, :, rows, aligned[rows]].mean(-1)


def head_metrics(
    attn: Tensor,
    tokens: Sequence[str],
    *,
    causal: bool = False,
    sinks: Sequence[int] | None = None,
) -> dict[str, Tensor]:
    """Every per-head metric of one text: name -> (L, H).

    `sinks`: the key positions of "special" (a sink's mass, dropped by confidence_content);
    default: the tokens in SPECIAL_TOKENS. `causal`: the pattern is causal; queries without a
    choice are left out (see `choice_rows`) and "next" is absent (undefined, not 0)."""
    if len(tokens) != attn.shape[-1]:
        raise ValueError(f"{len(tokens)} tokens for attention over {attn.shape[-1]} positions")
    T = len(tokens)
    if sinks is None:
        sink = torch.tensor([t in SPECIAL_TOKENS for t in tokens], dtype=torch.bool)
    else:
        if any(not -T <= p < T for p in sinks):
            raise ValueError(f"sinks must be positions in [0, {T}), got {list(sinks)}")
        sink = torch.zeros(T, dtype=torch.bool)
        sink[list(sinks)] = True
    rows = choice_rows(T, causal)
    share, offset = offset_share(attn, causal=causal)
    nats, normalised = entropy(attn, causal=causal)
    out = {
        "previous": previous_token(attn),
        "next": next_token(attn),
        "self": same_token(attn, causal=causal),
        "positional": share,
        "positional_offset": offset.double(),
        "special": column_mass(attn, sink, rows=rows),
        "punctuation": column_mass(
            attn, torch.tensor([is_punctuation(t) for t in tokens], dtype=torch.bool), rows=rows
        ),
        "entropy": nats,
        "entropy_norm": normalised,
        "confidence": confidence(attn, causal=causal),
        "confidence_content": confidence(
            attn, exclude_special=True, causal=causal, keep=(~sink).tolist()
        ),
    }
    if causal:
        del out["next"]  # a causal head cannot attend to the next token
    return out


# Metrics a causal pattern does not define, and why (reports show "n/a").
CAUSAL_UNDEFINED = {"next": "a causal head never attends to a later token"}


def corpus_metrics(
    texts: Iterable[tuple[Tensor, Sequence[str]] | tuple[Tensor, Sequence[str], Sequence[int]]],
    *,
    causal: bool = False,
    previous_distances: Sequence[int] | None = None,
) -> dict[str, Tensor]:
    """`head_metrics` averaged over texts (each its own unpadded (L, H, T, T), tokens and,
    optionally, sink positions). The positional offset is the most common one across texts.

    `previous_distances`: also scan previous-token mass at these distances, averaged over the
    texts: "previous_best" is the largest and "previous_distance" the distance that gave it."""
    totals: dict[str, Tensor] = {}
    offsets = []
    scans = []  # (O, L, H) per text
    count = 0
    for attn, tokens, *rest in texts:
        sinks = rest[0] if rest else None
        m = head_metrics(attn, tokens, causal=causal, sinks=sinks)
        offsets.append(m.pop("positional_offset"))
        for k, v in m.items():
            totals[k] = totals.get(k, 0) + v
        if previous_distances is not None:
            scans.append(previous_by_distance(attn, previous_distances))
        count += 1
    if count == 0:
        raise ValueError("corpus_metrics needs at least one text")
    out = {k: v / count for k, v in totals.items()}
    out["positional_offset"] = torch.stack(offsets).mode(0).values
    if previous_distances is not None:
        best, distance = best_offset(torch.stack(scans).mean(0), previous_distances)
        out["previous_best"], out["previous_distance"] = best, distance.double()
    return out
