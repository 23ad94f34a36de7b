/*
 * check_rng: the C check programs' random numbers (xorshift64*), the same
 * sequence on every compiler and target so that their outputs compare
 * across builds (x86 against aarch64 under qemu-user). Not for the simulator,
 * whose noise is counter-based (pendsim.c).
 */
#ifndef CHECK_RNG_H
#define CHECK_RNG_H

#include <stdint.h>

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

/* uniform in [lo, hi) */
static double uniform(double lo, double hi)
{
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  const uint64_t r = rng_state * 0x2545F4914F6CDD1Dull;
  return lo + (hi - lo) * ((double)(r >> 11) * 0x1.0p-53);
}

#endif
