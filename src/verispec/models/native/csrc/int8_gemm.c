/* verispec: an exact int8 matmul for passes of a few rows (x86-64).
 *
 * y[r, n] = float32(sum_k (c[r, k] - z) * w[n, k]) * out_scale[n]
 *
 * for uint8 activation codes c [m, k] around the zero point z (128: 8-bit codes, 64: 7-bit)
 * and int8 weights w [N, K]. The integer sum is exact; it is rounded to float32 once and
 * multiplied by out_scale once, so the result is bit for bit what oneDNN and fbgemm give for
 * the same codes with unit scales followed by the same multiplication.
 *
 * vpdpbusd multiplies unsigned bytes by signed ones, so the weights enter as unsigned bytes
 * u = w + 128 (1..255) and the codes as signed bytes d = c - z (|d| <= 127, or <= 63 for 7-bit
 * codes). Then
 *
 *     sum_k (c - z) w = sum_k u d - 128 sum_k d,
 *
 * a correction of one integer per row of x, summed with its codes. |sum_k u d| <= K * 255 * 127
 * fits an int32 for K <= VS_MAX_K. AVX-512 VNNI (vpdpbusd) adds every product into an int32.
 * AVX2 (vpmaddubsw) adds pairs into a saturating int16: 2 * 255 * 63 = 32,130 fits with 7-bit
 * codes, 8-bit codes would saturate there (the caller's self-test refuses them).
 *
 * Layout: panels of VS_PANEL = 32 weight rows, two blocks of VS_LANES = 16, a panel
 * [K4 = ceil(K / 4), 32, 4] bytes: step t, row i, byte j holds u[32 p + i, 4 t + j] (0 past the
 * last row or channel). One 64-byte load (16 rows x 4 channels) against 4 codes broadcast to
 * every lane is 16 rows' dot products of 4 channels, with no horizontal sums; a panel's two
 * blocks side by side give independent sums and one stream of memory per panel. Rows of x run
 * in tiles that reuse a panel from the cache.
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define VS_LANES 16    /* weight rows per block, one per 32-bit lane of a 512-bit vector */
#define VS_STEP 4      /* input channels per lane and step (one 32-bit lane of bytes) */
#define VS_TILE_AVX2 4 /* rows of x per tile on AVX2 (16 registers) */
#define VS_BLOCKS 2 /* blocks of 16 rows per panel, read side by side */
#define VS_PANEL (VS_BLOCKS * VS_LANES) /* weight rows per panel */
#define VS_TSTRIDE (VS_BLOCKS * 64) /* bytes per step of a panel */
#define VS_PREFETCH 4096 /* bytes ahead of each block's weights being read: fetched to L1 */
#define VS_PREFETCH_L2 8192 /* bytes ahead: fetched to L2 (see panel_vnni_m) */
#define VS_L2_ROWS 7 /* tiles of this many rows and more prefetch into L2 */
/* most rows of x per tile with AVX-512: VS_BLOCKS x VS_TILE int32 sums in 18 of the 32
 * registers (a pass of 9 rows, one verification of 8 drafted tokens, is one tile; longer
 * passes run in tiles of equal rows) */
#define VS_TILE 9
#define VS_WEIGHT_OFFSET 128 /* u = w + 128 */
#define VS_MAX_K 66000 /* input channels whose sums of u d fit an int32: K 255 127 < 2^31 */

enum { VS_ISA_NONE = 0, VS_ISA_AVX2 = 1, VS_ISA_AVX512_VNNI = 2 };

int vs_gemm_isa(void) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vnni"))
        return VS_ISA_AVX512_VNNI;
    if (__builtin_cpu_supports("avx2")) return VS_ISA_AVX2;
    return VS_ISA_NONE;
}

int vs_gemm_panel(void) { return VS_PANEL; }
int vs_gemm_step(void) { return VS_STEP; }

/* c [m, k] -> d [m, kp] int8 (c - z, zero padded to kp = 4 K4) and sums[r] = sum_k d.
 * Returns 0, or -3 where some c - z does not fit an int8. */
static int signed_codes(const uint8_t *c, int64_t m, int64_t k, int64_t kp, int zero,
                        int8_t *d, int32_t *sums) {
    int bad = 0;
    for (int64_t r = 0; r < m; r++) {
        const uint8_t *cr = c + r * k;
        int8_t *dr = d + r * kp;
        int32_t s = 0;
        for (int64_t i = 0; i < k; i++) {
            int v = (int)cr[i] - zero;
            bad |= v < -128 || v > 127;
            dr[i] = (int8_t)v;
            s += v;
        }
        for (int64_t i = k; i < kp; i++) dr[i] = 0;
        sums[r] = s;
    }
    return bad ? -3 : 0;
}

static inline int32_t lane_of(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* acc + the products of u's and x's bytes summed by 4 (vpdpbusd): written out, because
 * GCC 12 copies the accumulator to another register and back around the intrinsic in every
 * step (1.2-1.3x slower over 9 rows on the Zen 5 measured) */
__attribute__((target("avx512f,avx512bw,avx512vnni"), always_inline))
static inline __m512i dpbusd(__m512i acc, __m512i u, __m512i x) {
    __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(x));
    return acc;
}

/* the epilogue of one block and MT rows: y = float32(acc - 128 sums) * scale, lanes < valid */
__attribute__((target("avx512f,avx512bw,avx512vnni"), always_inline))
static inline void store_vnni(const __m512i *acc, const int MT, const int32_t *sums,
                              const float *scale, int64_t valid, float *y, int64_t n) {
    __mmask16 mask = (__mmask16)(valid >= VS_LANES ? 0xFFFF : (1u << valid) - 1u);
    __m512 s = _mm512_maskz_loadu_ps(mask, scale);
    for (int r = 0; r < MT; r++) {
        __m512i exact = _mm512_sub_epi32(acc[r], _mm512_set1_epi32(VS_WEIGHT_OFFSET * sums[r]));
        _mm512_mask_storeu_ps(y + r * n, mask, _mm512_mul_ps(_mm512_cvtepi32_ps(exact), s));
    }
}

/* a panel (w, columns n0..) against MT rows of d: the int32 sums of u d over every channel
 * per block, then the epilogue; MT is a constant where this is inlined, so the sums stay in
 * registers. Tiles of VS_L2_ROWS rows and more do enough products per byte of weights that
 * fetching them 8 KB ahead into L2 lets the products overlap the reads better than 4 KB
 * ahead into L1, as in the int4 kernel; smaller tiles are bound by the reads and keep L1
 * (the int8 target on an AMD EPYC Zen 4: benchmarks/int4_builds.py --kernel int8). */
__attribute__((target("avx512f,avx512bw,avx512vnni"), always_inline))
static inline void panel_vnni_m(const uint8_t *w, int64_t k4, const int8_t *d, int64_t kp,
                                const int32_t *sums, const float *scale, int64_t n0, int64_t n,
                                float *y, const int MT) {
    __m512i lo[VS_TILE], hi[VS_TILE]; /* the panel's first and second block */
    for (int r = 0; r < MT; r++) lo[r] = hi[r] = _mm512_setzero_si512();
    for (int64_t t = 0; t < k4; t++) {
        const uint8_t *p = w + t * VS_TSTRIDE;
        const __m512i w0 = _mm512_loadu_si512((const void *)p);
        const __m512i w1 = _mm512_loadu_si512((const void *)(p + 64));
        if (MT < VS_L2_ROWS) { /* a constant: one of the two is compiled per MT */
            _mm_prefetch((const char *)(p + VS_PREFETCH), _MM_HINT_T0);
            _mm_prefetch((const char *)(p + VS_PREFETCH + 64), _MM_HINT_T0);
        } else {
            _mm_prefetch((const char *)(p + VS_PREFETCH_L2), _MM_HINT_T1);
            _mm_prefetch((const char *)(p + VS_PREFETCH_L2 + 64), _MM_HINT_T1);
        }
        const int8_t *dt = d + t * VS_STEP;
        for (int r = 0; r < MT; r++) {
            const __m512i x = _mm512_set1_epi32(lane_of(dt + r * kp));
            lo[r] = dpbusd(lo[r], w0, x);
            hi[r] = dpbusd(hi[r], w1, x);
        }
    }
    store_vnni(lo, MT, sums, scale + n0, n - n0, y + n0, n);
    if (n0 + VS_LANES < n)
        store_vnni(hi, MT, sums, scale + n0 + VS_LANES, n - n0 - VS_LANES, y + n0 + VS_LANES, n);
}

__attribute__((target("avx512f,avx512bw,avx512vnni")))
static void panel_vnni(const uint8_t *w, int64_t k4, const int8_t *d, int64_t kp,
                       const int32_t *sums, const float *scale, int64_t n0, int64_t n, float *y,
                       int mt) {
    switch (mt) {
#define VS_CASE(MT) case MT: panel_vnni_m(w, k4, d, kp, sums, scale, n0, n, y, MT); break;
        VS_CASE(1) VS_CASE(2) VS_CASE(3) VS_CASE(4) VS_CASE(5) VS_CASE(6) VS_CASE(7)
        VS_CASE(8) VS_CASE(9)
#undef VS_CASE
    }
}

/* AVX2: one block of a panel (two halves of 8 lanes) against MT rows; pairs of products into
 * int16 (vpmaddubsw), widened to int32 at once (vpmaddwd by ones). */
__attribute__((target("avx2"), always_inline))
static inline void block_avx2_m(const uint8_t *w, int64_t k4, const int8_t *d, int64_t kp,
                                const int32_t *sums, const float *scale, int64_t n0, int64_t n,
                                float *y, const int MT) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i acc[2][VS_TILE_AVX2];
    for (int h = 0; h < 2; h++)
        for (int r = 0; r < MT; r++) acc[h][r] = _mm256_setzero_si256();
    for (int64_t t = 0; t < k4; t++) {
        const uint8_t *p = w + t * VS_TSTRIDE;
        __m256i w0 = _mm256_loadu_si256((const __m256i *)p);
        __m256i w1 = _mm256_loadu_si256((const __m256i *)(p + 32));
        _mm_prefetch((const char *)(p + VS_PREFETCH), _MM_HINT_T0);
        for (int r = 0; r < MT; r++) {
            __m256i x = _mm256_set1_epi32(lane_of(d + r * kp + t * VS_STEP));
            acc[0][r] = _mm256_add_epi32(acc[0][r],
                                         _mm256_madd_epi16(_mm256_maddubs_epi16(w0, x), ones));
            acc[1][r] = _mm256_add_epi32(acc[1][r],
                                         _mm256_madd_epi16(_mm256_maddubs_epi16(w1, x), ones));
        }
    }
    for (int h = 0; h < 2; h++) {
        int64_t nb = n0 + 8 * h;
        if (nb >= n) break;
        int valid = (int)(n - nb < 8 ? n - nb : 8);
        for (int r = 0; r < MT; r++) {
            int32_t lanes[8];
            float out[8];
            _mm256_storeu_si256((__m256i *)lanes, _mm256_sub_epi32(
                acc[h][r], _mm256_set1_epi32(VS_WEIGHT_OFFSET * sums[r])));
            for (int i = 0; i < valid; i++) out[i] = (float)lanes[i] * scale[nb + i];
            memcpy(y + r * n + nb, out, sizeof(float) * (size_t)valid);
        }
    }
}

__attribute__((target("avx2")))
static void block_avx2(const uint8_t *w, int64_t k4, const int8_t *d, int64_t kp,
                       const int32_t *sums, const float *scale, int64_t n0, int64_t n, float *y,
                       int mt) {
    switch (mt) {
#define VS_CASE(MT) case MT: block_avx2_m(w, k4, d, kp, sums, scale, n0, n, y, MT); break;
        VS_CASE(1) VS_CASE(2) VS_CASE(3) VS_CASE(4)
#undef VS_CASE
    }
}

/* y [m, n] = float32(sum_k (c - zero) w) * scale, c [m, k] uint8, w packed by the caller
 * (layout above), scale [n]. Returns 0; -1 for arguments it does not take, -2 where its
 * scratch cannot be allocated, -3 where a code minus the zero point does not fit an int8. */
int vs_int8_mm(const uint8_t *c, int64_t m, int64_t k, int zero, const uint8_t *w, int64_t n,
               const float *scale, float *y, int isa, int threads) {
    if (m < 1 || k < 1 || k > VS_MAX_K || n < 1 || isa < VS_ISA_AVX2 || isa > vs_gemm_isa() ||
        threads < 1)
        return -1;
    int64_t k4 = (k + VS_STEP - 1) / VS_STEP, kp = k4 * VS_STEP;
    int64_t panels = (n + VS_PANEL - 1) / VS_PANEL;
    int8_t *d = (int8_t *)malloc((size_t)(m * kp) + sizeof(int32_t) * (size_t)m);
    if (!d) return -2;
    int32_t *sums = (int32_t *)(d + m * kp);
    int rc = signed_codes(c, m, k, kp, zero, d, sums);
    if (rc == 0) {
        int most = isa == VS_ISA_AVX512_VNNI ? VS_TILE : VS_TILE_AVX2;
        int64_t tiles = (m + most - 1) / most;
        int tile = (int)((m + tiles - 1) / tiles); /* tiles of equal rows, the last shorter */
#pragma omp parallel for schedule(static) num_threads(threads)
        for (int64_t p = 0; p < panels; p++) {
            const uint8_t *wp = w + p * k4 * VS_TSTRIDE;
            int64_t n0 = p * VS_PANEL;
            for (int64_t r0 = 0; r0 < m; r0 += tile) {
                int mt = (int)(m - r0 < tile ? m - r0 : tile);
                if (isa == VS_ISA_AVX512_VNNI) {
                    panel_vnni(wp, k4, d + r0 * kp, kp, sums + r0, scale, n0, n, y + r0 * n, mt);
                    continue;
                }
                for (int b = 0; b < VS_BLOCKS && n0 + b * VS_LANES < n; b++)
                    block_avx2(wp + 64 * b, k4, d + r0 * kp, kp, sums + r0, scale,
                               n0 + b * VS_LANES, n, y + r0 * n, mt);
            }
        }
    }
    free(d);
    return rc;
}
