/*
 * On-target check of the firmware core and the generated controller, for an
 * emulated MCU (simavr for the ATmega328P, qemu-system-arm -M mps2-an386
 * -icount shift=0 for the Cortex-M4F). Prints on UART0, one item a line:
 *
 *   out <hex>         policy_step on each observation of check_data.h, as
 *                     the float's bit pattern (compared with onnxruntime)
 *   tick <count>      fw_tick, armed, with a fresh command each period
 *   receive <count>   fw_receive of one COMMAND frame
 *   policy <count>    one policy_step
 *   ondevice <count>  fw_tick in on-device control (the policy called by the core)
 *   reps <n>          how many of each the counts above add up
 *   stack <bytes>     (AVR) the deepest the stack went
 *
 * Counts: CPU cycles on AVR (Timer1 at the CPU clock, extended by its
 * overflow interrupt); on the Cortex-M4F, SysTick periods at 25 MHz, which
 * under QEMU's -icount shift=0 (1 ns per instruction) are 40 instructions
 * each. Then it stops the emulator (AVR: sleep with interrupts off;
 * Arm: the semihosting exit).
 */
#include <string.h>

#include "check_data.h" /* CHECK_N, CHECK_OBS(i) (CHECK_N x POLICY_NOBS floats) */
#include "fw_core.h"
#include "policy.h"

#define REPS 8u

#if defined(__AVR__)
#include <avr/interrupt.h>
#include <avr/io.h>
#include <avr/sleep.h>

static volatile uint16_t timer_overflows;
ISR(TIMER1_OVF_vect) { timer_overflows++; }

static void clock_start(void)
{
  TCCR1A = 0;
  TCCR1B = 1 << CS10;  /* the CPU clock, no prescaler */
  TIMSK1 = 1 << TOIE1;
  sei();
}

static uint32_t clock_now(void)
{
  const uint8_t sreg = SREG;
  cli();
  uint16_t high = timer_overflows;
  const uint16_t low = TCNT1;
  if ((TIFR1 & (1 << TOV1)) && low < 0x8000u) high++;  /* wrapped, not yet counted */
  SREG = sreg;
  return (uint32_t)high << 16 | low;
}

static void put_char(char c)
{
  while (!(UCSR0A & (1 << UDRE0))) {
  }
  UDR0 = (uint8_t)c;
}

static void uart_start(void) { UCSR0B = 1 << TXEN0; }

static void stop(void)
{
  cli();
  sleep_cpu();  /* simavr ends the run here */
}

/* how deep the stack went: painted before the run, read after */
extern uint8_t __heap_start;
static void paint_stack(void)
{
  uint8_t *p = &__heap_start;
  while (p < (uint8_t *)SP - 16) *p++ = 0xC5;
}
static uint16_t stack_used(void)
{
  const uint8_t *p = &__heap_start;
  while (*p == 0xC5) p++;
  return (uint16_t)(RAMEND + 1 - (uint16_t)(uintptr_t)p);
}
#elif defined(__arm__)
#define UART0_DATA (*(volatile uint32_t *)0x40004000u)
#define UART0_STATE (*(volatile uint32_t *)0x40004004u)
#define UART0_CTRL (*(volatile uint32_t *)0x40004008u)
#define UART0_BAUDDIV (*(volatile uint32_t *)0x40004010u)
#define SYST_CSR (*(volatile uint32_t *)0xE000E010u)
#define SYST_RVR (*(volatile uint32_t *)0xE000E014u)
#define SYST_CVR (*(volatile uint32_t *)0xE000E018u)

static uint32_t clock_ticks, clock_last;

static void clock_start(void)
{
  SYST_RVR = 0xFFFFFFu;
  SYST_CVR = 0;
  SYST_CSR = 5;  /* processor clock, no interrupt */
  clock_last = SYST_CVR;
}

/* the 24-bit down-counter, extended; read far more often than it wraps */
static uint32_t clock_now(void)
{
  const uint32_t now = SYST_CVR;
  clock_ticks += (clock_last - now) & 0xFFFFFFu;
  clock_last = now;
  return clock_ticks;
}

static void put_char(char c)
{
  while (UART0_STATE & 1u) {
  }
  UART0_DATA = (uint32_t)(uint8_t)c;
}

static void uart_start(void)
{
  UART0_BAUDDIV = 16;
  UART0_CTRL = 1;
}

static void stop(void)
{
  /* semihosting SYS_EXIT with ADP_Stopped_ApplicationExit */
  register uint32_t op __asm__("r0") = 0x18;
  register uint32_t arg __asm__("r1") = 0x20026;
  __asm__ __volatile__("bkpt 0xab" ::"r"(op), "r"(arg) : "memory");
  for (;;) {
  }
}
#endif

static void put_text(const char *s)
{
  while (*s) put_char(*s++);
}

static void put_hex(uint32_t v)
{
  for (int shift = 28; shift >= 0; shift -= 4) put_char("0123456789abcdef"[(v >> shift) & 0xFu]);
}

static void put_line(const char *label, uint32_t value)
{
  put_text(label);
  put_char(' ');
  char digits[10];
  int n = 0;
  do {
    digits[n++] = (char)('0' + value % 10u);
    value /= 10u;
  } while (value);
  while (n) put_char(digits[--n]);
  put_char('\n');
}

/* ---------------------------------------------------------------- a bare fw_hw */
static uint64_t fake_now;
static uint64_t hw_micros(void *ctx)
{
  (void)ctx;
  return fake_now;
}
static void hw_read_sensors(void *ctx, int32_t *counts)
{
  (void)ctx;
  /* a little motion (in 32 bits: a board reads a counter, it does not divide 64-bit times) */
  counts[0] = (int32_t)((uint32_t)fake_now / 5000u % 7u);
}
static void hw_write_actuator(void *ctx, float u)
{
  (void)ctx;
  (void)u;
}
static void hw_serial_write(void *ctx, const uint8_t *bytes, size_t n)
{
  (void)ctx;
  (void)bytes;
  (void)n;
}

static int run_policy(void *ctx, const float *obs, float *action)
{
  (void)ctx;
  return policy_step(obs, action);
}

/* Each measured call in a function of its own, not inlined or cloned (and, compiled
 * with -fno-ipa-icf, not merged with its twin), so that an instruction trace
 * finds it by name: boards.target_check's cycle estimate on QEMU. */
static __attribute__((noinline, noclone)) void measured_receive(fw_device *d, const uint8_t *w,
                                                                size_t n)
{
  fw_receive(d, w, n);
}
static __attribute__((noinline, noclone)) void measured_tick(fw_device *d, uint32_t due)
{
  fw_tick(d, due);
}
static __attribute__((noinline, noclone)) void measured_ondevice(fw_device *d, uint32_t due)
{
  fw_tick(d, due);
}
static __attribute__((noinline, noclone)) void measured_policy(const float *obs, float *u)
{
  policy_step(obs, u);
}

static size_t frame(uint8_t type, uint32_t seq, const uint8_t *payload, uint8_t len, uint8_t *wire)
{
  proto_frame f;
  f.type = type;
  f.seq = seq;
  f.len = len;
  if (len) memcpy(f.payload, payload, len);
  return proto_encode(&f, wire);
}

int main(void)
{
  uart_start();
#if defined(__AVR__)
  paint_stack();
#endif
  clock_start();

  for (unsigned i = 0; i < CHECK_N; ++i) {
    float obs[POLICY_NOBS], u;
    for (unsigned k = 0; k < POLICY_NOBS; ++k) obs[k] = CHECK_OBS(i * POLICY_NOBS + k);
    policy_step(obs, &u);
    uint32_t bits;
    memcpy(&bits, &u, sizeof bits);
    put_text("out ");
    put_hex(bits);
    put_char('\n');
  }

  static fw_device dev;
  fw_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.n_channels = 1;
  cfg.angle_mask = 1;
  cfg.period_us = 5000;
  cfg.u_max = 0.15f;
  cfg.counts_per_unit[0] = 2048.0f;
  cfg.vel_cutoff_hz = 20.0f;
  const fw_hw hw = {0, hw_micros, hw_read_sensors, hw_write_actuator, hw_serial_write, 0,
                    run_policy};
  fw_init(&dev, &cfg, &hw);
  uint8_t wire[PROTO_MAX_WIRE];
  fw_receive(&dev, wire, frame(MSG_ARM, 0, 0, 0, wire));

  uint32_t tick = 0, receive = 0, policy = 0, ondevice = 0;
  for (uint32_t r = 0; r < REPS; ++r) {
    uint8_t p[PROTO_COMMAND_LEN];
    const proto_command c = {0.01f, dev.last_state_seq, (uint32_t)fake_now};
    const size_t n = frame(MSG_COMMAND, r + 1, p, proto_pack_command(&c, p), wire);
    fake_now += 4000;
    uint32_t t0 = clock_now();
    measured_receive(&dev, wire, n);
    receive += clock_now() - t0;
    fake_now += 1000;
    t0 = clock_now();
    measured_tick(&dev, (uint32_t)fake_now);
    tick += clock_now() - t0;
    float obs[POLICY_NOBS], u;
    for (unsigned k = 0; k < POLICY_NOBS; ++k) obs[k] = CHECK_OBS(k);
    t0 = clock_now();
    measured_policy(obs, &u);
    policy += clock_now() - t0;
  }
  /* on-device control: the core runs the policy in its tick */
  uint8_t p[PROTO_PARAM_LEN];
  const proto_param select = {PARAM_CONTROL_SOURCE, 0, (float)CONTROL_ON_DEVICE};
  fw_receive(&dev, wire, frame(MSG_DISARM, 100, 0, 0, wire));
  fw_receive(&dev, wire, frame(MSG_PARAM_SET, 101, p,
                               proto_pack_param_request(MSG_PARAM_SET, &select, p), wire));
  fw_receive(&dev, wire, frame(MSG_ARM, 102, 0, 0, wire));
  for (uint32_t r = 0; r < REPS; ++r) {
    uint8_t keep_alive[PROTO_COMMAND_LEN];  /* the host's, which feeds the watchdog */
    const proto_command c = {0.0f, dev.last_state_seq, (uint32_t)fake_now};
    fw_receive(&dev, wire, frame(MSG_COMMAND, 103 + r, keep_alive,
                                 proto_pack_command(&c, keep_alive), wire));
    fake_now += 5000;
    const uint32_t t0 = clock_now();
    measured_ondevice(&dev, (uint32_t)fake_now);
    ondevice += clock_now() - t0;
  }
  put_line("tick", tick);
  put_line("ondevice", dev.control_source == CONTROL_ON_DEVICE ? ondevice : 0);
  put_line("receive", receive);
  put_line("policy", policy);
  put_line("reps", REPS);
  put_line("mode", dev.mode);
#if defined(__AVR__)
  put_line("stack", stack_used());
#endif
  put_text("done\n");
  stop();
  return 0;
}
