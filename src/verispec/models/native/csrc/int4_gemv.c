/* verispec: a weight-only int4 matmul for passes of a few rows, x86-64.
 *
 * y[r, n] (+)= sum_k W[n, k] u[r, k] (+ bias[n]) for r < m (u = x, or x after
 * an RMSNorm with channel weights norm), where per group g
 * of VS_GROUP input channels W[n, k] = code[n, k] * s[n, g] + lo[n, g], code in 0..15.
 *
 * Each group of a row of x is rounded to int8 with its own scale a[r, g] = max|x| / 127, so
 * sum_k code x = a * sum_k code xq is an exact integer dot product of unsigned 4-bit codes and
 * signed 8-bit codes: AVX-512 VNNI (vpdpbusd) accumulates it in int32; AVX2 (vpmaddubsw) adds
 * pairs into int16, at most 2 * 15 * 127 = 3810, so it never saturates. The lo term uses the
 * float sum of the group's x. A row's result never depends on the other rows of the pass
 * (an int4 target relies on it: a verification pass equals passes of one token).
 *
 * Layout: blocks of VS_LANES = 16 weight rows, each 32-bit lane of a 512-bit vector one row.
 * Block b, group g, step t (0..7) is 64 bytes: lane i, byte j holds code[n, k] (n = 16 b + i)
 * for k = 64 g + 4 t + j in its low nibble and k + 32 in its high nibble, so the low nibbles
 * of step t against 4 bytes of x broadcast to every lane are 16 rows' dots of 4 channels (one
 * vpdpbusd), with no horizontal sums. Scales s and lo: float16 [N / 16, G, 16].
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define VS_GROUP 64
#define VS_TILE_ROWS 8 /* rows of x per tile; longer passes run in tiles of equal rows */
#define VS_TILE_ROWS_AVX2 6 /* the same with AVX2 (see block_avx2_m) */
#define VS_LANES 16 /* weight rows interleaved in one block, one per 32-bit lane */
#define VS_PREFETCH 4096 /* bytes ahead of the weights being read: fetched to L1 */
#define VS_PREFETCH_L2 8192 /* bytes ahead: fetched to L2 (see block_vnni_m) */

enum { VS_ISA_NONE = 0, VS_ISA_AVX2 = 1, VS_ISA_AVX512_VNNI = 2 };

int vs_int4_isa(void) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("f16c"))
        return VS_ISA_AVX512_VNNI;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("f16c"))
        return VS_ISA_AVX2;
    return VS_ISA_NONE;
}

int vs_int4_group(void) { return VS_GROUP; }
int vs_int4_tile_rows(void) { return VS_TILE_ROWS; }
int vs_int4_lanes(void) { return VS_LANES; }

/* x [m, k] -> xq [m, k] int8, xs [m, G] group scales, xsum [m, G] float sums of the groups,
 * of u = x, or with norm [k] of u = rmsnorm(x) = x / sqrt(mean(x^2) + eps) * norm, or with
 * glu of u = silu(x[:, :k]) * x[:, k:] for x [m, 2 k] (a gated MLP's gate and up halves).
 * Each row alone, in the same order of operations whatever m is (8 lanes of sums, then a
 * fixed tree). */
__attribute__((target("avx2,fma")))
static float sum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)));
}

__attribute__((target("avx2,fma")))
static float max8(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_max_ss(s, _mm_shuffle_ps(s, s, 1)));
}

/* exp(x) lane-wise for x in [-87, 87] (clamped there): x = n ln2 + r, |r| <= ln2 / 2, exp(r)
 * by its Taylor series to r^7 (relative error below 1e-6), times 2^n built in the exponent */
__attribute__((target("avx2,fma")))
static __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(87.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145752f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860677e-6f), r);
    static const float c[7] = {1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f, 0.5f,
                               1.0f, 1.0f};
    __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
    for (int i = 0; i < 7; i++) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c[i]));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)),
                                  23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* silu(gate) * up = gate / (1 + exp(-gate)) * up, lane-wise */
__attribute__((target("avx2,fma")))
static __m256 swiglu8(__m256 gate, __m256 up) {
    __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), gate));
    return _mm256_mul_ps(_mm256_div_ps(gate, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), up);
}

__attribute__((target("avx2,fma")))
static void quantize_rows(const float *x, int64_t m, int64_t k, const float *norm, float eps,
                          int glu, int8_t *xq, float *xs, float *xsum) {
    const __m256 sign = _mm256_set1_ps(-0.0f), lo = _mm256_set1_ps(-127.0f),
                 hi = _mm256_set1_ps(127.0f);
    int64_t groups = k / VS_GROUP;
    for (int64_t r = 0; r < m; r++) {
        const float *row = x + r * k * (glu ? 2 : 1);
        __m256 rms = _mm256_set1_ps(1.0f);
        if (norm) {
            __m256 ss = _mm256_setzero_ps();
            for (int64_t i = 0; i < k; i += 8) {
                __m256 v = _mm256_loadu_ps(row + i);
                ss = _mm256_fmadd_ps(v, v, ss);
            }
            rms = _mm256_set1_ps(1.0f / sqrtf(sum8(ss) / (float)k + eps));
        }
        for (int64_t g = 0; g < groups; g++) {
            __m256 v[VS_GROUP / 8];
            __m256 amax = _mm256_setzero_ps(), sum = _mm256_setzero_ps();
            for (int i = 0; i < VS_GROUP / 8; i++) {
                int64_t c = g * VS_GROUP + 8 * i;
                v[i] = _mm256_loadu_ps(row + c);
                if (glu) v[i] = swiglu8(v[i], _mm256_loadu_ps(row + k + c));
                if (norm) v[i] = _mm256_mul_ps(_mm256_mul_ps(v[i], rms), _mm256_loadu_ps(norm + c));
                amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[i]));
                sum = _mm256_add_ps(sum, v[i]);
            }
            float a = max8(amax);
            __m256 inv = _mm256_set1_ps(a > 0.0f ? 127.0f / a : 0.0f);
            int8_t *q = xq + r * k + g * VS_GROUP;
            for (int i = 0; i < VS_GROUP / 8; i++) {
                /* clamped (a NaN becomes -127), so every input converts to a defined code;
                   rounded to nearest even, as nearbyintf */
                __m256 t = _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(v[i], inv), lo), hi);
                __m256i c = _mm256_cvtps_epi32(t);
                __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(c),
                                            _mm256_extracti128_si256(c, 1));
                _mm_storel_epi64((__m128i *)(q + 8 * i), _mm_packs_epi16(w, w));
            }
            xs[r * groups + g] = a / 127.0f;
            xsum[r * groups + g] = sum8(sum);
        }
    }
}

/* F(w, ws, wlo, groups, xq, xs, xsum, M, k, out) with M = m (1..VS_TILE_ROWS) as a constant,
 * so that F's per-row sums live in registers */
#define VS_CASE(F, M) \
    case M: F(w, ws, wlo, groups, xq, xs, xsum, M, k, out); break;
#define VS_CASES_6(F) \
    VS_CASE(F, 1) VS_CASE(F, 2) VS_CASE(F, 3) VS_CASE(F, 4) VS_CASE(F, 5) VS_CASE(F, 6)
#define VS_FOR_ROWS(F) switch (m) { VS_CASES_6(F) VS_CASE(F, 7) VS_CASE(F, 8) }
#define VS_FOR_ROWS_AVX2(F) switch (m) { VS_CASES_6(F) } /* VS_TILE_ROWS_AVX2 */

/* acc + the products of u's and x's bytes summed by 4 (vpdpbusd): written out, because
 * GCC 12 copies every accumulator to another register and back around the intrinsic in
 * every step, and spills some of them to the stack */
__attribute__((target("avx512f,avx512bw,avx512vnni"), always_inline))
static inline __m512i dpbusd(__m512i acc, __m512i u, __m512i x) {
    __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(x));
    return acc;
}

/* One block of VS_LANES weight rows against m rows of x: out[r][i] = row n0 + i's dot with
 * row r. The low and the high nibbles' products go into two int32 sums per row (two
 * independent chains of vpdpbusd, added once per group; exact: at most 32 * 15 * 127 each);
 * m is a constant where this is inlined (see block_vnni), so the int32 sums live in
 * registers. Measured on an AMD EPYC Zen 4 (2 threads, the 1.5B int4 target's whole pass
 * after 200 tokens, builds alternated in one process, ms): two chains against one, 40.2
 * against 44.7 at 4 rows, 51.1 against 51.3 at 8; and reading two adjacent blocks side by
 * side (each broadcast of x serving 32 weight rows, as this kernel did from 4 rows on) cost
 * 43.6 at 5 rows and 56.4 at 8 against 39.8 and 51.1 one block at a time.
 * Prefetching: one row's pass is bound by the memory's bandwidth and runs fastest with the
 * weights 4 KB ahead fetched to L1; from 2 rows on the products take about as long as the
 * reads, and fetching 8 KB ahead to L2 instead lets the two overlap (the same pass,
 * benchmarks/int4_builds.py against 4 KB to L1 at every m: 30.8 against 38.1 ms at 4 rows,
 * 31.7 against 35.9 at 5, 44.8 against 50.1 at 8; at 2 rows the two were within the
 * noise of each other). One row gained nothing from L2, so it keeps L1. */
__attribute__((target("avx512f,avx512bw,avx512vnni,f16c,fma"), always_inline))
static inline void block_vnni_m(const uint8_t *w, const uint16_t *ws, const uint16_t *wlo,
                                int64_t groups, const int8_t *xq, const float *xs,
                                const float *xsum, const int m, int64_t k,
                                float out[][VS_LANES]) {
    const __m512i mask = _mm512_set1_epi8(0x0F);
    for (int r = 0; r < m; r++) _mm512_storeu_ps(out[r], _mm512_setzero_ps());
    for (int64_t g = 0; g < groups; g++) {
        __m512i dot_lo[VS_TILE_ROWS], dot_hi[VS_TILE_ROWS];
        for (int r = 0; r < m; r++) dot_lo[r] = dot_hi[r] = _mm512_setzero_si512();
        for (int t = 0; t < VS_GROUP / 8; t++) {
            const uint8_t *wt = w + (g * VS_GROUP / 8 + t) * 64;
            __m512i packed = _mm512_loadu_si512((const void *)wt);
            if (m == 1) /* a constant: one of the two is compiled per m */
                _mm_prefetch((const char *)(wt + VS_PREFETCH), _MM_HINT_T0);
            else
                _mm_prefetch((const char *)(wt + VS_PREFETCH_L2), _MM_HINT_T1);
            __m512i lo = _mm512_and_si512(packed, mask);
            __m512i hi = _mm512_and_si512(_mm512_srli_epi16(packed, 4), mask);
            for (int r = 0; r < m; r++) {
                const int8_t *xg = xq + r * k + g * VS_GROUP;
                int32_t a, b;
                memcpy(&a, xg + 4 * t, 4);
                memcpy(&b, xg + 4 * t + VS_GROUP / 2, 4);
                dot_lo[r] = dpbusd(dot_lo[r], lo, _mm512_set1_epi32(a));
                dot_hi[r] = dpbusd(dot_hi[r], hi, _mm512_set1_epi32(b));
            }
        }
        __m512 s = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(ws + g * VS_LANES)));
        __m512 l = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(wlo + g * VS_LANES)));
        for (int r = 0; r < m; r++) {
            __m512 acc = _mm512_loadu_ps(out[r]);
            __m512 d = _mm512_cvtepi32_ps(_mm512_add_epi32(dot_lo[r], dot_hi[r]));
            acc = _mm512_fmadd_ps(d, _mm512_mul_ps(s, _mm512_set1_ps(xs[r * groups + g])), acc);
            acc = _mm512_fmadd_ps(l, _mm512_set1_ps(xsum[r * groups + g]), acc);
            _mm512_storeu_ps(out[r], acc);
        }
    }
}

__attribute__((target("avx512f,avx512bw,avx512vnni,f16c,fma")))
static void block_vnni(const uint8_t *w, const uint16_t *ws, const uint16_t *wlo,
                       int64_t groups, const int8_t *xq, const float *xs, const float *xsum,
                       int64_t m, int64_t k, float out[][VS_LANES]) {
    VS_FOR_ROWS(block_vnni_m)
}

/* acc + the products of u's and x's bytes summed by pairs (vpmaddubsw, then vpaddw): written
 * out, as dpbusd above, because GCC 12 puts each sum into another register and moves it back
 * in every step, and from 4 rows on spills sums to the stack */
__attribute__((target("avx2"), always_inline))
static inline __m256i maddubs_add(__m256i acc, __m256i u, __m256i x) {
    __m256i t;
    __asm__("vpmaddubsw %3, %2, %1\n\tvpaddw %1, %0, %0" : "+x"(acc), "=&x"(t) : "x"(u), "x"(x));
    return acc;
}

/* m is a constant where this is inlined (see block_avx2), so the per-row accumulators
   live in registers. Each half reads 32 bytes of every 64-byte step; the weights are
   prefetched 8 KB ahead to L2 at every m (on the Zen 4 above with this path asked for,
   benchmarks/int4_builds.py --isa avx2 against 4 KB to L1: the target's whole pass 24.5
   against 29.6 ms at 1 row and 39.4 against 47.1 at 3, the draft's 9.8 against 11.7 at
   1 row). With 16 vector registers a tile of m rows keeps 2 m int16 sums: at most
   VS_TILE_ROWS_AVX2 = 6 rows per tile, and the sums of 2+ rows added in place (maddubs_add;
   one row's code is left to GCC): the target's pass 37.9 against 47.1 ms at 4 rows, 51.7
   against 73.6 at 6, 69.5 against 100.5 at 8 (two tiles of 4 against one of 8; the block's
   weights are read again from the cache, not from memory) */
__attribute__((target("avx2,fma,f16c"), always_inline))
static inline void block_avx2_m(const uint8_t *w, const uint16_t *ws, const uint16_t *wlo,
                                int64_t groups, const int8_t *xq, const float *xs,
                                const float *xsum, const int m, int64_t k,
                                float out[][VS_LANES]) {
    const __m256i mask = _mm256_set1_epi8(0x0F);
    const __m256i ones = _mm256_set1_epi16(1);
    for (int half = 0; half < 2; half++) { /* lanes 0..7, then 8..15 */
        __m256 acc[VS_TILE_ROWS];
        for (int r = 0; r < m; r++) acc[r] = _mm256_setzero_ps();
        for (int64_t g = 0; g < groups; g++) {
            const uint8_t *wg = w + g * VS_GROUP * VS_LANES / 2 + half * 32;
            /* int16 sums of 8 products pairs each: |.| <= 8 * 2 * 15 * 127 = 30480 */
            __m256i dot[VS_TILE_ROWS][2];
            for (int r = 0; r < m; r++)
                dot[r][0] = dot[r][1] = _mm256_setzero_si256();
            for (int t = 0; t < VS_GROUP / 8; t++) {
                __m256i packed = _mm256_loadu_si256((const __m256i *)(wg + t * 64));
                _mm_prefetch((const char *)(wg + t * 64 + VS_PREFETCH_L2), _MM_HINT_T1);
                __m256i lo = _mm256_and_si256(packed, mask);
                __m256i hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), mask);
                for (int r = 0; r < m; r++) {
                    const int8_t *xg = xq + r * k + g * VS_GROUP;
                    int32_t a, b;
                    memcpy(&a, xg + 4 * t, 4);
                    memcpy(&b, xg + 4 * t + VS_GROUP / 2, 4);
                    __m256i xa = _mm256_set1_epi32(a), xb = _mm256_set1_epi32(b);
                    if (m == 1) { /* a constant; GCC schedules one row's sums well */
                        dot[r][0] = _mm256_add_epi16(dot[r][0], _mm256_maddubs_epi16(lo, xa));
                        dot[r][1] = _mm256_add_epi16(dot[r][1], _mm256_maddubs_epi16(hi, xb));
                    } else {
                        dot[r][0] = maddubs_add(dot[r][0], lo, xa);
                        dot[r][1] = maddubs_add(dot[r][1], hi, xb);
                    }
                }
            }
            __m256 s = _mm256_cvtph_ps(
                _mm_loadu_si128((const __m128i *)(ws + g * VS_LANES + half * 8)));
            __m256 l = _mm256_cvtph_ps(
                _mm_loadu_si128((const __m128i *)(wlo + g * VS_LANES + half * 8)));
            for (int r = 0; r < m; r++) {
                __m256i d = _mm256_add_epi32(_mm256_madd_epi16(dot[r][0], ones),
                                             _mm256_madd_epi16(dot[r][1], ones));
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d),
                                         _mm256_mul_ps(s, _mm256_set1_ps(xs[r * groups + g])),
                                         acc[r]);
                acc[r] = _mm256_fmadd_ps(l, _mm256_set1_ps(xsum[r * groups + g]), acc[r]);
            }
        }
        for (int r = 0; r < m; r++) _mm256_storeu_ps(out[r] + half * 8, acc[r]);
    }
}

__attribute__((target("avx2,fma,f16c")))
static void block_avx2(const uint8_t *w, const uint16_t *ws, const uint16_t *wlo,
                       int64_t groups, const int8_t *xq, const float *xs, const float *xsum,
                       int64_t m, int64_t k, float out[][VS_LANES]) {
    VS_FOR_ROWS_AVX2(block_avx2_m)
}

/* y [m, n] (+)= u W^T (+ bias), y contiguous, u = x [m, k], its RMSNorm with weights
 * norm, or with glu silu(x[:, :k]) * x[:, k:] of x [m, 2 k] (not both). Any m >= 1: rows
 * run in tiles of at most VS_TILE_ROWS, and a row's result does not depend on m, on its
 * tile or on the threads (every row's sums run the same operations in the same order).
 * Returns 0; -1 for arguments it does not take (the caller checks them first), -2 where its
 * scratch cannot be allocated. */
int vs_int4_mm(const float *x, int64_t m, int64_t k, const float *norm, float eps,
               const uint8_t *w, const uint16_t *ws, const uint16_t *wlo, int64_t n,
               const float *bias, float *y, int accumulate, int glu, int isa, int threads) {
    if (m < 1 || k < VS_GROUP || k % VS_GROUP != 0 || n % VS_LANES != 0 ||
        isa < VS_ISA_AVX2 || isa > vs_int4_isa() || threads < 1 || (glu && norm))
        return -1;
    int64_t groups = k / VS_GROUP;
    int64_t codes = ((m * k + 63) / 64) * 64;
    int8_t *xq = (int8_t *)malloc((size_t)codes + 2 * sizeof(float) * (size_t)(m * groups));
    if (!xq) return -2;
    float *xs = (float *)(xq + codes);
    float *xsum = xs + m * groups;
    quantize_rows(x, m, k, norm, eps, glu, xq, xs, xsum);
    int64_t blocks = n / VS_LANES;
    int64_t most = isa == VS_ISA_AVX512_VNNI ? VS_TILE_ROWS : VS_TILE_ROWS_AVX2;
    int64_t tiles = (m + most - 1) / most, rows = (m + tiles - 1) / tiles;
    int64_t bstride = VS_LANES * (k / 2);
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t b = 0; b < blocks; b++) {
        float out[VS_TILE_ROWS][VS_LANES];
        const uint8_t *wb = w + b * bstride;
        const uint16_t *sb = ws + b * VS_LANES * groups, *lb = wlo + b * VS_LANES * groups;
        for (int64_t r0 = 0; r0 < m; r0 += rows) {
            int64_t mt = m - r0 < rows ? m - r0 : rows;
            const int8_t *xt = xq + r0 * k;
            const float *st = xs + r0 * groups, *sumt = xsum + r0 * groups;
            if (isa == VS_ISA_AVX512_VNNI)
                block_vnni(wb, sb, lb, groups, xt, st, sumt, mt, k, out);
            else
                block_avx2(wb, sb, lb, groups, xt, st, sumt, mt, k, out);
            int64_t n0 = b * VS_LANES;
            for (int64_t r = 0; r < mt; r++) {
                float *yr = y + (r0 + r) * n + n0;
                for (int64_t i = 0; i < VS_LANES; i++) {
                    float t = out[r][i];
                    if (bias) t += bias[n0 + i];
                    yr[i] = accumulate ? yr[i] + t : t;
                }
            }
        }
    }
    free(xq);
    return 0;
}
