/*
 * Processor-in-the-loop firmware for the Arm MPS2 AN386 (Cortex-M4F), as
 * QEMU models it (qemu-system-arm -M mps2-an386 -serial pty): the firmware
 * core on the chip, the csrc/ pendulum simulated on the chip in place of the
 * motor and encoder, the protocol on UART0. The host runs
 * `grpo-ctrl run --port /dev/pts/N` against it as against a board.
 *
 * Time is the CMSDK timer 0, a 32-bit down-counter at the 25 MHz system
 * clock, extended to 64 bits in software (QEMU runs it on its virtual clock,
 * which follows the host's clock). Counting SysTick interrupts instead loses
 * time whenever QEMU takes an interrupt more than a period late, as it does
 * on a busy host. SysTick only wakes the loop, every 100 us (a tick starts
 * at most that late). The
 * UART0 receive interrupt moves each byte into a ring at once, and the main
 * loop sleeps (WFI) when idle: QEMU hands the pty's bytes to the one-byte
 * UART one at a time from its I/O thread, which then gets a CPU instead of
 * waiting behind a spinning guest. Like the HIL, the plant is held at its
 * start angle until the host first arms.
 *
 * Build options: PIL_RATE_HZ (control rate; 0 = the preset's), PIL_ANGLE0
 * (start angle, rad from upright), PIL_WATCHDOG_US (default 50 ms rather
 * than two periods: QEMU delivers the pty's bytes to the UART one at a time
 * from its I/O thread, and on a busy host that thread waits for a CPU).
 */
#include <math.h>
#include <string.h>

#include "fw_core.h"
#include "pendsim_one.h"
#include "policy_link.h"  /* BOARD_CONTROLLER: the exported controller, if any */

#ifndef PIL_RATE_HZ
#define PIL_RATE_HZ 0
#endif
#ifndef PIL_ANGLE0
#define PIL_ANGLE0 0.1
#endif
#ifndef PIL_WATCHDOG_US
#define PIL_WATCHDOG_US 50000u
#endif
#define SYSCLK_HZ 25000000u
#define TX_RING 2048u  /* bytes waiting for the UART; a frame that does not fit is dropped */

/* CMSDK APB UART0 */
#define UART0_DATA (*(volatile uint32_t *)0x40004000u)
#define UART0_STATE (*(volatile uint32_t *)0x40004004u)
#define UART0_CTRL (*(volatile uint32_t *)0x40004008u)
#define UART0_INTCLEAR (*(volatile uint32_t *)0x4000400Cu)
#define UART0_BAUDDIV (*(volatile uint32_t *)0x40004010u)
#define UART_TX_FULL 1u
#define UART_RX_FULL 2u
/* CMSDK APB timer 0 */
#define TIMER0_CTRL (*(volatile uint32_t *)0x40000000u)
#define TIMER0_VALUE (*(volatile uint32_t *)0x40000004u)
#define TIMER0_RELOAD (*(volatile uint32_t *)0x40000008u)
/* SysTick, the interrupt controls */
#define SYST_CSR (*(volatile uint32_t *)0xE000E010u)
#define SYST_RVR (*(volatile uint32_t *)0xE000E014u)
#define SYST_CVR (*(volatile uint32_t *)0xE000E018u)
#define NVIC_ISER0 (*(volatile uint32_t *)0xE000E100u)
#define RX_RING 256u

static fw_device dev;
static ps_model model;
static ps_one plant; /* the pendulum on the bench */
static double counts_per_rad;
static float u;
static int armed_once;
static uint8_t tx[TX_RING];
static uint32_t tx_head, tx_len, tx_dropped;
static volatile uint8_t rx[RX_RING];
static volatile uint32_t rx_in, rx_out, rx_overflows;  /* written by the ISR / by main */
static uint64_t clock_ticks;
static uint32_t clock_last;

void systick_handler(void) {}  /* a wake-up only */

void uart0_rx_handler(void)
{
  UART0_INTCLEAR = UART_RX_FULL;
  while (UART0_STATE & UART_RX_FULL) {
    const uint8_t byte = (uint8_t)UART0_DATA;
    if (rx_in - rx_out < RX_RING) rx[rx_in++ % RX_RING] = byte;
    else rx_overflows++;
  }
}

/* Called far more often than the counter wraps (every 172 s); main loop only. */
static uint64_t hw_micros(void *ctx)
{
  (void)ctx;
  const uint32_t now = TIMER0_VALUE;
  clock_ticks += clock_last - now;  /* counting down, modulo 2^32 */
  clock_last = now;
  return clock_ticks / (SYSCLK_HZ / 1000000u);
}

static void hw_read_sensors(void *ctx, int32_t *counts)
{
  (void)ctx;
  counts[0] = (int32_t)lround(plant.x[0] * counts_per_rad);
}

static void hw_write_actuator(void *ctx, float value)
{
  (void)ctx;
  u = value;
}

static size_t hw_serial_room(void *ctx)
{
  (void)ctx;
  return TX_RING - tx_len;
}

static void hw_serial_write(void *ctx, const uint8_t *bytes, size_t n)
{
  (void)ctx;
  if (tx_len + n > TX_RING) {  /* not with serial_room honoured */
    tx_dropped++;
    return;
  }
  for (size_t i = 0; i < n; ++i) tx[(tx_head + tx_len + i) % TX_RING] = bytes[i];
  tx_len += (uint32_t)n;
}

static void serve_uart(void)
{
  while (tx_len && !(UART0_STATE & UART_TX_FULL)) {
    UART0_DATA = tx[tx_head];
    tx_head = (tx_head + 1) % TX_RING;
    tx_len--;
  }
  while (rx_out != rx_in) {
    const uint8_t byte = rx[rx_out % RX_RING];
    rx_out++;
    fw_receive(&dev, &byte, 1);
    armed_once |= dev.mode == MODE_ARMED;
  }
}

static void plant_init(void)
{
  ps_model_init(&model, PS_PENDULUM, "rig");
  const double h = model.dt / model.substeps;
  const double rate_hz = PIL_RATE_HZ;
  if (rate_hz > 0) {
    model.dt = 1.0 / rate_hz;
    model.substeps = (int)ceil(model.dt / h - 1e-9);
    if (model.substeps < 1) model.substeps = 1;
  }
  model.max_steps = 0;
  ps_one_reset(&model, &plant, 0);
  plant.x[0] = PIL_ANGLE0;
  plant.x[1] = 0.0;
}

int main(void)
{
  UART0_BAUDDIV = 16;  /* the minimum; QEMU does not pace the line by it */
  UART0_CTRL = 0xBu;   /* TX and RX enabled, RX interrupt */
  NVIC_ISER0 = 1u;     /* IRQ 0: UART0 RX */
  TIMER0_RELOAD = 0xFFFFFFFFu;
  TIMER0_VALUE = 0xFFFFFFFFu;
  TIMER0_CTRL = 1u;    /* enabled, no interrupt */
  clock_last = TIMER0_VALUE;
  SYST_RVR = SYSCLK_HZ / 10000u - 1u;
  SYST_CVR = 0;
  SYST_CSR = 7;        /* processor clock, interrupt every 100 us, enabled */
  plant_init();

  fw_config cfg;
  memset(&cfg, 0, sizeof cfg);
  const double per_rev = model.enc_counts[0] > 0 ? model.enc_counts[0] : 4096.0;
  counts_per_rad = per_rev / (2 * 3.14159265358979323846);
  cfg.system = PS_PENDULUM;
  cfg.n_channels = 1;
  cfg.angle_mask = 1;
  cfg.device_id = 0x4D505332u;  /* "MPS2" */
  cfg.period_us = (uint32_t)lround(model.dt * 1e6);
  cfg.u_max = (float)model.u_max;
  cfg.counts_per_unit[0] = (float)per_rev;
  cfg.watchdog_us = PIL_WATCHDOG_US;
  memcpy(cfg.preset, "rig", 4);
  const fw_hw hw = {0, hw_micros, hw_read_sensors, hw_write_actuator, hw_serial_write,
                    hw_serial_room, BOARD_CONTROLLER};
  fw_init(&dev, &cfg, &hw);

  const uint64_t period = cfg.period_us;
  uint64_t next = hw_micros(0) + period;
  for (;;) {
    fw_transmit(&dev);
    serve_uart();
    const uint64_t now = hw_micros(0);
    if (now < next) {
      /* sleep until the next interrupt (a byte or SysTick), unless
       * one came in since serve_uart looked */
      __asm__ __volatile__("cpsid i" ::: "memory");
      if (rx_out == rx_in && !tx_len) __asm__ __volatile__("wfi");
      __asm__ __volatile__("cpsie i" ::: "memory");
      continue;
    }
    if (armed_once) {
      uint8_t terminated, truncated;
      ps_step(&model, &plant.data, &u, 0, 0, &terminated, &truncated, 0, 0);
    }
    dev.extra_flags = armed_once ? 0 : FLAG_HELD;
    fw_tick(&dev, (uint32_t)next);
    next += period;
    if (now >= next + 10 * period) next = now + period;  /* stalled (QEMU descheduled): afresh */
  }
}
