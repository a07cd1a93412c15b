"""The C functions every generated kernel file starts with: exp and erf in plain arithmetic
(so vector loops inline them), the thread count the runtime sets, NaN-propagating max/min and
Python's floor division and modulo. `kiln.codegen.c` puts ``PRELUDE`` after the includes."""

from __future__ import annotations

__all__ = ["PRELUDE"]

EXPF = """\
/* expf in plain arithmetic, so vector loops inline it without a vector math library:
   Cephes' polynomial on r = x - k ln2, times 2^k built from the exponent bits in two
   halves (k may be -150..128). Within 1.02 ulp of exp where the result is a normal float.
   The clamp does the special cases without selects: x > 89 gives 2^128 = inf, x < -104
   rounds to 0, NaN stays NaN through the arithmetic (checked bit for bit, over all 2^32
   inputs, against the version with a select for each).
   Every f32 exp takes it, not glibc's SIMD expf: that one is 10% faster on moderate
   inputs, but goes scalar below -87.3, and a causal mask's large negative fill made a
   GPT-2 softmax 7x slower (0.44 ms against 0.07). */
#pragma omp declare simd notinbranch
static inline __attribute__((always_inline)) float kiln_expf_of_clamped(float xc) {
  /* k = round(x / ln2): adding 1.5 * 2^23 leaves k in the mantissa's low bits */
  union { float f; uint32_t u; } t = {xc * 1.44269504088896341f + 12582912.0f};
  float kf = t.f - 12582912.0f;
  float r = xc - kf * 0.693359375f;
  r = r + kf * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  /* unsigned, so a NaN's bits go through defined arithmetic (p is NaN, and so the result) */
  uint32_t k = t.u - 0x4B400000u, k1 = (uint32_t)((int32_t)k >> 1);
  union { uint32_t u; float f; } s1 = {(k1 + 127u) << 23}, s2 = {(k - k1 + 127u) << 23};
  return p * s1.f * s2.f;
}
#pragma omp declare simd notinbranch
static inline __attribute__((always_inline)) float kiln_expf(float x) {
  return kiln_expf_of_clamped(x < -104.0f ? -104.0f : (x > 89.0f ? 89.0f : x));
}
"""

ERFF = """\
/* erff as a rational function (the one Eigen and XLA use): odd degree-13 numerator over
   even degree-8 denominator, argument clamped to [-4, 4] where erf is +-1 in float.
   Within 4.5e-7 absolute (7 ulp) of erf; NaN stays NaN, +-inf give +-1. Plain arithmetic,
   so vector loops inline it: 2.1x faster than libmvec's erff (bias+GELU is erf-bound). */
#pragma omp declare simd notinbranch
static inline __attribute__((always_inline)) float kiln_erff(float a) {
  float x = a < -4.0f ? -4.0f : (a > 4.0f ? 4.0f : a);
  float x2 = x * x;
  float p = x2 * -2.72614225801306e-10f + 2.77068142495902e-08f;
  p = x2 * p + -2.10102402082508e-06f;
  p = x2 * p + -5.69250639462346e-05f;
  p = x2 * p + -7.34990630326855e-04f;
  p = x2 * p + -2.95459980854025e-03f;
  p = x2 * p + -1.60960333262415e-02f;
  float q = x2 * -1.45660718464996e-05f + -2.13374055278905e-04f;
  q = x2 * q + -1.68282697438203e-03f;
  q = x2 * q + -7.37332916720468e-03f;
  q = x2 * q + -1.42647390514189e-02f;
  return x * p / q;
}
"""

# the thread count of parallel loops: the runtime sets it to torch.get_num_threads(), so a
# kernel uses the threads the user gave torch (0, before it is set: OpenMP's default)
THREADS = """\
#ifdef _OPENMP
#include <omp.h>
#define KILN_THREADS (kiln_num_threads > 0 ? kiln_num_threads : omp_get_max_threads())
#endif
int kiln_num_threads = 0;
void kiln_set_num_threads(int n) { kiln_num_threads = n; }

"""

HELPERS = EXPF + ERFF + """\
/* NaN-propagating max/min in two selects, not one with ||: gcc makes the first a vmaxss and
   the NaN test a predictable branch; (a > b || a != a) ? a : b became a branch per call, and
   a row's combine of lane maxima mispredicted half of them */
static inline float kiln_max_f32(float a, float b) {
  float m = a > b ? a : b; return a != a ? a : m;
}
static inline float kiln_min_f32(float a, float b) {
  float m = a < b ? a : b; return a != a ? a : m;
}
static inline double kiln_max_f64(double a, double b) {
  double m = a > b ? a : b; return a != a ? a : m;
}
static inline double kiln_min_f64(double a, double b) {
  double m = a < b ? a : b; return a != a ? a : m;
}
/* the same against a constant bound (relu, clamp): the result behind a barrier, so that gcc
   does not merge a clamp's two selects into one chain of compares when it vectorizes them
   (AVX2: 9 instructions a vector, 6 with it; MobileNetV2's 3x3 depthwise over 112x112x32
   with its relu6 147 -> 122 us, 101 with a relu alone) */
#if defined(__has_builtin)
#if __has_builtin(__builtin_assoc_barrier)
#define KILN_BARRIER(x) __builtin_assoc_barrier(x)
#endif
#endif
#ifndef KILN_BARRIER
#define KILN_BARRIER(x) (x)
#endif
/* exp with the results below exp(-87) given as 0 (TIR's EXP_FLUSHED, a softmax's terms):
   x < -87 goes to -176, where k = -254 makes both halves of 2^k +0.0, so no lane computes
   a subnormal (on Intel cores a microcode assist each); the same clamps as kiln_expf's
   otherwise, so from -87 up the same result bit for bit, and NaN stays NaN. The clamp's
   bounds are this file's variables, not constants: where a side of the clamp is a constant,
   gcc may compute exp on x itself and blend that side's constant result in afterwards,
   subnormals and all (LeViT's 8x49x196 attention 490 against 214 us; a behind-the-barrier
   clamp did that in one loop and not in another) */
float kiln_exp_flush_floor = -176.0f, kiln_exp_ceiling = 89.0f;
#pragma omp declare simd notinbranch
static inline __attribute__((always_inline)) float kiln_expf_flushed(float x) {
  return kiln_expf_of_clamped(x < -87.0f ? kiln_exp_flush_floor
                              : (x > 89.0f ? kiln_exp_ceiling : x));
}
static inline float kiln_maxc_f32(float a, float b) {
  float m = a > b ? a : b; return KILN_BARRIER(a != a ? a : m);
}
static inline float kiln_minc_f32(float a, float b) {
  float m = a < b ? a : b; return KILN_BARRIER(a != a ? a : m);
}
static inline double kiln_maxc_f64(double a, double b) {
  double m = a > b ? a : b; return KILN_BARRIER(a != a ? a : m);
}
static inline double kiln_minc_f64(double a, double b) {
  double m = a < b ? a : b; return KILN_BARRIER(a != a ? a : m);
}
/* a vector the compiler must keep in a register, by its size in bytes: gcc otherwise folds
   each use of a register tile's weight vector back into a load (a memory operand of each
   FMA), and the loads then outnumber what the core issues per cycle (a 4 x 24 GEMM tile on
   AVX2, 16 loads per 12 FMAs, ran at 65% of peak); a size the target has no register for
   stays as it is */
#define KILN_IN_REGISTER_4(v) ((void)0)
#if defined(__GNUC__) && defined(__AVX512F__)
#define KILN_IN_REGISTER_64(v) __asm__("" : "+v"(v))
#else
#define KILN_IN_REGISTER_64(v) ((void)0)
#endif
#if defined(__GNUC__) && defined(__AVX__)
#define KILN_IN_REGISTER_32(v) __asm__("" : "+v"(v))
#else
#define KILN_IN_REGISTER_32(v) ((void)0)
#endif
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__)) && defined(__SSE2__)
#define KILN_IN_REGISTER_16(v) __asm__("" : "+x"(v))
#elif defined(__GNUC__) && defined(__aarch64__)
#define KILN_IN_REGISTER_16(v) __asm__("" : "+w"(v))
#else
#define KILN_IN_REGISTER_16(v) ((void)0)
#endif
static inline int64_t kiln_floordiv_i64(int64_t a, int64_t b) {
  int64_t q = a / b; return (q * b != a && ((a < 0) != (b < 0))) ? q - 1 : q;
}
static inline int64_t kiln_floormod_i64(int64_t a, int64_t b) {
  int64_t r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
/* floor division as ATen computes it (c10 div_floor_floating): by way of fmod, so that
   3 // -inf is -1 (as in Python), where floorf(3 / -inf) is -0 */
static inline float kiln_floordiv_f32(float a, float b) {
  if (b == 0.0f) return a / b;
  float mod = fmodf(a, b), div = (a - mod) / b;
  if (mod != 0.0f && ((b < 0.0f) != (mod < 0.0f))) div -= 1.0f;
  if (div == 0.0f) return copysignf(0.0f, a / b);
  float q = floorf(div); return div - q > 0.5f ? q + 1.0f : q;
}
static inline double kiln_floordiv_f64(double a, double b) {
  if (b == 0.0) return a / b;
  double mod = fmod(a, b), div = (a - mod) / b;
  if (mod != 0.0 && ((b < 0.0) != (mod < 0.0))) div -= 1.0;
  if (div == 0.0) return copysign(0.0, a / b);
  double q = floor(div); return div - q > 0.5 ? q + 1.0 : q;
}
static inline float kiln_floormod_f32(float a, float b) {
  float r = fmodf(a, b); return (r != 0.0f && ((r < 0.0f) != (b < 0.0f))) ? r + b : r;
}
static inline double kiln_floormod_f64(double a, double b) {
  double r = fmod(a, b); return (r != 0.0 && ((r < 0.0) != (b < 0.0))) ? r + b : r;
}
"""


PRELUDE = THREADS + HELPERS
