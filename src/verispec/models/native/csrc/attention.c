/* verispec: attention over a slot cache, each query alone, in float64 or float32 (x86-64).
 *
 * out[r, h, i, :] = sum_{t <= last[r, j]} softmax_t(q[r, h, i] . K[t] / sqrt(D)) V[t]
 *
 * for rows r of a pass, key/value heads h, and the G k queries i = g k + j of a head (query
 * head g of the group, token j of the row), over the keys K and values V of row r's slot of
 * the cache [P, Hkv, L, D] (float64 or float32). Token j of row r attends positions
 * 0..last[r, j].
 *
 * Every query is computed alone, in one fixed order (the query heads of a token share each
 * load of a key, each with its own sums): its scores in position order, their maximum,
 * exp(score - max) in chunks of one vector of positions (the chunks start at position 0, so
 * they depend on the query's own positions only) summed lane-wise and then by a fixed tree,
 * and the values weighted in position order. So a query's result never depends on the
 * other queries, rows, tokens of the pass or on the threads: k tokens scored in one pass
 * get what k passes of one token get, bit for bit. Products and sums run in the cache's
 * dtype (exp by a polynomial: relative error below 1e-15 in float64, 1e-6 in float32) and
 * the result is rounded to float32 once.
 *
 * The vector code is written once with GCC vector types of 64 bytes (VS_W doubles, VS_FW
 * floats) for both dtypes (VS_ATTENTION) and compiled for AVX-512 and for AVX2 + FMA (two
 * 256-bit halves); a process runs one of them throughout.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define VS_W 8 /* doubles per vector */
#define VS_FW 16 /* floats per vector */
#define VS_EXP_FLOOR -700.0 /* exp of less is taken as 0 (it is below 1e-304) */
#define VS_FEXP_FLOOR -87.0f /* the same in float32 (below 1.7e-38) */

typedef double vd __attribute__((vector_size(VS_W * sizeof(double))));
typedef int64_t vl __attribute__((vector_size(VS_W * sizeof(int64_t))));
typedef float vf __attribute__((vector_size(VS_FW * sizeof(float))));
typedef int32_t vi __attribute__((vector_size(VS_FW * sizeof(int32_t))));

enum { VS_ISA_NONE = 0, VS_ISA_AVX2 = 1, VS_ISA_AVX512 = 2 };

int vs_attention_isa(void) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return VS_ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return VS_ISA_AVX2;
    return VS_ISA_NONE;
}

int vs_attention_width(void) { return VS_W; }
int vs_attention_float_width(void) { return VS_FW; }

static inline __attribute__((always_inline)) vd splat(double x) {
    vd v;
    for (int i = 0; i < VS_W; i++) v[i] = x;
    return v;
}

static inline __attribute__((always_inline)) double total(vd v) {
    /* a fixed tree: (0+4) + (2+6), (1+5) + (3+7) */
    double a = (v[0] + v[4]) + (v[2] + v[6]), b = (v[1] + v[5]) + (v[3] + v[7]);
    return a + b;
}

/* exp(x) for x <= 0, lane-wise: x = n ln2 + r with |r| <= ln2 / 2, exp(r) by its Taylor
 * series to r^12 (relative error below 1e-15), times 2^n built in the exponent bits;
 * 0 below VS_EXP_FLOOR (and for -inf) */
static inline __attribute__((always_inline)) vd exp_nonpositive(vd x) {
    const vd magic = splat(6755399441055744.0); /* 1.5 * 2^52: adding it rounds to an integer */
    vl dead = x < splat(VS_EXP_FLOOR);
    x = (vd)((vl)x & ~dead); /* dead lanes compute exp(0), then become 0 */
    vd t = x * splat(1.4426950408889634) + magic;
    vd n = t - magic;
    vd r = x - n * splat(0.6931471803691238) - n * splat(1.9082149292705877e-10);
    vd p = splat(1.0 / 479001600.0);
    static const double c[12] = {1.0 / 39916800.0, 1.0 / 3628800.0, 1.0 / 362880.0,
                                 1.0 / 40320.0, 1.0 / 5040.0, 1.0 / 720.0, 1.0 / 120.0,
                                 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0};
    for (int i = 0; i < 12; i++) p = p * r + splat(c[i]);
    vl scale = ((vl)t + 1023) << 52; /* 2^n: n + 1023 in the exponent field */
    return (vd)((vl)(p * (vd)scale) & ~dead);
}

static inline __attribute__((always_inline)) vd load(const double *p) {
    vd v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline __attribute__((always_inline)) vf fsplat(float x) {
    vf v;
    for (int i = 0; i < VS_FW; i++) v[i] = x;
    return v;
}

static inline __attribute__((always_inline)) float ftotal(vf v) {
    /* a fixed tree: the upper half added to the lower, and again, down to one lane */
    v += __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
    v += __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3);
    v += __builtin_shufflevector(v, v, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1);
    v += __builtin_shufflevector(v, v, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0);
    return v[0];
}

static inline __attribute__((always_inline)) vf fload(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* exp(x) for x <= 0, lane-wise: x = n ln2 + r, |r| <= ln2 / 2, exp(r) by its Taylor series
 * to r^7, times 2^n built in the exponent bits; 0 below VS_FEXP_FLOOR (and for -inf) */
static inline __attribute__((always_inline)) vf fexp_nonpositive(vf x) {
    const vf magic = fsplat(12582912.0f); /* 1.5 * 2^23: adding it rounds to an integer */
    vi dead = x < fsplat(VS_FEXP_FLOOR);
    x = (vf)((vi)x & ~dead);
    vf t = x * fsplat(1.44269504f) + magic;
    vf n = t - magic;
    vf r = x - n * fsplat(0.693145752f) - n * fsplat(1.42860677e-6f);
    static const float c[7] = {1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f, 0.5f,
                               1.0f, 1.0f};
    vf p = fsplat(1.0f / 5040.0f);
    for (int i = 0; i < 7; i++) p = p * r + fsplat(c[i]);
    vi scale = ((vi)t - (vi)magic + 127) << 23; /* 2^n: n + 127 in the exponent field */
    return (vf)((vi)(p * (vf)scale) & ~dead);
}

/* VS_ATTENTION(R, V, W, ...) defines, for a cache of real type R read in vectors V of W
 * lanes (with the helpers SPLAT, TOTAL, LOAD and EXP of that type, and the queries' scale
 * SCALE, an expression of d):
 *
 * SCORES: the scores of m queries (m <= VS_GROUP, a constant where it is inlined) that
 *   attend the same n positions: s[g * stride + t] = qd_g . K[t] (qd scaled). Each key is
 *   loaded once for all m; every query's sum runs over the same chunks in the same order,
 *   whatever m is.
 * WEIGH: one query's softmax over its n scores s (scratch of n rounded up to W) and the
 *   values [n, d] weighted by it -> out [d] float32.
 * QUERIES: m (<= VS_GROUP) queries q [m] of [d] float32 that attend the same n positions ->
 *   out [m] of [d]; s: scratch [m, stride], stride >= n rounded up to W. */
#define VS_GROUP 8
#define VS_MAX_D 512
#define VS_ATTENTION(R, V, W, SPLAT, TOTAL, LOAD, EXP, SCALE, SCORES, WEIGH, QUERIES)        \
    static inline __attribute__((always_inline)) void SCORES(                                 \
        const V (*qd)[VS_MAX_D / W], const int m, const R *keys, int64_t n, int64_t d, R *s, \
        int64_t stride) {                                                                    \
        for (int64_t t = 0; t < n; t++) {                                                    \
            const R *kt = keys + t * d;                                                      \
            V acc[VS_GROUP];                                                                 \
            for (int g = 0; g < m; g++) acc[g] = SPLAT(0);                                   \
            for (int64_t c = 0; c < d / W; c++) {                                            \
                V kv = LOAD(kt + c * W);                                                     \
                for (int g = 0; g < m; g++) acc[g] += qd[g][c] * kv;                         \
            }                                                                                \
            for (int g = 0; g < m; g++) s[g * stride + t] = TOTAL(acc[g]);                   \
        }                                                                                    \
    }                                                                                        \
                                                                                             \
    static inline __attribute__((always_inline)) void WEIGH(R *s, const R *values, int64_t n, \
                                                            int64_t d, float *out) {         \
        R top = -INFINITY;                                                                   \
        for (int64_t t = 0; t < n; t++) top = s[t] > top ? s[t] : top;                       \
        int64_t padded = (n + W - 1) / W * W;                                                \
        for (int64_t t = n; t < padded; t++) s[t] = -INFINITY;                               \
        V sum = SPLAT(0);                                                                    \
        for (int64_t t = 0; t < padded; t += W) {                                            \
            V e = EXP(LOAD(s + t) - SPLAT(top));                                             \
            memcpy(s + t, &e, sizeof e);                                                     \
            sum += e;                                                                        \
        }                                                                                    \
        R inv = (R)1 / TOTAL(sum);                                                           \
        V acc[VS_MAX_D / W];                                                                 \
        for (int64_t c = 0; c < d / W; c++) acc[c] = SPLAT(0);                               \
        for (int64_t t = 0; t < n; t++) {                                                    \
            V w = SPLAT(s[t]);                                                               \
            const R *vt = values + t * d;                                                    \
            for (int64_t c = 0; c < d / W; c++) acc[c] += w * LOAD(vt + c * W);              \
        }                                                                                    \
        for (int64_t c = 0; c < d / W; c++)                                                  \
            for (int i = 0; i < W; i++) out[c * W + i] = (float)(acc[c][i] * inv);           \
    }                                                                                        \
                                                                                             \
    static inline __attribute__((always_inline)) void QUERIES(                                \
        const float *const *q, int m, const R *keys, const R *values, int64_t n, int64_t d,  \
        R *s, int64_t stride, float *const *out) {                                           \
        V qd[VS_GROUP][VS_MAX_D / W];                                                        \
        R scale = SCALE;                                                                     \
        for (int g = 0; g < m; g++)                                                          \
            for (int64_t c = 0; c < d / W; c++)                                              \
                for (int i = 0; i < W; i++) qd[g][c][i] = (R)q[g][c * W + i] * scale;        \
        switch (m) { /* m a constant in each call, so SCORES' sums live in registers */      \
            case 1: SCORES(qd, 1, keys, n, d, s, stride); break;                             \
            case 2: SCORES(qd, 2, keys, n, d, s, stride); break;                             \
            case 3: SCORES(qd, 3, keys, n, d, s, stride); break;                             \
            case 4: SCORES(qd, 4, keys, n, d, s, stride); break;                             \
            case 5: SCORES(qd, 5, keys, n, d, s, stride); break;                             \
            case 6: SCORES(qd, 6, keys, n, d, s, stride); break;                             \
            case 7: SCORES(qd, 7, keys, n, d, s, stride); break;                             \
            case 8: SCORES(qd, 8, keys, n, d, s, stride); break;                             \
        }                                                                                    \
        for (int g = 0; g < m; g++) WEIGH(s + g * stride, values, n, d, out[g]);             \
    }

VS_ATTENTION(double, vd, VS_W, splat, total, load, exp_nonpositive, 1.0 / sqrt((double)d),
             scores, weigh, queries)
VS_ATTENTION(float, vf, VS_FW, fsplat, ftotal, fload, fexp_nonpositive,
             1.0f / sqrtf((float)d), fscores, fweigh, fqueries)

/* The queries of one (row, head) of the pass, over a float64 (wide) or float32 cache; 0, or
 * -2 where the scratch cannot be allocated. */
typedef struct {
    const float *q;
    int64_t heads, group_k, d, k;
    const void *cache_k, *cache_v;
    int64_t slot_stride, head_stride;
    const int64_t *slots, *last;
    float *out;
    int wide;
} pass;

static inline __attribute__((always_inline)) int task(const pass *a, int64_t t) {
    int64_t r = t / a->heads, h = t % a->heads, k = a->k, heads_per_kv = a->group_k / k;
    int64_t most = 0;
    for (int64_t j = 0; j < k; j++) most = a->last[r * k + j] > most ? a->last[r * k + j] : most;
    int64_t stride = (most + 1 + VS_FW - 1) / VS_FW * VS_FW; /* a multiple of both widths */
    void *s = malloc(sizeof(double) * (size_t)(VS_GROUP * stride));
    if (!s) return -2;
    int64_t base = a->slots[r] * a->slot_stride + h * a->head_stride;
    for (int64_t j = 0; j < k; j++) { /* token j: its G query heads attend the same positions */
        for (int64_t g0 = 0; g0 < heads_per_kv; g0 += VS_GROUP) {
            int m = (int)(heads_per_kv - g0 < VS_GROUP ? heads_per_kv - g0 : VS_GROUP);
            const float *q[VS_GROUP];
            float *out[VS_GROUP];
            for (int g = 0; g < m; g++) {
                int64_t at = (r * a->heads + h) * a->group_k + (g0 + g) * k + j;
                q[g] = a->q + at * a->d;
                out[g] = a->out + at * a->d;
            }
            int64_t n = a->last[r * k + j] + 1;
            if (a->wide)
                queries(q, m, (const double *)a->cache_k + base,
                        (const double *)a->cache_v + base, n, a->d, (double *)s, stride, out);
            else
                fqueries(q, m, (const float *)a->cache_k + base,
                         (const float *)a->cache_v + base, n, a->d, (float *)s, stride, out);
        }
    }
    free(s);
    return 0;
}

/* the vector code compiled for each instruction set (OpenMP's threads call these: a
 * parallel region inside them would be outlined without their target) */
__attribute__((target("avx512f"))) static int task_avx512(const pass *a, int64_t t) {
    return task(a, t);
}

__attribute__((target("avx2,fma"))) static int task_avx2(const pass *a, int64_t t) {
    return task(a, t);
}

/* q [rows, heads, group_k, d] float32 (group_k = G k, query i is token i % k), the cache's
 * keys and values as float64 (wide = 1) or float32 (wide = 0) [P, heads, L, d] with the
 * given strides (in elements), slots [rows], last [rows, k] (the last position each token
 * attends, < L) -> out like q. Returns 0; -1 for arguments it does not take (the caller
 * checks them first), -2 where its scratch cannot be allocated. */
int vs_attend(const float *q, int64_t rows, int64_t heads, int64_t group_k, int64_t d,
              int64_t k, const void *cache_k, const void *cache_v, int64_t slot_stride,
              int64_t head_stride, const int64_t *slots, const int64_t *last, float *out,
              int wide, int isa, int threads) {
    int64_t width = wide ? VS_W : VS_FW;
    if (rows < 1 || heads < 1 || k < 1 || group_k % k != 0 || d < width || d % width != 0 ||
        d > VS_MAX_D || threads < 1 || isa < VS_ISA_AVX2 || isa > vs_attention_isa() ||
        (wide != 0 && wide != 1))
        return -1;
    pass a = {q, heads, group_k, d, k, cache_k, cache_v, slot_stride, head_stride, slots, last,
              out, wide};
    int (*run)(const pass *, int64_t) = isa == VS_ISA_AVX512 ? task_avx512 : task_avx2;
    int64_t tasks = rows * heads;
    int failed = 0;
#pragma omp parallel for schedule(static) num_threads(tasks < threads ? tasks : threads) \
    reduction(| : failed)
    for (int64_t t = 0; t < tasks; t++) failed |= run(&a, t) != 0;
    return failed ? -2 : 0;
}
