"""Attention over variable-length sequences packed without padding ("varlen").

Packed layout: the tokens of several sequences concatenated along the first axis, `(N, ...)`
with `N = sum(lengths)`. Attention stays inside each sequence, so nothing is computed on padding
and no mask is needed. Consecutive sequences of equal length form a *run*: a run of `n`
sequences of length `L` is a zero-copy `(n, H, L, D)` view of the packed tensor, and so one
ordinary batched attention call through `dispatch`. Sort sequences by length to make runs long
(`SentenceEncoder.encode` does).

Shapes: q `(N, H, D)`, k `(N, Hkv, D)`, v `(N, Hkv, Dv)` -> `(N, H, Dv)`.
"""

from __future__ import annotations

import itertools
import numbers
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from .attention import dispatch
from .call import make_call


class VarLen:
    """The lengths of packed sequences and their runs of equal length, computed once per batch
    and shared by every layer.

    `runs`: `(start row, number of sequences, length)` per run of equal consecutive lengths.
    """

    __slots__ = ("lengths", "runs", "total")

    def __init__(self, lengths: Sequence[int]) -> None:
        if hasattr(lengths, "tolist"):  # a tensor or a numpy array
            lengths = lengths.tolist()
        if not isinstance(lengths, Sequence) or isinstance(lengths, str):
            raise TypeError(f"lengths must be a sequence of ints, got {type(lengths).__name__}")
        for i, n in enumerate(lengths):
            if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
                raise ValueError(f"lengths[{i}] must be a positive int, got {n!r}")
        self.lengths: tuple[int, ...] = tuple(int(n) for n in lengths)
        runs = []
        start = 0
        for length, group in itertools.groupby(self.lengths):
            n = sum(1 for _ in group)
            runs.append((start, n, length))
            start += n * length
        self.runs: tuple[tuple[int, int, int], ...] = tuple(runs)
        self.total: int = start

    @classmethod
    def of(cls, lengths: VarLen | Sequence[int]) -> VarLen:
        return lengths if isinstance(lengths, VarLen) else cls(lengths)

    def __len__(self) -> int:
        return len(self.lengths)

    def __repr__(self) -> str:
        return f"VarLen({len(self)} sequences, {self.total} tokens, {len(self.runs)} runs)"

    def positions(self, device: torch.device | str | None = None) -> Tensor:
        """Each token's position inside its own sequence: `(N,)` int64."""
        if not self.lengths:
            return torch.empty(0, dtype=torch.long, device=device)
        longest = max(self.lengths)
        table = torch.arange(longest, device=device)
        return torch.cat([table[:n].repeat(count) for _, count, n in self.runs])

    def mean(self, x: Tensor) -> Tensor:
        """Mean over each sequence's tokens: `(N, C)` -> `(number of sequences, C)`."""
        self.check(x, "x")
        if not self.runs:
            return x.new_empty(0, *x.shape[1:])
        # (n * L, C) -> (n, L, C) -> (n, C) per run: a view and one reduction each
        means = [x[s : s + n * L].unflatten(0, (n, L)).mean(1) for s, n, L in self.runs]
        return means[0] if len(means) == 1 else torch.cat(means)

    def check(self, t: object, name: str) -> None:
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() == 0 or t.shape[0] != self.total:
            raise ValueError(
                f"{name} has shape {tuple(t.shape)}, but the lengths sum to {self.total}: its "
                f"first axis must hold the {self.total} packed tokens"
            )


def varlen_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    lengths: VarLen | Sequence[int],
    *,
    causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
    backend: str = "auto",
) -> Tensor:
    """Self-attention inside each of several packed sequences, with no padding.

    Args:
        q: queries `(N, H, D)`, the tokens of every sequence one after another.
        k: keys `(N, Hkv, D)`; `Hkv` must divide `H` (grouped-query attention).
        v: values `(N, Hkv, Dv)`.
        lengths: the sequence lengths (summing to N), or a `VarLen` built once and reused.
        causal: each token sees only the tokens before it in its own sequence.
        scale: multiplies `q @ k^T`; defaults to `1 / sqrt(D)`.
        dropout_p: dropout on the attention probabilities (apply it only in training).
        backend: as `attention()`.

    Returns:
        `(N, H, Dv)`: the same as padding every sequence and masking the padding, without
        the cost of either.
    """
    packed = VarLen.of(lengths)
    for name, t in (("q", q), ("k", k), ("v", v)):
        packed.check(t, name)
        if t.dim() != 3:
            raise ValueError(f"{name} must be a (N, heads, head_dim) tensor, got {tuple(t.shape)}")
    # (N, heads, D) -> (1, heads, N, D): the one validation every attention call gets
    call = make_call(
        *(t.transpose(0, 1)[None] for t in (q, k, v)),
        causal=causal,
        scale=scale,
        dropout_p=dropout_p,
    )
    return varlen_dispatch(q, k, v, packed, causal, call.scale, call.dropout_p, backend)


def varlen_dispatch(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    packed: VarLen,
    causal: bool,
    scale: float,
    dropout_p: float,
    backend: str = "auto",
    *,
    bias: Callable[[int], Tensor | None] | None = None,
) -> Tensor:
    """`varlen_attention` on inputs already checked (modules call this): one dispatch per run.
    `bias(L)`: an additive bias broadcastable to `(n, H, L, L)` for a run of length L (ALiBi)."""
    outs = []
    for start, n, length in packed.runs:
        rows = slice(start, start + n * length)
        # (n * L, heads, D) -> (n, L, heads, D) -> (n, heads, L, D): views, no copy
        q_run, k_run, v_run = (t[rows].unflatten(0, (n, length)).transpose(1, 2) for t in (q, k, v))
        run_bias = None if bias is None else bias(length)
        call = make_call(
            q_run,
            k_run,
            v_run,
            bias=run_bias,
            causal=causal,
            scale=scale,
            dropout_p=dropout_p,
            qkv_checked=True,  # views of checked tensors
        )
        out, _ = dispatch(call, backend)
        # (n, H, L, Dv) -> (n * L, H, Dv): free when the kernel wrote (n, L, H, Dv), as SDPA does
        outs.append(out.transpose(1, 2).reshape(n * length, out.shape[1], out.shape[3]))
    if not outs:
        return q.new_empty(0, q.shape[1], v.shape[2])
    return outs[0] if len(outs) == 1 else torch.cat(outs)
