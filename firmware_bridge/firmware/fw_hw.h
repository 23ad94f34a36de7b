/*
 * The hardware interface the firmware core needs, implemented once per
 * back-end (hw_sim.c for the HIL pendulum, board/ for a real board). Serial
 * input is pushed into the core by the back-end (fw_receive), so only the
 * output direction needs verbs here.
 *
 * The last two members are optional (NULL): a back-end written for the
 * first four verbs keeps working (its serial_write may then block).
 */
#ifndef GRPO_FW_HW_H
#define GRPO_FW_HW_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
  void *ctx;                                         /* the back-end's own state */
  uint64_t (*micros)(void *ctx);                     /* monotonic clock, us */
  void (*read_sensors)(void *ctx, int32_t *counts);  /* one per channel, zero
                                                        at upright / centre; a
                                                        hardware counter may wrap */
  void (*write_actuator)(void *ctx, float u);        /* physical units, already
                                                        clamped by the core */
  /* Queued output bytes, in order, in pieces of any size (not whole frames).
   * With serial_room set the core never passes more than it reported, so
   * the call must not block; without it, all queued bytes are passed. */
  void (*serial_write)(void *ctx, const uint8_t *bytes, size_t n);
  /* Bytes serial_write takes now without blocking (Arduino:
   * Serial.availableForWrite()); NULL: unlimited. */
  size_t (*serial_room)(void *ctx);
  /* The on-device controller, NULL if none is linked: obs (as PROTOCOL.md's
   * "On-device control" lays it out for the system) -> *action, physical
   * units; returns 0, or nonzero for a failure (then the core faults with
   * FAULT_BAD_COMMAND, as for a NaN). Called from fw_tick once per period
   * while armed in CONTROL_ON_DEVICE. An exported controller
   * (`grpo-ctrl export --c DIR`, int policy_step(const float *obs, float
   * *action)) is linked through a three-line adapter:
   *   static int run_policy(void *ctx, const float *obs, float *action)
   *   { (void)ctx; return policy_step(obs, action); }                      */
  int (*controller)(void *ctx, const float *obs, float *action);
} fw_hw;

#endif /* GRPO_FW_HW_H */
