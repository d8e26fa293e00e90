/* verispec: attention in float64 over a slot cache, each query alone (x86-64).
 *
 * out[r, h, i, :] = sum_{t <= last[r, j]} softmax_t(q[r, h, i] . K[t] / sqrt(D)) V[t]
 *
 * for rows r of a pass, key/value heads h, and the G k queries i = g k + j of a head (query
 * head g of the group, token j of the row), over the keys K and values V of row r's slot of
 * the cache [P, Hkv, L, D] (float64). Token j of row r attends positions 0..last[r, j].
 *
 * Every query is computed alone, in one fixed order (the query heads of a token share each
 * load of a key, each with its own sums): its scores in position order, their maximum,
 * exp(score - max) in chunks of VS_W positions (the chunks start at position 0, so they
 * depend on the query's own positions only) summed lane-wise and then by a fixed tree, and
 * the values weighted in position order. So a query's result never depends on the
 * other queries, rows, tokens of the pass or on the threads: k tokens scored in one pass
 * get what k passes of one token get, bit for bit. Products and sums run in float64 and
 * the result is rounded to float32 once.
 *
 * The vector code is written once with GCC vector types of VS_W doubles and compiled for
 * AVX-512 and for AVX2 + FMA (two 256-bit halves); a process runs one of them throughout.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define VS_W 8 /* doubles per vector */
#define VS_EXP_FLOOR -700.0 /* exp of less is taken as 0 (it is below 1e-304) */

typedef double vd __attribute__((vector_size(VS_W * sizeof(double))));
typedef int64_t vl __attribute__((vector_size(VS_W * sizeof(int64_t))));

enum { VS_ISA_NONE = 0, VS_ISA_AVX2 = 1, VS_ISA_AVX512 = 2 };

int vs_attention_isa(void) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return VS_ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return VS_ISA_AVX2;
    return VS_ISA_NONE;
}

int vs_attention_width(void) { return VS_W; }

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

/* The scores of m queries (m <= VS_GROUP, a constant where this is inlined) that attend
 * the same n positions: s[g * stride + t] = qd_g . K[t] (qd scaled). Each key is loaded
 * once for all m; every query's sum runs over the same chunks in the same order, whatever m
 * is. */
#define VS_GROUP 8
#define VS_MAX_D 512
static inline __attribute__((always_inline)) void scores(const vd (*qd)[VS_MAX_D / VS_W],
                                                         const int m, const double *keys,
                                                         int64_t n, int64_t d, double *s,
                                                         int64_t stride) {
    for (int64_t t = 0; t < n; t++) {
        const double *kt = keys + t * d;
        vd acc[VS_GROUP];
        for (int g = 0; g < m; g++) acc[g] = splat(0.0);
        for (int64_t c = 0; c < d / VS_W; c++) {
            vd kv = load(kt + c * VS_W);
            for (int g = 0; g < m; g++) acc[g] += qd[g][c] * kv;
        }
        for (int g = 0; g < m; g++) s[g * stride + t] = total(acc[g]);
    }
}

/* One query's softmax over its n scores s (scratch of n rounded up to VS_W) and the values
 * [n, d] float64 weighted by it -> out [d] float32. */
static inline __attribute__((always_inline)) void weigh(double *s, const double *values,
                                                        int64_t n, int64_t d, float *out) {
    double top = -INFINITY;
    for (int64_t t = 0; t < n; t++) top = s[t] > top ? s[t] : top;
    int64_t padded = (n + VS_W - 1) / VS_W * VS_W;
    for (int64_t t = n; t < padded; t++) s[t] = -INFINITY;
    vd sum = splat(0.0);
    for (int64_t t = 0; t < padded; t += VS_W) {
        vd e = exp_nonpositive(load(s + t) - splat(top));
        memcpy(s + t, &e, sizeof e);
        sum += e;
    }
    double inv = 1.0 / total(sum);
    vd acc[VS_MAX_D / VS_W];
    for (int64_t c = 0; c < d / VS_W; c++) acc[c] = splat(0.0);
    for (int64_t t = 0; t < n; t++) {
        vd w = splat(s[t]);
        const double *vt = values + t * d;
        for (int64_t c = 0; c < d / VS_W; c++) acc[c] += w * load(vt + c * VS_W);
    }
    for (int64_t c = 0; c < d / VS_W; c++)
        for (int i = 0; i < VS_W; i++) out[c * VS_W + i] = (float)(acc[c][i] * inv);
}

/* m (<= VS_GROUP) queries q [m] of [d] float32 that attend the same n positions -> out
 * [m] of [d]; s: scratch [m, stride], stride >= n rounded up to VS_W. */
static inline __attribute__((always_inline)) void queries(const float *const *q, int m,
                                                          const double *keys,
                                                          const double *values, int64_t n,
                                                          int64_t d, double *s, int64_t stride,
                                                          float *const *out) {
    vd qd[VS_GROUP][VS_MAX_D / VS_W];
    double scale = 1.0 / sqrt((double)d);
    for (int g = 0; g < m; g++)
        for (int64_t c = 0; c < d / VS_W; c++)
            for (int i = 0; i < VS_W; i++) qd[g][c][i] = (double)q[g][c * VS_W + i] * scale;
    switch (m) {
#define VS_CASE(M) \
    case M: scores(qd, M, keys, n, d, s, stride); break;
        VS_CASE(1) VS_CASE(2) VS_CASE(3) VS_CASE(4) VS_CASE(5) VS_CASE(6) VS_CASE(7) VS_CASE(8)
#undef VS_CASE
    }
    for (int g = 0; g < m; g++) weigh(s + g * stride, values, n, d, out[g]);
}

/* The queries of one (row, head) of the pass; 0, or -2 where the scratch cannot be
 * allocated. */
typedef struct {
    const float *q;
    int64_t heads, group_k, d, k;
    const double *cache_k, *cache_v;
    int64_t slot_stride, head_stride;
    const int64_t *slots, *last;
    float *out;
} pass;

static inline __attribute__((always_inline)) int task(const pass *a, int64_t t) {
    int64_t r = t / a->heads, h = t % a->heads, k = a->k, heads_per_kv = a->group_k / k;
    int64_t most = 0;
    for (int64_t j = 0; j < k; j++) most = a->last[r * k + j] > most ? a->last[r * k + j] : most;
    int64_t stride = (most + 1 + VS_W - 1) / VS_W * VS_W;
    double *s = (double *)malloc(sizeof(double) * (size_t)(VS_GROUP * stride));
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
            queries(q, m, a->cache_k + base, a->cache_v + base, a->last[r * k + j] + 1, a->d, s,
                    stride, out);
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
 * keys and values as float64 [P, heads, L, d] with the given strides (in doubles), slots
 * [rows], last [rows, k] (the last position each token attends, < L) -> out like q.
 * Returns 0; -1 for arguments it does not take (the caller checks them first), -2 where
 * its scratch cannot be allocated. */
int vs_attend(const float *q, int64_t rows, int64_t heads, int64_t group_k, int64_t d,
              int64_t k, const double *cache_k, const double *cache_v, int64_t slot_stride,
              int64_t head_stride, const int64_t *slots, const int64_t *last, float *out,
              int isa, int threads) {
    if (rows < 1 || heads < 1 || k < 1 || group_k % k != 0 || d < VS_W || d % VS_W != 0 ||
        d > VS_MAX_D || threads < 1 || isa < VS_ISA_AVX2 || isa > vs_attention_isa())
        return -1;
    pass a = {q, heads, group_k, d, k, cache_k, cache_v, slot_stride, head_stride, slots, last,
              out};
    int (*run)(const pass *, int64_t) = isa == VS_ISA_AVX512 ? task_avx512 : task_avx2;
    int failed = 0;
#pragma omp parallel for schedule(static) num_threads(threads) reduction(| : failed)
    for (int64_t t = 0; t < rows * heads; t++) failed |= run(&a, t) != 0;
    return failed ? -2 : 0;
}
