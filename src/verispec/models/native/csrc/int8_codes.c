/* verispec: the activation codes of an int8 layer, one fused pass over each row (x86-64 and
 * any other CPU a C compiler targets).
 *
 * For x [m, k] float32 and one row at a time (never across rows, so a row's codes do not
 * depend on the rows around it or on how many there are):
 *   u = x, or x * factors (float32, channel factors [k]);
 *   u = u B per block of b = p q channels, B = A (x) C the Kronecker product of A [p, p] and
 *       C [q, q] (float64 arithmetic, rounded once to float32): a block read as a p x q
 *       matrix X (channel i q + j at X[i, j]) becomes A^T X C (a dense block R: A = R,
 *       q = 1, C = [1]);
 *   a = max |u| (exact in any order);
 *   code = trunc(half + (inv * u) / a) (float32, the order torch's addcdiv uses), written as
 *       uint8 or as the float32 integer code - zero;
 *   s = a, or with norm = 1: a / sqrt(sum x^2 / k + eps) (sum in float64, see sum_squares).
 * A row of zeros gets the zero point's codes and s = 0 (its output is 0); a row with a NaN or
 * an infinity gets the zero point's codes and s = NaN, so its output is NaN, as the torch
 * operators' would be, never a finite number made from garbage codes.
 * Rows and blocks are spread over the threads; each is computed whole by one thread in a fixed
 * order, so the result never depends on the thread count either.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define VS_MAX_BLOCK 4096 /* the most channels p q of a rotation block */
#define VS_MAX_Q 64        /* the largest q (a dense block R is p = b, q = 1 with C = [1]) */

#define VS_MIN_PARALLEL 16384 /* entries (m k) from which rows and blocks spread over threads */

int vs_codes_max_block(void) { return VS_MAX_BLOCK; }
int vs_codes_min_parallel(void) { return VS_MIN_PARALLEL; }
int vs_codes_max_q(void) { return VS_MAX_Q; }

/* One block: in [p q] float32 -> out [p q] float32 = A^T X C (A [p, p], C [q, q] float64).
 * Output row i of the block is T_i = sum_r A[r, i] X[r, :] and then sum_l T_i[l] C[l, :]:
 * both accumulate in a few registers (q doubles each) in the order r, l = 0, 1, .... */
static inline __attribute__((always_inline)) void rotate_block(
    const float *in, float *out, const double *a, int64_t p, const double *c, int64_t q) {
    double xd[VS_MAX_BLOCK]; /* X in float64 */
    for (int64_t i = 0; i < p * q; i++) xd[i] = (double)in[i];
    for (int64_t i = 0; i < p; i++) {
        double t[VS_MAX_Q], y[VS_MAX_Q];
        for (int64_t j = 0; j < q; j++) t[j] = 0.0;
        for (int64_t r = 0; r < p; r++) {
            double w = a[r * p + i];
            const double *xr = xd + r * q;
            for (int64_t j = 0; j < q; j++) t[j] += w * xr[j];
        }
        for (int64_t j = 0; j < q; j++) y[j] = 0.0;
        for (int64_t l = 0; l < q; l++) {
            double w = t[l];
            const double *cl = c + l * q;
            for (int64_t j = 0; j < q; j++) y[j] += w * cl[j];
        }
        for (int64_t j = 0; j < q; j++) out[i * q + j] = (float)y[j];
    }
}

/* The block sides verispec's layers use (16 x 16 and 8 x 8) in vectors of VS_W doubles
 * (GCC's vector extension sized to the widest registers the build targets), the same
 * arithmetic in the same order as rotate_block. */
#if defined(__AVX512F__)
#define VS_W 8
#elif defined(__AVX__)
#define VS_W 4
#else
#define VS_W 2
#endif
typedef double vs_dv __attribute__((vector_size(8 * VS_W)));
typedef float vs_fv __attribute__((vector_size(4 * VS_W)));

static inline vs_dv load_f(const float *p) {
    vs_fv v;
    memcpy(&v, p, sizeof v);
    return __builtin_convertvector(v, vs_dv);
}

static inline void store_f(float *p, vs_dv v) {
    vs_fv f = __builtin_convertvector(v, vs_fv);
    memcpy(p, &f, sizeof f);
}

static inline vs_dv load_d(const double *p) {
    vs_dv v;
    memcpy(&v, p, sizeof v);
    return v;
}

#define VS_ROTATE(NAME, P, Q)                                                                 \
    static void NAME(const float *in, float *out, const double *a, const double *c) {         \
        enum { H = (Q) / VS_W }; /* vectors per row of X */                                   \
        vs_dv x[P][H];                                                                        \
        for (int r = 0; r < P; r++)                                                           \
            for (int h = 0; h < H; h++) x[r][h] = load_f(in + r * Q + VS_W * h);              \
        for (int i = 0; i < P; i++) {                                                         \
            vs_dv t[H], y[H];                                                                 \
            for (int h = 0; h < H; h++) t[h] = y[h] = (vs_dv){0};                             \
            for (int r = 0; r < P; r++)                                                       \
                for (int h = 0; h < H; h++) t[h] += a[r * P + i] * x[r][h];                   \
            for (int l = 0; l < Q; l++)                                                       \
                for (int h = 0; h < H; h++)                                                   \
                    y[h] += t[l / VS_W][l % VS_W] * load_d(c + l * Q + VS_W * h);             \
            for (int h = 0; h < H; h++) store_f(out + i * Q + VS_W * h, y[h]);                \
        }                                                                                     \
    }

VS_ROTATE(rotate_16_16, 16, 16)
VS_ROTATE(rotate_8_8, 8, 8)

static void rotate_any(const float *in, float *out, const double *a, int64_t p,
                       const double *c, int64_t q) {
    if (p == 16 && q == 16)
        rotate_16_16(in, out, a, c);
    else if (p == 8 && q == 8)
        rotate_8_8(in, out, a, c);
    else
        rotate_block(in, out, a, p, c, q);
}

/* sum x[i]^2 in float64: VS_W partial sums over i = lane (mod VS_W), added in lane order,
 * then the tail in order. */
static double sum_squares(const float *x, int64_t k) {
    vs_dv acc = {0};
    int64_t i = 0;
    for (; i + VS_W <= k; i += VS_W) {
        vs_dv v = load_f(x + i);
        acc += v * v;
    }
    double ss = 0.0;
    for (int j = 0; j < VS_W; j++) ss += acc[j];
    for (; i < k; i++) ss += (double)x[i] * (double)x[i];
    return ss;
}

/* x [m, k]; factors [k] or NULL; rot_a [p, p] and rot_c [q, q] float64, or NULL (no rotation);
 * u_out [m, k] float32 scratch (the rotated or scaled rows; may be x itself when neither
 * applies); codes [m, k]: uint8 when as_float == 0, else float32 code - zero; s [m].
 * Returns 0, or a negative code for arguments it refuses. */
int vs_int8_codes(const float *x, int64_t m, int64_t k, const float *factors,
                  const double *rot_a, int64_t p, const double *rot_c, int64_t q,
                  float inv, float half, float zero, int norm, double eps,
                  float *u_out, void *codes, int as_float, float *s, int threads) {
    if (m < 0 || k <= 0) return -1;
    if (rot_a && (!rot_c || p < 1 || q < 1 || q > VS_MAX_Q || p * q > VS_MAX_BLOCK ||
                  k % (p * q)))
        return -2;
    int64_t b = rot_a ? p * q : k;
    int64_t blocks = k / b;
    int64_t work = m * k;
    const float *u = x;
    if (rot_a || factors) {
#pragma omp parallel for schedule(static) num_threads(threads) if (work >= VS_MIN_PARALLEL)
        for (int64_t t = 0; t < m * blocks; t++) {
            int64_t r = t / blocks, off = (t % blocks) * b;
            const float *in = x + r * k + off;
            float *out = u_out + r * k + off;
            float scaled[VS_MAX_BLOCK];
            if (factors) {
                const float *f = factors + off;
                if (!rot_a) {
                    for (int64_t i = 0; i < b; i++) out[i] = in[i] * f[i];
                    continue;
                }
                for (int64_t i = 0; i < b; i++) scaled[i] = in[i] * f[i];
                in = scaled;
            }
            rotate_any(in, out, rot_a, p, rot_c, q);
        }
        u = u_out;
    }
#pragma omp parallel for schedule(static) num_threads(threads) if (work >= VS_MIN_PARALLEL)
    for (int64_t r = 0; r < m; r++) {
        const float *ur = u + r * k;
        float amax = 0.0f;
        int bad = 0; /* a NaN in the row */
        for (int64_t i = 0; i < k; i++) {
            float v = fabsf(ur[i]);
            amax = v > amax ? v : amax;
            bad |= v != v;
        }
        int blank = amax == 0.0f || bad || isinf(amax); /* no codes to make */
        if (as_float) { /* such a row gets the zero point's code */
            float *cr = (float *)codes + r * k;
            if (blank)
                for (int64_t i = 0; i < k; i++) cr[i] = 0.0f;
            else
                for (int64_t i = 0; i < k; i++) cr[i] = truncf(half + (inv * ur[i]) / amax) - zero;
        } else {
            uint8_t *cr = (uint8_t *)codes + r * k;
            uint8_t z = (uint8_t)zero;
            if (blank)
                for (int64_t i = 0; i < k; i++) cr[i] = z;
            else
                for (int64_t i = 0; i < k; i++) cr[i] = (uint8_t)(half + (inv * ur[i]) / amax);
        }
        float scale = amax == 0.0f ? 0.0f : blank ? NAN : amax; /* NaN marks the output */
        if (norm && !blank) {
            const float *xr = x + r * k;
            double ss = sum_squares(xr, k);
            scale = (float)((double)amax / sqrt(ss / (double)k + eps));
        }
        s[r] = scale;
    }
    return 0;
}
