"""Matrix products that read packed weights as stored, and their dequantisers.

Two packed forms (rows = output features, K = input features, groups of 32 along K):
- int4: `qs` uint8 (N, K/2): byte j of group g holds element 32g + j (low nibble) and
  32g + 16 + j (high nibble), llama.cpp's Q4_0/Q4_1 order; `scale`, `zero` float32 (N, K/32);
  w = q * scale + zero.
- int8: `qs` int8 (N, K); `scale` float32 (N, K/32); w = q * scale (llama.cpp's Q8_0).

Why a small C kernel: torch 2.13's CPU int4/int8 weight-only kernels
(`_weight_int4pack_mm_for_cpu`, `_weight_int8pack_mm`) are vectorised for bfloat16 activations
only; with float32 activations they run a scalar loop (measured here: 4096 x 4096, one row, one
thread: 98-117 ms against 11 ms for the float32 GEMV; bfloat16 activations 1.0 ms, but bfloat16
rounding breaks "exact to the file"). The kernel below multiplies float32 activations by the
packed weights, dequantising in registers, and is compiled once per machine with the system C
compiler (`cc`, cached under ~/.cache/multihead); without a compiler the products dequantise
tile by tile and use torch's GEMM (same values, slower).

Per call, `rows` (the activations' rows, M) picks the path: the kernel at M <= KERNEL_MAX_ROWS,
above that the whole matrix is dequantised once into a temporary and multiplied by MKL's GEMM,
which wins once the dequantisation is shared by enough rows (`multihead bench decode` prints
both; the crossover is stated in docs/performance.md).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import subprocess
import tempfile
from functools import cache
from pathlib import Path

import torch
from torch import Tensor

GROUP = 32
KERNEL_MAX_ROWS = 8  # measured crossover (docs/performance.md): above it, dequantise + GEMM
_TILE_ELEMENTS = 1 << 22  # dequantised float32 values per tile on the fallback path (16 MB)

_SOURCE = r"""
#include <stdint.h>
#include <string.h>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif
#define MH_MAX_ROWS 8

/* y (M, N) = x (M, K) @ w^T, w int4 groups of 32 (see kernels.py); xs (M, K/32) = group sums;
   M <= MH_MAX_ROWS (each group's weights are decoded once for all rows) */
void mh_int4_mm(const float *x, const float *xs, const uint8_t *qs, const float *scale,
                const float *zero, float *y, long M, long N, long K, int threads) {
    const long G = K / 32;
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (long n = 0; n < N; n++) {
        const uint8_t *qn = qs + n * (K / 2);
        const float *s = scale + n * G, *z = zero + n * G;
        float zacc[MH_MAX_ROWS] = {0};
#if defined(__AVX2__) && defined(__FMA__)
        __m256 acc[MH_MAX_ROWS];
        for (long m = 0; m < M; m++) acc[m] = _mm256_setzero_ps();
        const __m128i mask = _mm_set1_epi8(15);
        for (long g = 0; g < G; g++) {
            __m128i b = _mm_loadu_si128((const __m128i *)(qn + g * 16));
            __m128i lo = _mm_and_si128(b, mask);
            __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), mask);
            __m256 w0 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo));
            __m256 w1 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)));
            __m256 w2 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi));
            __m256 w3 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)));
            __m256 sg = _mm256_set1_ps(s[g]);
            for (long m = 0; m < M; m++) {
                const float *xg = x + m * K + g * 32;
                __m256 t = _mm256_mul_ps(_mm256_loadu_ps(xg), w0);
                t = _mm256_fmadd_ps(_mm256_loadu_ps(xg + 8), w1, t);
                t = _mm256_fmadd_ps(_mm256_loadu_ps(xg + 16), w2, t);
                t = _mm256_fmadd_ps(_mm256_loadu_ps(xg + 24), w3, t);
                acc[m] = _mm256_fmadd_ps(t, sg, acc[m]);
                zacc[m] += z[g] * xs[m * G + g];
            }
        }
        for (long m = 0; m < M; m++) {
            float lanes[8];
            _mm256_storeu_ps(lanes, acc[m]);
            float total = zacc[m];
            for (int j = 0; j < 8; j++) total += lanes[j];
            y[m * N + n] = total;
        }
#else
        for (long m = 0; m < M; m++) {
            const float *xm = x + m * K;
            float total = 0.0f;
            for (long g = 0; g < G; g++) {
                const uint8_t *b = qn + g * 16;
                const float *xg = xm + g * 32;
                float t = 0.0f;
                for (int j = 0; j < 16; j++)
                    t += xg[j] * (float)(b[j] & 15) + xg[j + 16] * (float)(b[j] >> 4);
                total += s[g] * t;
                zacc[m] += z[g] * xs[m * G + g];
            }
            y[m * N + n] = total + zacc[m];
        }
#endif
    }
}

/* w (N, K) float32 = the int4 form's rows, dequantised */
void mh_int4_rows(const uint8_t *qs, const float *scale, const float *zero, float *w,
                  long N, long K, int threads) {
    const long G = K / 32;
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (long n = 0; n < N; n++)
        for (long g = 0; g < G; g++) {
            const uint8_t *b = qs + n * (K / 2) + g * 16;
            const float s = scale[n * G + g], z = zero[n * G + g];
            float *out = w + n * K + g * 32;
            for (int j = 0; j < 16; j++) {
                out[j] = (float)(b[j] & 15) * s + z;
                out[j + 16] = (float)(b[j] >> 4) * s + z;
            }
        }
}

/* w (N, K) float32 = the int8 form's rows, dequantised */
void mh_int8_rows(const int8_t *qs, const float *scale, float *w, long N, long K, int threads) {
    const long G = K / 32;
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (long n = 0; n < N; n++)
        for (long g = 0; g < G; g++) {
            const float s = scale[n * G + g];
            for (int j = 0; j < 32; j++) w[n * K + g * 32 + j] = (float)qs[n * K + g * 32 + j] * s;
        }
}

/* y (M, N) = x (M, K) @ w^T, w int8 with a scale per group of 32 (Q8_0); M <= MH_MAX_ROWS */
void mh_int8_mm(const float *x, const int8_t *qs, const float *scale, float *y,
                long M, long N, long K, int threads) {
    const long G = K / 32;
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (long n = 0; n < N; n++) {
        const int8_t *qn = qs + n * K;
        const float *s = scale + n * G;
#if defined(__AVX2__) && defined(__FMA__)
        __m256 acc[MH_MAX_ROWS];
        for (long m = 0; m < M; m++) acc[m] = _mm256_setzero_ps();
        for (long g = 0; g < G; g++) {
            const int8_t *b = qn + g * 32;
            __m256 w[4];
            for (int i = 0; i < 4; i++) {
                __m128i eight = _mm_loadl_epi64((const __m128i *)(b + 8 * i));
                w[i] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(eight));
            }
            __m256 sg = _mm256_set1_ps(s[g]);
            for (long m = 0; m < M; m++) {
                const float *xg = x + m * K + g * 32;
                __m256 t = _mm256_mul_ps(_mm256_loadu_ps(xg), w[0]);
                t = _mm256_fmadd_ps(_mm256_loadu_ps(xg + 8), w[1], t);
                t = _mm256_fmadd_ps(_mm256_loadu_ps(xg + 16), w[2], t);
                t = _mm256_fmadd_ps(_mm256_loadu_ps(xg + 24), w[3], t);
                acc[m] = _mm256_fmadd_ps(t, sg, acc[m]);
            }
        }
        for (long m = 0; m < M; m++) {
            float lanes[8];
            _mm256_storeu_ps(lanes, acc[m]);
            float total = 0.0f;
            for (int j = 0; j < 8; j++) total += lanes[j];
            y[m * N + n] = total;
        }
#else
        for (long m = 0; m < M; m++) {
            const float *xm = x + m * K;
            float total = 0.0f;
            for (long g = 0; g < G; g++) {
                float t = 0.0f;
                for (int j = 0; j < 32; j++) t += xm[g * 32 + j] * (float)qn[g * 32 + j];
                total += s[g] * t;
            }
            y[m * N + n] = total;
        }
#endif
    }
}
"""
_FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC"]


def _cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "multihead"


@cache
def _library() -> ctypes.CDLL | None:
    """The compiled kernels, or None where they cannot be built (no C compiler, no OpenMP,
    MULTIHEAD_NO_KERNELS=1): callers then take the torch path."""
    if os.environ.get("MULTIHEAD_NO_KERNELS") == "1" or platform.system() != "Linux":
        return None
    key = hashlib.sha256(
        (_SOURCE + " ".join(_FLAGS) + platform.machine() + platform.node()).encode()
    ).hexdigest()[:16]
    target = _cache_dir() / f"quant_kernels_{key}.so"
    try:
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory() as tmp:
                src = Path(tmp) / "k.c"
                src.write_text(_SOURCE)
                out = Path(tmp) / "k.so"
                subprocess.run(
                    [os.environ.get("CC", "cc"), *_FLAGS, str(src), "-o", str(out)],
                    check=True,
                    capture_output=True,
                    timeout=120,
                )
                os.replace(out, target)  # atomic: a concurrent process sees all or nothing
        lib = ctypes.CDLL(str(target))
    except (OSError, subprocess.SubprocessError):
        return None
    f, i64, i32 = ctypes.c_void_p, ctypes.c_long, ctypes.c_int
    lib.mh_int4_mm.argtypes = [f, f, f, f, f, f, i64, i64, i64, i32]
    lib.mh_int8_mm.argtypes = [f, f, f, f, i64, i64, i64, i32]
    lib.mh_int4_rows.argtypes = [f, f, f, f, i64, i64, i32]
    lib.mh_int8_rows.argtypes = [f, f, f, i64, i64, i32]
    return lib


def kernels_available() -> bool:
    return _library() is not None


# -- dequantisers (torch; rows start..stop) -------------------------------------------------


def dequantize_int4(qs: Tensor, scale: Tensor, zero: Tensor, dtype=torch.float32) -> Tensor:
    """(n, K/2) uint8 + (n, K/32) scale, zero -> (n, K) in `dtype` (computed in float32)."""
    n, G = scale.shape
    if _rows_ok(qs, scale, zero):
        w = torch.empty(n, G * GROUP)
        lib = _library()
        assert lib is not None
        lib.mh_int4_rows(
            qs.data_ptr(), scale.data_ptr(), zero.data_ptr(), w.data_ptr(), n, G * GROUP,
            torch.get_num_threads(),
        )  # fmt: skip
        return w.to(dtype)
    b = qs.view(n, G, 16)  # (n, K/2) -> (n, G, 16)
    q = torch.cat((b & 15, b >> 4), dim=-1)  # (n, G, 32): low nibbles first, as stored
    w = torch.addcmul(zero.float()[..., None], q.float(), scale.float()[..., None])
    return w.view(n, G * GROUP).to(dtype)


def dequantize_int8(qs: Tensor, scale: Tensor, dtype=torch.float32) -> Tensor:
    """(n, K) int8 + (n, K/32) scale -> (n, K) in `dtype` (computed in float32)."""
    n, G = scale.shape
    if _rows_ok(qs, scale):
        w = torch.empty(n, G * GROUP)
        lib = _library()
        assert lib is not None
        lib.mh_int8_rows(
            qs.data_ptr(), scale.data_ptr(), w.data_ptr(), n, G * GROUP, torch.get_num_threads()
        )
        return w.to(dtype)
    w = qs.view(n, G, GROUP).float() * scale.float()[..., None]  # (n, G, 32)
    return w.view(n, G * GROUP).to(dtype)


def _rows_ok(qs: Tensor, *scales: Tensor) -> bool:
    return (
        qs.device.type == "cpu"
        and qs.is_contiguous()
        and all(s.dtype == torch.float32 and s.is_contiguous() for s in scales)
        and _library() is not None
    )


# -- products -------------------------------------------------------------------------------


def _kernel_ok(x: Tensor, *tensors: Tensor) -> bool:
    return (
        x.device.type == "cpu"
        and x.dtype == torch.float32
        and all(t.is_contiguous() and t.device.type == "cpu" for t in tensors)
        and _library() is not None
    )


def int4_mm(x: Tensor, qs: Tensor, scale: Tensor, zero: Tensor) -> Tensor:
    """x (M, K) @ w^T -> (M, N), w the int4 form."""
    M = x.shape[0]
    N = qs.shape[0]
    if M <= KERNEL_MAX_ROWS and _kernel_ok(x, qs, scale, zero) and scale.dtype == torch.float32:
        x = x.contiguous()
        xs = x.view(M, -1, GROUP).sum(-1)  # (M, K) -> (M, K/32): the zero's factor
        y = torch.empty(M, N, dtype=x.dtype)
        lib = _library()
        assert lib is not None
        lib.mh_int4_mm(
            x.data_ptr(), xs.data_ptr(), qs.data_ptr(), scale.data_ptr(), zero.data_ptr(),
            y.data_ptr(), M, N, x.shape[1], torch.get_num_threads(),
        )  # fmt: skip
        return y
    return _tiled(x, N, lambda a, b: dequantize_int4(qs[a:b], scale[a:b], zero[a:b], x.dtype))


def int8_mm(x: Tensor, qs: Tensor, scale: Tensor) -> Tensor:
    """x (M, K) @ w^T -> (M, N), w the int8 form."""
    M = x.shape[0]
    N = qs.shape[0]
    if M <= KERNEL_MAX_ROWS and _kernel_ok(x, qs, scale) and scale.dtype == torch.float32:
        x = x.contiguous()
        y = torch.empty(M, N, dtype=x.dtype)
        lib = _library()
        assert lib is not None
        lib.mh_int8_mm(
            x.data_ptr(), qs.data_ptr(), scale.data_ptr(), y.data_ptr(),
            M, N, x.shape[1], torch.get_num_threads(),
        )  # fmt: skip
        return y
    return _tiled(x, N, lambda a, b: dequantize_int8(qs[a:b], scale[a:b], x.dtype))


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
