/*
 * Host test of the reference board back-end against mock_arduino.c: the
 * quadrature decoder (from the port register), the interrupt state around
 * the count's read, the handshake, arming, the PWM and direction pins,
 * clamping and the watchdog. tests/test_hil.py builds and runs it.
 * Exit status 0 when every check passes; each failure is printed.
 */
#include <stdio.h>
#include <string.h>

#include "board_pendulum.h"
#include "mock_arduino.h"
#include "proto.h"

#define PIN_A 2
#define PIN_B 3
#define PIN_PWM 5
#define PIN_DIR 6

static int failures;
#define CHECK(cond)                                                   \
  do {                                                                \
    if (!(cond)) {                                                    \
      printf("FAIL line %d: %s\n", __LINE__, #cond);                  \
      failures++;                                                     \
    }                                                                 \
  } while (0)

static proto_decoder dec;
static size_t tx_seen;
static uint32_t host_seq;
static proto_state last_state;
static uint32_t last_state_seq;

/* Decode what the board sent since last time; returns the last frame of
 * `type` in *out (1) or 0 if none. Keeps the newest STATE. */
static int received(uint8_t type, proto_frame *out)
{
  int found = 0;
  proto_frame f;
  for (; tx_seen < mock.tx_len; ++tx_seen) {
    if (!proto_decoder_push(&dec, mock.tx[tx_seen], &f)) continue;
    if (f.type == MSG_STATE) {
      proto_unpack_state(f.payload, f.len, &last_state);
      last_state_seq = f.seq;
    }
    if (f.type == type) {
      *out = f;
      found = 1;
    }
  }
  return found;
}

static void send(uint8_t type, const uint8_t *payload, uint8_t len)
{
  proto_frame f;
  uint8_t wire[PROTO_MAX_WIRE];
  f.type = type;
  f.seq = host_seq++;
  f.len = len;
  if (len) memcpy(f.payload, payload, len);
  mock_send(wire, proto_encode(&f, wire));
}

static void command(float u)
{
  proto_command c = {u, last_state_seq, (uint32_t)last_state.t_us};
  uint8_t p[PROTO_COMMAND_LEN];
  send(MSG_COMMAND, p, proto_pack_command(&c, p));
}

static void run_for(uint64_t us)
{
  for (uint64_t end = mock.now_us + us; mock.now_us < end; mock.now_us += 50) board_loop();
}

/* Turn the encoder by `steps` counts (x4 quadrature, A leads when positive). */
static void turn(int steps)
{
  static const uint8_t SEQUENCE[4] = {0, 2, 3, 1};  /* AB: 00 10 11 01 */
  static int phase;
  for (int i = 0; i < (steps < 0 ? -steps : steps); ++i) {
    phase = (phase + (steps > 0 ? 1 : 3)) % 4;
    const uint8_t ab = SEQUENCE[phase];
    mock_set_pin(PIN_A, ab >> 1);
    mock_set_pin(PIN_B, ab & 1);
  }
}

int main(void)
{
  proto_frame f;
  proto_decoder_init(&dec, PROTO_FROM_DEVICE);
  mock.now_us = 1000;
  mock.irq_enabled = 1;
  mock.tx_room = 63;  /* the Uno core's transmit buffer, less one */
  board_setup();
  CHECK(mock.mode[PIN_PWM] == OUTPUT && mock.isr[PIN_A] && mock.isr[PIN_B]);

  /* the encoder: hanging at power-on is half a turn from upright */
  run_for(6000);
  CHECK(received(MSG_STATE, &f) && last_state.n == 1 && last_state.pos[0] == 1024);
  turn(100);
  run_for(5000);
  received(MSG_STATE, &f);
  CHECK(last_state.pos[0] == 1124);
  turn(-40);
  run_for(5000);
  received(MSG_STATE, &f);
  CHECK(last_state.pos[0] == 1084);

  /* the count is read with interrupts off, and the previous state restored:
   * enabled stays enabled, disabled (a caller in a critical section) stays
   * disabled */
  const unsigned disables = mock.irq_disables;
  run_for(5000);
  CHECK(mock.irq_disables > disables && mock.irq_enabled == 1);
  mock.irq_enabled = 0;
  run_for(5000);
  CHECK(mock.irq_enabled == 0);
  mock.irq_enabled = 1;

  /* the handshake */
  const uint8_t version = PROTO_VERSION;
  send(MSG_HELLO, &version, 1);
  run_for(100);
  proto_info info;
  CHECK(received(MSG_INFO, &f) && proto_unpack_info(f.payload, f.len, &info) == 0);
  CHECK(info.period_us == 5000 && info.counts_per_unit[0] == 2048.0f &&
        strcmp(info.preset, "rig") == 0 && info.u_max == 0.15f);

  /* armed: the command sets PWM duty and direction at the next tick */
  proto_ack ack;
  send(MSG_ARM, 0, 0);
  run_for(100);
  CHECK(received(MSG_ACK, &f) && proto_unpack_ack(f.payload, f.len, &ack) == 0 &&
        ack.result == RESULT_OK && ack.mode == MODE_ARMED);
  run_for(5000);
  received(MSG_STATE, &f);
  command(0.075f);
  run_for(5000);
  CHECK(mock.pwm[PIN_PWM] == 128 && mock.level[PIN_DIR] == HIGH);
  received(MSG_STATE, &f);
  CHECK(last_state.actuator == 0.075f && (last_state.flags & FLAG_FRESH));
  command(-0.15f);
  run_for(5000);
  CHECK(mock.pwm[PIN_PWM] == 255 && mock.level[PIN_DIR] == LOW);
  received(MSG_STATE, &f);
  command(3.0f);  /* beyond the limit: clamped */
  run_for(5000);
  received(MSG_STATE, &f);
  CHECK(mock.pwm[PIN_PWM] == 255 && mock.level[PIN_DIR] == HIGH);
  CHECK(last_state.actuator == 0.15f && (last_state.flags & FLAG_CLAMPED));

  /* the host goes silent: the watchdog stops the motor within two periods */
  run_for(15000);
  proto_status st;
  CHECK(received(MSG_FAULT, &f) && proto_unpack_status(f.payload, f.len, &st) == 0 &&
        st.fault == FAULT_WATCHDOG && st.t_us - st.info_t_us < 3 * 5000 + 100);
  CHECK(mock.pwm[PIN_PWM] == 0 && last_state.mode == MODE_FAULT);

  send(MSG_DISARM, 0, 0);
  run_for(100);
  CHECK(received(MSG_ACK, &f) && proto_unpack_ack(f.payload, f.len, &ack) == 0 &&
        ack.result == RESULT_OK && ack.mode == MODE_DISARMED);
  /* output went out in pieces the serial buffer had room for: never a blocking write */
  CHECK(mock.tx_max_write > 0 && mock.tx_max_write <= 63);
  printf("board checks done: %d failures, %zu bytes sent\n", failures, mock.tx_len);
  return failures ? 1 : 0;
}
