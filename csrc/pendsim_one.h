/*
 * pendsim_one: one environment of a plant together with its storage, for the
 * programs that step a single plant (the HIL back-end firmware/hw_sim.c and
 * the boards' processor-in-the-loop benches, firmware/board/). Internal: not
 * in Python's cdef, whose batches are numpy arrays.
 */
#ifndef PENDSIM_ONE_H
#define PENDSIM_ONE_H

#include "pendsim.h"

typedef struct {
  ps_data data; /* bound to the arrays below by ps_one_reset */
  double x[PS_MAX_NX], param[PS_MAX_PARAMS];
  float act_buf[PS_MAX_DELAY];
  uint64_t rng_key, rng_ctr;
  int32_t steps;
} ps_one;

/* Point one->data at one's own storage (a batch of one); the rest of
 * one->data (a held plant's state) stays as the caller set it. */
static inline void ps_one_bind(ps_one *one)
{
  one->data.B = 1;
  one->data.x = one->x;
  one->data.param = one->param;
  one->data.act_buf = one->act_buf;
  one->data.rng_key = &one->rng_key;
  one->data.rng_ctr = &one->rng_ctr;
  one->data.t = &one->steps;
}

/* Bind one's storage, seed it and reset it to a start state of m (the
 * caller then sets one->x where it wants the plant to start). */
static inline void ps_one_reset(const ps_model *m, ps_one *one, uint64_t seed)
{
  ps_one_bind(one);
  ps_seed(&one->data, &seed);
  ps_reset(m, &one->data, 0, 0);
}

#endif
