/*
 * The device firmware core: protocol handling, the disarmed / armed / fault
 * state machine, the command watchdog, clamping and limits, the state
 * stream, the transmit queue and the on-device controller hook. Portable
 * C99 (16-bit int included): no allocation, no stdio, no clock of its own;
 * all hardware goes through fw_hw.
 *
 * A back-end's main loop:
 *     fw_init(&dev, &config, &hw);
 *     for (;;) {
 *       feed received serial bytes to fw_receive(&dev, bytes, n);
 *       when the control period has elapsed: fw_tick(&dev, due);
 *       fw_transmit(&dev);   (hand queued bytes to the line as it has room)
 *     }
 * Commands take effect at the next tick (the actuator is updated once per
 * period, as a PWM would be), so a command answering state k is in effect
 * from tick k + 1 if it arrives within the period.
 *
 * Not re-entrant: all calls on one fw_device must come from one context
 * (the main loop), never from an interrupt handler while another runs.
 * Output never blocks when the back-end sets serial_room: frames queue in
 * a FW_TX_BUF-byte ring; when it is full the oldest queued STATE is dropped
 * (counted), and a reply that still does not fit is dropped and counted
 * too (STATUS: COUNTER_TX_DROPPED_STATES, COUNTER_TX_DROPPED_REPLIES).
 */
#ifndef GRPO_FW_CORE_H
#define GRPO_FW_CORE_H

#include "fw_hw.h"
#include "proto.h"

#define FW_VERSION 4       /* 4: info_t_us kept in 64 bits, echoed times before start-up stale */
#ifndef FW_TX_BUF         /* transmit ring, bytes (>= PROTO_MAX_WIRE) */
#if defined(__AVR__)
#define FW_TX_BUF 128     /* an INFO, or a STATE and a STATUS: the Uno has 2 KB of RAM */
#else
#define FW_TX_BUF 256
#endif
#endif
#define FW_TX_FRAMES 8    /* frames queued at most */
#define FW_MAX_OBS 6      /* the longest observation (Furuta) */

typedef struct {
  uint8_t system;            /* 0 pendulum, 1 cartpole, 2 furuta (as csrc/) */
  uint8_t n_channels;        /* position sensors, <= PROTO_MAX_CHANNELS */
  uint8_t angle_mask;        /* bit c set: channel c is an angle */
  uint32_t device_id;
  uint32_t period_us;        /* control period */
  float u_max;               /* hardware actuator limit, physical units */
  float counts_per_unit[PROTO_MAX_CHANNELS];  /* per revolution or metre */
  uint32_t watchdog_us;      /* 0: two control periods; clamped to [2 periods, 10 s] */
  float pos_limit[PROTO_MAX_CHANNELS];        /* counts, 0 = none */
  float vel_limit[PROTO_MAX_CHANNELS];        /* counts/s, 0 = none */
  float vel_cutoff_hz;       /* first-order low-pass on the velocity, 0 = none */
  char preset[PROTO_PRESET_LEN];
} fw_config;

typedef struct {
  fw_config cfg;
  fw_hw hw;
  proto_decoder rx;
  proto_frame rx_frame;          /* the frame being handled (here, not on the stack) */
  uint8_t mode, fault, control_source;
  float u_limit;                 /* command clamp, <= cfg.u_max */
  /* the command received and not yet applied (raw, clamped when applied),
   * and the one in effect */
  uint8_t have_pending, pending_fresh;
  float pending_u;
  uint32_t pending_seq;
  uint8_t have_cmd_seq;          /* a command was accepted since arming */
  uint32_t last_cmd_seq;         /* frame seq of the newest accepted command */
  float applied_u;
  uint32_t applied_seq;
  uint8_t applied_flags;
  uint32_t rx_latency_max_us;    /* worst latency of the commands accepted this
                                    period, LATENCY_UNKNOWN if none */
  uint64_t info_t_us;            /* the watchdog counts from here: the time of the STATE
                                    the newest accepted command answers (or of arming),
                                    0 before the first ARM */
  /* sensing */
  uint8_t have_prev;
  int32_t prev_counts[PROTO_MAX_CHANNELS];
  uint64_t prev_t_us;            /* the last tick's time */
  float vel[PROTO_MAX_CHANNELS];
  float vel_alpha;               /* low-pass coefficient for the nominal period */
  float obs_unit[PROTO_MAX_CHANNELS];   /* observation: rad or m per count, 0 absent */
  int32_t obs_turn[PROTO_MAX_CHANNELS]; /* counts per turn (whole) of an angle, else 0 */
  /* output */
  uint32_t tx_seq;
  uint8_t have_state;
  uint32_t last_state_seq;
  uint8_t tx_wire[PROTO_MAX_WIRE];  /* the frame being queued: its payload packed in
                                       place and encoded (here, not on the stack) */
  uint8_t tx_buf[FW_TX_BUF];     /* ring of queued wire bytes */
  uint16_t tx_head, tx_bytes;    /* first queued byte, bytes queued */
  uint8_t tx_len[FW_TX_FRAMES];  /* queued frames, oldest first */
  uint8_t tx_is_state[FW_TX_FRAMES];
  uint8_t tx_frames_queued, tx_sent;  /* tx_sent: bytes of the oldest already out */
  /* counters (STATUS) */
  uint32_t counter[PROTO_COUNTERS - COUNTER_TX_FRAMES];  /* FW_COUNTER; rx: the decoder's */
  uint32_t ticks;
  uint8_t extra_flags;           /* ORed into STATE flags by the back-end */
} fw_device;

/* The device's own STATUS counters, COUNTER_TX_FRAMES onwards (the four
 * before it are the decoder's, d->rx). */
#define FW_COUNTER(d, which) ((d)->counter[(which) - COUNTER_TX_FRAMES])

void fw_init(fw_device *d, const fw_config *cfg, const fw_hw *hw);
/* Bytes that arrived on the serial line. */
void fw_receive(fw_device *d, const uint8_t *bytes, size_t n);
/* One control period: sense, estimate velocity, watchdog and limits, run the
 * on-device controller if it is in charge, actuate, queue a STATE. due_us:
 * when the back-end's schedule wanted this tick, low 32 bits of the micros()
 * clock (a timer-driven board: the tick's start): the watchdog is checked at
 * that time, and a tick a period or more after it is LATE. */
void fw_tick(fw_device *d, uint32_t due_us);
/* Hand queued output to serial_write, as much as serial_room allows. Called
 * by fw_receive and fw_tick; call it from the main loop too, so frames go
 * out as the line drains. */
void fw_transmit(fw_device *d);
/* The observation the on-device controller gets (PROTOCOL.md), from the
 * last tick's counts and velocity estimate; returns its length. */
uint8_t fw_observation(const fw_device *d, float *obs);

#endif /* GRPO_FW_CORE_H */
