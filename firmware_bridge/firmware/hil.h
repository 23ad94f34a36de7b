/*
 * The HIL back-end: the firmware core driving a simulated plant from csrc/
 * in real time, talking over a file descriptor (the master side of a
 * pseudo-terminal), with fault injection on the serial line.
 *
 * POSIX (clock_gettime, read, write; epoll and timerfd on Linux, else pselect);
 * not for a board.
 */
#ifndef GRPO_HIL_H
#define GRPO_HIL_H

#include <stddef.h>
#include <stdint.h>

#include "fw_core.h"

typedef struct {
  double corrupt_rate;        /* probability that a byte is corrupted */
  double drop_rate;           /* probability that a device frame is dropped */
  double latency_us;          /* added to every device -> host frame */
  double spike_rate;          /* probability that a frame is delayed more ... */
  double spike_us;            /* ... by this much (later frames wait behind it) */
  double disconnect_after_s;  /* close the line after this long, 0 = never */
  int both_ways;              /* corrupt the host's bytes too (not just the device's) */
} hil_faults;

typedef struct {
  int system;                 /* PS_PENDULUM, ... */
  char preset[PROTO_PRESET_LEN];
  double rate_hz;             /* control rate, 0 = the preset's */
  int set_x0;                 /* start at x0 rather than the preset's draw */
  double x0[4];
  int hold_until_armed;       /* hold the plant at its start until first armed */
  /* a plant that is not the preset (grpo-ctrl hil --param, --plant, --mystery) */
  int n_param;                /* parameters 0..n_param-1 replace the preset's (0: none) */
  double param[16];           /* PS_MAX_PARAMS */
  int delay_steps;            /* actuation delay, control steps (0..PS_MAX_DELAY) */
  double offset[PROTO_MAX_CHANNELS];  /* added to each channel's position (encoder offset) */
  double motor_k;             /* the actuator's first-order response per control step,
                                 (0, 1] as the simulator's (pendsim.h); 0 or 1: instant */
  double sensor_noise[PROTO_MAX_CHANNELS];  /* std of Gaussian noise on each channel's
                                               position before it is counted (rad or m) */
  uint64_t seed;
  uint32_t device_id;
  uint32_t watchdog_us;       /* 0 = two control periods */
  float pos_limit[PROTO_MAX_CHANNELS];  /* physical units (rad or m), 0 = none */
  float vel_limit[PROTO_MAX_CHANNELS];  /* per second, 0 = none */
  float vel_cutoff_hz;        /* velocity low-pass cutoff, 0 = none */
  /* an on-device controller u = -K obs (PROTOCOL.md's observation), for
   * CONTROL_ON_DEVICE; controller_nobs 0: none linked */
  int controller_nobs;
  float controller_gain[FW_MAX_OBS];
  hil_faults faults;
  int fd;                     /* non-blocking, raw; closed by the HIL on disconnect */
  int realtime;               /* try SCHED_FIFO for the loop's thread (best effort) */
  /* per-tick trace, caller-owned, may be NULL; t_us and x [cap * 4];
   * due_us: when the tick was due (a loaded host runs it late) */
  size_t trace_cap;
  uint64_t *trace_t_us, *trace_due_us;
  double *trace_x;
  float *trace_u;
  uint8_t *trace_mode, *trace_fault;
} hil_options;

typedef struct {
  uint64_t t_us, ticks, late_ticks, arms;
  uint8_t mode, fault, disconnected, n_channels, realtime;
  uint8_t io_error;            /* the loop could not set up its event wait: it served nothing */
  uint32_t rx_frames, rx_crc_errors, rx_bad_frames, watchdog_trips, stale_ticks;
  uint32_t stale_commands, tx_dropped_states, tx_dropped_replies;
  uint32_t tx_frames, tx_dropped, tx_corrupted_bytes, tx_overflow, rx_corrupted_bytes;
  uint32_t period_us;
  float u_max;
  size_t trace_len;
} hil_stats;

typedef struct hil_sim hil_sim;

size_t hil_sizeof(void);
/* 0 on success, else a PS_ERR_* code (unknown system or preset, bad option). */
int hil_init(hil_sim *h, const hil_options *o);
/* Run in real time until hil_stop or duration_s (0 = no limit). */
void hil_run(hil_sim *h, double duration_s);
void hil_stop(hil_sim *h);
void hil_get_stats(const hil_sim *h, hil_stats *s);

#endif /* GRPO_HIL_H */
