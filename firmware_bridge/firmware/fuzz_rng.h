/* The fuzz drivers' dice: xorshift64, seeded from the command line
 * (fuzz_rng_seed(argc > 2 ? argv[2] : 0)). Not for the firmware. */
#ifndef GRPO_FUZZ_RNG_H
#define GRPO_FUZZ_RNG_H

#include <stdint.h>
#include <stdlib.h>

static uint64_t rng_state;

static void fuzz_rng_seed(const char *seed)
{
  rng_state = seed ? strtoull(seed, 0, 10) * 2654435761u + 1 : 88172645463325252ull;
}

static uint32_t rnd(void)
{
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (uint32_t)(rng_state >> 16);
}

#endif /* GRPO_FUZZ_RNG_H */
