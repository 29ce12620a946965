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
rounding breaks "exact to the file"). The kernel below multiplies float32 activations by the
packed weights, dequantising in registers, and is compiled once per machine with the system C
compiler (`cc -O3 -march=native`, cached under ~/.cache/multihead), so the compiler picks the
widest path the machine has (`kernel_isa()`): AVX-512 (16 lanes; per group of 32 the 16
values s q + z form a table that `vpermps` indexes with the nibbles, so weights come out
dequantised with no integer conversion and no separate zero term; two groups per iteration),
AVX2 + FMA (8 lanes), or portable C. Without a compiler the products dequantise tile by tile
and use torch's GEMM (same values, slower).

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
import hashlib
import os
import platform
import subprocess
import tempfile
import weakref
from functools import cache
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import Tensor

GROUP = 32
KERNEL_MAX_ROWS = 8  # measured crossover (docs/performance.md): above it, dequantise + GEMM
_TILE_ELEMENTS = 1 << 22  # dequantised float32 values per tile on the fallback path (16 MB)

_SOURCE = r"""
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512F__) || defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif
#define MH_MAX_ROWS 8
#if defined(__AVX512F__)
#define MH_ISA 512
#elif defined(__AVX2__) && defined(__FMA__)
#define MH_ISA 256
#else
#define MH_ISA 0
#endif

#define MH_LOAD16(p) _mm_loadu_si128((const __m128i *)(p))

int mh_isa(void) { return MH_ISA; }

/* IEEE half -> float, exact (subnormals, inf and NaN included) */
static inline float mh_h2f(uint16_t h) {
    uint32_t s = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 31, m = h & 1023, f;
    float r;
    if (e == 0) {
        r = (float)m * 5.9604644775390625e-8f; /* m * 2^-24 */
        return s ? -r : r;
    }
    f = e == 31 ? (s | 0x7f800000u | (m << 13)) : (s | ((e + 112) << 23) | (m << 13));
    memcpy(&r, &f, 4);
    return r;
}

/* out[0..n) = the halves h[0..n) as floats */
static inline void mh_halves(const uint16_t *h, long n, float *out) {
    long i = 0;
#if MH_ISA == 512
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(out + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(h + i))));
#elif defined(__F16C__)
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
#endif
#if MH_ISA == 512 && defined(__AVX512BW__) && defined(__AVX512VL__)
    if (i < n) { /* the last 1..15: a masked load, no scalar tail */
        __mmask16 k = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(out + i, k, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, h + i)));
        return;
    }
#endif
    for (; i < n; i++) out[i] = mh_h2f(h[i]);
}

/* rows n..n+R-1's G scales (and zeros) as float32 into sf (zf), R * G values each (the rows
   are contiguous in the (N, G) arrays, so a block converts in one pass): `half` says the
   stored dtype is float16; zero NULL means Q4_0's implicit zero, -8 scale */
static inline void mh_block_scales(const void *scale, const void *zero, int half, long n, long G,
                                   long R, float *sf, float *zf) {
    if (half) {
        mh_halves((const uint16_t *)scale + n * G, G * R, sf);
    } else {
        memcpy(sf, (const float *)scale + n * G, G * R * sizeof(float));
    }
    if (!zf) return;
    if (!zero) {
        for (long g = 0; g < G * R; g++) zf[g] = -8.0f * sf[g];
    } else if (half) {
        mh_halves((const uint16_t *)zero + n * G, G * R, zf);
    } else {
        memcpy(zf, (const float *)zero + n * G, G * R * sizeof(float));
    }
}

/* row n's G scales (and zeros), as mh_block_scales with R = 1 */
static inline void mh_row_scales(const void *scale, const void *zero, int half, long n, long G,
                                 float *sf, float *zf) {
    mh_block_scales(scale, zero, half, n, G, 1, sf, zf);
}

/* software prefetch of `bytes` from p (rows ahead of the ones computed: see mh_m1_block) */
static inline void mh_prefetch(const void *p, long bytes) {
    for (long i = 0; i < bytes; i += 64) __builtin_prefetch((const char *)p + i, 0, 3);
}

#if MH_ISA == 512
/* 16 int8 -> 16 floats */
static inline __m512 mh_i8f(__m128i b) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)); }
/* the table t (16 floats) read at the low 4 bits of v's lanes */
static inline __m512 mh_lut(__m512i v, __m512 t) { return _mm512_permutexvar_ps(v, t); }
/* the table s q + z, q = 0..15 */
static inline __m512 mh_table(float s, float z) {
    const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    return _mm512_fmadd_ps(iota, _mm512_set1_ps(s), _mm512_set1_ps(z));
}
static inline float mh_hsum(__m512 v) { return _mm512_reduce_add_ps(v); }
#elif MH_ISA == 256
static inline float mh_hsum(__m256 v) {
    float lanes[8], t = 0.0f;
    _mm256_storeu_ps(lanes, v);
    for (int j = 0; j < 8; j++) t += lanes[j];
    return t;
}
#endif

#if MH_ISA == 512
#define MH_BLOCK 4 /* output rows per iteration of the one-row path */
#define MH_AHEAD 2 /* blocks between the one computed and the one prefetched */
/* y[0..R) = R weight rows (from qn, K/2 bytes each; scales sf and zeros zf, G per row) times
   the one activation row x. Per group of 32, the 16 values s q + z (q = 0..15) form a table
   that vpermps indexes with the nibbles (it reads the low 4 bits of each index): the weights
   come out dequantised, as the dequantiser makes them, with no int -> float conversion. R rows
   at once share the loads of x and give 2 R independent accumulation chains. */
static inline __attribute__((always_inline)) void mh_int4_m1(
        const float *x, const uint8_t *qn, const float *sf, const float *zf, long G, long K,
        const int R, float *y) {
    __m512 a[MH_BLOCK][2];
    for (int r = 0; r < R; r++) a[r][0] = a[r][1] = _mm512_setzero_ps();
    for (long g = 0; g < G; g++) {
        const float *xg = x + g * 32;
        const __m512 x0 = _mm512_loadu_ps(xg), x1 = _mm512_loadu_ps(xg + 16);
        for (int r = 0; r < R; r++) {
            __m512i v = _mm512_cvtepu8_epi32(MH_LOAD16(qn + r * (K / 2) + g * 16));
            __m512 t = mh_table(sf[r * G + g], zf[r * G + g]);
            a[r][0] = _mm512_fmadd_ps(x0, mh_lut(v, t), a[r][0]);
            a[r][1] = _mm512_fmadd_ps(x1, mh_lut(_mm512_srli_epi32(v, 4), t), a[r][1]);
        }
    }
    for (int r = 0; r < R; r++) y[r] = mh_hsum(_mm512_add_ps(a[r][0], a[r][1]));
}
/* y[0..R) = R int8 weight rows (from qn, K bytes each; scales sf, G per row) times the one
   activation row x */
static inline __attribute__((always_inline)) void mh_int8_m1(
        const float *x, const int8_t *qn, const float *sf, long G, long K, const int R,
        float *y) {
    __m512 a[MH_BLOCK];
    for (int r = 0; r < R; r++) a[r] = _mm512_setzero_ps();
    for (long g = 0; g < G; g++) {
        const float *xg = x + g * 32;
        const __m512 x0 = _mm512_loadu_ps(xg), x1 = _mm512_loadu_ps(xg + 16);
        for (int r = 0; r < R; r++) {
            const int8_t *b = qn + r * K + g * 32;
            __m512 t = _mm512_mul_ps(x0, mh_i8f(MH_LOAD16(b)));
            t = _mm512_fmadd_ps(x1, mh_i8f(MH_LOAD16(b + 16)), t);
            a[r] = _mm512_fmadd_ps(t, _mm512_set1_ps(sf[r * G + g]), a[r]);
        }
    }
    for (int r = 0; r < R; r++) y[r] = mh_hsum(a[r]);
}

/* rows n .. n + MH_BLOCK (or to N) of one matrix (int4 or int8) times the one row x, into
   y[n..). The block MH_AHEAD blocks on is prefetched: with the weights in DRAM (a model's
   layers, one after another) that took a 1536 x 576 Q4_1 product from ~90 to ~60 us (one
   thread); the hardware prefetcher alone left the loop waiting on memory. */
static inline void mh_m1_block(int int4, const float *x, const void *qs, const void *scale,
                               const void *zero, int half, long n, long N, long K, float *sf,
                               float *zf, float *y) {
    const long G = K / 32, R = N - n < MH_BLOCK ? N - n : MH_BLOCK;
    const long row = int4 ? K / 2 : K, srow = G * (half ? 2 : 4);
    if (n + (MH_AHEAD + 1) * MH_BLOCK <= N) { /* software prefetch MH_AHEAD blocks ahead */
        const long ahead = n + MH_AHEAD * MH_BLOCK;
        mh_prefetch((const char *)qs + ahead * row, MH_BLOCK * row);
        mh_prefetch((const char *)scale + ahead * srow, MH_BLOCK * srow);
        if (zero) mh_prefetch((const char *)zero + ahead * srow, MH_BLOCK * srow);
    }
    if (int4) {
        const uint8_t *q = (const uint8_t *)qs + n * (K / 2);
        mh_block_scales(scale, zero, half, n, G, R, sf, zf);
        if (R == MH_BLOCK) {
            mh_int4_m1(x, q, sf, zf, G, K, MH_BLOCK, y + n);
        } else {
            for (long r = 0; r < R; r++)
                mh_int4_m1(x, q + r * (K / 2), sf + r * G, zf + r * G, G, K, 1, y + n + r);
        }
    } else {
        const int8_t *q = (const int8_t *)qs + n * K;
        mh_block_scales(scale, NULL, half, n, G, R, sf, NULL);
        if (R == MH_BLOCK) {
            mh_int8_m1(x, q, sf, G, K, MH_BLOCK, y + n);
        } else {
            for (long r = 0; r < R; r++) mh_int8_m1(x, q + r * K, sf + r * G, G, K, 1, y + n + r);
        }
    }
}

/* y (1, NA + NB) = x (1, K) @ [A; B]^T for packed matrices A (NA rows) and B (NB rows, or none:
   NB = 0) of one form, in one parallel region over blocks of MH_BLOCK rows of both */
static void mh_m1(int int4, const float *x, const void *qa, const void *sa, const void *za,
                  long NA, const void *qb, const void *sb, const void *zb, long NB, int half,
                  float *y, long K, int threads) {
    const long G = K / 32, BA = (NA + MH_BLOCK - 1) / MH_BLOCK;
    const long blocks = BA + (NB + MH_BLOCK - 1) / MH_BLOCK;
    #pragma omp parallel num_threads(threads) if (threads > 1)
    {
        float *sf = (float *)malloc(sizeof(float) * 2 * MH_BLOCK * G), *zf = sf + MH_BLOCK * G;
        #pragma omp for schedule(static)
        for (long b = 0; b < blocks; b++) {
            if (b < BA)
                mh_m1_block(int4, x, qa, sa, za, half, b * MH_BLOCK, NA, K, sf, zf, y);
            else
                mh_m1_block(int4, x, qb, sb, zb, half, (b - BA) * MH_BLOCK, NB, K, sf, zf, y + NA);
        }
        free(sf);
    }
}
#endif

/* y (M, N) = x (M, K) @ w^T, w int4 groups of 32 (see kernels.py); M <= MH_MAX_ROWS (each
   group's weights are decoded once for all rows). Per row: sum_g s_g (x_g . q_g) plus the zero
   term sum_g z_g (sum of x_g). */
void mh_int4_mm(const float *x, const uint8_t *qs, const void *scale, const void *zero,
                int half, float *y, long M, long N, long K, int threads) {
    const long G = K / 32;
#if MH_ISA == 512
    if (M == 1) { /* decoding: blocks of MH_BLOCK rows (mh_m1, below) */
        mh_m1(1, x, qs, scale, zero, N, NULL, NULL, NULL, 0, half, y, K, threads);
        return;
    }
#endif
    float *xs = (float *)malloc(sizeof(float) * M * G);
    for (long m = 0; m < (MH_ISA == 512 ? 0 : M); m++)
        for (long g = 0; g < G; g++) {
            float t = 0.0f;
            for (int j = 0; j < 32; j++) t += x[m * K + g * 32 + j];
            xs[m * G + g] = t;
        }
    #pragma omp parallel num_threads(threads) if (threads > 1)
    {
        float *sf = (float *)malloc(sizeof(float) * 2 * G), *zf = sf + G;
        #pragma omp for schedule(static)
        for (long n = 0; n < N; n++) {
            const uint8_t *qn = qs + n * (K / 2);
            mh_row_scales(scale, zero, half, n, G, sf, zf);
#if MH_ISA != 512
            float zacc[MH_MAX_ROWS];
            for (long m = 0; m < M; m++) {
                float t = 0.0f;
                for (long g = 0; g < G; g++) t += zf[g] * xs[m * G + g];
                zacc[m] = t;
            }
#endif
#if MH_ISA == 512
            /* M > 1: each group's table and weights, decoded once, serve every row */
            __m512 acc[MH_MAX_ROWS], acc2[MH_MAX_ROWS];
            for (long m = 0; m < M; m++) acc[m] = acc2[m] = _mm512_setzero_ps();
            for (long g = 0; g < G; g++) {
                __m512i v = _mm512_cvtepu8_epi32(MH_LOAD16(qn + g * 16));
                __m512 t = mh_table(sf[g], zf[g]);
                __m512 lo = mh_lut(v, t);
                __m512 hi = mh_lut(_mm512_srli_epi32(v, 4), t);
                for (long m = 0; m < M; m++) {
                    const float *xg = x + m * K + g * 32;
                    acc[m] = _mm512_fmadd_ps(_mm512_loadu_ps(xg), lo, acc[m]);
                    acc2[m] = _mm512_fmadd_ps(_mm512_loadu_ps(xg + 16), hi, acc2[m]);
                }
            }
            for (long m = 0; m < M; m++) y[m * N + n] = mh_hsum(_mm512_add_ps(acc[m], acc2[m]));
#elif MH_ISA == 256
            __m256 acc[MH_MAX_ROWS];
            for (long m = 0; m < M; m++) acc[m] = _mm256_setzero_ps();
            const __m128i mask = _mm_set1_epi8(15);
            for (long g = 0; g < G; g++) {
                __m128i b = MH_LOAD16(qn + g * 16);
                __m128i lo = _mm_and_si128(b, mask);
                __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), mask);
                __m256 w0 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo));
                __m256 w1 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)));
                __m256 w2 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi));
                __m256 w3 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)));
                __m256 sg = _mm256_set1_ps(sf[g]);
                for (long m = 0; m < M; m++) {
                    const float *xg = x + m * K + g * 32;
                    __m256 t = _mm256_mul_ps(_mm256_loadu_ps(xg), w0);
                    t = _mm256_fmadd_ps(_mm256_loadu_ps(xg + 8), w1, t);
                    t = _mm256_fmadd_ps(_mm256_loadu_ps(xg + 16), w2, t);
                    t = _mm256_fmadd_ps(_mm256_loadu_ps(xg + 24), w3, t);
                    acc[m] = _mm256_fmadd_ps(t, sg, acc[m]);
                }
            }
            for (long m = 0; m < M; m++) y[m * N + n] = mh_hsum(acc[m]) + zacc[m];
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
                    total += sf[g] * t;
                }
                y[m * N + n] = total + zacc[m];
            }
#endif
        }
        free(sf);
    }
    free(xs);
}

/* w (N, K) float32 = the int4 form's rows, dequantised */
void mh_int4_rows(const uint8_t *qs, const void *scale, const void *zero, int half, float *w,
                  long N, long K, int threads) {
    const long G = K / 32;
    #pragma omp parallel num_threads(threads)
    {
        float *sf = (float *)malloc(sizeof(float) * 2 * G), *zf = sf + G;
        #pragma omp for schedule(static)
        for (long n = 0; n < N; n++) {
            mh_row_scales(scale, zero, half, n, G, sf, zf);
            for (long g = 0; g < G; g++) {
                const uint8_t *b = qs + n * (K / 2) + g * 16;
                const float s = sf[g], z = zf[g];
                float *out = w + n * K + g * 32;
                /* the buffer is fresh memory, its lines in no cache: ask for them 8 KB ahead
                   (prefetch for writing; never faults past the end): see kernels.py's
                   docstring for what it gained */
                __builtin_prefetch(out + 2048, 1, 3);
                __builtin_prefetch(out + 2048 + 16, 1, 3);
#if MH_ISA == 512
                /* the table s q + z (q = 0..15) read at the nibbles, as mh_int4_m1 does:
                   the same values as q * s + z in one FMA */
                __m512i v = _mm512_cvtepu8_epi32(MH_LOAD16(b));
                __m512 t = mh_table(s, z);
                _mm512_storeu_ps(out, mh_lut(v, t));
                _mm512_storeu_ps(out + 16, mh_lut(_mm512_srli_epi32(v, 4), t));
#else
                for (int j = 0; j < 16; j++) {
                    out[j] = (float)(b[j] & 15) * s + z;
                    out[j + 16] = (float)(b[j] >> 4) * s + z;
                }
#endif
            }
        }
        free(sf);
    }
}

/* w (N, K) float32 = the int8 form's rows, dequantised */
void mh_int8_rows(const int8_t *qs, const void *scale, int half, float *w, long N, long K,
                  int threads) {
    const long G = K / 32;
    #pragma omp parallel num_threads(threads)
    {
        float *sf = (float *)malloc(sizeof(float) * G);
        #pragma omp for schedule(static)
        for (long n = 0; n < N; n++) {
            mh_row_scales(scale, NULL, half, n, G, sf, NULL);
            for (long g = 0; g < G; g++)
                for (int j = 0; j < 32; j++)
                    w[n * K + g * 32 + j] = (float)qs[n * K + g * 32 + j] * sf[g];
        }
        free(sf);
    }
}


/* y (M, N) = x (M, K) @ w^T, w int8 with a scale per group of 32 (Q8_0); M <= MH_MAX_ROWS.
   `unused` stands where mh_int4_mm takes its zeros: the two share one signature. */
void mh_int8_mm(const float *x, const int8_t *qs, const void *scale, const void *unused,
                int half, float *y, long M, long N, long K, int threads) {
    const long G = K / 32;
#if MH_ISA == 512
    if (M == 1) { /* decoding (the LM head): blocks of MH_BLOCK rows (mh_m1, below) */
        mh_m1(0, x, qs, scale, NULL, N, NULL, NULL, NULL, 0, half, y, K, threads);
        return;
    }
#endif
    #pragma omp parallel num_threads(threads) if (threads > 1)
    {
        float *sf = (float *)malloc(sizeof(float) * G);
        #pragma omp for schedule(static)
        for (long n = 0; n < N; n++) {
            const int8_t *qn = qs + n * K;
            mh_row_scales(scale, NULL, half, n, G, sf, NULL);
#if MH_ISA == 512
            __m512 acc[MH_MAX_ROWS], acc2[MH_MAX_ROWS];
            for (long m = 0; m < M; m++) acc[m] = acc2[m] = _mm512_setzero_ps();
            long g = 0;
            for (; g + 1 < G; g += 2) {
                const int8_t *b = qn + g * 32;
                __m512 a0 = mh_i8f(MH_LOAD16(b));
                __m512 b0 = mh_i8f(MH_LOAD16(b + 16));
                __m512 a1 = mh_i8f(MH_LOAD16(b + 32));
                __m512 b1 = mh_i8f(MH_LOAD16(b + 48));
                __m512 s0 = _mm512_set1_ps(sf[g]), s1 = _mm512_set1_ps(sf[g + 1]);
                for (long m = 0; m < M; m++) {
                    const float *xg = x + m * K + g * 32;
                    __m512 t0 = _mm512_mul_ps(_mm512_loadu_ps(xg), a0);
                    __m512 t1 = _mm512_mul_ps(_mm512_loadu_ps(xg + 32), a1);
                    t0 = _mm512_fmadd_ps(_mm512_loadu_ps(xg + 16), b0, t0);
                    t1 = _mm512_fmadd_ps(_mm512_loadu_ps(xg + 48), b1, t1);
                    acc[m] = _mm512_fmadd_ps(t0, s0, acc[m]);
                    acc2[m] = _mm512_fmadd_ps(t1, s1, acc2[m]);
                }
            }
            for (; g < G; g++) {
                const int8_t *b = qn + g * 32;
                __m512 a0 = mh_i8f(MH_LOAD16(b));
                __m512 b0 = mh_i8f(MH_LOAD16(b + 16));
                __m512 s0 = _mm512_set1_ps(sf[g]);
                for (long m = 0; m < M; m++) {
                    const float *xg = x + m * K + g * 32;
                    __m512 t0 = _mm512_mul_ps(_mm512_loadu_ps(xg), a0);
                    t0 = _mm512_fmadd_ps(_mm512_loadu_ps(xg + 16), b0, t0);
                    acc[m] = _mm512_fmadd_ps(t0, s0, acc[m]);
                }
            }
            for (long m = 0; m < M; m++) y[m * N + n] = mh_hsum(_mm512_add_ps(acc[m], acc2[m]));
#elif MH_ISA == 256
            __m256 acc[MH_MAX_ROWS];
            for (long m = 0; m < M; m++) acc[m] = _mm256_setzero_ps();
            for (long g = 0; g < G; g++) {
                const int8_t *b = qn + g * 32;
                __m256 w[4];
                for (int i = 0; i < 4; i++) {
                    __m128i eight = _mm_loadl_epi64((const __m128i *)(b + 8 * i));
                    w[i] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(eight));
                }
                __m256 sg = _mm256_set1_ps(sf[g]);
                for (long m = 0; m < M; m++) {
                    const float *xg = x + m * K + g * 32;
                    __m256 t = _mm256_mul_ps(_mm256_loadu_ps(xg), w[0]);
                    t = _mm256_fmadd_ps(_mm256_loadu_ps(xg + 8), w[1], t);
                    t = _mm256_fmadd_ps(_mm256_loadu_ps(xg + 16), w[2], t);
                    t = _mm256_fmadd_ps(_mm256_loadu_ps(xg + 24), w[3], t);
                    acc[m] = _mm256_fmadd_ps(t, sg, acc[m]);
                }
            }
            for (long m = 0; m < M; m++) y[m * N + n] = mh_hsum(acc[m]);
#else
            for (long m = 0; m < M; m++) {
                const float *xm = x + m * K;
                float total = 0.0f;
                for (long g = 0; g < G; g++) {
                    float t = 0.0f;
                    for (int j = 0; j < 32; j++) t += xm[g * 32 + j] * (float)qn[g * 32 + j];
                    total += sf[g] * t;
                }
                y[m * N + n] = total;
            }
#endif
        }
        free(sf);
    }
}

/* y (1, NA + NB) = x (1, K) @ [A; B]^T, A and B packed in one form (int4 = 1: uint8 nibbles,
   scales, zeros or NULL; int4 = 0: int8 and scales; scales of one dtype): SwiGLU's gate and up
   read with one call (one parallel region on AVX-512; two products elsewhere). Each output
   row is computed as mh_int4_mm / mh_int8_mm compute it alone. */
void mh_pair_mv(int int4, const float *x, const void *qa, const void *sa, const void *za,
                long NA, const void *qb, const void *sb, const void *zb, long NB, int half,
                float *y, long K, int threads) {
#if MH_ISA == 512
    mh_m1(int4, x, qa, sa, za, NA, qb, sb, zb, NB, half, y, K, threads);
#else
    if (int4) {
        mh_int4_mm(x, (const uint8_t *)qa, sa, za, half, y, 1, NA, K, threads);
        mh_int4_mm(x, (const uint8_t *)qb, sb, zb, half, y + NA, 1, NB, K, threads);
    } else {
        mh_int8_mm(x, (const int8_t *)qa, sa, NULL, half, y, 1, NA, K, threads);
        mh_int8_mm(x, (const int8_t *)qb, sb, NULL, half, y + NA, 1, NB, K, threads);
    }
#endif
}
"""
_FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC")


def _cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "multihead"


@cache
def _library(extra: tuple[str, ...] = ()) -> ctypes.CDLL | None:
    """The compiled kernels, or None where they cannot be built (no C compiler, no OpenMP,
    MULTIHEAD_NO_KERNELS=1): callers then take the torch path. `extra` flags are appended
    (tests build the AVX2 and scalar variants with `-mno-avx512f`, `-mno-avx2`)."""
    if os.environ.get("MULTIHEAD_NO_KERNELS") == "1" or platform.system() != "Linux":
        return None
    flags = [*_FLAGS, *extra]
    key = hashlib.sha256(
        (_SOURCE + " ".join(flags) + platform.machine() + platform.node()).encode()
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
                    [os.environ.get("CC", "cc"), *flags, str(src), "-o", str(out)],
                    check=True,
                    capture_output=True,
                    timeout=120,
                )
                os.replace(out, target)  # atomic: a concurrent process sees all or nothing
        lib = ctypes.CDLL(str(target))
    except (OSError, subprocess.SubprocessError):
        return None
    f, i64, i32 = ctypes.c_void_p, ctypes.c_long, ctypes.c_int
    lib.mh_int4_mm.argtypes = [f, f, f, f, i32, f, i64, i64, i64, i32]
    lib.mh_int8_mm.argtypes = [f, f, f, f, i32, f, i64, i64, i64, i32]
    lib.mh_int4_rows.argtypes = [f, f, f, i32, f, i64, i64, i32]
    lib.mh_int8_rows.argtypes = [f, f, i32, f, i64, i64, i32]
    lib.mh_pair_mv.argtypes = [i32, f, f, f, f, i64, f, f, f, i64, i32, f, i64, i32]
    lib.mh_int4_mm.restype = lib.mh_int8_mm.restype = lib.mh_pair_mv.restype = None
    lib.mh_int4_rows.restype = lib.mh_int8_rows.restype = None
    lib.mh_isa.restype = i32
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
        w = torch.empty(n, G * GROUP)
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
        w = torch.empty(n, G * GROUP)
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
    if args is not None and _kernel_reads(x):
        return run_kernel(x.contiguous(), args)
    if dense_reads(x, (args,)):
        assert args is not None
        return dense_mm(x, True, (args,))
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
    y = torch.empty(M, N)
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
    if args is not None and _kernel_reads(x):
        return run_kernel(x.contiguous(), args)
    if dense_reads(x, (args,)):
        assert args is not None
        return dense_mm(x, False, (args,))
    return _tiled(x, qs.shape[0], lambda a, b: dequantize_int8(qs[a:b], scale[a:b], x.dtype))


def dense_mm(x: Tensor, int4: bool, plans: tuple[KernelArgs, ...]) -> Tensor:
    """x (M, K) float32 on the CPU @ [W1; W2; ...]^T -> (M, N1 + N2 + ...): the packed matrices
    (one form, width K; their `kernel_args`) dequantised one after another into one float32
    buffer owned by this call, then one GEMM. Each row's value is what `x @ w.t()` gives with
    w the dequantiser's matrix (the products of M > KERNEL_MAX_ROWS rows; see the module
    docstring)."""
    lib = _library()
    assert lib is not None
    K = plans[0].k
    w = torch.empty(sum(p.n for p in plans), K)
    threads = torch.get_num_threads()
    at = w.data_ptr()
    for p in plans:
        t = threads if p.parallel else 1
        if int4:
            lib.mh_int4_rows(p.qs, p.scale, p.zero, p.half, at, p.n, K, t)
        else:
            lib.mh_int8_rows(p.qs, p.scale, p.half, at, p.n, K, t)
        at += p.n * K * 4  # (float32 bytes)
    return torch.mm(x, w.t())


def dense_reads(x: Tensor, plans: tuple[KernelArgs | None, ...]) -> bool:
    """Whether `dense_mm` takes activations x (M, K) with these plans: float32 on the CPU, more
    than KERNEL_MAX_ROWS rows, every plan readable, of width K, together at most _TILE_ELEMENTS
    dequantised values."""
    return (
        x.shape[0] > KERNEL_MAX_ROWS
        and x.dtype is torch.float32
        and x.device.type == "cpu"
        and all(p is not None and p.k == x.shape[1] for p in plans)
        and sum(p.n * p.k for p in plans if p is not None) <= _TILE_ELEMENTS
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
    lib = _library()
    assert lib is not None
    y = torch.empty(1, a.n + b.n)
    threads = torch.get_num_threads() if a.parallel or b.parallel else 1
    lib.mh_pair_mv(
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
