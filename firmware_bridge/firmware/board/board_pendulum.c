/*
 * Reference board back-end: a pendulum on a DC motor, for an Arduino-class
 * board (e.g. a Teensy 4 or an Arduino Due: 32-bit, native USB serial).
 *
 * Hardware (change the pins and constants below to match yours):
 *   - a quadrature encoder on the pendulum shaft (512 lines: 2048 counts per
 *     revolution in x4 decoding), channels A and B on interrupt pins;
 *   - an H-bridge with a PWM input and a direction input (Pololu or
 *     Cytron style; for a two-PWM bridge change write_actuator);
 *   - USB serial to the host running `grpo-ctrl run --port /dev/ttyACM0`.
 * The pendulum must hang at rest at power-on: that position is pi from
 * upright, so the count starts at COUNTS_PER_REV / 2.
 *
 * The actuator value is a torque in N m; full PWM duty stands for U_MAX.
 * That is an open-loop calibration (torque ~ current ~ duty at low speed):
 * measure your motor's stall torque at full duty and set U_MAX to match
 * the preset your controller was trained for (the host refuses a policy
 * whose u_max differs from the device's).
 */
#include "arduino_api.h"
#include "board_pendulum.h"
#include "fw_core.h"

#define PIN_ENC_A 2
#define PIN_ENC_B 3
#define PIN_PWM 5
#define PIN_DIR 6
#define PWM_MAX 255
#define COUNTS_PER_REV 2048
#define PERIOD_US 5000u    /* 200 Hz, the rig preset's rate */
#define U_MAX 0.15f        /* N m at full duty (the rig preset's limit) */
#define VEL_LIMIT_RAD_S 30.0f

static fw_device dev;
static volatile int32_t encoder_count = COUNTS_PER_REV / 2;
static volatile uint8_t encoder_state;
static uint64_t clock_high;     /* micros() wraps every 71 minutes: extend it */
static uint32_t clock_last;
static uint64_t next_tick;

/* x4 quadrature decoding: index by (previous AB << 2) | new AB */
static const int8_t QUADRATURE[16] = {0, -1, 1, 0, 1, 0, 0, -1, -1, 0, 0, 1, 0, 1, -1, 0};

void board_encoder_isr(void)
{
  const uint8_t ab = (uint8_t)((digitalRead(PIN_ENC_A) << 1) | digitalRead(PIN_ENC_B));
  encoder_count += QUADRATURE[(encoder_state << 2) | ab];
  encoder_state = ab;
}

static uint64_t board_micros(void *ctx)
{
  (void)ctx;
  const uint32_t now = (uint32_t)micros();
  if (now < clock_last) clock_high += (uint64_t)1 << 32;
  clock_last = now;
  return clock_high | now;
}

static void read_sensors(void *ctx, int32_t *counts)
{
  (void)ctx;
  noInterrupts();
  counts[0] = encoder_count;
  interrupts();
}

static void write_actuator(void *ctx, float u)
{
  (void)ctx;
  const float duty = (u < 0 ? -u : u) / U_MAX;
  digitalWrite(PIN_DIR, u >= 0 ? HIGH : LOW);
  analogWrite(PIN_PWM, (int)(duty * PWM_MAX + 0.5f));
}

static void serial_write(void *ctx, const uint8_t *bytes, size_t n)
{
  (void)ctx;
  board_serial_write(bytes, n);
}

void board_setup(void)
{
  pinMode(PIN_ENC_A, INPUT_PULLUP);
  pinMode(PIN_ENC_B, INPUT_PULLUP);
  pinMode(PIN_PWM, OUTPUT);
  pinMode(PIN_DIR, OUTPUT);
  encoder_state = (uint8_t)((digitalRead(PIN_ENC_A) << 1) | digitalRead(PIN_ENC_B));
  attachInterrupt((uint8_t)digitalPinToInterrupt(PIN_ENC_A), board_encoder_isr, CHANGE);
  attachInterrupt((uint8_t)digitalPinToInterrupt(PIN_ENC_B), board_encoder_isr, CHANGE);
  fw_config cfg = {0};
  const char preset[] = "rig";
  cfg.system = 0; /* pendulum */
  cfg.n_channels = 1;
  cfg.angle_mask = 1;
  cfg.device_id = 0x0B0A4D01u;
  cfg.period_us = PERIOD_US;
  cfg.u_max = U_MAX;
  cfg.counts_per_unit[0] = COUNTS_PER_REV;
  cfg.vel_limit[0] = VEL_LIMIT_RAD_S * COUNTS_PER_REV / 6.2831853f;
  cfg.vel_cutoff_hz = 20.0f;
  for (unsigned i = 0; i < sizeof preset; ++i) cfg.preset[i] = preset[i];
  const fw_hw hw = {0, board_micros, read_sensors, write_actuator, serial_write, 0, 0};
  fw_init(&dev, &cfg, &hw);
  next_tick = board_micros(0) + PERIOD_US;
}

void board_loop(void)
{
  while (board_serial_available() > 0) {
    const uint8_t byte = (uint8_t)board_serial_read();
    fw_receive(&dev, &byte, 1);
  }
  const uint64_t now = board_micros(0);
  if (now >= next_tick) {
    dev.tick_late = now >= next_tick + PERIOD_US;
    fw_tick(&dev);
    next_tick += PERIOD_US;
    if (dev.tick_late) next_tick = now + PERIOD_US;  /* never burst to catch up */
  }
}
