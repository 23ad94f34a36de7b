/*
 * Arithmetic that must match NumPy and libm bit for bit, written so that
 * the compiler vectorises it. Internal to pendsim.c; csrc/check_exact_math.c
 * tests it against libm and NumPy's algorithm.
 *
 * angle_normalize: Gymnasium's ((x + pi) % (2 pi)) - pi.
 *
 * libm_sin_block: sin(x) for a block of values, what the C library's sin
 * gives. Gymnasium's pendulum is chaotic over an episode, so parity with it
 * needs libm's exact sin; glibc's scalar sin, whose range branches random
 * angles mispredict, was half of the simulator's step time.
 * How: x = k pi/2 + r (Cody-Waite with a four-part pi/2, as a
 * double-double), r = i/64 + b (tables of sin and cos at i/64 as
 * double-doubles, sin_table.h), short polynomials in b, and the angle-sum
 * formulas evaluated as a double-double: good to about 2^-66 relative, so
 * it names the correctly rounded double unless the true value lies within
 * 0.06 ulp of a rounding midpoint. glibc's sin is correctly rounded except
 * very near midpoints (its worst error over 2e7 random values here: 0.5154
 * ulp, so it strays only within 0.016 ulp of one), so away from them the two
 * agree; the values near a midpoint (12%), tiny reduced arguments, powers
 * of two and |x| > 1e5 are flagged and recomputed by sin() itself.
 * check_exact_math.c compares the result with sin() on 3e7 values.
 *
 * Only with glibc: another C library's sin may round differently, so there
 * libm_sin_block simply calls sin().
 */
#ifndef PS_EXACT_MATH_H
#define PS_EXACT_MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "sin_table.h"

static const double PI = 3.14159265358979323846;

/* NumPy's float remainder (sign of the divisor), as Gymnasium's
 * angle_normalize uses it: ((x + pi) % (2 pi)) - pi. For x + pi in
 * (-2 pi, 4 pi) it avoids fmod, exactly (a - 2 pi is exact for
 * 2 pi <= a < 4 pi by Sterbenz; a + 2 pi is NumPy's own correction), and
 * with selects rather than branches, which random angles would mispredict. */
static inline double angle_normalize(double x)
{
  const double two_pi = 2 * PI;
  const double a = x + PI;
  if (!(a > -two_pi && a < 2 * two_pi)) {
    double r = fmod(a, two_pi);
    if (r != 0.0) {
      if (r < 0) r += two_pi;
    } else {
      r = 0.0;
    }
    return r - PI;
  }
  double r = a >= two_pi ? a - two_pi : a;
  r = a < 0.0 ? a + two_pi : r;
  return r - PI;
}

/* angle_normalize without fmod: its selects for x + pi in (-2 pi, 4 pi),
 * else the remainder by a fused multiply-add, exact because the remainder
 * is representable (both operands are multiples of 2^-50 there), as fmod's
 * and NumPy's are. *far flags |x + pi| >= 2^20 and NaN for angle_normalize. */
static inline __attribute__((always_inline)) double angle_normalize_near(double x, uint8_t *far)
{
  const double two_pi = 2 * PI;
  const double a = x + PI;
  double r = a >= two_pi ? a - two_pi : a;
  r = a < 0.0 ? a + two_pi : r;
  const double n0 = floor(a * (1 / two_pi));
  const double r0 = fma(-n0, two_pi, a);
  const double n1 = n0 - (r0 < 0.0) + (r0 >= two_pi); /* a * (1 / two_pi) may round across */
  const double r_far = fma(-n1, two_pi, a);
  *far = (uint8_t)!(fabs(a) < 0x1.0p20);
  return ((a > -two_pi && a < 2 * two_pi) ? r : r_far) - PI;
}

static inline uint64_t double_bits(double x)
{
  uint64_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}

static inline double bits_double(uint64_t u)
{
  double x;
  memcpy(&x, &u, sizeof x);
  return x;
}

#if defined(__GLIBC__)
/* y[j] = sin(x[j]) where the fast path is sure of libm's answer; redo[j] = 1
 * where it is not (then y[j] is to be recomputed with sin). */
static inline __attribute__((always_inline)) void
libm_sin_fast(int n, const double *restrict x, double *restrict y, uint8_t *restrict redo)
{
  const double two_over_pi = 6.36619772367581382433e-01;
  const double round_magic = 6755399441055744.0; /* 1.5 * 2^52: adding it rounds to an integer */
  /* pi/2 in four parts; the first three have 33 bits, so k * part is exact for |k| < 2^20 */
  const double pio2_1 = 1.57079632673412561417e+00, pio2_2 = 6.07710050630396597660e-11,
               pio2_3 = 2.02226624879595063154e-21, pio2_3t = 8.47842766036889956997e-32;
  const double midpoint_band = 0.06; /* ulps: trust only results this far from a tie */
  for (int j = 0; j < n; ++j) {
    const int outside = !(fabs(x[j]) <= 1e5); /* and NaN */
    /* 0 in place of an outside value keeps the table row in range (bit
     * masking: a select here stops GCC vectorising the loop) */
    const double xj = bits_double(double_bits(x[j]) & ((uint64_t)outside - 1));
    const double kr = xj * two_over_pi + round_magic;
    const double k = kr - round_magic;
    const uint64_t quadrant = double_bits(kr); /* k's low bits */
    /* r = x - k pi/2 as rh + rl: two exact products, two error-free sums */
    const double r1 = xj - k * pio2_1;
    const double m2 = -(k * pio2_2), h2 = r1 + m2, v2 = h2 - r1;
    double lo = (r1 - (h2 - v2)) + (m2 - v2);
    const double m3 = -(k * pio2_3), h3 = h2 + m3, v3 = h3 - h2;
    lo += (h2 - (h3 - v3)) + (m3 - v3) - k * pio2_3t;
    const double rh = h3 + lo, rl = lo - (rh - h3);
    /* r = i/64 + b; b is exact, |b| <= 1/128 */
    const double ir = rh * 64.0 + round_magic;
    const int64_t row = (int64_t)(double_bits(ir) - double_bits(round_magic)) + SIN_TABLE_HALF;
    const double b = rh - (ir - round_magic) * (1.0 / 64);
    const double b2 = b * b;
    /* sin b = b + rl + sin_tail, cos b = 1 + cos_tail (rl folded in to first order) */
    const double sin_tail = rl + b * b2 * (-1.0 / 6 + b2 * (1.0 / 120 + b2 * (-1.0 / 5040)));
    const double cos_tail = b2 * (-0.5 + b2 * (1.0 / 24 + b2 * (-1.0 / 720))) - b * rl;
    /* even quadrant: sin(a+b) = Sa cos b + Ca sin b; odd: cos(a+b) = Ca cos b - Sa sin b */
    const int odd = (int)(quadrant & 1);
    const double sh = SIN_COS[row][0], sl = SIN_COS[row][1], ch = SIN_COS[row][2], cl = SIN_COS[row][3];
    const double t1h = odd ? ch : sh, t1l = odd ? cl : sl;
    const double t2h = odd ? -sh : ch, t2l = odd ? -sl : cl;
    const double p = t2h * b, p_err = fma(t2h, b, -p);
    const double s = t1h + p, vs = s - t1h;
    const double s_err = (t1h - (s - vs)) + (p - vs);
    const double tail = s_err + p_err + t1l + t1h * cos_tail + t2h * sin_tail + t2l * b;
    const double v = s + tail;
    const double v_err = tail - (v - s); /* the true value is about v + v_err */
    const uint64_t vb = double_bits(v);
    const double ulp = bits_double(vb & 0x7FF0000000000000ull) * 0x1.0p-52;
    redo[j] = (uint8_t)(outside | (fabs(rh) < 0x1.0p-30) |
                        ((vb & 0x000FFFFFFFFFFFFFull) == 0) | /* a power of two: ulp changes */
                        (fabs(v_err) > (0.5 - midpoint_band) * ulp));
    y[j] = (quadrant & 2) ? -v : v;
  }
}

static inline void libm_sin_block(int n, const double *restrict x, double *restrict y,
                                  uint8_t *restrict redo)
{
  libm_sin_fast(n, x, y, redo);
  for (int j = 0; j < n; ++j)
    if (redo[j]) y[j] = sin(x[j]);
}
#else
static inline void libm_sin_block(int n, const double *restrict x, double *restrict y,
                                  uint8_t *restrict redo)
{
  (void)redo;
  for (int j = 0; j < n; ++j) y[j] = sin(x[j]);
}
#endif

#endif /* PS_EXACT_MATH_H */
