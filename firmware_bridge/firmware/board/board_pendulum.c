/*
 * Reference board back-end: a pendulum on a DC motor, for an Arduino-class
 * board: an Uno (AVR, 16 MHz, the Debian arduino-core-avr tested by
 * tests/test_boards.py) or a 32-bit one (Teensy, Due) with native USB serial.
 *
 * Hardware (change the pins and constants below to match yours):
 *   - a quadrature encoder on the pendulum shaft (512 lines: 2048 counts per
 *     revolution in x4 decoding), channels A and B on interrupt pins of one
 *     port (the ISR samples both in one read of the port's input register;
 *     on an Uno pins 2 and 3 are PD2 and PD3);
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
#include "policy_link.h"  /* BOARD_CONTROLLER: the exported controller, if any */

#define PIN_ENC_A 2
#define PIN_ENC_B 3
#define PIN_PWM 5
#define PIN_DIR 6
#define PWM_MAX 255
#define COUNTS_PER_REV 2048
#define PERIOD_US 5000u    /* 200 Hz, the rig preset's rate */
#define U_MAX 0.15f        /* N m at full duty (the rig preset's limit) */
#define VEL_LIMIT_RAD_S 30.0f
#ifndef BOARD_WATCHDOG_US
#define BOARD_WATCHDOG_US 0u  /* 0: the core's two periods; the simavr PIL builds with more */
#endif

static fw_device dev;
static volatile int32_t encoder_count = COUNTS_PER_REV / 2;
static volatile uint8_t encoder_state;
static volatile board_port_bits *encoder_port;
static board_port_bits mask_a, mask_b;
static uint32_t clock_high;     /* micros() wraps every 71 minutes: extend it */
static uint32_t clock_last;
static uint32_t next_tick;      /* micros() of the next tick; compared by differences, which
                                   wrap safely (and cost far less than 64-bit sums on AVR) */

/* x4 quadrature decoding: index by (previous AB << 2) | new AB. In flash on
 * AVR, where a plain const table would be copied into SRAM. */
#if defined(__AVR__)
#define QUADRATURE_AT(i) ((int8_t)pgm_read_byte(&QUADRATURE[i]))
static const int8_t QUADRATURE[16] PROGMEM =
#else
#define QUADRATURE_AT(i) (QUADRATURE[i])
static const int8_t QUADRATURE[16] =
#endif
    {0, -1, 1, 0, 1, 0, 0, -1, -1, 0, 0, 1, 0, 1, -1, 0};

/* A and B from one load of the port: two digitalRead calls would sample the
 * channels at different instants, and an edge between them is a lost count. */
static uint8_t read_ab(void)
{
  const board_port_bits port = *encoder_port;
  return (uint8_t)(((port & mask_a) ? 2u : 0u) | ((port & mask_b) ? 1u : 0u));
}

void board_encoder_isr(void)
{
  const uint8_t ab = read_ab();
  encoder_count += QUADRATURE_AT((unsigned)(encoder_state << 2) | ab);
  encoder_state = ab;
}

static uint64_t board_micros(void *ctx)
{
  (void)ctx;
  const uint32_t now = (uint32_t)micros();
  if (now < clock_last) clock_high++;
  clock_last = now;
  return (uint64_t)clock_high << 32 | now;
}

static void read_sensors(void *ctx, int32_t *counts)
{
  (void)ctx;
  const board_irq_state irq = board_irq_save();  /* 32 bits: several loads on AVR */
  counts[0] = encoder_count;
  board_irq_restore(irq);
}

static void write_actuator(void *ctx, float u)
{
  (void)ctx;
  const float duty = (u < 0 ? -u : u) * (1.0f / U_MAX);
  digitalWrite(PIN_DIR, u >= 0 ? HIGH : LOW);
  analogWrite(PIN_PWM, (int)(duty * PWM_MAX + 0.5f));
}

static void serial_write(void *ctx, const uint8_t *bytes, size_t n)
{
  (void)ctx;
  board_serial_write(bytes, n);
}

static size_t serial_room(void *ctx)
{
  (void)ctx;
  return board_serial_room();
}

void board_setup(void)
{
  pinMode(PIN_ENC_A, INPUT_PULLUP);
  pinMode(PIN_ENC_B, INPUT_PULLUP);
  pinMode(PIN_PWM, OUTPUT);
  pinMode(PIN_DIR, OUTPUT);
  encoder_port = portInputRegister(digitalPinToPort(PIN_ENC_A));
  mask_a = digitalPinToBitMask(PIN_ENC_A);
  mask_b = digitalPinToBitMask(PIN_ENC_B);
  encoder_state = read_ab();
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
  cfg.watchdog_us = BOARD_WATCHDOG_US;
  for (unsigned i = 0; i < sizeof preset; ++i) cfg.preset[i] = preset[i];
  const fw_hw hw = {0, board_micros, read_sensors, write_actuator, serial_write, serial_room,
                    BOARD_CONTROLLER};
  fw_init(&dev, &cfg, &hw);
  next_tick = (uint32_t)micros() + PERIOD_US;
}

void board_loop(void)
{
  while (board_serial_available() > 0) {
    const uint8_t byte = (uint8_t)board_serial_read();
    fw_receive(&dev, &byte, 1);
  }
  const uint32_t now = (uint32_t)micros();
  const int32_t overdue = (int32_t)(now - next_tick);
  if (overdue >= 0) {
    fw_tick(&dev, next_tick);
    next_tick += PERIOD_US;
    if (overdue >= (int32_t)PERIOD_US) next_tick = now + PERIOD_US;  /* never burst to catch up */
  }
  fw_transmit(&dev);  /* as much as the serial buffer has room for */
}
