/*
 * Checks exact_math.h against its references, bit for bit:
 *   libm_sin_block       against the C library's sin, value by value;
 *   angle_normalize(_near) against NumPy's float remainder algorithm
 *                        (fmod, then the divisor's sign), written out here.
 * Random values over the ranges the simulator meets and far beyond, and the
 * hard cases: near multiples of pi/2, near the sin table's cell edges, tiny,
 * huge, powers of two, zeros, infinities, NaN. Prints "ok N" (N values
 * checked) or the first mismatches and exits 1. tests/test_sim_parity.py
 * builds it with the simulator's flags, plain and for AVX2 with FMA;
 * tests/test_cross_aarch64.py for aarch64, run under qemu-user on a tenth of
 * the random values ("check_exact_math 10").
 */
#include <stdio.h>
#include <stdlib.h>

#include "exact_math.h"

enum { BLOCK = 1024 };

#include "check_rng.h"

static double numpy_angle_normalize(double x) /* numpy: npy_divmod's remainder */
{
  const double b = 2 * PI;
  double mod = fmod(x + PI, b);
  if (mod != 0.0) {
    if ((b < 0) != (mod < 0)) mod += b;
  } else {
    mod = copysign(0.0, b);
  }
  return mod - PI;
}

static long checked, failures;

static void report(const char *what, double x, double got, double want)
{
  if (++failures <= 10)
    printf("%s(%a): got %a, want %a\n", what, x, got, want);
}

static int same(double a, double b)
{
  return double_bits(a) == double_bits(b) || (isnan(a) && isnan(b));
}

static void check_block(const double *x, int n)
{
  double y[BLOCK];
  uint8_t redo[BLOCK];
  libm_sin_block(n, x, y, redo);
  for (int j = 0; j < n; ++j) {
    if (!same(y[j], sin(x[j]))) report("sin", x[j], y[j], sin(x[j]));
    uint8_t far;
    double a = angle_normalize_near(x[j], &far);
    if (far) a = angle_normalize(x[j]);
    const double want = numpy_angle_normalize(x[j]);
    if (!same(a, want)) report("angle_normalize_near", x[j], a, want);
    if (!same(angle_normalize(x[j]), want))
      report("angle_normalize", x[j], angle_normalize(x[j]), want);
  }
  checked += n;
}

/* n values from next(i), checked a block at a time */
static void check_many(long n, double (*next)(long))
{
  double x[BLOCK];
  for (long i = 0; i < n; i += BLOCK) {
    const int m = n - i < BLOCK ? (int)(n - i) : BLOCK;
    for (int j = 0; j < m; ++j) x[j] = next(i + j);
    check_block(x, m);
  }
}

static double wide(long i) { (void)i; return uniform(-100.0, 100.0); }
static double far(long i) { (void)i; return uniform(-2e6, 2e6); }
static double spin(long i) { (void)i; return uniform(-4.0, 4.0); }

static double near_quadrant(long i) /* k pi/2 + a tiny offset of any scale */
{
  const double k = (double)(i % 4001 - 2000);
  return k * (PI / 2) + uniform(-1.0, 1.0) * ldexp(1.0, -(int)(i % 60));
}

static double near_cell_edge(long i) /* r near (i + 1/2)/64, where the table index changes */
{
  const double k = (double)(i % 201 - 100), cell = (double)(i % 103 - 51) + 0.5;
  return k * (PI / 2) + cell / 64 + uniform(-1e-12, 1e-12);
}

static double near_turn(long i) /* x + pi near a multiple of 2 pi: the remainder's edges */
{
  const double k = (double)(i % 41 - 20);
  return k * (2 * PI) - PI + uniform(-1.0, 1.0) * ldexp(1.0, -(int)(i % 50));
}

int main(int argc, char **argv)
{
  /* an argument N checks 1/N of the random values (under emulation: tests/test_cross_aarch64.py) */
  const long part = argc > 1 ? atol(argv[1]) : 1;
  if (part < 1 || part > 1000) {
    fprintf(stderr, "error: the argument is the part of the values to check, 1..1000\n");
    return 2;
  }
  check_many(20000000 / part, wide);
  check_many(3000000 / part, spin);
  check_many(2000000 / part, far);
  check_many(2000000 / part, near_quadrant);
  check_many(2000000 / part, near_cell_edge);
  check_many(1000000 / part, near_turn);
  double special[BLOCK];
  int n = 0;
  const double values[] = {0.0, -0.0, INFINITY, -INFINITY, NAN, 1e5, -1e5, 1e6, 1e300, -1e300,
                           0x1.0p-1074, 0x1.0p-30, PI, -PI, 2 * PI, 3 * PI, -3 * PI, PI / 2};
  for (size_t k = 0; k < sizeof values / sizeof values[0]; ++k) special[n++] = values[k];
  for (int e = -60; e <= 20; ++e) {
    special[n++] = ldexp(1.0, e);
    special[n++] = -ldexp(1.0, e);
    special[n++] = nextafter(ldexp(1.0, e), 0.0);
  }
  check_block(special, n);
  if (failures) {
    printf("FAILED: %ld of %ld values\n", failures, checked);
    return 1;
  }
  printf("ok %ld\n", checked);
  return 0;
}
