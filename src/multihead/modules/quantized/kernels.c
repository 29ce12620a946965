#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
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

/* -- the small ops around a decoding step's products (one row of activations) ------------- */

/* y (rows, K) = RMSNorm of x's rows: x / sqrt(sum(x^2) / K + eps), times w (NULL: no gain).
   torch's order after the sum: the division by the count, + eps, 1 / sqrt, then x * that and
   the product times w, each rounded (no FMA contraction, function attribute); the sum of
   squares runs in eight float32 chains, an order of its own (torch's reduction has another):
   values within float32 rounding of F.rms_norm's. */
__attribute__((optimize("fp-contract=off")))
void mh_rms_norm(const float *x, const float *w, float eps, float *y, long rows, long K) {
    for (long r = 0; r < rows; r++) {
        const float *xr = x + r * K;
        float *yr = y + r * K;
        float a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        long i = 0;
        for (; i + 8 <= K; i += 8)
            for (int j = 0; j < 8; j++) a[j] += xr[i + j] * xr[i + j];
        for (; i < K; i++) a[0] += xr[i] * xr[i];
        const float ss = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
        const float h = 1.0f / sqrtf(ss / (float)K + eps);
        if (w) {
            for (i = 0; i < K; i++) yr[i] = (xr[i] * h) * w[i];
        } else {
            for (i = 0; i < K; i++) yr[i] = xr[i] * h;
        }
    }
}

/* RoPE in place on n contiguous rows of D (D even) by one position's tables cos and sgn (D
   each; sgn = sin with the first half negated): x[i] = x[i] cos[i] + x[i +- D/2] sgn[i], as
   `RotaryEmbedding.rotate_heads_` computes it (two products and a sum, each rounded: no FMA
   contraction), so the values are the same bits. */
__attribute__((optimize("fp-contract=off")))
void mh_rope_rows(float *x, const float *cos, const float *sgn, long n, long D) {
    const long half = D / 2;
    for (long r = 0; r < n; r++) {
        float *xr = x + r * D;
        for (long i = 0; i < half; i++) {
            const float a = xr[i], b = xr[i + half];
            xr[i] = a * cos[i] + b * sgn[i];
            xr[i + half] = b * cos[i + half] + a * sgn[i + half];
        }
    }
}

/* One query per head over a cache (a decoding step's attention): out (H, D) = softmax(q_h .
   K_g^T * scale) V_g with g = h / (H / Hkv) (grouped heads). Head g's keys start at
   k + g * ks, T rows of D floats (row stride D; likewise v with vs): a cache's buffer read in
   place. No mask (every key is seen). The sums in float32 chains of their own: values within
   float32 rounding of SDPA's. */
#if MH_ISA == 512
/* e^x for 16 lanes: x = n ln2 + r (|r| <= ln2 / 2, ln2 in two parts), e^r by Cephes' degree-6
   polynomial for expf, times 2^n by vscalefps (which gives inf past the top and 0 or a
   subnormal below, as expf does); NaN stays NaN (the clamps let it through). Within ~2 ulp of
   expf. */
static inline __m512 mh_exp16(__m512 x) {
    x = _mm512_min_ps(_mm512_set1_ps(89.0f), _mm512_max_ps(_mm512_set1_ps(-104.0f), x));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}
#endif

static inline float mh_dot(const float *restrict a, const float *restrict b, long D) {
    float s = 0.0f;
    for (long d = 0; d < D; d++) s += a[d] * b[d];
    return s;
}

/* head h of mh_attend_one; p: T floats of scratch */
static void mh_attend_head(const float *q, const float *k, const float *v, long ks, long vs,
                           float *out, long h, long H, long Hkv, long T, long D, float scale,
                           float *p) {
    const long group = H / Hkv;
#if MH_ISA == 512
    const int wide = D % 16 == 0 && D <= 256; /* the vector path: D/16 registers per row */
#endif
    {
        const float *qh = q + h * D, *kg = k + (h / group) * ks, *vg = v + (h / group) * vs;
        float *restrict oh = out + h * D;
        float top = -INFINITY, total = 0.0f;
        long t = 0;
#if MH_ISA == 512
        if (wide) { /* four keys at a time: four independent chains */
            for (; t + 4 <= T; t += 4) {
                const float *k0 = kg + t * D;
                __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
                for (long d = 0; d < D; d += 16) {
                    const __m512 x = _mm512_loadu_ps(qh + d);
                    a0 = _mm512_fmadd_ps(x, _mm512_loadu_ps(k0 + d), a0);
                    a1 = _mm512_fmadd_ps(x, _mm512_loadu_ps(k0 + D + d), a1);
                    a2 = _mm512_fmadd_ps(x, _mm512_loadu_ps(k0 + 2 * D + d), a2);
                    a3 = _mm512_fmadd_ps(x, _mm512_loadu_ps(k0 + 3 * D + d), a3);
                }
                p[t] = _mm512_reduce_add_ps(a0) * scale;
                p[t + 1] = _mm512_reduce_add_ps(a1) * scale;
                p[t + 2] = _mm512_reduce_add_ps(a2) * scale;
                p[t + 3] = _mm512_reduce_add_ps(a3) * scale;
            }
        }
#endif
        for (; t < T; t++) p[t] = mh_dot(qh, kg + t * D, D) * scale;
        for (t = 0; t < T; t++)
            if (p[t] > top) top = p[t];
        t = 0;
#if MH_ISA == 512
        {
            __m512 sum = _mm512_setzero_ps();
            const __m512 m = _mm512_set1_ps(top);
            for (; t + 16 <= T; t += 16) {
                const __m512 e = mh_exp16(_mm512_sub_ps(_mm512_loadu_ps(p + t), m));
                _mm512_storeu_ps(p + t, e);
                sum = _mm512_add_ps(sum, e);
            }
            total = _mm512_reduce_add_ps(sum);
        }
#endif
        for (; t < T; t++) {
            p[t] = expf(p[t] - top);
            total += p[t];
        }
        const float inv = 1.0f / total;
#if MH_ISA == 512
        if (wide) { /* the D/16 accumulators are independent chains across the keys */
            __m512 acc[16];
            const long n = D / 16;
            for (long j = 0; j < n; j++) acc[j] = _mm512_setzero_ps();
            for (t = 0; t < T; t++) {
                const __m512 e = _mm512_set1_ps(p[t]);
                const float *vt = vg + t * D;
                for (long j = 0; j < n; j++)
                    acc[j] = _mm512_fmadd_ps(e, _mm512_loadu_ps(vt + 16 * j), acc[j]);
            }
            for (long j = 0; j < n; j++)
                _mm512_storeu_ps(oh + 16 * j, _mm512_mul_ps(acc[j], _mm512_set1_ps(inv)));
            return;
        }
#endif
        for (long d = 0; d < D; d++) oh[d] = 0.0f;
        for (t = 0; t < T; t++)
            for (long d = 0; d < D; d++) oh[d] += p[t] * vg[t * D + d];
        for (long d = 0; d < D; d++) oh[d] *= inv;
    }
}

/* (the heads split over `threads` where the work is large: a long cache) */
void mh_attend_one(const float *q, const float *k, const float *v, long ks, long vs, float *out,
                   long H, long Hkv, long T, long D, float scale, int threads) {
    #pragma omp parallel num_threads(threads) if (threads > 1 && H > 1)
    {
        float stack[1024];
        float *p = T <= 1024 ? stack : (float *)malloc(sizeof(float) * T);
        #pragma omp for schedule(static)
        for (long h = 0; h < H; h++) mh_attend_head(q, k, v, ks, vs, out, h, H, Hkv, T, D, scale, p);
        if (p != stack) free(p);
    }
}

/* y (1, NA) = silu(x A^T) * (x B^T) for x (1, K): SwiGLU's gate A and up B read with one call
   (mh_pair_mv), the products into a scratch row, then each gate's SiLU g / (1 + exp(-g)) (as
   torch writes it) times its up value: each product as the pair call gives it, the SiLU within
   float32 rounding of torch's (another exp). NA == NB. */
void mh_pair_silu(int int4, const float *x, const void *qa, const void *sa, const void *za,
                  long NA, const void *qb, const void *sb, const void *zb, long NB, int half,
                  float *y, long K, int threads) {
    float *both = (float *)malloc(sizeof(float) * (NA + NB));
    mh_pair_mv(int4, x, qa, sa, za, NA, qb, sb, zb, NB, half, both, K, threads);
    long i = 0;
#if MH_ISA == 512
    for (; i + 16 <= NA; i += 16) {
        const __m512 g = _mm512_loadu_ps(both + i);
        const __m512 e = mh_exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
        const __m512 silu = _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
        _mm512_storeu_ps(y + i, _mm512_mul_ps(silu, _mm512_loadu_ps(both + NA + i)));
    }
#endif
    for (; i < NA; i++) {
        const float g = both[i];
        y[i] = (g / (1.0f + expf(-g))) * both[NA + i];
    }
    free(both);
}

/* A decoding step's keys and values appended, then its attention: the fused projection's row
   (H query heads, Hkv key heads, Hkv value heads of D, contiguous) writes its keys and values
   at position s of a cache buffer (keys of head g at kv + g * hs, values at kv + (Hkv + g) * hs,
   rows of D), then mh_attend_one over the s + 1 keys: the copy and the call made apart, so
   the same values. out (H, D). */
void mh_append_attend(const float *row, float *kv, long hs, long s, float *out, long H, long Hkv,
                      long D, float scale, int threads) {
    for (long g = 0; g < 2 * Hkv; g++)
        memcpy(kv + g * hs + s * D, row + (H + g) * D, sizeof(float) * D);
    mh_attend_one(row, kv, kv + Hkv * hs, hs, hs, out, H, Hkv, s + 1, D, scale, threads);
}

/* Whether a static cache's key mask (R bools, one byte each) marks exactly the slots
 * 0 .. n - 1: then a one-query attention over its first n keys (mh_attend_one) is the masked
 * attention over all R. */
int mh_prefix_mask(const unsigned char *m, long R, long n) {
    if (n < 1 || n > R) return 0;
    for (long i = 0; i < n; i++)
        if (!m[i]) return 0;
    for (long i = n; i < R; i++)
        if (m[i]) return 0;
    return 1;
}
