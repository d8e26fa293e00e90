/* verispec: a weight-only int4 matmul for a few rows (the draft's steps), x86-64.
 *
 * y[r, n] (+)= sum_k W[n, k] u[r, k] (+ bias[n]) for r < m <= VS_MAX_ROWS (u = x, or x after
 * an RMSNorm with channel weights norm), where per group g
 * of VS_GROUP input channels W[n, k] = code[n, k] * s[n, g] + lo[n, g], code in 0..15.
 *
 * Each group of a row of x is rounded to int8 with its own scale a[r, g] = max|x| / 127, so
 * sum_k code x = a * sum_k code xq is an exact integer dot product of unsigned 4-bit codes and
 * signed 8-bit codes: AVX-512 VNNI (vpdpbusd) accumulates it in int32; AVX2 (vpmaddubsw) adds
 * pairs into int16, at most 2 * 15 * 127 = 3810, so it never saturates. The lo term uses the
 * float sum of the group's x. Only the draft runs this (its q is whatever distribution it
 * computed, so the rounding of x is allowed; the target never runs it).
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
#define VS_MAX_ROWS 8
#define VS_LANES 16 /* weight rows interleaved in one block, one per 32-bit lane */
#define VS_PREFETCH 4096 /* bytes ahead of the weights being read: fetched to L1 */

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
int vs_int4_max_rows(void) { return VS_MAX_ROWS; }
int vs_int4_lanes(void) { return VS_LANES; }

/* x [m, k] -> xq [m, k] int8, xs [m, G] group scales, xsum [m, G] float sums of the groups,
 * of u = x, or with norm [k] of u = rmsnorm(x) = x / sqrt(mean(x^2) + eps) * norm. */
static void quantize_rows(const float *x, int64_t m, int64_t k, const float *norm, float eps,
                          int8_t *xq, float *xs, float *xsum) {
    int64_t groups = k / VS_GROUP;
    for (int64_t r = 0; r < m; r++) {
        const float *row = x + r * k;
        float rms = 1.0f;
        if (norm) {
            float ss = 0.0f;
            for (int64_t i = 0; i < k; i++) ss += row[i] * row[i];
            rms = 1.0f / sqrtf(ss / (float)k + eps);
        }
        for (int64_t g = 0; g < groups; g++) {
            float v[VS_GROUP];
            int8_t *q = xq + r * k + g * VS_GROUP;
            float amax = 0.0f, sum = 0.0f;
            for (int i = 0; i < VS_GROUP; i++) {
                int64_t c = g * VS_GROUP + i;
                v[i] = norm ? row[c] * rms * norm[c] : row[c];
                float a = fabsf(v[i]);
                amax = a > amax ? a : amax;
                sum += v[i];
            }
            float scale = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
            /* clamped, so that a non-finite input still converts to a defined code */
            for (int i = 0; i < VS_GROUP; i++)
                q[i] = (int8_t)nearbyintf(fminf(fmaxf(v[i] * inv, -127.0f), 127.0f));
            xs[r * groups + g] = scale;
            xsum[r * groups + g] = sum;
        }
    }
}

/* acc + the products of u's and x's bytes summed by 4 (vpdpbusd): written out, because
 * GCC 12 copies every accumulator to another register and back around the intrinsic in
 * every step, and spills some of them to the stack */
__attribute__((target("avx512f,avx512bw,avx512vnni"), always_inline))
static inline __m512i dpbusd(__m512i acc, __m512i u, __m512i x) {
    __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(x));
    return acc;
}

/* One block of VS_LANES weight rows against the m rows of x: out[r][i] = row n0 + i's dot. */
/* m is a constant where this is inlined (see block_vnni), so the per-row accumulators
   live in registers */
__attribute__((target("avx512f,avx512bw,avx512vnni,f16c,fma"), always_inline))
static inline void block_vnni_m(const uint8_t *w, const uint16_t *ws, const uint16_t *wlo,
                                int64_t groups, const int8_t *xq, const float *xs,
                                const float *xsum, const int m, int64_t k,
                                float out[][VS_LANES]) {
    const __m512i mask = _mm512_set1_epi8(0x0F);
    __m512 acc[VS_MAX_ROWS];
    for (int r = 0; r < m; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; g++) {
        const uint8_t *wg = w + g * VS_GROUP * VS_LANES / 2;
        __m512i dot[VS_MAX_ROWS][2];
        for (int r = 0; r < m; r++)
            dot[r][0] = dot[r][1] = _mm512_setzero_si512();
        for (int t = 0; t < VS_GROUP / 8; t++) {
            __m512i packed = _mm512_loadu_si512((const void *)(wg + t * 64));
            _mm_prefetch((const char *)(wg + t * 64 + VS_PREFETCH), _MM_HINT_T0);
            __m512i lo = _mm512_and_si512(packed, mask);
            __m512i hi = _mm512_and_si512(_mm512_srli_epi16(packed, 4), mask);
            for (int r = 0; r < m; r++) {
                const int8_t *xg = xq + r * k + g * VS_GROUP;
                int32_t a, b;
                memcpy(&a, xg + 4 * t, 4);
                memcpy(&b, xg + 4 * t + VS_GROUP / 2, 4);
                dot[r][0] = dpbusd(dot[r][0], lo, _mm512_set1_epi32(a));
                dot[r][1] = dpbusd(dot[r][1], hi, _mm512_set1_epi32(b));
            }
        }
        __m512 s = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(ws + g * VS_LANES)));
        __m512 l = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(wlo + g * VS_LANES)));
        for (int r = 0; r < m; r++) {
            __m512 d = _mm512_cvtepi32_ps(_mm512_add_epi32(dot[r][0], dot[r][1]));
            acc[r] = _mm512_fmadd_ps(d, _mm512_mul_ps(s, _mm512_set1_ps(xs[r * groups + g])),
                                     acc[r]);
            acc[r] = _mm512_fmadd_ps(l, _mm512_set1_ps(xsum[r * groups + g]), acc[r]);
        }
    }
    for (int r = 0; r < m; r++) _mm512_storeu_ps(out[r], acc[r]);
}

__attribute__((target("avx512f,avx512bw,avx512vnni,f16c,fma")))
static void block_vnni(const uint8_t *w, const uint16_t *ws, const uint16_t *wlo,
                       int64_t groups, const int8_t *xq, const float *xs, const float *xsum,
                       int64_t m, int64_t k, float out[][VS_LANES]) {
    switch (m) {
#define VS_CASE(M) \
    case M: block_vnni_m(w, ws, wlo, groups, xq, xs, xsum, M, k, out); break;
        VS_CASE(1) VS_CASE(2) VS_CASE(3) VS_CASE(4) VS_CASE(5) VS_CASE(6) VS_CASE(7) VS_CASE(8)
#undef VS_CASE
    }
}

/* m is a constant where this is inlined (see block_avx2), so the per-row accumulators
   live in registers */
__attribute__((target("avx2,fma,f16c"), always_inline))
static inline void block_avx2_m(const uint8_t *w, const uint16_t *ws, const uint16_t *wlo,
                                int64_t groups, const int8_t *xq, const float *xs,
                                const float *xsum, const int m, int64_t k,
                                float out[][VS_LANES]) {
    const __m256i mask = _mm256_set1_epi8(0x0F);
    const __m256i ones = _mm256_set1_epi16(1);
    for (int half = 0; half < 2; half++) { /* lanes 0..7, then 8..15 */
        __m256 acc[VS_MAX_ROWS];
        for (int r = 0; r < m; r++) acc[r] = _mm256_setzero_ps();
        for (int64_t g = 0; g < groups; g++) {
            const uint8_t *wg = w + g * VS_GROUP * VS_LANES / 2 + half * 32;
            /* int16 sums of 8 products pairs each: |.| <= 8 * 2 * 15 * 127 = 30480 */
            __m256i dot[VS_MAX_ROWS][2];
            for (int r = 0; r < m; r++)
                dot[r][0] = dot[r][1] = _mm256_setzero_si256();
            for (int t = 0; t < VS_GROUP / 8; t++) {
                __m256i packed = _mm256_loadu_si256((const __m256i *)(wg + t * 64));
                _mm_prefetch((const char *)(wg + t * 64 + VS_PREFETCH), _MM_HINT_T0);
                __m256i lo = _mm256_and_si256(packed, mask);
                __m256i hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), mask);
                for (int r = 0; r < m; r++) {
                    const int8_t *xg = xq + r * k + g * VS_GROUP;
                    int32_t a, b;
                    memcpy(&a, xg + 4 * t, 4);
                    memcpy(&b, xg + 4 * t + VS_GROUP / 2, 4);
                    dot[r][0] = _mm256_add_epi16(
                        dot[r][0], _mm256_maddubs_epi16(lo, _mm256_set1_epi32(a)));
                    dot[r][1] = _mm256_add_epi16(
                        dot[r][1], _mm256_maddubs_epi16(hi, _mm256_set1_epi32(b)));
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
    switch (m) {
#define VS_CASE(M) \
    case M: block_avx2_m(w, ws, wlo, groups, xq, xs, xsum, M, k, out); break;
        VS_CASE(1) VS_CASE(2) VS_CASE(3) VS_CASE(4) VS_CASE(5) VS_CASE(6) VS_CASE(7) VS_CASE(8)
#undef VS_CASE
    }
}

/* y [m, n] (+)= u W^T (+ bias), y contiguous, u = x [m, k] or its RMSNorm with weights norm. Returns 0; -1 for arguments it does not
 * take (the caller checks them first), -2 where its scratch cannot be allocated. */
int vs_int4_mm(const float *x, int64_t m, int64_t k, const float *norm, float eps,
               const uint8_t *w, const uint16_t *ws, const uint16_t *wlo, int64_t n,
               const float *bias, float *y, int accumulate, int isa, int threads) {
    if (m < 1 || m > VS_MAX_ROWS || k % VS_GROUP != 0 || n % VS_LANES != 0 ||
        isa < VS_ISA_AVX2 || isa > vs_int4_isa() || threads < 1)
        return -1;
    int64_t groups = k / VS_GROUP;
    int64_t codes = ((m * k + 63) / 64) * 64;
    int8_t *xq = (int8_t *)malloc((size_t)codes + 2 * sizeof(float) * (size_t)(m * groups));
    if (!xq) return -2;
    float *xs = (float *)(xq + codes);
    float *xsum = xs + m * groups;
    quantize_rows(x, m, k, norm, eps, xq, xs, xsum);
    int64_t blocks = n / VS_LANES;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t b = 0; b < blocks; b++) {
        float out[VS_MAX_ROWS][VS_LANES];
        const uint8_t *wb = w + b * VS_LANES * (k / 2);
        const uint16_t *sb = ws + b * VS_LANES * groups, *lb = wlo + b * VS_LANES * groups;
        if (isa == VS_ISA_AVX512_VNNI)
            block_vnni(wb, sb, lb, groups, xq, xs, xsum, m, k, out);
        else
            block_avx2(wb, sb, lb, groups, xq, xs, xsum, m, k, out);
        for (int r = 0; r < m; r++) {
            float *yr = y + r * n + b * VS_LANES;
            for (int i = 0; i < VS_LANES; i++) {
                float t = out[r][i];
                if (bias) t += bias[b * VS_LANES + i];
                yr[i] = accumulate ? yr[i] + t : t;
            }
        }
    }
    free(xq);
    return 0;
}
