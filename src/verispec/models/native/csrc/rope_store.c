/* verispec: rotary position embedding and the cache store of one layer, in one call.
 *
 * Between a layer's fused q/k/v projection and its attention, for every token j of every row
 * r of a pass (at position p = positions[r, j], in cache slot slots[r]):
 *
 *   q head h      -> rope(q_h)  stored at q_out[r, h / G, (h % G) k + j, :] (attention layout)
 *   key head h    -> rope(k_h)  stored at cache_k[slots[r], h, p, :]
 *   value head h  ->      v_h   stored at cache_v[slots[r], h, p, :]
 *
 * rope(x)[i] = fma(x[i ± d/2], sin[p, i], x[i] cos[p, i]) (x[i ± d/2] the element of the
 * other half), where sin has its first half negated (rotate_half(x) ⊙ sin = swapped halves of
 * x ⊙ that sin): the product with cos rounded to float32, then the other product added in one
 * fused multiply-add, as torch's x * cos followed by addcmul computes it on an x86-64 CPU
 * with FMA (the same bits there). Every element depends on its own token only, so a token
 * gets the same bits whatever else its pass holds. The cache is float32 or float64 (a float32
 * value widens exactly). Where the CPU lacks FMA, fmaf is still exact (in software).
 *
 * This replaces some twenty small tensor operations per layer (views, a half swap, two
 * products, the writes into the cache, the permutation of q) whose fixed costs outweigh their
 * arithmetic in one-token passes.
 */
#include <math.h>
#include <stdint.h>

#define VS_MIN_PARALLEL 64 /* tokens: fewer run on the calling thread */

typedef struct {
    const float *qkv;
    int64_t k, hq, hkv, d;
    const float *cos, *sin;
    const int64_t *positions, *slots;
    void *cache_k, *cache_v;
    int64_t slot_stride, head_stride;
    int wide;
    float *q_out;
} pass;

static inline __attribute__((always_inline)) void rope(const float *x, const float *c,
                                                       const float *s, int64_t d, float *out) {
    int64_t half = d / 2;
    for (int64_t i = 0; i < half; i++) {
        out[i] = fmaf(x[i + half], s[i], x[i] * c[i]);
    }
    for (int64_t i = half; i < d; i++) {
        out[i] = fmaf(x[i - half], s[i], x[i] * c[i]);
    }
}

static inline __attribute__((always_inline)) void store(const pass *a, void *cache, int64_t at,
                                                        const float *x) {
    if (a->wide) {
        double *dst = (double *)cache + at;
        for (int64_t i = 0; i < a->d; i++) dst[i] = (double)x[i];
    } else {
        float *dst = (float *)cache + at;
        for (int64_t i = 0; i < a->d; i++) dst[i] = x[i];
    }
}

static inline __attribute__((always_inline)) void token(const pass *a, int64_t t) {
    int64_t r = t / a->k, j = t % a->k, d = a->d, g = a->hq / a->hkv;
    int64_t p = a->positions[t];
    const float *x = a->qkv + t * (a->hq + 2 * a->hkv) * d;
    const float *c = a->cos + p * d, *s = a->sin + p * d;
    for (int64_t h = 0; h < a->hq; h++) {
        int64_t at = ((r * a->hkv + h / g) * g * a->k + (h % g) * a->k + j) * d;
        rope(x + h * d, c, s, d, a->q_out + at);
    }
    float roped[1024];
    int64_t base = a->slots[r] * a->slot_stride + p * d;
    for (int64_t h = 0; h < a->hkv; h++) {
        rope(x + (a->hq + h) * d, c, s, d, roped);
        store(a, a->cache_k, base + h * a->head_stride, roped);
        store(a, a->cache_v, base + h * a->head_stride, x + (a->hq + a->hkv + h) * d);
    }
}

/* compiled with and without FMA instructions (fmaf is a library call without them; both give
 * the exactly rounded fused result) */
__attribute__((target("avx2,fma"))) static void token_fma(const pass *a, int64_t t) {
    token(a, t);
}

static void token_plain(const pass *a, int64_t t) { token(a, t); }

int vs_rope_max_head_dim(void) { return 1024; }

/* qkv [rows, k, hq + 2 hkv, d] float32; cos, sin [N, d] float32 (N above every position);
 * positions [rows, k], slots [rows] int64; the caches [P, hkv, L, d] float32 (wide = 0) or
 * float64 (wide = 1) with the given strides in elements (positions contiguous) ->
 * q_out [rows, hkv, G k, d] float32. Returns 0, or -1 for arguments it does not take (the
 * caller checks positions and slots against the cache). */
int vs_rope_store(const float *qkv, int64_t rows, int64_t k, int64_t hq, int64_t hkv, int64_t d,
                  const float *cos, const float *sin, const int64_t *positions,
                  const int64_t *slots, void *cache_k, void *cache_v, int64_t slot_stride,
                  int64_t head_stride, int wide, float *q_out, int threads) {
    if (rows < 1 || k < 1 || hkv < 1 || hq < hkv || hq % hkv != 0 || d < 2 || d % 2 != 0 ||
        d > vs_rope_max_head_dim() || threads < 1 || (wide != 0 && wide != 1))
        return -1;
    pass a = {qkv, k, hq, hkv, d, cos, sin, positions, slots, cache_k, cache_v, slot_stride,
              head_stride, wide, q_out};
    __builtin_cpu_init();
    int fused = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    void (*run)(const pass *, int64_t) = fused ? token_fma : token_plain;
    int64_t tokens = rows * k;
    if (tokens < VS_MIN_PARALLEL || threads == 1) {
        for (int64_t t = 0; t < tokens; t++) run(&a, t);
        return 0;
    }
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t t = 0; t < tokens; t++) run(&a, t);
    return 0;
}
