"""The C every kernel includes: vectorizable float32 math (exp, log, log1p, tanh, sigmoid, erf, sin, cos),
NaN-propagating max/min, Python's remainder and 16-bit float conversions (PRELUDE).

The C library's `expf`, `tanhf`, ... are scalar calls (~10 ns an element, about 0.3 GB/s for
tanh), so a loop calling them is never vectorized.  These are branch-free inline functions (selects,
bit casts, explicit `fmaf`) that gcc/clang vectorize with the loop around them.  The forms are
Cephes' (exp, log, tanh, sin/cos polynomials; Cody-Waite reductions) and N. Juffa's erf, evaluated
with explicit fused multiply-adds; `+ - * /` of the user's program are never contracted
(-ffp-contract=off), only these polynomials use `fmaf`.

sin and cos reduce their argument by pi/2 in double (exact product in an fma, pi/2 in two
doubles), which is accurate for |x| <= FJ_TRIG_LIMIT; a chunk of elements that holds a larger
argument is recomputed with the C library's sinf/cosf (their forms' guard sets a flag the kernel
keeps, see codegen).

Measured maximum errors against torch's CPU results over a dense float32 sample (every value in
tests/executors/test_c_executor.py::test_vector_math_ulp_error_against_torch, all special values included):
each block's `c_vector` form states its `ulp`, which that test asserts.  Every function maps NaN to NaN, +-inf and signed zeros as
torch does, and keeps denormal inputs and results (no flush to zero).
"""
from __future__ import annotations

# The argument bound of sin's and cos's reduction (their blocks' guards test against it).
TRIG_LIMIT = "0x1p20f"

SOURCE = r"""
static inline float fj_asf(int32_t i) { float f; memcpy(&f, &i, 4); return f; }
static inline int32_t fj_asi(float f) { int32_t i; memcpy(&i, &f, 4); return i; }
#define FJ_TRIG_LIMIT """ + TRIG_LIMIT + r"""
/* exp: x = n ln2 + r, |r| <= ln2/2 (ln2 in two parts, n*hi exact); 2^n applied as two factors so
   that results in the denormal range round once. */
static inline float fj_expf(float x) {
    x = x > 88.8f ? 88.8f : x;            /* NaN stays NaN: comparisons with it are false */
    x = x < -104.0f ? -104.0f : x;
    float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = fmaf(n, -0.693359375f, x);
    r = fmaf(n, 2.12194440e-4f, r);
    float p = fmaf(1.9875691500e-4f, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    p = fmaf(p, r * r, r) + 1.0f;
    int32_t k = (int32_t)(n == n ? n : 0.0f);
    int32_t k1 = k >> 1, k2 = k - k1;
    return p * fj_asf((k1 + 127) << 23) * fj_asf((k2 + 127) << 23);
}
static inline float fj_sigmoidf(float x) { return 1.0f / (1.0f + fj_expf(-x)); }
/* log: x = m 2^e, m in [sqrt(1/2), sqrt(2)); log(m) = f - f^2/2 + f^3 P(f), f = m - 1 */
static inline float fj_logf(float x) {
    int32_t sub = x < 0x1p-126f;
    float xs = sub ? x * 0x1p23f : x;
    int32_t ix = fj_asi(xs);
    int32_t e = ((ix >> 23) & 0xff) - 126 - (sub ? 23 : 0);
    float m = fj_asf((ix & 0x007fffff) | 0x3f000000);
    int32_t lt = m < 0.707106781186547524f;
    e = lt ? e - 1 : e;
    m = lt ? m + m - 1.0f : m - 1.0f;
    float z = m * m;
    float p = fmaf(7.0376836292e-2f, m, -1.1514610310e-1f);
    p = fmaf(p, m, 1.1676998740e-1f);
    p = fmaf(p, m, -1.2420140846e-1f);
    p = fmaf(p, m, 1.4249322787e-1f);
    p = fmaf(p, m, -1.6668057665e-1f);
    p = fmaf(p, m, 2.0000714765e-1f);
    p = fmaf(p, m, -2.4999993993e-1f);
    p = fmaf(p, m, 3.3333331174e-1f);
    float fe = (float)e;
    float y = p * m * z;
    y = fmaf(fe, -2.12194440e-4f, y);
    y = fmaf(-0.5f, z, y);
    float res = fmaf(fe, 0.693359375f, m + y);
    res = x == INFINITY ? x : res;
    res = x < 0.0f ? NAN : res;
    res = x == 0.0f ? -INFINITY : res;
    return x != x ? x : res;
}
/* log1p: log(u) * x / (u - 1) with u = 1 + x rounded (Goldberg's form: the quotient undoes the
   rounding of u), x itself where u rounds to 1; +inf stays +inf (x / (u - 1) is inf / inf). */
static inline float fj_log1pf(float x) {
    float u = 1.0f + x, d = u - 1.0f;
    float res = d == 0.0f ? x : fj_logf(u) * (x / d);
    return x == INFINITY ? x : res;
}
/* tanh: an odd polynomial below 0.625, 1 - 2 / (exp(2|x|) + 1) above */
static inline float fj_tanhf(float x) {
    float a = fabsf(x), s = x * x;
    float p = fmaf(-5.70498872745e-3f, s, 2.06390887954e-2f);
    p = fmaf(p, s, -5.37397155531e-2f);
    p = fmaf(p, s, 1.33314422036e-1f);
    p = fmaf(p, s, -3.33332819422e-1f);
    float small = fmaf(p * s, x, x);
    float big = copysignf(1.0f - 2.0f / (fj_expf(a + a) + 1.0f), x);
    return a < 0.625f ? small : big;
}
/* erf (N. Juffa's minimax forms): x P(x^2) below 0.927734375, 1 - exp(Q(|x|)) above */
static inline float fj_erff(float x) {
    float t = fabsf(x), s = x * x;
    float r = fmaf(-1.72853470e-5f, t, 3.83197126e-4f);
    float u = fmaf(-3.88396438e-3f, t, 2.42546219e-2f);
    r = fmaf(r, s, u);
    r = fmaf(r, t, -1.06777877e-1f);
    r = fmaf(r, t, -6.34846687e-1f);
    r = fmaf(r, t, -1.28717512e-1f);
    r = fmaf(r, t, -t);
    float big = copysignf(1.0f - fj_expf(r), x);
    float q = fmaf(-5.96761703e-4f, s, 4.99119423e-3f);
    q = fmaf(q, s, -2.67681349e-2f);
    q = fmaf(q, s, 1.12819925e-1f);
    q = fmaf(q, s, -3.76125336e-1f);
    q = fmaf(q, s, 1.28379166e-1f);
    float small = fmaf(q, x, x);
    return t > 0.927734375f ? big : (x != x ? x : small);
}
/* sin/cos: x = j pi/2 + r in double, then Cephes' polynomials on |r| <= pi/4; quadrant j + shift */
static inline float fj_sincosf(float x, int64_t shift) {
    double xd = (double)x;
    double j = (xd * 0x1.45f306dc9c883p-1 + 0x1.8p52) - 0x1.8p52;
    double rd = fma(-j, 0x1.921fb54442d18p+0, xd);
    rd = fma(-j, 0x1.1a62633145c07p-54, rd);
    float r = (float)rd, z = r * r;
    int64_t q = (int64_t)(j == j ? j : 0.0) + shift;
    float ps = fmaf(-1.9515295891e-4f, z, 8.3321608736e-3f);
    ps = fmaf(ps, z, -1.6666654611e-1f);
    ps = fmaf(ps * z, r, r);
    float pc = fmaf(2.443315711809948e-5f, z, -1.388731625493765e-3f);
    pc = fmaf(pc, z, 4.166664568298827e-2f);
    pc = fmaf(pc * z, z, fmaf(-0.5f, z, 1.0f));
    float y = (q & 1) ? pc : ps;
    return (q & 2) ? -y : y;
}
static inline float fj_sinf(float x) { return fj_sincosf(x, 0); }
static inline float fj_cosf(float x) { return fj_sincosf(x, 1); }
"""

# What every C kernel starts with: NaN-propagating max/min, Python's remainder, 16-bit floats, then
# the vector forms above.
PRELUDE = """\
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
/* torch's maximum/minimum/clamp propagate NaN from either side, and keep `a` when a == b
   (maximum(-0.0, 0.0) is -0.0) */
#define FJ_MAX(a, b) ((a) != (a) ? (a) : (b) != (b) ? (b) : (a) < (b) ? (b) : (a))
#define FJ_MIN(a, b) ((a) != (a) ? (a) : (b) != (b) ? (b) : (a) > (b) ? (b) : (a))
/* Python's modulo: the sign of the divisor (r is fmod(a, b)) */
#define FJ_REMAINDER(a, b, r) ((r) != 0 && (((r) < 0) != ((b) < 0)) ? (r) + (b) : (r))
/* 16-bit floats, converted with round-to-nearest-even as c10 converts them */
static inline float fj_f32(uint32_t b) { float f; memcpy(&f, &b, 4); return f; }
static inline uint32_t fj_bits(float f) { uint32_t b; memcpy(&b, &f, 4); return b; }
static inline float fj_from_bf16(uint16_t h) { return fj_f32((uint32_t)h << 16); }
static inline uint16_t fj_to_bf16(float f) {
    uint32_t b = fj_bits(f);
    if (f != f) return 0x7FC0;
    return (uint16_t)((b + 0x7FFF + ((b >> 16) & 1)) >> 16);
}
static inline float fj_from_f16(uint16_t h) {
    uint32_t w = (uint32_t)h << 16, sign = w & 0x80000000u, two_w = w + w;
    float normalized = fj_f32((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
    float denormalized = fj_f32((two_w >> 17) | (126u << 23)) - 0.5f;
    return fj_f32(sign | (two_w < (1u << 27) ? fj_bits(denormalized) : fj_bits(normalized)));
}
static inline uint16_t fj_to_f16(float f) {
    float base = (fabsf(f) * 0x1.0p+112f) * 0x1.0p-110f;
    uint32_t w = fj_bits(f), shl1_w = w + w, sign = w & 0x80000000u, bias = shl1_w & 0xFF000000u;
    if (bias < 0x71000000u) bias = 0x71000000u;
    uint32_t bits = fj_bits(fj_f32((bias >> 1) + 0x07800000u) + base);
    uint32_t nonsign = ((bits >> 13) & 0x00007C00u) + (bits & 0x00000FFFu);
    return (uint16_t)((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}
static inline float fj_round_bf16(float f) { return fj_from_bf16(fj_to_bf16(f)); }
static inline float fj_round_f16(float f) { return fj_from_f16(fj_to_f16(f)); }
""" + SOURCE
