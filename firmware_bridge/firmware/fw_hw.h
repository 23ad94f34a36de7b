/*
 * The hardware interface the firmware core needs: four verbs, implemented
 * once per back-end (hw_sim.c for the HIL pendulum, board/ for a real board).
 * Serial input is pushed into the core by the back-end (fw_receive), so
 * only the output direction needs a verb here.
 */
#ifndef GRPO_FW_HW_H
#define GRPO_FW_HW_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
  void *ctx;                                         /* the back-end's own state */
  uint64_t (*micros)(void *ctx);                     /* monotonic clock, us */
  void (*read_sensors)(void *ctx, int32_t *counts);  /* one per channel, zero
                                                        at upright / centre */
  void (*write_actuator)(void *ctx, float u);        /* physical units, already
                                                        clamped by the core */
  void (*serial_write)(void *ctx, const uint8_t *bytes, size_t n);  /* one whole
                                                        frame per call */
} fw_hw;

#endif /* GRPO_FW_HW_H */
