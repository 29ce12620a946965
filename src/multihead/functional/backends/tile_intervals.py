"""Attention where each query row sees ONE interval of keys, lo[i] .. hi[i] - 1, by a C kernel
that computes exactly those pairs (row_intervals.c, beside this file): a causal window
(lo = i - W + 1), documents (lo = the document's start; hi = i + 1, or the document's end
without causality), a window within documents (the later of the two), any held mask_mod
plan whose rows are such intervals (`held_intervals`, from its band: `mask_band`).

Why: the band paths (tile_band.py, tile_masked_band.py) run torch's fused flash kernel on short
blocks over overlapping key bands: 1.125-1.5x the allowed pairs, and that kernel costs ~3x more
per pair on such narrow calls than on a long causal call. A causal window of 64 within
documents (the bench's general_mod) read 3.5-4.1x its ideal. The kernel here takes blocks of 4
query rows over the union of their intervals, 16 keys at a time from K^T (the keys a chunk of
256 rows sees, transposed), so its cost follows the allowed pairs; the backward recomputes the
probabilities from lse and accumulates dk, dv per kv head (its query heads in turn: no
atomics). Threads: the fast paths' per-call choice (`tile_threads.per_call`, weighing the pairs
the intervals allow): inline, one C call whose units (a query head forward, a kv head backward)
run on the caller's torch threads by OpenMP, dynamically scheduled (the library links the
libgomp torch loaded: its threads are torch's own, awake after a projection's GEMM); beside a
busy process, units of batch rows and kv heads on the tiled backend's workers, one single-
threaded C call each.

Measured (2-core machine shared with another session; fwd + bwd; /ideal as the bench
prints it: structured / (allowed pairs / causal pairs x causal time), the module's with its
projections; `multihead bench attention --mask general_mod,window,mask_mod,documents,
documents_mod --repeats 3`, 2 threads, before (commit 4a0f47f) -> after (two runs)):
  general_mod fn T 4096 2.77x -> 1.68-2.08x, T 8192 3.39x -> 2.14-2.17x; module T 1024
  1.58x -> 1.22-1.25x, T 4096 1.41x -> 1.23-1.30x;
  window fn 1.60x -> 1.08x, 1.56x -> 1.03x; module 1.28x -> 1.07x, 1.30x -> 1.11x;
  mask_mod fn 1.61x -> 1.00x, 1.59x -> 1.05x; module 1.20x -> 1.04x, 1.28x -> 1.13x;
  documents fn 1.75x -> 1.04x, 1.35x -> 0.84x; module 1.33x -> 1.18x, 1.35x -> 1.15x;
  documents_mod fn 1.70x -> 0.93x, 1.31x -> 0.90x; module 1.35x -> 1.21x, 1.33x -> 1.10x.
Beside a busy process (`--conditions contend`, the workers' units): window module 1.03x
(T 1024), 1.14x (T 4096); general_mod fn 2.54x (T 4096), 3.56x (T 8192), module 0.88x,
1.43x. general_mod stays above 2x in its function row: its backward (five
products a pair against the forward's two) is ~2/3 of the call.
In one process, interleaved, the kernel called directly against the path it replaces,
(1, 8, 4096, 64), /ideal at 1 and 2 threads: window 64 1.75x vs 2.7-3.1x; 128 1.33x vs
2.0-2.2x; 256 1.2x vs 1.45-1.6x; 512 1.1x vs 1.26-1.36x; 1024 1.05-1.08x vs 1.18-1.2x;
documents (8 of 512) 0.8-0.9x vs 1.5x: every width runs here. Its forward alone at
general_mod: 0.4-0.65x the masked band's time.
Then (the next stop), at the same general_mod call, one thread, the kernel alone: forward
12.0 -> 9.4 ms, backward 24.5 -> 19.8 ms, from 16 x 16 transposes in registers (a scalar
transposed copy was ~90 us a head), sums and maxima across lanes as trees, the forward's
normalisation applied to its output, and K^T, V^T a chunk of 256 query rows at a time (only
the keys those rows see, in a buffer of the widest chunk's keys: ~84 KB a head here) instead
of the whole call's fresh 8-17 MB, whose first touch cost ~4 ms of page faults a call (this
machine: ~2.4 us a fault); the whole call, one thread: 44 -> 39 ms, with a sum's expanded
gradient read through its strides (`rows_contiguous`), not copied.
Tried and dropped: blocks of 8 query rows (the P V accumulators spill: ~7% slower), the
key-gradient sums as a tree (no change measured).

Not taken (the band paths, or the general plan, run instead): other dtypes (fp64, bf16,
fp16), D not a multiple of 16 or above 256, a head dimension that is not contiguous, a mask
or bias beside the structure, dropout, Tq != Tk, no C compiler (MULTIHEAD_NO_KERNELS=1),
tracing (the tiled backend refuses torch.compile / export itself).

Shapes: q (B, H, T, D), k / v (B, Hkv, T, D), D a multiple of 16, float32 on the CPU; lo, hi
(B, H, T) int32 (a plan's (B or 1, H or 1, T) expanded); out (B, H, T, D), lse (B, H, T);
a row with no key (lo >= hi) gets out 0, lse 0 and gradients 0.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from importlib import resources
from typing import NamedTuple

import torch
from torch import Tensor

from ...native import load as load_native
from ..mask_band import BandMask, band_of_grid
from .tile_segments import segments_of
from .tile_threads import head_units, per_call, run, workers

_SOURCE = (resources.files(__package__) / "row_intervals.c").read_text("utf-8")
_FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC")


@functools.cache
def library(extra: tuple[str, ...] = ()) -> ctypes.CDLL | None:
    """The compiled kernel, or None where it cannot be built (`native.load`). `extra` flags are
    appended (tests build the AVX2 and scalar variants)."""
    lib = load_native("row_intervals", _SOURCE, (*_FLAGS, *extra))
    if lib is None:  # (no OpenMP: the same kernel, on one thread)
        lib = load_native("row_intervals", _SOURCE, (*_FLAGS, *extra, "-fno-openmp"))
    if lib is None:
        return None
    p, i, f = ctypes.c_void_p, ctypes.c_long, ctypes.c_float
    lib.mh_iv_forward_all.argtypes = [p, p, p, p, p, p, p, p, i, i, i, i, i, f, ctypes.c_int]
    lib.mh_iv_backward_all.argtypes = [
        p, p, p, p, p, p, p, p, p, p, p, p, i, i, i, i, i, f, ctypes.c_int,
    ]  # fmt: skip
    lib.mh_iv_forward_all.restype = lib.mh_iv_backward_all.restype = None
    return lib


class Intervals(NamedTuple):
    """Row i of batch row b, head h sees keys lo[b, h, i] .. hi[b, h, i] - 1 (int32, (B or 1,
    H or 1, T), rows contiguous); lo >= hi: no key. `allowed`: the pairs they allow over their
    own (B or 1, H or 1, T), found where they are made (once for a held plan).

    Why count them there: the per-call thread choice weighs a call's pairs, and counting
    them per call on its (B, H, T) intervals took five small torch ops, each a parallel
    region above 32768 elements: beside a busy process each waited for a descheduled thread,
    ~4 ms apiece, ~25-40 ms of a (1, 8, 8192, 64) general_mod call (forward and backward),
    against ~0.2 ms idle."""

    lo: Tensor
    hi: Tensor
    allowed: int

    def pairs(self, B: int, H: int) -> int:
        """The pairs of a call of B batch rows and H heads (the intervals expanded to it)."""
        return self.allowed * (B // self.lo.shape[0]) * (H // self.lo.shape[1])


def counted(lo: Tensor, hi: Tensor) -> Intervals:
    """Intervals of lo, hi with their pairs counted (torch ops on their own shape)."""
    return Intervals(lo, hi, int(_pairs(lo, hi)))


def window_intervals(left: int, T: int) -> Intervals:
    """A causal window of left + 1 keys: keys i - left .. i."""
    i = torch.arange(T, dtype=torch.int32)
    return Intervals((i - left).clamp_(min=0)[None, None], (i + 1)[None, None], _window(T, left))


def band_intervals(band: BandMask) -> Intervals | None:
    """The intervals of a band's rows (`mask_band.BandMask`: row p's column e is key
    p - L + e), when every row's allowed keys are contiguous; else None."""
    allowed, L = band.allowed, band.left
    T = allowed.shape[2]
    count = allowed.sum(dim=-1, dtype=torch.int32)  # (B or 1, H or 1, T)
    first = allowed.int().argmax(dim=-1).int()  # the first allowed column (0 where none)
    last = L - allowed.flip(-1).int().argmax(dim=-1).int()
    some = count > 0
    if bool((some & (last - first + 1 != count)).any()):
        return None  # a row with a hole
    p = torch.arange(T, dtype=torch.int32)
    lo = torch.where(some, p - L + first, p + 1)
    hi = torch.where(some, p - L + last + 1, p + 1)
    return counted(lo.contiguous(), hi.contiguous())


def interval_runs(q: Tensor, k: Tensor, v: Tensor) -> bool:
    """Whether the kernel takes these inputs: float32 on the CPU, rows of D contiguous, D a
    multiple of 16 (at most 256), k and v of one shape, and a compiled kernel."""
    D = q.shape[3]
    return (
        all(t.dtype is torch.float32 and t.device.type == "cpu" for t in (q, k, v))
        and all(t.stride(3) == 1 for t in (q, k, v))
        and D % 16 == 0
        and D <= 256
        and k.shape == v.shape
        and q.shape[3] == k.shape[3]
        and library() is not None
    )


def _strides(*tensors: Tensor) -> ctypes.Array:
    """Each tensor's (batch, head, row) strides, in one C array of longs."""
    return (ctypes.c_long * (3 * len(tensors)))(*(s for t in tensors for s in t.stride()[:3]))


def _run(
    call: Callable[..., None],
    pairs: int,
    q: Tensor,
    k: Tensor,
    kv: list[Tensor],
    qh: list[Tensor],
    *more: Tensor,
) -> None:
    """`call(kv tensors, query-head tensors, threads)` over the whole call or in units.

    The per-call thread choice of the fast paths (`tile_threads.per_call`): inline, one C call
    on the caller's torch threads by OpenMP (a small call on free cores: torch's threads take
    it at once after a projection's GEMM); else units of batch rows and kv heads on the
    tiled backend's workers, one C call each on one thread (a descheduled thread holds up
    only its own unit). The size it weighs is the pairs the intervals allow (what this
    kernel computes), not the dense B H T^2 of the band paths' calls."""
    threads = workers(q, k, *more)
    n = per_call(threads, pairs)
    if n <= 1:
        call(kv, qh, threads)
        return
    units = [
        functools.partial(call, [t[r, g] for t in kv], [t[r, h] for t in qh], 1)
        for r, h, g in head_units(q.shape[0], q.shape[1], k.shape[1], n)
    ]
    run(units, n)


def _pairs(lo: Tensor, hi: Tensor) -> Tensor:
    """The pairs the intervals allow (lo, hi (B, H, T), expanded or not)."""
    return (hi - lo).clamp_(min=0).sum()


def interval_forward(q, k, v, lo, hi, scale: float, out: Tensor, lse: Tensor, pairs: int):
    """Write out (B, H, T, D; rows of D contiguous) and lse (B, H, T; contiguous). `pairs`:
    those lo, hi allow (`Intervals.pairs`: counted where the intervals were made)."""
    lib = library()
    assert lib is not None

    def call(kv: list[Tensor], qh: list[Tensor], threads: int) -> None:
        (k, v), (q, out, lse, lo, hi) = kv, qh
        B, H, T, D = q.shape
        st = _strides(q, k, v, out, lse, lo, hi)
        lib.mh_iv_forward_all(
            q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr(),
            lo.data_ptr(), hi.data_ptr(), st, B, H, k.shape[1], T, D, scale, threads,
        )  # fmt: skip

    _run(call, pairs, q, k, [k, v], [q, out, lse, lo, hi], v, out)


def rows_contiguous(t: Tensor) -> Tensor:
    """t (B, H, T, D) with each row's D values contiguous, as the kernel reads them. An expanded
    gradient (a sum's: every stride 0) is made once per distinct row and expanded again (the
    kernel follows its zero strides), not copied whole: at (1, 8, 4096, 64) a whole copy was
    8 MB of fresh pages, ~2000 page faults, on every backward."""
    if t.stride(3) == 1:
        return t
    distinct = tuple(slice(0, 1) if t.stride(d) == 0 else slice(None) for d in range(3))
    return t[distinct].contiguous().expand(t.shape)


def interval_backward(q, k, v, grad_out, out, lse, lo, hi, scale: float, dq, dk, dv, pairs: int):
    """Write all of dq (B, H, T, D), dk, dv (B, Hkv, T, D) (rows of D contiguous, float32).
    `pairs`: as `interval_forward`'s."""
    lib = library()
    assert lib is not None
    grad_out = rows_contiguous(grad_out)

    def call(kvs: list[Tensor], qh: list[Tensor], threads: int) -> None:
        (k, v, dk, dv), (q, grad_out, out, lse, lo, hi, dq) = kvs, qh
        B, H, T, D = q.shape
        st = _strides(q, k, v, out, lse, lo, hi, grad_out, dq, dk, dv)
        lib.mh_iv_backward_all(
            q.data_ptr(), k.data_ptr(), v.data_ptr(), grad_out.data_ptr(), out.data_ptr(),
            lse.data_ptr(), lo.data_ptr(), hi.data_ptr(), dq.data_ptr(), dk.data_ptr(),
            dv.data_ptr(), st, B, H, k.shape[1], T, D, scale, threads,
        )  # fmt: skip

    qh = [q, grad_out, out, lse, lo, hi, dq]
    _run(call, pairs, q, k, [k, v, dk, dv], qh, v, grad_out, dq)


def interval_plan(band, masked, mask, bias, q: Tensor, k: Tensor) -> Intervals | None:
    """The intervals of a call the band (`tile_band.BandPlan`: a causal window) or masked band
    (`tile_masked_band.MaskedBand`) would run, where the kernel takes it: no mask or bias,
    square, float32 on the CPU (`interval_runs`), every row one interval; else None."""
    if (band is None and masked is None) or mask is not None or bias is not None:
        return None
    if q.shape[2] != k.shape[2] or not interval_runs(q, k, k):
        return None
    if masked is not None:
        return masked.intervals()
    return window_intervals(band.left, q.shape[2])


def documents_intervals(ids: Tensor, left: int) -> Intervals | None:
    """A causal window of left + 1 keys within documents (ids (B, T)) as intervals: key
    p - left .. p of p's own run of equal ids; None unless every id is one contiguous run
    (`tile_segments.segments_of`: an id seen again later would let a row see two runs)."""
    segments = segments_of(ids)
    if segments is None:
        return None
    docs = segments_intervals(segments, ids.shape[0], ids.shape[1], causal=True)
    p = torch.arange(ids.shape[1], dtype=torch.int32)
    count = sum(_window(stop - start, left) for _, start, stop in segments)
    return Intervals(torch.maximum(docs.lo, p - left).contiguous(), docs.hi, count)


def structure_intervals(structure, causal: bool, mask, bias, q: Tensor, k: Tensor):
    """The intervals of `window=` with `documents=` (causal; nothing else beside them, no mask
    or bias; square; inputs the kernel takes), else None."""
    if structure is None or mask is not None or bias is not None:
        return None
    window, docs = structure.window, structure.documents
    if window is None or docs is None or structure.prefix is not None:
        return None
    if structure.mask_mod is not None or not (causal or window[1] == 0) or window[0] < 0:
        return None
    T = q.shape[2]
    if k.shape[2] != T or docs.shape[1] != T or docs.device.type != "cpu":
        return None
    if not interval_runs(q, k, k):
        return None
    return documents_intervals(docs, window[0])


MAX_LEFT = 1024  # a held plan's band, at most this many keys back (its booleans: T x 1025)


def held_intervals(plan, causal: bool, q: Tensor, k: Tensor) -> Intervals | None:
    """The intervals of a held mask_mod plan (`mask_plan.MaskPlan`) whose rows each see one
    interval of keys within MAX_LEFT before them (found once per plan and causality, kept on
    the plan: `mask_band.band_of_grid`, then `band_intervals`), where the kernel takes the
    inputs; else None."""
    T = q.shape[2]
    if k.shape[2] != T or plan.kinds is None or not interval_runs(q, k, k):
        return None
    block = plan.block if isinstance(plan.block, tuple) else (plan.block, plan.block)

    def build() -> Intervals | None:
        found = band_of_grid(plan.kinds, plan.masks, causal, block, T, T, min(T - 1, MAX_LEFT))
        return None if found is None else band_intervals(found)

    return plan.held(("row intervals", causal), build)


def segments_intervals(segments: list, B: int, T: int, causal: bool) -> Intervals:
    """Documents as intervals, from their runs (`tile_segments.segments_of`: (b, start,
    stop), each id one run): row p of run start .. stop - 1 sees keys start .. p (causal)
    or start .. stop - 1; a position in no run sees nothing."""
    p = torch.arange(T, dtype=torch.int32)
    lo, hi = (p + 1).repeat(B, 1), (p + 1).repeat(B, 1)  # (B, T): no key
    count = 0
    for b, start, stop in segments:
        lo[b, start:stop] = start
        if not causal:
            hi[b, start:stop] = stop
        n = stop - start
        count += n * (n + 1) // 2 if causal else n * n
    return Intervals(lo[:, None], hi[:, None], count)


def _window(n: int, left: int) -> int:
    """The pairs of n rows that each see the keys up to left before them (from key 0 on)."""
    full = min(n, left + 1)  # rows 0 .. full - 1 see every key up to their own
    return full * (full + 1) // 2 + (n - full) * (left + 1)
