/* Attention over one interval of keys per query row: row i sees keys lo[i] .. hi[i] - 1
   (tile_intervals.py says why and where it runs). float32; D a multiple of 16.

   Portable C with GCC/Clang vector types of 16 floats: `cc -O3 -march=native` makes them one
   AVX-512 register, two AVX2 registers, or scalar code, so one source serves every machine.

   A block of R query rows at a time computes the keys of the union of its intervals
   (a .. e - 1), 16 keys a step: scores from K transposed (kt: D rows of `tp` floats, the
   keys of the block's chunk of CHUNK rows, padded by 16 zeros so a step may read past the
   last key), each q[r][d] broadcast against 16
   keys of row d; keys outside a row's own interval are dropped by a lane mask after the
   exponential (exactly 0). The R rows share every load of K and V.

   Shapes (strides in floats; a row's D values contiguous): q, out, grad_out, dq (T, D) per
   query head, k, v, dk, dv (T, D) per kv head, kt, vt (D, tp: a chunk's keys); lse, lo, hi (T)
   per query head. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef float v16 __attribute__((vector_size(64)));
typedef int32_t i16v __attribute__((vector_size(64)));

#define R 4 /* query rows per block */

static inline v16 ld(const float *p) {
    v16 x;
    memcpy(&x, p, sizeof x);
    return x;
}
static inline void st(float *p, v16 x) { memcpy(p, &x, sizeof x); }
static inline v16 splat(float x) { return (v16){0} + x; }
static inline v16 sel(i16v m, v16 x) { return (v16)(m & (i16v)x); }
/* Keep a value in a register: GCC otherwise folds a vector used by several FMAs back into
   each as a memory operand, one load per use (measured: the score loop load-bound). */
#if defined(__AVX512F__) && defined(__GNUC__) /* (a 16-float register) */
#define HOLD(x) __asm__("" : "+v"(x))
#else
#define HOLD(x) ((void)0)
#endif
/* across the 16 lanes, as a tree (four shuffles: a serial loop's 15 dependent adds were
   ~60 cycles a row, a fifth of a 4-row block's work at a window of 64) */
typedef float v8 __attribute__((vector_size(32)));
typedef float v4 __attribute__((vector_size(16)));
static inline float hsum(v16 x) {
    const v8 a = __builtin_shufflevector(x, x, 0, 1, 2, 3, 4, 5, 6, 7) +
                 __builtin_shufflevector(x, x, 8, 9, 10, 11, 12, 13, 14, 15);
    const v4 b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
    return (b[0] + b[2]) + (b[1] + b[3]);
}
typedef int32_t i8v __attribute__((vector_size(32)));
typedef int32_t i4v __attribute__((vector_size(16)));
static inline v8 max8(v8 a, v8 b) {
    const i8v m = a > b;
    return (v8)((m & (i8v)a) | (~m & (i8v)b));
}
static inline v4 max4(v4 a, v4 b) {
    const i4v m = a > b;
    return (v4)((m & (i4v)a) | (~m & (i4v)b));
}
static inline float hmax(v16 x) {
    const v8 a = max8(__builtin_shufflevector(x, x, 0, 1, 2, 3, 4, 5, 6, 7),
                      __builtin_shufflevector(x, x, 8, 9, 10, 11, 12, 13, 14, 15));
    const v4 b = max4(__builtin_shufflevector(a, a, 0, 1, 2, 3), __builtin_shufflevector(a, a, 4, 5, 6, 7));
    const float c = b[0] > b[2] ? b[0] : b[2], d = b[1] > b[3] ? b[1] : b[3];
    return c > d ? c : d;
}

/* e^x for x <= 0 (Cephes' expf polynomial; 2^n built in the exponent bits). Below -87 the
   result is clamped to ~e^-87 (callers mask the lanes that must be exactly 0). */
static inline v16 vexp(v16 x) {
    const i16v low = x < splat(-87.0f);
    x = (v16)((low & (i16v)splat(-87.0f)) | (~low & (i16v)x));
    const v16 t = x * 1.44269504088896341f + 12582912.0f; /* round to nearest */
    const v16 n = t - 12582912.0f;
    v16 r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    v16 p = splat(1.9875691500e-4f);
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + (r + 1.0f);
    const i16v e = (__builtin_convertvector(n, i16v) + 127) << 23;
    return p * (v16)e;
}

/* lanes j0 .. j0 + 15 inside [lo, hi) */
static inline i16v inside(long j0, int32_t lo, int32_t hi) {
    const i16v j = (i16v){0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15} + (int32_t)j0;
    return (j >= lo) & (j < hi);
}

/* s[r][j - a] = x_r . col_j of xt (D rows of tp), for j in a .. a + 16 n - 1, rows 0 .. R-1 */
static inline __attribute__((always_inline)) void products(const float *x[R], const float *xt,
                                                           long tp, long a, long n, long D,
                                                           float *s, long sw) {
    long c = 0;
    for (; c + 2 <= n; c += 2) {
        v16 acc[R][2];
        for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = (v16){0};
        const float *col = xt + a + 16 * c;
        for (long d = 0; d < D; d++) {
            v16 k0 = ld(col + d * tp), k1 = ld(col + d * tp + 16);
            HOLD(k0);
            HOLD(k1);
            for (int r = 0; r < R; r++) {
                acc[r][0] += x[r][d] * k0;
                acc[r][1] += x[r][d] * k1;
            }
        }
        for (int r = 0; r < R; r++) {
            st(s + r * sw + 16 * c, acc[r][0]);
            st(s + r * sw + 16 * c + 16, acc[r][1]);
        }
    }
    for (; c < n; c++) {
        v16 acc[R];
        for (int r = 0; r < R; r++) acc[r] = (v16){0};
        const float *col = xt + a + 16 * c;
        for (long d = 0; d < D; d++) {
            v16 k0 = ld(col + d * tp);
            HOLD(k0);
            for (int r = 0; r < R; r++) acc[r] += x[r][d] * k0;
        }
        for (int r = 0; r < R; r++) st(s + r * sw + 16 * c, acc[r]);
    }
}

/* y_r (D) = sum_j w[r][j - a] row_j of m (rows of stride ms), j in a .. e - 1; DC = D / 16 */
static inline __attribute__((always_inline)) void weighted(const float *w, long sw,
                                                           const float *m, long ms, long a,
                                                           long e, int DC, v16 *y) {
    for (int i = 0; i < R * DC; i++) y[i] = (v16){0};
    for (long j = a; j < e; j++) {
        const float *row = m + j * ms;
        for (int c = 0; c < DC; c++) {
            v16 mv = ld(row + 16 * c);
            HOLD(mv);
            for (int r = 0; r < R; r++) y[r * DC + c] += w[r * sw + j - a] * mv;
        }
    }
}

/* g_j (D) += sum_r w[r][j - a] x_r, j in a .. e - 1 (g rows of stride gs) */
static inline __attribute__((always_inline)) void scatter(const float *w, long sw,
                                                          const float *x[R], float *g, long gs,
                                                          long a, long e, int DC) {
    v16 xv[R][16];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < DC; c++) xv[r][c] = ld(x[r] + 16 * c);
    for (long j = a; j < e; j++) {
        float *row = g + j * gs;
        for (int c = 0; c < DC; c++) {
            v16 acc = ld(row + 16 * c);
            for (int r = 0; r < R; r++) acc += w[r * sw + j - a] * xv[r][c];
            st(row + 16 * c, acc);
        }
    }
}

/* the block's union of intervals; rows past T (r >= rows) or with no key count for nothing */
static long block_keys(const int32_t *lo, const int32_t *hi, long i0, long rows, long *a) {
    long first = -1, end = 0;
    for (long r = 0; r < rows; r++) {
        if (lo[i0 + r] >= hi[i0 + r]) continue;
        if (first < 0 || lo[i0 + r] < first) first = lo[i0 + r];
        if (hi[i0 + r] > end) end = hi[i0 + r];
    }
    *a = first;
    return first < 0 ? 0 : end - first;
}

/* Query rows a chunk: K (and V) are transposed a chunk at a time, only the keys its rows see,
   into a buffer of the widest chunk's keys (not T: at a window of 64 within documents,
   T 4096, D 64, ~84 KB against 1 MB a head, pages a fresh call need not fault in; a key
   seen by two chunks is transposed twice, a few us). A multiple of R. */
#define CHUNK 256

void mh_iv_transpose(const float *x, long xs, long T, long D, float *xt, long tp);

/* the most keys one chunk of rows sees */
static long widest(const int32_t *lo, const int32_t *hi, long T) {
    long most = 0, a;
    for (long c0 = 0; c0 < T; c0 += CHUNK) {
        const long n = block_keys(lo, hi, c0, T - c0 < CHUNK ? T - c0 : CHUNK, &a);
        most = n > most ? n : most;
    }
    return most;
}

static inline __attribute__((always_inline)) void forward_head(
    const float *q, long qs, const float *k, long ks, float *kt, long tp, const float *v,
    long vs, float *out, long os, float *lse, const int32_t *lo, const int32_t *hi, long T,
    long D, float scale, int DC, float *s, long sw) {
    static const float zero[256];
    for (long c0 = 0; c0 < T; c0 += CHUNK) {
        const long c1 = c0 + CHUNK < T ? c0 + CHUNK : T;
        long ka; /* the chunk's keys ka .. ka + kn - 1, transposed into kt's columns 0 .. kn - 1 */
        const long kn = block_keys(lo, hi, c0, c1 - c0, &ka);
        if (kn > 0) mh_iv_transpose(k + ka * ks, ks, kn, D, kt, tp);
        for (long i0 = c0; i0 < c1; i0 += R) {
            const long rows = c1 - i0 < R ? c1 - i0 : R;
            long a;
            const long n = block_keys(lo, hi, i0, rows, &a);
            const float *x[R];
            for (int r = 0; r < R; r++) x[r] = r < rows ? q + (i0 + r) * qs : zero;
            if (n == 0) {
                for (long r = 0; r < rows; r++) {
                    memset(out + (i0 + r) * os, 0, D * sizeof(float));
                    lse[i0 + r] = 0.0f;
                }
                continue;
            }
            const long steps = (n + 15) / 16;
            products(x, kt, tp, a - ka, steps, D, s, sw);
            float inv[R];
            for (int r = 0; r < R; r++) {
                const int32_t l = r < rows ? lo[i0 + r] : 0, h = r < rows ? hi[i0 + r] : 0;
                float *sr = s + r * sw;
                v16 top = splat(-INFINITY);
                for (long c = 0; c < steps; c++) {
                    const i16v m = inside(a + 16 * c, l, h);
                    const v16 x16 = ld(sr + 16 * c) * scale;
                    top = (v16)((m & (i16v)x16) | (~m & (i16v)top));
                }
                const float mx = hmax(top);
                v16 sum = (v16){0};
                for (long c = 0; c < steps; c++) {
                    const i16v m = inside(a + 16 * c, l, h);
                    const v16 p = sel(m, vexp(ld(sr + 16 * c) * scale - mx));
                    st(sr + 16 * c, p);
                    sum += p;
                }
                const float total = hsum(sum);
                if (r < rows) lse[i0 + r] = l < h ? mx + logf(total) : 0.0f;
                inv[r] = l < h ? 1.0f / total : 0.0f; /* (applied to the output: P V / sum) */
            }
            v16 y[R * 16];
            weighted(s, sw, v, vs, a, a + n, DC, y);
            for (long r = 0; r < rows; r++)
                for (int c = 0; c < DC; c++) st(out + (i0 + r) * os + 16 * c, y[r * DC + c] * inv[r]);
        }
    }
}

/* Forward of one query head. */
void mh_iv_forward(const float *q, long qs, const float *k, long ks, const float *v, long vs,
                   float *out, long os, float *lse, const int32_t *lo, const int32_t *hi, long T,
                   long D, float scale) {
    const long tp = widest(lo, hi, T) + 16, sw = tp + 32;
    float *kt = malloc(sizeof(float) * (D * tp + R * sw));
    if (!kt) return;
    float *s = kt + D * tp;
#define MH_FORWARD(DC) \
    forward_head(q, qs, k, ks, kt, tp, v, vs, out, os, lse, lo, hi, T, D, scale, DC, s, sw)
    switch (D / 16) { /* (constant chunk counts: the accumulators stay in registers) */
    case 4: MH_FORWARD(4); break;
    case 8: MH_FORWARD(8); break;
    default: MH_FORWARD((int)(D / 16));
    }
    free(kt);
}

static inline __attribute__((always_inline)) void backward_head(
    const float *q, long qs, const float *k, long ks, float *kt, const float *v, long vs,
    float *vt, long tp, const float *go, long gs, const float *o, long os, const float *lse,
    const int32_t *lo, const int32_t *hi, float *dq, long dqs, float *dk, long dks, float *dv,
    long dvs, long T, long D, float scale, int DC, float *p, float *ds, long sw) {
    static const float zero[256];
    for (long c0 = 0; c0 < T; c0 += CHUNK) {
        const long c1 = c0 + CHUNK < T ? c0 + CHUNK : T;
        long ka; /* (as the forward's) */
        const long kn = block_keys(lo, hi, c0, c1 - c0, &ka);
        if (kn > 0) {
            mh_iv_transpose(k + ka * ks, ks, kn, D, kt, tp);
            mh_iv_transpose(v + ka * vs, vs, kn, D, vt, tp);
        }
        for (long i0 = c0; i0 < c1; i0 += R) {
            const long rows = c1 - i0 < R ? c1 - i0 : R;
            long a;
            const long n = block_keys(lo, hi, i0, rows, &a);
            if (n == 0) {
                for (long r = 0; r < rows; r++) memset(dq + (i0 + r) * dqs, 0, D * sizeof(float));
                continue;
            }
            const float *x[R], *g[R];
            float delta[R];
            for (int r = 0; r < R; r++) {
                x[r] = r < rows ? q + (i0 + r) * qs : zero;
                g[r] = r < rows ? go + (i0 + r) * gs : zero;
                delta[r] = 0.0f;
                if (r < rows) {
                    v16 acc = (v16){0};
                    const float *orow = o + (i0 + r) * os;
                    for (int c = 0; c < DC; c++) acc += ld(g[r] + 16 * c) * ld(orow + 16 * c);
                    delta[r] = hsum(acc);
                }
            }
            const long steps = (n + 15) / 16;
            products(x, kt, tp, a - ka, steps, D, p, sw);
            products(g, vt, tp, a - ka, steps, D, ds, sw);
            for (int r = 0; r < R; r++) {
                const int32_t l = r < rows ? lo[i0 + r] : 0, h = r < rows ? hi[i0 + r] : 0;
                const float m = r < rows ? lse[i0 + r] : 0.0f;
                float *pr = p + r * sw, *dr = ds + r * sw;
                for (long c = 0; c < steps; c++) {
                    const i16v in = inside(a + 16 * c, l, h);
                    const v16 pv = sel(in, vexp(ld(pr + 16 * c) * scale - m));
                    st(pr + 16 * c, pv);
                    st(dr + 16 * c, pv * (ld(dr + 16 * c) - delta[r]) * scale);
                }
            }
            v16 y[R * 16];
            weighted(ds, sw, k, ks, a, a + n, DC, y);
            for (long r = 0; r < rows; r++)
                for (int c = 0; c < DC; c++) st(dq + (i0 + r) * dqs + 16 * c, y[r * DC + c]);
            scatter(ds, sw, x, dk, dks, a, a + n, DC);
            scatter(p, sw, g, dv, dvs, a, a + n, DC);
        }
    }
}

/* Backward of one query head into its kv head's dk, dv (accumulated: the caller zeroes them
   and runs a kv head's query heads one after another); dq written. */
void mh_iv_backward(const float *q, long qs, const float *k, long ks, const float *v, long vs,
                    const float *go, long gs, const float *o, long os, const float *lse,
                    const int32_t *lo, const int32_t *hi, float *dq, long dqs, float *dk,
                    long dks, float *dv, long dvs, long T, long D, float scale) {
    const long tp = widest(lo, hi, T) + 16, sw = tp + 32;
    float *kt = malloc(sizeof(float) * (2 * D * tp + 2 * R * sw));
    if (!kt) return;
    float *vt = kt + D * tp, *p = vt + D * tp, *ds = p + R * sw;
#define MH_BACKWARD(DC)                                                                        \
    backward_head(q, qs, k, ks, kt, v, vs, vt, tp, go, gs, o, os, lse, lo, hi, dq, dqs, dk, dks, \
                  dv, dvs, T, D, scale, DC, p, ds, sw)
    switch (D / 16) {
    case 4: MH_BACKWARD(4); break;
    case 8: MH_BACKWARD(8); break;
    default: MH_BACKWARD((int)(D / 16));
    }
    free(kt);
}

/* xt (D rows of tp floats) = x^T, x (T rows of stride xs); the 16 columns after T (those
   within tp) zero: all a 16-key step reads past the last key. Whole
   16 x 16 tiles are transposed in registers (four rounds of two-source shuffles, each
   swapping the off-diagonal blocks of 2s x 2s blocks: s = 8, 4, 2, 1); the rows past the
   last whole tile element by element. (A scalar copy of the transposed view cost ~90 us a
   head at T 4096, D 64: ~6% of a window-64 forward.) */
/* the shuffles' lanes: row i's new lanes (LO) and row i + s's (HI), of (row i, row i + s) */
#define LO8 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23
#define HI8 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31
#define LO4 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27
#define HI4 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31
#define LO2 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29
#define HI2 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31
#define LO1 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30
#define HI1 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31
#define SWAP_BLOCKS(s, LO, HI)                                                                 \
    for (int i = 0; i < 16; i++)                                                               \
        if (!(i & (s))) {                                                                      \
            const v16 a = m[i], b = m[i + (s)];                                                \
            m[i] = __builtin_shufflevector(a, b, LO);                                          \
            m[i + (s)] = __builtin_shufflevector(a, b, HI);                                    \
        }
void mh_iv_transpose(const float *x, long xs, long T, long D, float *xt, long tp) {
    long t0 = 0;
    for (; t0 + 16 <= T; t0 += 16)
        for (long d0 = 0; d0 < D; d0 += 16) {
            v16 m[16];
            for (int i = 0; i < 16; i++) m[i] = ld(x + (t0 + i) * xs + d0);
            SWAP_BLOCKS(8, LO8, HI8)
            SWAP_BLOCKS(4, LO4, HI4)
            SWAP_BLOCKS(2, LO2, HI2)
            SWAP_BLOCKS(1, LO1, HI1)
            for (int i = 0; i < 16; i++) st(xt + (d0 + i) * tp + t0, m[i]);
        }
    for (long t = t0; t < T; t++)
        for (long d = 0; d < D; d++) xt[d * tp + t] = x[t * xs + d];
    const long pad = tp - T < 16 ? tp - T : 16; /* (what a 16-key step reads past the last) */
    for (long d = 0; d < D; d++) memset(xt + d * tp + T, 0, pad * sizeof(float));
}

/* The whole call's units on `threads` OpenMP threads (torch's own pool: the library links
   the libgomp torch loaded), dynamically scheduled: the forward per query head, the backward
   per kv head (its query heads in turn: dk, dv need no atomics). Each unit transposes the
   keys (and values) its chunks of rows see into buffers of its own (`CHUNK`). Strides st:
   q, k, v, out, lse, lo, hi, grad_out, dq, dk, dv, each (batch, head, row), in floats or
   int32s. */
enum { SQ, SK, SV, SO, SL, SLO, SHI, SG, SDQ, SDK, SDV };
#define AT(p, s, b, h) ((p) + (b) * st[3 * (s)] + (h) * st[3 * (s) + 1])
#define ROW(s) st[3 * (s) + 2]

void mh_iv_forward_all(const float *q, const float *k, const float *v, float *out, float *lse,
                       const int32_t *lo, const int32_t *hi, const long *st, long B, long H,
                       long Hkv, long T, long D, float scale, int threads) {
    const long G = H / Hkv;
    #pragma omp parallel for num_threads(threads) schedule(dynamic, 1) if (threads > 1)
    for (long u = 0; u < B * H; u++) {
        const long b = u / H, h = u % H;
        mh_iv_forward(AT(q, SQ, b, h), ROW(SQ), AT(k, SK, b, h / G), ROW(SK), AT(v, SV, b, h / G),
                      ROW(SV), AT(out, SO, b, h), ROW(SO), AT(lse, SL, b, h), AT(lo, SLO, b, h),
                      AT(hi, SHI, b, h), T, D, scale);
    }
}

void mh_iv_backward_all(const float *q, const float *k, const float *v, const float *go,
                        const float *out, const float *lse, const int32_t *lo,
                        const int32_t *hi, float *dq, float *dk, float *dv, const long *st,
                        long B, long H, long Hkv, long T, long D, float scale, int threads) {
    const long G = H / Hkv;
    #pragma omp parallel for num_threads(threads) schedule(dynamic, 1) if (threads > 1)
    for (long u = 0; u < B * Hkv; u++) {
        const long b = u / Hkv, g = u % Hkv;
        float *gk = AT(dk, SDK, b, g), *gv = AT(dv, SDV, b, g);
        for (long t = 0; t < T; t++) {
            memset(gk + t * ROW(SDK), 0, D * sizeof(float));
            memset(gv + t * ROW(SDV), 0, D * sizeof(float));
        }
        for (long h = g * G; h < g * G + G; h++)
            mh_iv_backward(AT(q, SQ, b, h), ROW(SQ), AT(k, SK, b, g), ROW(SK), AT(v, SV, b, g),
                           ROW(SV), AT(go, SG, b, h), ROW(SG), AT(out, SO, b, h), ROW(SO),
                           AT(lse, SL, b, h), AT(lo, SLO, b, h), AT(hi, SHI, b, h),
                           AT(dq, SDQ, b, h), ROW(SDQ), gk, ROW(SDK), gv, ROW(SDV), T, D, scale);
    }
}
