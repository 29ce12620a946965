"""Matrix products that read packed weights as stored, and their dequantisers.

Two packed forms (rows = output features, K = input features, groups of 32 along K):
- int4: `qs` uint8 (N, K/2): byte j of group g holds element 32g + j (low nibble) and
  32g + 16 + j (high nibble), llama.cpp's Q4_0/Q4_1 order; `scale`, `zero` (N, K/32), float16
  or float32 (the two alike); w = q * scale + zero; zero None means -8 scale (Q4_0, whose
  file stores no zero: neither do we).
- int8: `qs` int8 (N, K); `scale` float16 or float32 (N, K/32); w = q * scale (Q8_0).
Float16 scales are widened to float32 a row at a time inside the kernels (exact).

Why a small C kernel: torch 2.13's CPU int4/int8 weight-only kernels
(`_weight_int4pack_mm_for_cpu`, `_weight_int8pack_mm`) are vectorised for bfloat16 activations
only; with float32 activations they run a scalar loop (measured here: 4096 x 4096, one row, one
thread: 98-117 ms against 11 ms for the float32 GEMV; bfloat16 activations 1.0 ms, but bfloat16
rounding breaks "exact to the file"). The kernel (kernels.c, beside this file) multiplies
float32 activations by the packed weights, dequantising in registers, and is compiled once per
machine with the system C compiler (`cc -O3 -march=native`, cached under ~/.cache/multihead),
so the compiler picks the widest path the machine has (`kernel_isa()`): AVX-512 (16 lanes; per
group of 32 the 16 values s q + z form a table that `vpermps` indexes with the nibbles, so
weights come out dequantised with no integer conversion and no separate zero term; two groups
per iteration), AVX2 + FMA (8 lanes), or portable C. Without a compiler the products dequantise
tile by tile and use torch's GEMM (same values, slower).

Per call, `rows` (the activations' rows, M) picks the path: the kernel at M <= KERNEL_MAX_ROWS,
above that the whole matrix is dequantised once into a temporary and multiplied by MKL's GEMM,
which wins once the dequantisation is shared by enough rows (`multihead bench decode` prints
both; the crossover is stated in docs/performance.md). `dense_mm` is that path: the C
dequantiser writes straight into one float32 buffer owned by the call (the buffers' addresses
from the matrix's cached plan, no per-call slicing or checks), and one GEMM reads it; a
matrix above _TILE_ELEMENTS values goes through `_tiled` instead. Measured on a 512-token
SmolLM2 prefill and kept out: GEMMs over L2-sized tiles of rows (`torch.mm(..., out=y[:, a:b])`:
3-10% slower GEMMs at M = 512, x is repacked per tile, which costs more than the dequantised
values' trip through L3) and non-temporal stores in the dequantiser (slower themselves, and
they leave the weights in memory for the GEMM). Kept: the dequantiser reads the AVX-512 table
as the one-row kernel does and prefetches its output buffer's lines for writing 8 KB ahead
(together 16.3-18.7 -> 15.6-15.9 ms of dequantisation per 512-token SmolLM2 prefill, two
threads, loaded; values unchanged).
"""

from __future__ import annotations

import ctypes
import weakref
from functools import cache
from importlib import resources
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ...native import load as load_native

GROUP = 32
KERNEL_MAX_ROWS = 8  # measured crossover (docs/performance.md): above it, dequantise + GEMM
_TILE_ELEMENTS = 1 << 22  # dequantised float32 values per tile on the fallback path (16 MB)

# the C source (kernels.c, beside this file: package data), compiled by `_library`
_SOURCE = (resources.files(__package__) / "kernels.c").read_text("utf-8")
_FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC")


@cache
def _library(extra: tuple[str, ...] = ()) -> ctypes.CDLL | None:
    """The compiled kernels, or None where they cannot be built (no C compiler, no OpenMP,
    MULTIHEAD_NO_KERNELS=1): callers then take the torch path. `extra` flags are appended
    (tests build the AVX2 and scalar variants with `-mno-avx512f`, `-mno-avx2`). Built and
    cached by `multihead.native.load`."""
    lib = load_native("quant_kernels", _SOURCE, (*_FLAGS, *extra))
    if lib is None:
        return None
    f, i64, i32 = ctypes.c_void_p, ctypes.c_long, ctypes.c_int
    lib.mh_int4_mm.argtypes = [f, f, f, f, i32, f, i64, i64, i64, i32]
    lib.mh_int8_mm.argtypes = [f, f, f, f, i32, f, i64, i64, i64, i32]
    lib.mh_int4_rows.argtypes = [f, f, f, i32, f, i64, i64, i32]
    lib.mh_int8_rows.argtypes = [f, f, i32, f, i64, i64, i32]
    lib.mh_pair_mv.argtypes = [i32, f, f, f, f, i64, f, f, f, i64, i32, f, i64, i32]
    lib.mh_int4_mm.restype = lib.mh_int8_mm.restype = lib.mh_pair_mv.restype = None
    lib.mh_int4_rows.restype = lib.mh_int8_rows.restype = None
    lib.mh_rms_norm.argtypes = [f, f, ctypes.c_float, f, i64, i64]
    lib.mh_rope_rows.argtypes = [f, f, f, i64, i64]
    lib.mh_rms_norm.restype = lib.mh_rope_rows.restype = None
    lib.mh_attend_one.argtypes = [f, f, f, i64, i64, f, i64, i64, i64, i64, ctypes.c_float, i32]
    lib.mh_attend_one.restype = None
    lib.mh_pair_silu.argtypes = lib.mh_pair_mv.argtypes
    lib.mh_pair_silu.restype = None
    lib.mh_append_attend.argtypes = [f, f, i64, i64, f, i64, i64, i64, ctypes.c_float, i32]
    lib.mh_append_attend.restype = None
    lib.mh_prefix_mask.argtypes = [f, i64, i64]
    lib.mh_isa.restype = lib.mh_prefix_mask.restype = i32
    return lib


def kernels_available() -> bool:
    return _library() is not None


def kernel_isa() -> str:
    """Which vector path the compiled kernel takes here: "avx512", "avx2" or "scalar" ("" when
    there is no compiled kernel)."""
    lib = _library()
    return "" if lib is None else {512: "avx512", 256: "avx2"}.get(lib.mh_isa(), "scalar")


# -- dequantisers (torch; rows start..stop) -------------------------------------------------

SCALE_DTYPES = (torch.float16, torch.float32)


def dequantize_int4(
    qs: Tensor, scale: Tensor, zero: Tensor | None, dtype: torch.dtype = torch.float32
) -> Tensor:
    """(n, K/2) uint8 + (n, K/32) scale and zero (float16 or float32; zero None: Q4_0's
    implicit -8 scale) -> (n, K) in `dtype` (computed in float32)."""
    n, G = scale.shape
    lib = _eager_host_library(qs, scale, zero)
    if lib is not None:
        w = torch.empty(n, G * GROUP, dtype=torch.float32)  # (the C code writes float32)
        lib.mh_int4_rows(
            qs.data_ptr(), scale.data_ptr(), None if zero is None else zero.data_ptr(),
            scale.dtype == torch.float16, w.data_ptr(), n, G * GROUP, torch.get_num_threads(),
        )  # fmt: skip
        return w.to(dtype)
    s = scale.float()
    z = -8.0 * s if zero is None else zero.float()
    b = qs.view(n, G, 16)  # (n, K/2) -> (n, G, 16)
    q = torch.cat((b & 15, b >> 4), dim=-1)  # (n, G, 32): low nibbles first, as stored
    w = torch.addcmul(z[..., None], q.float(), s[..., None])
    return w.view(n, G * GROUP).to(dtype)


def dequantize_int8(qs: Tensor, scale: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """(n, K) int8 + (n, K/32) scale (float16 or float32) -> (n, K) in `dtype` (computed in
    float32)."""
    n, G = scale.shape
    lib = _eager_host_library(qs, scale)
    if lib is not None:
        w = torch.empty(n, G * GROUP, dtype=torch.float32)  # (the C code writes float32)
        lib.mh_int8_rows(
            qs.data_ptr(), scale.data_ptr(), scale.dtype == torch.float16, w.data_ptr(), n,
            G * GROUP, torch.get_num_threads(),
        )  # fmt: skip
        return w.to(dtype)
    w = qs.view(n, G, GROUP).float() * scale.float()[..., None]  # (n, G, 32)
    return w.view(n, G * GROUP).to(dtype)


def _eager_host_library(
    qs: Tensor, scale: Tensor, zero: Tensor | None = None
) -> ctypes.CDLL | None:
    """The compiled kernels for a dequantisation they can read, outside tracing; else None (the
    torch path). Traced code (torch.compile of a CUDA model's prefill, or of the dequantiser
    itself) must not reach `_library()`: it hashes, stats and compiles, which dynamo cannot
    trace, and a raw pointer means nothing to a graph. Device first: a CUDA tensor never asks."""
    if not _cpu_contiguous(qs, scale, zero) or torch.compiler.is_compiling():
        return None
    return _library()


def _cpu_contiguous(qs: Tensor, scale: Tensor, zero: Tensor | None = None) -> bool:
    return (
        qs.device.type == "cpu"
        and qs.is_contiguous()
        and scale.dtype in SCALE_DTYPES
        and scale.is_contiguous()
        and (zero is None or (zero.dtype == scale.dtype and zero.is_contiguous()))
    )


# -- products -------------------------------------------------------------------------------


def _host_float32(x: Tensor) -> bool:
    return x.dtype is torch.float32 and x.device.type == "cpu" and not torch.compiler.is_compiling()


def _kernel_reads(x: Tensor) -> bool:
    """Whether the compiled kernel takes activations x (M, K): float32 on the CPU, at most
    KERNEL_MAX_ROWS rows (above that dequantise + GEMM is faster)."""
    return x.shape[0] <= KERNEL_MAX_ROWS and x.dtype == torch.float32 and x.device.type == "cpu"


def int4_mm(x: Tensor, qs: Tensor, scale: Tensor, zero: Tensor | None) -> Tensor:
    """x (M, K) @ w^T -> (M, N), w the int4 form."""
    args = kernel_args("int4", qs, scale, zero) if _host_float32(x) else None
    if args is not None:
        if _kernel_reads(x):
            return run_kernel(x.contiguous(), args)
        if dense_reads(x, args):
            return dense_mm(x, True, args)
    return _tiled(
        x, qs.shape[0],
        lambda a, b: dequantize_int4(qs[a:b], scale[a:b], _rows(zero, a, b), x.dtype),
    )  # fmt: skip


PARALLEL_MIN = 1 << 16  # weights below which one thread does the product (fork-join costs more)


class KernelArgs(NamedTuple):
    """The constant arguments of the kernel for one packed matrix (`kernel_args`)."""

    fn: Any  # the C function: mh_int4_mm or mh_int8_mm
    qs: int  # the buffers' addresses (zero None: Q4_0's implicit zero, or int8)
    scale: int
    zero: int | None
    half: bool  # scales (and zeros) stored as float16
    n: int  # output rows
    k: int  # width
    parallel: bool  # large enough to be worth the threads' fork and join


def kernel_args(form: str, qs: Tensor, scale: Tensor, zero: Tensor | None) -> KernelArgs | None:
    """The constant arguments of the kernel for a packed matrix, for `run_kernel`; None where
    the kernel cannot read it (no compiler, not on the CPU, a layout it does not know)."""
    lib = _library()
    if lib is None or not _cpu_contiguous(qs, scale, zero):
        return None
    half = scale.dtype == torch.float16
    zp = None if zero is None else zero.data_ptr()
    N, K = qs.shape[0], qs.shape[1] * (2 if form == "int4" else 1)
    fn = lib.mh_int4_mm if form == "int4" else lib.mh_int8_mm
    return KernelArgs(fn, qs.data_ptr(), scale.data_ptr(), zp, half, N, K, N * K >= PARALLEL_MIN)


def run_kernel(x: Tensor, args: KernelArgs) -> Tensor:
    """x (M, K) float32, contiguous, on the CPU, M <= KERNEL_MAX_ROWS -> (M, N): the packed
    product with `kernel_args`'s constants (the per-call work kept to the C call)."""
    fn, qp, sp, zp, half, N, K, parallel = args
    M = x.shape[0]
    y = torch.empty(M, N, dtype=torch.float32)  # (not the default dtype: the C code's)
    threads = torch.get_num_threads() if parallel else 1
    fn(x.data_ptr(), qp, sp, zp, half, y.data_ptr(), M, N, K, threads)
    return y


# id(qs tensor) -> (its buffers' addresses, kernel_args); an entry is dropped when its tensor
# is freed (weakref.finalize), so an id reused by a later tensor never finds a stale one
_PLANS: dict[int, tuple[tuple, KernelArgs | None]] = {}


def _plan(form: str, qs: Tensor, scale: Tensor, zero: Tensor | None) -> KernelArgs | None:
    """`kernel_args` of a packed matrix, remembered per qs tensor and remade when a buffer's
    storage changed: the operator torch.compile calls per product then costs little more than
    the C call (a plain dict read: a weak-keyed dictionary costs ~1 us more per call)."""
    key = (form, qs.data_ptr(), scale.data_ptr(), None if zero is None else zero.data_ptr())
    hit = _PLANS.get(id(qs))
    if hit is None or hit[0] != key:
        if hit is None:
            weakref.finalize(qs, _PLANS.pop, id(qs), None)
        hit = (key, kernel_args(form, qs, scale, zero))
        _PLANS[id(qs)] = hit
    return hit[1]


def _rows(t: Tensor | None, a: int, b: int) -> Tensor | None:
    return None if t is None else t[a:b]


def int8_mm(x: Tensor, qs: Tensor, scale: Tensor) -> Tensor:
    """x (M, K) @ w^T -> (M, N), w the int8 form."""
    args = kernel_args("int8", qs, scale, None) if _host_float32(x) else None
    if args is not None:
        if _kernel_reads(x):
            return run_kernel(x.contiguous(), args)
        if dense_reads(x, args):
            return dense_mm(x, False, args)
    return _tiled(x, qs.shape[0], lambda a, b: dequantize_int8(qs[a:b], scale[a:b], x.dtype))


def dense_mm(x: Tensor, int4: bool, plan: KernelArgs) -> Tensor:
    """x (M, K) float32 on the CPU @ w^T -> (M, N): the packed matrix (its `kernel_args`)
    dequantised into one float32 buffer owned by this call, then one GEMM. Each row's value is
    what `x @ w.t()` gives with w the dequantiser's matrix (the products of
    M > KERNEL_MAX_ROWS rows; see the module docstring)."""
    lib = _library()
    assert lib is not None
    w = torch.empty(plan.n, plan.k, dtype=torch.float32)
    threads = torch.get_num_threads() if plan.parallel else 1
    if int4:
        lib.mh_int4_rows(
            plan.qs, plan.scale, plan.zero, plan.half, w.data_ptr(), plan.n, plan.k, threads
        )
    else:
        lib.mh_int8_rows(plan.qs, plan.scale, plan.half, w.data_ptr(), plan.n, plan.k, threads)
    return torch.mm(x, w.t())


def dense_reads(x: Tensor, plan: KernelArgs) -> bool:
    """Whether `dense_mm` takes activations x (M, K) with this plan: float32 on the CPU, more
    than KERNEL_MAX_ROWS rows, the plan of width K, at most _TILE_ELEMENTS dequantised values."""
    return (
        x.shape[0] > KERNEL_MAX_ROWS
        and x.dtype is torch.float32
        and x.device.type == "cpu"
        and plan.k == x.shape[1]
        and plan.n * plan.k <= _TILE_ELEMENTS
    )


def _tiled(x: Tensor, N: int, rows) -> Tensor:
    """x (M, K) @ w^T with w dequantised `rows(a, b)` a tile of output rows at a time: never
    more than _TILE_ELEMENTS dequantised values alive (the whole matrix when it is smaller)."""
    K = x.shape[1]
    step = max(1, _TILE_ELEMENTS // max(1, K))
    if step >= N:
        return x @ rows(0, N).t()
    return torch.cat([x @ rows(a, min(N, a + step)).t() for a in range(0, N, step)], dim=1)


def tiled_transposed(g: Tensor, N: int, K: int, rows) -> Tensor:
    """g (M, N) @ w -> (M, K), w dequantised a tile of rows at a time (the input gradient)."""
    step = max(1, _TILE_ELEMENTS // max(1, K))
    out = g.new_zeros(g.shape[0], K)
    for a in range(0, N, step):
        b = min(N, a + step)
        out += g[:, a:b] @ rows(a, b)
    return out


# -- the products as torch operators (what torch.compile sees) ------------------------------


# multihead::packed_mm is defined on a torch.library.Library, not with custom_op: compiled code
# calls it once per product (151 times per SmolLM2 token), and custom_op's Python wrapper cost
# ~8 us a call more (36 vs 27 us on a 576 x 576 matrix, two threads, docs/performance.md).
_OPS = torch.library.Library("multihead", "FRAGMENT")
_OPS.define("packed_mm(Tensor x, Tensor qs, Tensor scale, Tensor? zero, str form) -> Tensor")


def _packed_mm(x: Tensor, qs: Tensor, scale: Tensor, zero: Tensor | None, form: str) -> Tensor:
    """x (M, K) float32 @ w^T -> (M, N) float32, w the `form` ("int4" or "int8") packed
    matrix: an opaque operator, so torch.compile (fullgraph) calls the kernel instead of
    tracing into ctypes."""
    if x.dim() == 2 and x.shape[0] <= KERNEL_MAX_ROWS and x.dtype is torch.float32 and x.is_cpu:
        args = _plan(form, qs, scale, zero)
        if args is not None and x.shape[1] == args.k:
            return run_kernel(x.contiguous(), args)
    if form == "int4":
        return int4_mm(x, qs, scale, zero)
    return int8_mm(x, qs, scale)


_OPS.impl("packed_mm", _packed_mm, "CompositeExplicitAutograd")
packed_mm = torch.ops.multihead.packed_mm.default


@torch.library.register_fake("multihead::packed_mm")
def _packed_mm_fake(x: Tensor, qs: Tensor, scale: Tensor, zero: Tensor | None, form: str) -> Tensor:
    return x.new_empty(x.shape[0], qs.shape[0])


_OPS.define(
    "packed_mm_pair(Tensor x, Tensor qs, Tensor scale, Tensor? zero, Tensor qs2, Tensor scale2, "
    "Tensor? zero2, str form) -> Tensor"
)


def _packed_mm_pair(
    x: Tensor,
    qs: Tensor,
    scale: Tensor,
    zero: Tensor | None,
    qs2: Tensor,
    scale2: Tensor,
    zero2: Tensor | None,
    form: str,
) -> Tensor:
    """x (M, K) float32 @ [A; B]^T -> (M, NA + NB): two packed matrices of one form and width
    (SwiGLU's gate and up) read with one kernel call when M is 1, each row's value as
    `packed_mm` gives it; otherwise the two products, concatenated."""
    if x.dim() == 2 and x.shape[0] == 1 and x.dtype is torch.float32 and x.is_cpu:
        plans = pair_plans(form, x.shape[1], (qs, scale, zero), (qs2, scale2, zero2))
        if plans is not None:
            return run_pair(x.contiguous(), form == "int4", *plans)
    return torch.cat(
        (_packed_mm(x, qs, scale, zero, form), _packed_mm(x, qs2, scale2, zero2, form)), dim=1
    )


Buffers = tuple[Tensor, Tensor, Tensor | None]  # a packed matrix's (qs, scale, zero)


def pair_plans(form: str, k: int, a: Buffers, b: Buffers) -> tuple[KernelArgs, KernelArgs] | None:
    """The plans of two packed matrices of one form that `run_pair` reads in one call with
    activations of width k: both readable by the kernel, of width k, scales of one dtype;
    else None."""
    pa, pb = _plan(form, *a), _plan(form, *b)
    if pa is None or pb is None or pa.half != pb.half or not k == pa.k == pb.k:
        return None
    return pa, pb


def run_pair(x: Tensor, int4: bool, a: KernelArgs, b: KernelArgs) -> Tensor:
    """x (1, K) float32, contiguous, on the CPU -> (1, NA + NB): `mh_pair_mv` with the plans
    of two matrices of one form (`pair_plans`)."""
    return _pair_call("mh_pair_mv", a.n + b.n, x, int4, a, b)


def run_pair_silu(x: Tensor, int4: bool, a: KernelArgs, b: KernelArgs) -> Tensor:
    """x (1, K) float32, contiguous, on the CPU -> (1, NA): silu(x A^T) * (x B^T), SwiGLU's
    hidden row, by one C call (`mh_pair_silu`: `run_pair`'s products, then the SiLU and the
    product in C instead of split, two views, silu and mul: ~15 us a layer). NA == NB."""
    return _pair_call("mh_pair_silu", a.n, x, int4, a, b)


def _pair_call(
    name: str, width: int, x: Tensor, int4: bool, a: KernelArgs, b: KernelArgs
) -> Tensor:
    """One of the pair kernels (same arguments) into a fresh (1, width) float32 row."""
    lib = _library()
    assert lib is not None
    y = torch.empty(1, width, dtype=torch.float32)
    threads = torch.get_num_threads() if a.parallel or b.parallel else 1
    getattr(lib, name)(
        int4, x.data_ptr(), a.qs, a.scale, a.zero, a.n, b.qs, b.scale, b.zero, b.n,
        a.half, y.data_ptr(), a.k, threads,
    )  # fmt: skip
    return y


_OPS.impl("packed_mm_pair", _packed_mm_pair, "CompositeExplicitAutograd")
packed_mm_pair = torch.ops.multihead.packed_mm_pair.default


@torch.library.register_fake("multihead::packed_mm_pair")
def _packed_mm_pair_fake(
    x: Tensor,
    qs: Tensor,
    scale: Tensor,
    zero: Tensor | None,
    qs2: Tensor,
    scale2: Tensor,
    zero2: Tensor | None,
    form: str,
) -> Tensor:
    return x.new_empty(x.shape[0], qs.shape[0] + qs2.shape[0])


@torch.library.custom_op("multihead::packed_take", mutates_args=())
def packed_take(
    qs: Tensor, scale: Tensor, zero: Tensor | None, index: Tensor, form: str, k: int
) -> Tensor:
    """The packed rows `index` (1-D) dequantised to float32: (len(index), k)."""
    if form == "int4":
        return dequantize_int4(qs[index], scale[index], None if zero is None else zero[index])
    return dequantize_int8(qs[index], scale[index])


@packed_take.register_fake
def _packed_take_fake(
    qs: Tensor, scale: Tensor, zero: Tensor | None, index: Tensor, form: str, k: int
) -> Tensor:
    return scale.new_empty(index.shape[0], k, dtype=torch.float32)


# -- the small ops around a decoding step's products ----------------------------------------


def rms_norm_row(x: Tensor, weight: Tensor | None, eps: float) -> Tensor | None:
    """RMSNorm of ONE row x (..., K) (float32, contiguous, on the CPU; a weight of K float32
    values or None) by one C call: a decoding step's norm, where torch's seven small ops
    (`RMSNorm.plain`) cost ~20 us and this ~3. Values within float32 rounding of
    `F.rms_norm` (the sum of squares in another order: see kernels.c). None where the kernels
    are missing or traced: the caller's torch path."""
    if torch.compiler.is_compiling():
        return None
    lib = _library()
    if lib is None:
        return None
    y = torch.empty(x.shape, dtype=torch.float32)  # (the C code writes float32)
    w = None if weight is None else weight.data_ptr()
    lib.mh_rms_norm(x.data_ptr(), w, eps, y.data_ptr(), 1, x.shape[-1])
    return y


def rope_rows_(x: Tensor, cos: Tensor, signed: Tensor) -> bool:
    """Rotate x's rows (n contiguous float32 rows of D on the CPU) in place by one position's
    tables cos and signed (D contiguous float32 values each): `RotaryEmbedding.rotate_heads_`'s
    values bit for bit, in one C call instead of six torch ops. False (nothing done) where the
    kernels are missing or traced."""
    if torch.compiler.is_compiling():
        return False
    lib = _library()
    if lib is None:
        return False
    D = x.shape[-1]
    lib.mh_rope_rows(x.data_ptr(), cos.data_ptr(), signed.data_ptr(), x.numel() // D, D)
    return True


ATTEND_PARALLEL_MIN = 1 << 18  # H * keys * D below which one thread attends (fork-join costs more)


def _attend_threads(work: int) -> int:
    """Threads for a one-query attention of `work` = heads * keys * D values (split by head)."""
    return torch.get_num_threads() if work >= ATTEND_PARALLEL_MIN else 1


def attend_one(q: Tensor, k: Tensor, v: Tensor) -> Tensor | None:
    """A decoding step's attention by one C call: q (1, H, 1, D) contiguous, keys k and values
    v (1, Hkv, Tk, D) whose rows are contiguous (a cache's buffer narrowed: any head stride),
    float32 on the CPU, H a multiple of Hkv, every key seen, scale D^-1/2 -> (1, 1, H * D):
    softmax(q K^T / sqrt(D)) V per head, the heads side by side (what the output projection
    reads). Values within float32 rounding of SDPA's (~45 us a SmolLM2 layer at 128 keys, one
    thread, against a few us here). None where the kernels are missing or traced. The caller
    checks the shapes, strides and dtypes."""
    if torch.compiler.is_compiling():
        return None
    lib = _library()
    if lib is None:
        return None
    H, D = q.shape[1], q.shape[3]
    Hkv, T = k.shape[1], k.shape[2]
    out = torch.empty(1, 1, H * D, dtype=torch.float32)
    lib.mh_attend_one(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), k.stride(1), v.stride(1), out.data_ptr(),
        H, Hkv, T, D, D**-0.5, _attend_threads(H * T * D),
    )  # fmt: skip
    return out


def append_attend(heads: Tensor, buffer: Tensor, stored: int, H: int) -> Tensor:
    """`attend_one` after writing this step's keys and values into a cache's buffer, by one C
    call: heads (1, H + 2 Hkv, 1, D) contiguous float32 (queries, keys, values of the fused
    projection, rotated), buffer (1, 2 Hkv, room, D) contiguous float32 (keys, then values),
    `stored` keys held before this one -> (1, 1, H * D) over the stored + 1 keys. The caller
    checks shapes and room, that the kernels exist (`kernels_available`) and that nothing is
    traced, and keeps the cache's counts."""
    lib = _library()
    assert lib is not None
    D = heads.shape[3]
    out = torch.empty(1, 1, H * D, dtype=torch.float32)
    lib.mh_append_attend(
        heads.data_ptr(), buffer.data_ptr(), buffer.stride(1), stored, out.data_ptr(), H,
        buffer.shape[1] // 2, D, D**-0.5, _attend_threads(H * (stored + 1) * D),
    )  # fmt: skip
    return out


# A static cache's one-query step as an operator (what torch.compile sees): the compiled decode
# step writes its cache with index tensors and reads the whole buffer under a mask, so the
# eager path's checks of the cache's counts happen here, at run time, inside the operator.
_OPS.define("attend_prefix(Tensor q, Tensor k, Tensor v, Tensor key_mask, Tensor count) -> Tensor")


def _attend_prefix(q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor, count: Tensor) -> Tensor:
    """q (1, H, 1, D) float32, k and v (1, Hkv, R, D) a `StaticKVCache`'s buffers (rows of D
    contiguous), key_mask (1, R) bool its real keys, count () the tokens it holds, in slots
    0 .. count - 1 (no ring) -> (1, H, 1, D): the query attends every key key_mask marks (a
    causal step: the cache holds nothing after the query). One C call (`mh_attend_one` over the
    first count keys) when key_mask marks exactly those slots; else SDPA under the mask (zeros
    where it marks none)."""
    H, D = q.shape[1], q.shape[3]
    Hkv, R = k.shape[1], k.shape[2]
    lib = _library()
    n = int(count)
    if (
        lib is not None
        and key_mask.is_contiguous()
        and lib.mh_prefix_mask(key_mask.data_ptr(), R, n)
    ):
        q = q.contiguous()
        out = torch.empty(1, H, 1, D, dtype=torch.float32)
        lib.mh_attend_one(
            q.data_ptr(), k.data_ptr(), v.data_ptr(), k.stride(1), v.stride(1), out.data_ptr(),
            H, Hkv, n, D, D**-0.5, _attend_threads(H * n * D),
        )  # fmt: skip
        return out
    mask = key_mask[:, None, None, :]  # (1, R) -> (1, 1, 1, R)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=H != Hkv)
    return out if bool(key_mask.any()) else torch.zeros_like(out)


_OPS.impl("attend_prefix", _attend_prefix, "CompositeExplicitAutograd")
attend_prefix = torch.ops.multihead.attend_prefix.default


@torch.library.register_fake("multihead::attend_prefix")
def _attend_prefix_fake(q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor, count: Tensor) -> Tensor:
    return q.new_empty(q.shape[0], q.shape[1], q.shape[2], v.shape[3])
