/*
 * Processor-in-the-loop for the Arduino Uno on simavr: the Uno sketch of
 * `grpo-ctrl firmware --board uno` (the Arduino core, the firmware core and,
 * with --policy, the on-device controller), unchanged, on simavr's
 * cycle-accurate ATmega328P at 16 MHz, its UART0 on a pseudo-terminal for
 * `grpo-ctrl run --port /dev/pts/N`. This host program is the rest of the
 * bench: the csrc/ pendulum (the C simulator's plant, in double), the
 * quadrature encoder the sketch decodes on pins 2 and 3 (INT0/INT1), and
 * the H-bridge it drives (PWM duty on pin 5, OC0B; direction on pin 6).
 *
 * Time: the plant steps every control period of the chip's own cycles (a
 * simavr cycle timer), with the command the pins show at that instant, and
 * the encoder's edges follow the plant's angle one edge every EDGE_CYCLES;
 * so the loop the chip closes is timed by the chip alone, whatever the host
 * does. The host only talks to it: simavr is held to the wall clock (it
 * sleeps when ahead) so that the host's keep-alives, sent by the wall
 * clock, meet the firmware's watchdog, counted in the chip's time. Where
 * simavr cannot keep up with real time, the chip's time runs slow and the
 * host sees fewer STATEs a wall-clock second; on exit (SIGTERM) the
 * program prints the ratio of chip time to wall time, and that ratio over
 * the time it was not held back (how fast this host runs the chip).
 *
 *   simavr_pil FIRMWARE.elf ANGLE0
 *
 * ANGLE0: the plant's start angle (rad from upright; pi hanging, where the
 * sketch's count starts). A start off the hanging rest is held there (by
 * hand, as on a bench) until the chip first drives the motor.
 * Prints "pty /dev/pts/N" on stdout after 0.5 s of chip time, the sketch set
 * up and the encoder at the start angle.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <simavr/avr_ioport.h>
#include <simavr/avr_uart.h>
#include <simavr/parts/uart_pty.h>
#include <simavr/sim_avr.h>
#include <simavr/sim_elf.h>
#include <simavr/sim_time.h>

#include "pendsim_one.h"

#define FREQ 16000000u
#define PI 3.14159265358979323846
#define COUNTS_PER_REV 2048.0      /* the sketch's encoder (board_pendulum.c) */
#define U_MAX 0.15                 /* the sketch's full-duty torque */
#define EDGE_CYCLES 400u           /* an encoder edge at most every 25 us: 40,000 edges/s */
#define BOOT_CYCLES (FREQ / 5u)    /* edges from 0.2 s on: the sketch's setup() has attached
                                      the encoder's interrupts (edges before are lost) */
#define READY_CYCLES (FREQ / 2u)   /* the pty named at 0.5 s: the encoder at the start angle
                                      and the sketch's velocity filter settled after the
                                      edges that brought it there */
/* ATmega328P data-space addresses (datasheet, register summary) */
#define REG_PORTD 0x2B
#define REG_TCCR0A 0x44
#define REG_OCR0B 0x48
#define COM0B1 5
#define PIN_PWM 5
#define PIN_DIR 6

static avr_t *avr;
static uart_pty_t pty;
static avr_irq_t *pin_a, *pin_b;
static ps_model model;
static ps_one plant; /* the pendulum on the bench */
static double counts_per_rad;
static int32_t count;      /* the edges sent: the sketch's count if it decoded them all */
static uint8_t ab;         /* the encoder's A (bit 1) and B (bit 0) levels */
static int held;
static avr_cycle_count_t period_cycles;
static volatile sig_atomic_t stop;

static void on_signal(int sig) { (void)sig; stop = 1; }

/* The H-bridge: the mean of the PWM (fast PWM: (OCR0B + 1) / 256 of the
 * period; analogWrite's 0 and 255 set the pin instead), signed by pin 6. */
static double motor_command(void)
{
  const uint8_t portd = avr->data[REG_PORTD];
  double duty;
  if (avr->data[REG_TCCR0A] & (1u << COM0B1)) duty = (avr->data[REG_OCR0B] + 1) / 256.0;
  else duty = (portd >> PIN_PWM) & 1u;
  return ((portd >> PIN_DIR) & 1u ? 1.0 : -1.0) * duty * U_MAX;
}

/* The encoder's levels as the pins' external state: simavr otherwise lets a
 * write of PORTD (the sketch's direction pin, its PWM pin's digitalWrite)
 * put the pull-ups' 1 back on the input pins 2 and 3. */
static void drive_encoder(void)
{
  avr_ioport_external_t e = {.name = 'D', .mask = 0x0C, .value = (uint8_t)(ab << 2)};
  /* A on pin 2 is bit 1 of ab, B on pin 3 bit 0 */
  e.value = (uint8_t)(((ab >> 1) & 1u) << 2 | (ab & 1u) << 3);
  avr_ioctl(avr, AVR_IOCTL_IOPORT_SET_EXTERNAL('D'), &e);
}

/* One edge toward the plant's angle (x4 decoding: +1 is AB 00 -> 10 -> 11 -> 01). */
static avr_cycle_count_t encoder_edge(avr_t *a, avr_cycle_count_t when, void *p)
{
  (void)a;
  (void)p;
  const int32_t target = (int32_t)lround(plant.x[0] * counts_per_rad);
  if (target != count) {
    static const uint8_t up[4] = {2, 0, 3, 1};    /* next AB counting up, by AB */
    static const uint8_t down[4] = {1, 3, 0, 2};  /* and down */
    const uint8_t next = target > count ? up[ab] : down[ab];
    count += target > count ? 1 : -1;
    if ((next ^ ab) & 2u) avr_raise_irq(pin_a, (next >> 1) & 1u);
    if ((next ^ ab) & 1u) avr_raise_irq(pin_b, next & 1u);
    ab = next;
    drive_encoder();
  }
  return when + EDGE_CYCLES;
}

static avr_cycle_count_t plant_step(avr_t *a, avr_cycle_count_t when, void *p)
{
  (void)a;
  (void)p;
  float u = (float)motor_command();
  if (held && u != 0.0f) {
    held = 0;
    fprintf(stderr, "simavr_pil: released at %.3f s of chip time, command %g\n",
            (double)when / FREQ, (double)u);
  }
  if (!held) {
    uint8_t terminated, truncated;
    ps_step(&model, &plant.data, &u, 0, 0, &terminated, &truncated, 0, 0);
  }
  return when + period_cycles;
}

static void plant_init(double angle0)
{
  ps_model_init(&model, PS_PENDULUM, "rig");
  model.max_steps = 0;
  ps_one_reset(&model, &plant, 0);
  plant.x[0] = angle0;
  plant.x[1] = 0.0;
  counts_per_rad = COUNTS_PER_REV / (2 * PI);
  count = (int32_t)(COUNTS_PER_REV / 2);  /* the sketch starts its count hanging */
  held = fabs(angle0 - PI) > 1e-9;
  period_cycles = (avr_cycle_count_t)llround(model.dt * FREQ);
}

static double now_s(void)
{
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv)
{
  if (argc != 3) {
    fprintf(stderr, "usage: %s FIRMWARE.elf ANGLE0\n", argv[0]);
    return 2;
  }
  elf_firmware_t f;
  memset(&f, 0, sizeof f);
  if (elf_read_firmware(argv[1], &f) != 0) {
    fprintf(stderr, "simavr_pil: cannot read %s\n", argv[1]);
    return 2;
  }
  strcpy(f.mmcu, "atmega328p");
  f.frequency = FREQ;
  avr = avr_make_mcu_by_name(f.mmcu);
  if (!avr || avr_init(avr) != 0) {
    fprintf(stderr, "simavr_pil: no atmega328p in this simavr\n");
    return 2;
  }
  avr_load_firmware(avr, &f);
  avr->log = 0;
  plant_init(strtod(argv[2], 0));
  pin_a = avr_io_getirq(avr, AVR_IOCTL_IOPORT_GETIRQ('D'), 2);
  pin_b = avr_io_getirq(avr, AVR_IOCTL_IOPORT_GETIRQ('D'), 3);
  ab = 0;
  drive_encoder();
  avr_raise_irq(pin_a, 0);
  avr_raise_irq(pin_b, 0);
  uart_pty_init(avr, &pty);
  uart_pty_connect(&pty, '0');
  /* simavr's UART "poll sleep" (on by default, for programs that spin on an
   * idle UART) sleeps in wall time on reads of its status; the sketch's
   * serial reads it as it sends, and those sleeps held the chip below real
   * time (0.5 to 0.9 of it). The bench's own hold is the only pacing. */
  uint32_t uart_flags = 0;
  avr_ioctl(avr, AVR_IOCTL_UART_GET_FLAGS('0'), &uart_flags);
  uart_flags &= ~(uint32_t)AVR_UART_FLAG_POLL_SLEEP;
  avr_ioctl(avr, AVR_IOCTL_UART_SET_FLAGS('0'), &uart_flags);
  signal(SIGTERM, on_signal);
  signal(SIGINT, on_signal);
  avr_cycle_timer_register(avr, period_cycles, plant_step, 0);
  avr_cycle_timer_register(avr, BOOT_CYCLES, encoder_edge, 0);

  const double start = now_s();
  avr_cycle_count_t checked = 0;
  double slept = 0.0;  /* wall time spent held: the bench's headroom */
  int state = cpu_Running, ready = 0;
  while (!stop && state != cpu_Done && state != cpu_Crashed) {
    state = avr_run(avr);
    if (!ready && avr->cycle >= READY_CYCLES) {
      ready = 1;
      printf("pty %s\n", pty.pty.slavename);
      fflush(stdout);
    }
    if (avr->cycle - checked >= FREQ / 1000u) {  /* each ms of chip time: hold to the wall */
      checked = avr->cycle;
      const double ahead = (double)avr->cycle / FREQ - (now_s() - start);
      if (ahead > 0.002) {
        const struct timespec t = {0, (long)(ahead * 1e9)};
        const double before = now_s();
        nanosleep(&t, 0);
        slept += now_s() - before;
      }
    }
  }
  const double wall = now_s() - start;
  const double chip = (double)avr->cycle / FREQ;
  fprintf(stderr, "simavr_pil: %.3f s of chip time in %.3f s (%.2f of real time; "
          "%.2f where not held to it)%s\n", chip, wall, chip / wall, chip / (wall - slept),
          state == cpu_Crashed ? "; the chip crashed" : "");
  /* no uart_pty_stop: its thread may sit in a read of the pty; exit ends it */
  return state == cpu_Crashed ? 1 : 0;
}
