/*
 * The device firmware core: protocol handling, the disarmed / armed / fault
 * state machine, the command watchdog, clamping and limits, and the state
 * stream. Portable C99: no allocation, no stdio, no clock of its own; all
 * hardware goes through fw_hw.
 *
 * A back-end's main loop:
 *     fw_init(&dev, &config, &hw);
 *     for (;;) {
 *       feed received serial bytes to fw_receive(&dev, bytes, n);
 *       when the control period has elapsed: fw_tick(&dev);
 *     }
 * Commands take effect at the next tick (the actuator is updated once per
 * period, as a PWM would be), so a command answering state k is in effect
 * from tick k + 1 if it arrives within the period.
 */
#ifndef GRPO_FW_CORE_H
#define GRPO_FW_CORE_H

#include "fw_hw.h"
#include "proto.h"

#define FW_VERSION 1
#define FW_STATE_HISTORY 8  /* recent STATE (seq, time) pairs, for latency */

typedef struct {
  uint8_t system;            /* 0 pendulum, 1 cartpole, 2 furuta (as csrc/) */
  uint8_t n_channels;        /* position sensors, <= PROTO_MAX_CHANNELS */
  uint8_t angle_mask;        /* bit c set: channel c is an angle */
  uint32_t device_id;
  uint32_t period_us;        /* control period */
  float u_max;               /* hardware actuator limit, physical units */
  float counts_per_unit[PROTO_MAX_CHANNELS];  /* per revolution or metre */
  uint32_t watchdog_us;      /* 0: two control periods */
  float pos_limit[PROTO_MAX_CHANNELS];        /* counts, 0 = none */
  float vel_limit[PROTO_MAX_CHANNELS];        /* counts/s, 0 = none */
  float vel_cutoff_hz;       /* first-order low-pass on the velocity, 0 = none */
  char preset[PROTO_PRESET_LEN];
} fw_config;

typedef struct {
  fw_config cfg;
  fw_hw hw;
  proto_decoder rx;
  uint8_t mode, fault;
  float u_limit;                 /* command clamp, <= cfg.u_max */
  /* the command received and not yet applied, and the one in effect */
  int have_pending;
  float pending_u;
  uint32_t pending_seq;
  int pending_fresh_for;         /* 1 if it answers the last STATE */
  uint8_t pending_clamped;
  float applied_u;
  uint32_t applied_seq;
  uint32_t rx_latency_max_us;    /* worst latency of the commands received this
                                    period, LATENCY_UNKNOWN if none */
  uint8_t applied_flags;
  uint64_t last_cmd_t_us;        /* arrival of the last valid command (or arming) */
  /* sensing */
  int have_prev;
  int32_t prev_counts[PROTO_MAX_CHANNELS];
  uint64_t prev_t_us;
  float vel[PROTO_MAX_CHANNELS];
  /* output */
  uint32_t tx_seq;
  uint32_t last_state_seq;
  uint32_t hist_seq[FW_STATE_HISTORY];
  uint64_t hist_t_us[FW_STATE_HISTORY];
  uint32_t hist_n;
  /* counters */
  uint32_t tx_frames, watchdog_trips, stale_ticks, late_ticks, ticks;
  int tick_late;                 /* set by the back-end before fw_tick */
  uint8_t extra_flags;           /* ORed into STATE flags by the back-end */
} fw_device;

void fw_init(fw_device *d, const fw_config *cfg, const fw_hw *hw);
/* Bytes that arrived on the serial line. */
void fw_receive(fw_device *d, const uint8_t *bytes, size_t n);
/* One control period: sense, estimate velocity, watchdog and limits, actuate,
 * stream STATE. */
void fw_tick(fw_device *d);

#endif /* GRPO_FW_CORE_H */
