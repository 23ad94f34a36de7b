/*
 * Fuzz harness for the firmware core: fw_receive, fw_tick and fw_transmit
 * driven by a byte script, on a fake board whose clock, encoder counts
 * (wrapping int32), line room and on-device controller come from the script
 * too. Built with -fsanitize=address,undefined (tests/test_fw_core.py,
 * benchmarks/fuzz_protocol.py); with -DFUZZ_LIBFUZZER and clang's
 * -fsanitize=fuzzer it is a libFuzzer target.
 *
 * Invariants checked after every step (abort on a violation):
 *   - the actuator never receives more than u_limit (<= u_max), nor NaN;
 *   - outside the armed mode the last value written is 0;
 *   - serial_write never gets more than serial_room reported;
 *   - the transmit queue's bookkeeping adds up.
 * Script ops (first byte of each step, mod 6): raw bytes to fw_receive; a
 * valid host frame built from the script (so the state machine is reached
 * past the CRC); a tick after a script-chosen time; an encoder jump; line
 * room; fw_transmit.
 * Standalone: fuzz_fw [bytes] [seed] runs random scripts and prints counts.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fw_core.h"

static struct {
  uint64_t t;
  int32_t counts[PROTO_MAX_CHANNELS];
  size_t room;
  float u_last, controller_u;
  int controller_fails;
  uint64_t writes, bytes_out, ticks, frames_in;
} board;

static fw_device dev;

static void fail(const char *what)
{
  fprintf(stderr, "fuzz_fw: invariant violated: %s\n", what);
  abort();
}

static uint64_t hw_micros(void *ctx) { (void)ctx; return board.t; }
static void hw_read(void *ctx, int32_t *counts)
{
  (void)ctx;
  memcpy(counts, board.counts, sizeof board.counts);
}
static void hw_actuate(void *ctx, float u)
{
  (void)ctx;
  if (!(fabsf(u) <= dev.u_limit) || !(dev.u_limit <= dev.cfg.u_max)) fail("actuator beyond u_limit");
  board.u_last = u;
}
static void hw_write(void *ctx, const uint8_t *bytes, size_t n)
{
  (void)ctx;
  (void)bytes;
  if (n > board.room) fail("serial_write beyond serial_room");
  board.room -= n;
  board.writes++;
  board.bytes_out += n;
}
static size_t hw_room(void *ctx) { (void)ctx; return board.room; }
static int hw_controller(void *ctx, const float *obs, float *action)
{
  (void)ctx;
  for (int i = 0; i < 3; ++i)
    if (!isfinite(obs[i])) fail("non-finite observation");
  *action = board.controller_u;
  return board.controller_fails;
}

static void check(void)
{
  if (dev.mode != MODE_ARMED && board.u_last != 0.0f) fail("actuator not zero outside armed");
  unsigned total = 0;
  for (unsigned k = 0; k < dev.tx_frames_queued; ++k) total += dev.tx_len[k];
  if (dev.tx_bytes > FW_TX_BUF || dev.tx_frames_queued > FW_TX_FRAMES ||
      total != (unsigned)dev.tx_bytes + dev.tx_sent || (dev.tx_frames_queued && dev.tx_sent >= dev.tx_len[0]))
    fail("transmit queue bookkeeping");
}

static void setup(uint8_t variant)
{
  fw_config cfg;
  memset(&cfg, 0, sizeof cfg);
  memset(&board, 0, sizeof board);
  cfg.system = (uint8_t)(variant % 3);
  cfg.n_channels = cfg.system == 0 ? 1 : 2;
  cfg.angle_mask = cfg.system == 1 ? 2 : 3;
  cfg.period_us = variant & 4 ? 1000 : 5000;
  cfg.u_max = 0.15f;
  cfg.counts_per_unit[0] = 2048.0f;
  cfg.counts_per_unit[1] = variant & 8 ? 10000.0f : 4096.0f;
  cfg.vel_cutoff_hz = variant & 16 ? 20.0f : 0.0f;
  cfg.vel_limit[0] = variant & 32 ? 1e5f : 0.0f;
  cfg.pos_limit[1] = variant & 64 ? 5000.0f : 0.0f;
  const fw_hw hw = {0, hw_micros, hw_read, hw_actuate, hw_write, hw_room,
                    variant & 128 ? hw_controller : 0};
  board.t = 1000;
  board.room = 1u << 20;
  fw_init(&dev, &cfg, &hw);
}

static uint32_t take(const uint8_t **p, const uint8_t *end, int nbytes)
{
  uint32_t v = 0;
  for (int i = 0; i < nbytes && *p < end; ++i) v |= (uint32_t)*(*p)++ << (8 * i);
  return v;
}

/* One script; returns 0. The libFuzzer entry point and the random driver. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  static const uint8_t HOST_TYPES[] = {MSG_HELLO, MSG_ARM, MSG_DISARM, MSG_COMMAND,
                                       MSG_HEARTBEAT, MSG_PARAM_GET, MSG_PARAM_SET};
  const uint8_t *p = data, *end = data + size;
  setup((uint8_t)take(&p, end, 1));
  uint32_t host_seq = 0;
  while (p < end) {
    const uint8_t op = (uint8_t)(*p++ % 6);
    if (op == 0) {  /* raw bytes */
      size_t n = take(&p, end, 1) % 64;
      if (n > (size_t)(end - p)) n = (size_t)(end - p);
      fw_receive(&dev, p, n);
      p += n;
    } else if (op == 1) {  /* a valid host frame */
      proto_frame f;
      uint8_t wire[PROTO_MAX_WIRE];
      f.type = HOST_TYPES[take(&p, end, 1) % sizeof HOST_TYPES];
      const uint8_t seq_mode = (uint8_t)take(&p, end, 1);
      f.seq = seq_mode < 200 ? host_seq++ : take(&p, end, 4);  /* mostly in order */
      f.len = (uint8_t)proto_expected_len(f.type, 0, 0);
      for (uint8_t i = 0; i < f.len; ++i) f.payload[i] = (uint8_t)take(&p, end, 1);
      if (f.type == MSG_HELLO && seq_mode & 1) f.payload[0] = PROTO_VERSION;
      if (f.type == MSG_COMMAND && seq_mode & 2) {  /* a plausible command */
        const float u = (float)(int8_t)f.payload[0] * 0.01f;
        memcpy(f.payload, &u, 4);
      }
      const size_t n = proto_encode(&f, wire);
      fw_receive(&dev, wire, n);
      board.frames_in++;
    } else if (op == 2) {  /* a tick */
      board.t += take(&p, end, 2) * 10u;
      const uint8_t c = (uint8_t)take(&p, end, 1);
      board.controller_u = (float)(int8_t)c * 0.01f;
      board.controller_fails = c == 0x7F;
      if (c == 0x80) board.controller_u = NAN;
      fw_tick(&dev, (uint32_t)board.t - (c & 1 ? take(&p, end, 4) : 0));
      board.ticks++;
    } else if (op == 3) {  /* the encoder moves (and wraps) */
      const uint8_t ch = (uint8_t)(take(&p, end, 1) & 1);
      board.counts[ch] = (int32_t)((uint32_t)board.counts[ch] + take(&p, end, 4));
    } else if (op == 4) {  /* the line frees some room */
      board.room = take(&p, end, 1);
    } else {
      fw_transmit(&dev);
    }
    check();
  }
  return 0;
}

#ifndef FUZZ_LIBFUZZER
#include "fuzz_rng.h"

int main(int argc, char **argv)
{
  const size_t want = argc > 1 ? (size_t)strtoull(argv[1], 0, 10) : 1000000u;
  fuzz_rng_seed(argc > 2 ? argv[2] : 0);
  uint8_t script[4096];
  size_t total = 0, scripts = 0;
  uint64_t ticks = 0, frames_in = 0, bytes_out = 0, rx_frames = 0, bad = 0, stale = 0;
  uint64_t dropped = 0, faults = 0, armed_ticks = 0;
  while (total < want) {
    const size_t n = 16 + rnd() % (sizeof script - 16);
    for (size_t i = 0; i < n; ++i) script[i] = (uint8_t)(rnd() >> 8);
    LLVMFuzzerTestOneInput(script, n);
    total += n;
    scripts++;
    ticks += board.ticks;
    frames_in += board.frames_in;
    bytes_out += board.bytes_out;
    rx_frames += dev.rx.frames;
    bad += dev.rx.bad_frames + dev.rx.crc_errors;
    stale += FW_COUNTER(&dev, COUNTER_STALE_COMMANDS);
    dropped += FW_COUNTER(&dev, COUNTER_TX_DROPPED_STATES) + FW_COUNTER(&dev, COUNTER_TX_DROPPED_REPLIES);
    faults += dev.mode == MODE_FAULT;
    armed_ticks += dev.mode == MODE_ARMED;
  }
  printf("bytes=%zu scripts=%zu ticks=%llu frames_in=%llu rx_frames=%llu rx_rejected=%llu "
         "stale_commands=%llu tx_dropped=%llu bytes_out=%llu ended_fault=%llu ended_armed=%llu\n",
         total, scripts, (unsigned long long)ticks, (unsigned long long)frames_in,
         (unsigned long long)rx_frames, (unsigned long long)bad, (unsigned long long)stale,
         (unsigned long long)dropped, (unsigned long long)bytes_out, (unsigned long long)faults,
         (unsigned long long)armed_ticks);
  return 0;
}
#endif
