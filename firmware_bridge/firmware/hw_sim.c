/* The HIL back-end (see hil.h): the csrc/ plant behind fw_hw, paced by the
 * monotonic clock, with a fault-injecting serial line. */
#define _POSIX_C_SOURCE 200112L
#include "hil.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <string.h>
#include <sys/select.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/epoll.h>
#include <sys/timerfd.h>
#endif

#include "pendsim.h"
#include "pendsim_one.h"
#include "plant_layout.h"

#define TXQ 128  /* device -> host frames waiting for their release time */

typedef struct {
  uint64_t release_us;
  uint8_t len, off;
  uint8_t bytes[PROTO_MAX_WIRE];
} tx_slot;

/* hil_options.param holds a plant's whole parameter vector */
typedef char hil_param_room[sizeof(((hil_options *)0)->param) / sizeof(double) == PS_MAX_PARAMS
                            ? 1 : -1];

struct hil_sim {
  hil_options o;
  fw_device dev;
  ps_model m;
  ps_one plant;  /* the plant on the bench, a batch of one */
  /* the plant beyond its parameters, for a motor that lags (PS_PLANT_HOLD) */
  int32_t delay, push_left;
  double motor_k, torque_noise, offset[PS_MAX_NX / 2], tau, push;
  uint64_t rng, noise_rng;
  int state_index[PROTO_MAX_CHANNELS];  /* plant state component of each channel */
  double counts_per_rad_or_m[PROTO_MAX_CHANNELS];
  float u;                              /* actuator value, held between ticks */
  struct timespec t0;
  volatile int stop;
  int fd;
  tx_slot txq[TXQ];
  unsigned tx_head, tx_count;
  uint8_t stage[PROTO_MAX_WIRE];  /* the frame the core is handing over, so far */
  unsigned stage_n;
  uint64_t last_release_us;
  int rx_ready;                /* input may be waiting: read before sleeping */
#ifdef __linux__
  int epoll_fd, timer_fd, io_want_write;
#endif
  hil_stats stats;
};

size_t hil_sizeof(void) { return sizeof(hil_sim); }
void hil_stop(hil_sim *h) { h->stop = 1; }

static uint64_t now_us(const hil_sim *h)
{
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)(t.tv_sec - h->t0.tv_sec) * 1000000u + (uint64_t)(t.tv_nsec / 1000) -
         (uint64_t)(h->t0.tv_nsec / 1000);
}

/* splitmix64: the fault injector's dice */
static double uniform(hil_sim *h)
{
  uint64_t z = (h->rng += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return (double)((z ^ (z >> 31)) >> 11) * (1.0 / 9007199254740992.0);
}

/* Flip a random nonzero pattern into each byte with probability rate. */
static uint32_t corrupt(hil_sim *h, uint8_t *bytes, size_t n)
{
  uint32_t hits = 0;
  for (size_t i = 0; i < n; ++i) {
    if (uniform(h) < h->o.faults.corrupt_rate) {
      bytes[i] ^= (uint8_t)(1 + (int)(uniform(h) * 255.0));
      hits++;
    }
  }
  return hits;
}

/* A standard normal draw for the sensors, from their own splitmix stream
 * (the fault injector's dice stay as they were). Box-Muller. */
static double sensor_normal(hil_sim *h)
{
  double u[2];
  for (int i = 0; i < 2; ++i) {
    uint64_t z = (h->noise_rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    u[i] = ((double)((z ^ (z >> 31)) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
  }
  return sqrt(-2.0 * log(u[0])) * cos(2.0 * 3.14159265358979323846 * u[1]);
}

/* ---------------------------------------------------------------- fw_hw */
static uint64_t hw_micros(void *ctx) { return now_us((hil_sim *)ctx); }

/* An incremental encoder's 32-bit counter: it wraps, as a board's would. */
static void hw_read_sensors(void *ctx, int32_t *counts)
{
  hil_sim *h = ctx;
  for (int c = 0; c < h->dev.cfg.n_channels; ++c) {
    double x = h->plant.x[h->state_index[c]] + h->o.offset[c];
    if (h->o.sensor_noise[c] > 0) x += h->o.sensor_noise[c] * sensor_normal(h);
    const double v = round(x * h->counts_per_rad_or_m[c]);
    const double wrapped = isfinite(v) ? fmod(v, 4294967296.0) : 0.0;
    counts[c] = (int32_t)(uint32_t)(int64_t)wrapped;
  }
}

/* On-device control: u = -K obs, K from the options. */
static int hw_linear_controller(void *ctx, const float *obs, float *action)
{
  const hil_sim *h = ctx;
  float u = 0.0f;
  for (int i = 0; i < h->o.controller_nobs; ++i) u -= h->o.controller_gain[i] * obs[i];
  *action = u;
  return 0;
}

static void hw_write_actuator(void *ctx, float u) { ((hil_sim *)ctx)->u = u; }

/* Room while the line's queue has slots for every frame a piece may end
 * (a frame is at least 12 bytes); then as much as completes the frame. */
static size_t hw_serial_room(void *ctx)
{
  const hil_sim *h = ctx;
  if (h->fd >= 0 && TXQ - h->tx_count < 16) return 0;  /* the host is not reading */
  return PROTO_MAX_WIRE - h->stage_n;
}

/* One whole frame onto the line, through the fault injector. */
static void line_frame(hil_sim *h, const uint8_t *bytes, size_t n)
{
  const hil_faults *f = &h->o.faults;
  if (h->fd < 0) return;
  if (f->drop_rate > 0 && uniform(h) < f->drop_rate) { h->stats.tx_dropped++; return; }
  if (h->tx_count == TXQ || n > PROTO_MAX_WIRE) { h->stats.tx_overflow++; return; }
  tx_slot *s = &h->txq[(h->tx_head + h->tx_count++) % TXQ];
  memcpy(s->bytes, bytes, n);
  s->len = (uint8_t)n;
  s->off = 0;
  if (f->corrupt_rate > 0) h->stats.tx_corrupted_bytes += corrupt(h, s->bytes, n);
  double delay = f->latency_us;
  if (f->spike_rate > 0 && uniform(h) < f->spike_rate) delay += f->spike_us;
  uint64_t release = now_us(h) + (uint64_t)delay;
  if (release < h->last_release_us) release = h->last_release_us;  /* a byte stream keeps order */
  s->release_us = h->last_release_us = release;
}

/* The core hands bytes over in pieces: frames are cut at their delimiter. */
static void hw_serial_write(void *ctx, const uint8_t *bytes, size_t n)
{
  hil_sim *h = ctx;
  for (size_t i = 0; i < n; ++i) {
    if (h->stage_n < sizeof h->stage) h->stage[h->stage_n++] = bytes[i];
    if (bytes[i] == 0) {
      line_frame(h, h->stage, h->stage_n);
      h->stage_n = 0;
    }
  }
}

/* Write the frames whose time has come, as far as the line takes them. */
static void flush_tx(hil_sim *h, uint64_t now)
{
  while (h->tx_count && h->fd >= 0) {
    tx_slot *s = &h->txq[h->tx_head];
    if (s->release_us > now) return;
    const ssize_t w = write(h->fd, s->bytes + s->off, (size_t)(s->len - s->off));
    if (w < 0) {
      if (errno == EINTR) continue;
      return;  /* EAGAIN: the reader is behind; try again later */
    }
    s->off = (uint8_t)(s->off + w);
    if (s->off < s->len) return;
    h->tx_head = (h->tx_head + 1) % TXQ;
    h->tx_count--;
  }
}

/* ---------------------------------------------------------------- set-up */
int hil_init(hil_sim *h, const hil_options *o)
{
  memset(h, 0, sizeof *h);
  h->o = *o;
  h->fd = o->fd;
#ifdef __linux__
  h->epoll_fd = h->timer_fd = -1;
#endif
  h->rng = o->seed ^ 0x5DEECE66Dull;
  h->noise_rng = o->seed ^ 0xC0FFEE5EED5ull;
  clock_gettime(CLOCK_MONOTONIC, &h->t0);
  if (ps_model_init(&h->m, o->system, o->preset) != PS_OK)
    return o->system >= 0 && o->system < PS_NUM_SYSTEMS ? PS_ERR_PRESET : PS_ERR_SYSTEM;
  /* step the plant once per control tick, no coarser than the preset integrates */
  const double h_int = h->m.dt / h->m.substeps;
  if (o->rate_hz > 0) {
    h->m.dt = 1.0 / o->rate_hz;
    h->m.substeps = (int)ceil(h->m.dt / h_int - 1e-9);
    if (h->m.substeps < 1) h->m.substeps = 1;
  }
  h->m.max_steps = 0;
  if (o->n_param < 0 || o->n_param > h->m.nparam) return PS_ERR_MODEL;
  for (int k = 0; k < o->n_param; ++k) {
    if (!isfinite(o->param[k])) return PS_ERR_MODEL;
    h->m.param[k] = o->param[k];  /* the nominal plant mode resets to these */
  }
  h->m.delay = o->delay_steps;
  if (!(o->motor_k >= 0 && o->motor_k <= 1)) return PS_ERR_MODEL;
  for (int c = 0; c < PROTO_MAX_CHANNELS; ++c)
    if (!(o->sensor_noise[c] >= 0 && isfinite(o->sensor_noise[c]))) return PS_ERR_MODEL;
  if (ps_model_check(&h->m) != PS_OK) return PS_ERR_MODEL;
  ps_one_bind(&h->plant);
  if (o->motor_k > 0 && o->motor_k < 1) {
    /* a lagging motor is the simulator's held plant: the model's parameters
     * (copied in by a nominal reset first), this delay and motor, an ideal
     * rest (no noise, pushes or offsets: the encoders take theirs here) */
    ps_reset(&h->m, &h->plant.data, 0, 0);
    h->m.plant_mode = PS_PLANT_HOLD;
    h->delay = o->delay_steps;
    h->motor_k = o->motor_k;
    h->plant.data.delay = &h->delay;
    h->plant.data.motor_k = &h->motor_k;
    h->plant.data.torque_noise = &h->torque_noise;
    h->plant.data.offset = h->offset;
    h->plant.data.tau = &h->tau;
    h->plant.data.push = &h->push;
    h->plant.data.push_left = &h->push_left;
  }
  ps_seed(&h->plant.data, &o->seed);
  ps_reset(&h->m, &h->plant.data, 0, 0);
  if (o->set_x0)
    for (int k = 0; k < h->m.nx; ++k) h->plant.x[k] = o->x0[k];

  /* the sensors: encoders on the angles, a linear encoder on a cart */
  fw_config cfg;
  memset(&cfg, 0, sizeof cfg);
  ps_layout layout;
  ps_plant_layout(o->system, &layout);  /* the system is known: ps_model_init took it */
  const double PI = 3.14159265358979323846;
  for (int c = 0; c < layout.n_channels && c < PROTO_MAX_CHANNELS; ++c) {
    const int k = layout.channel_position[c];
    const int angle = layout.is_angle[k];
    const double per_unit = angle ? (h->m.enc_counts[k] > 0 ? h->m.enc_counts[k] : 4096.0)
                                  : 10000.0;  /* 0.1 mm */
    h->state_index[c] = k;
    cfg.counts_per_unit[c] = (float)per_unit;
    h->counts_per_rad_or_m[c] = angle ? per_unit / (2 * PI) : per_unit;
    cfg.angle_mask |= (uint8_t)(angle << c);
    cfg.pos_limit[c] = (float)(o->pos_limit[c] * h->counts_per_rad_or_m[c]);
    cfg.vel_limit[c] = (float)(o->vel_limit[c] * h->counts_per_rad_or_m[c]);
    cfg.n_channels = (uint8_t)(c + 1);
  }
  cfg.system = (uint8_t)o->system;
  cfg.device_id = o->device_id;
  cfg.period_us = (uint32_t)lround(h->m.dt * 1e6);
  cfg.u_max = (float)h->m.u_max;
  cfg.watchdog_us = o->watchdog_us;
  cfg.vel_cutoff_hz = o->vel_cutoff_hz;
  memcpy(cfg.preset, o->preset, PROTO_PRESET_LEN);
  if (o->controller_nobs < 0 || o->controller_nobs > FW_MAX_OBS) return PS_ERR_MODEL;
  const fw_hw hw = {h, hw_micros, hw_read_sensors, hw_write_actuator, hw_serial_write,
                    hw_serial_room, o->controller_nobs > 0 ? hw_linear_controller : 0};
  fw_init(&h->dev, &cfg, &hw);
  h->stats.period_us = cfg.period_us;
  h->stats.u_max = cfg.u_max;
  h->stats.n_channels = cfg.n_channels;
  return PS_OK;
}

/* ---------------------------------------------------------------- running */
static void note_mode(hil_sim *h, uint8_t before)
{
  if (before != MODE_ARMED && h->dev.mode == MODE_ARMED) h->stats.arms++;
}

/* One read takes all the line discipline holds (its buffer is 4096 bytes).
 * Reading again to see EAGAIN is what must not happen (see wait_io). */
static void receive(hil_sim *h)
{
  uint8_t buf[4096];
  const ssize_t n = read(h->fd, buf, sizeof buf);
  h->rx_ready = n == (ssize_t)sizeof buf;
  if (n <= 0) return;  /* EAGAIN, or no writer: nothing to do */
  if (h->o.faults.both_ways && h->o.faults.corrupt_rate > 0)
    h->stats.rx_corrupted_bytes += corrupt(h, buf, (size_t)n);
  const uint8_t before = h->dev.mode;
  fw_receive(&h->dev, buf, (size_t)n);
  note_mode(h, before);
}

/* Sleep until `wake` (device microseconds), input, or room to write when
 * `want_write`; `wake` 0 only collects what has already happened. Sets
 * h->rx_ready when input may be waiting.
 *
 * Why epoll, edge-triggered, on Linux: a tty's poll() and a read that finds
 * nothing both wait for the kernel worker that moves bytes into the line
 * discipline. That worker has just woken this (real-time) thread and been
 * preempted by it, so each such wait queued it behind whatever else the CPU
 * runs: 1+ ms stalls, missed periods. An edge-triggered epoll never polls the
 * tty unasked, and receive() reads only after an edge. */
static void wait_io(hil_sim *h, uint64_t wake, int want_write)
{
#ifdef __linux__
  if (want_write != h->io_want_write && h->fd >= 0) {
    struct epoll_event ev = {EPOLLIN | EPOLLET | (want_write ? EPOLLOUT : 0), {.fd = h->fd}};
    epoll_ctl(h->epoll_fd, EPOLL_CTL_MOD, h->fd, &ev);
    h->io_want_write = want_write;
  }
  if (wake) {
    const uint64_t ns = (uint64_t)h->t0.tv_nsec + wake * 1000u;
    struct itimerspec at;
    memset(&at, 0, sizeof at);
    at.it_value.tv_sec = h->t0.tv_sec + (time_t)(ns / 1000000000u);
    at.it_value.tv_nsec = (long)(ns % 1000000000u);
    timerfd_settime(h->timer_fd, TFD_TIMER_ABSTIME, &at, 0);
  }
  struct epoll_event events[2];
  const int n = epoll_wait(h->epoll_fd, events, 2, wake ? -1 : 0);
  for (int i = 0; i < n; ++i) {
    if (events[i].data.fd == h->fd && events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR))
      h->rx_ready = 1;
    if (events[i].data.fd == h->timer_fd) {
      uint64_t expirations;
      if (read(h->timer_fd, &expirations, sizeof expirations) < 0) { /* EAGAIN: disarmed */ }
    }
  }
#else  /* POSIX: pselect (a tty poll may wait for the kernel's worker, see above) */
  const uint64_t now = now_us(h);
  const uint64_t wait = wake > now ? wake - now : 0;
  struct timespec ts = {(time_t)(wait / 1000000u), (long)(wait % 1000000u) * 1000L};
  fd_set readable, writable;
  FD_ZERO(&readable);
  FD_ZERO(&writable);
  if (h->fd >= 0) FD_SET(h->fd, &readable);
  if (want_write) FD_SET(h->fd, &writable);
  const int r = pselect(h->fd >= 0 ? h->fd + 1 : 0, &readable, &writable, 0, &ts, 0);
  if (r > 0 && h->fd >= 0 && FD_ISSET(h->fd, &readable)) h->rx_ready = 1;
#endif
}

static void tick(hil_sim *h, uint64_t due_us)
{
  const int held = h->o.hold_until_armed && h->stats.arms == 0;
  if (!held) {
    uint8_t terminated, truncated;
    ps_step(&h->m, &h->plant.data, &h->u, 0, 0, &terminated, &truncated, 0, 0);
  }
  h->dev.extra_flags = held ? FLAG_HELD : 0;
  fw_tick(&h->dev, (uint32_t)due_us);
  const size_t i = h->stats.trace_len;
  if (i < h->o.trace_cap) {
    if (h->o.trace_t_us) h->o.trace_t_us[i] = h->dev.prev_t_us;
    if (h->o.trace_due_us) h->o.trace_due_us[i] = due_us;
    if (h->o.trace_x)
      for (int k = 0; k < 4; ++k) h->o.trace_x[4 * i + k] = k < h->m.nx ? h->plant.x[k] : 0.0;
    if (h->o.trace_u) h->o.trace_u[i] = h->u;
    if (h->o.trace_mode) h->o.trace_mode[i] = h->dev.mode;
    if (h->o.trace_fault) h->o.trace_fault[i] = h->dev.fault;
    h->stats.trace_len = i + 1;
  }
}

void hil_run(hil_sim *h, double duration_s)
{
  const uint64_t period = h->dev.cfg.period_us;
  const uint64_t start = now_us(h);
  const uint64_t end = duration_s > 0 ? start + (uint64_t)(duration_s * 1e6) : UINT64_MAX;
  const double disc = h->o.faults.disconnect_after_s;
  const uint64_t disconnect = disc > 0 ? start + (uint64_t)(disc * 1e6) : UINT64_MAX;
  uint64_t next = start;
  h->stop = 0;
  h->rx_ready = 1;  /* input may predate the epoll registration */
#ifdef __linux__
  h->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  h->timer_fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  struct epoll_event ev = {EPOLLIN | EPOLLET, {.fd = h->timer_fd}};
  if (h->epoll_fd < 0 || h->timer_fd < 0 ||
      epoll_ctl(h->epoll_fd, EPOLL_CTL_ADD, h->timer_fd, &ev) != 0) {
    h->stats.io_error = 1;  /* out of file descriptors: serve nothing */
    h->stop = 1;
  }
  ev.data.fd = h->fd;
  if (h->fd >= 0 && !h->stop && epoll_ctl(h->epoll_fd, EPOLL_CTL_ADD, h->fd, &ev) != 0) {
    h->stats.io_error = 1;
    h->stop = 1;
  }
  h->io_want_write = 0;
#endif
  if (h->o.realtime) {  /* a real-time priority keeps the ticks on time on a busy host */
    struct sched_param sp;
    memset(&sp, 0, sizeof sp);
    sp.sched_priority = 10;
    h->stats.realtime = pthread_setschedparam(pthread_self(), SCHED_FIFO, &sp) == 0;
  }
  while (!h->stop) {
    uint64_t now = now_us(h);
    if (now >= end) break;
    if (now >= disconnect && h->fd >= 0) {
      close(h->fd);  /* closing also removes it from the epoll set */
      h->fd = -1;
      h->stats.disconnected = 1;
    }
    fw_transmit(&h->dev);  /* what the line queue took back room for */
    flush_tx(h, now);
    if (now >= next) {
      /* what arrived while we slept late is not the host's fault: read it first */
      wait_io(h, 0, 0);
      if (h->rx_ready && h->fd >= 0) receive(h);
      tick(h, next);
      next += period;
      if (now >= next + 10 * period) next = now + period;  /* stalled: start afresh */
      continue;
    }
    /* sleep until the next tick, a frame's release time, input, or room to
     * write a frame that is due (the reader was behind) */
    uint64_t wake = next;
    int blocked = 0;
    if (h->tx_count && h->fd >= 0) {
      const uint64_t release = h->txq[h->tx_head].release_us;
      if (release > now && release < wake) wake = release;
      blocked = release <= now;
    }
    if (!h->rx_ready) wait_io(h, wake, blocked);
    if (h->rx_ready && h->fd >= 0) receive(h);
  }
#ifdef __linux__
  if (h->timer_fd >= 0) close(h->timer_fd);
  if (h->epoll_fd >= 0) close(h->epoll_fd);
  h->timer_fd = h->epoll_fd = -1;
#endif
  h->stats.t_us = now_us(h);
}

void hil_get_stats(const hil_sim *h, hil_stats *s)
{
  *s = h->stats;
  s->ticks = h->dev.ticks;
  s->late_ticks = FW_COUNTER(&h->dev, COUNTER_LATE_TICKS);
  s->mode = h->dev.mode;
  s->fault = h->dev.fault;
  s->rx_frames = h->dev.rx.frames;
  s->rx_crc_errors = h->dev.rx.crc_errors;
  s->rx_bad_frames = h->dev.rx.bad_frames;
  s->watchdog_trips = FW_COUNTER(&h->dev, COUNTER_WATCHDOG_TRIPS);
  s->stale_ticks = FW_COUNTER(&h->dev, COUNTER_STALE_TICKS);
  s->stale_commands = FW_COUNTER(&h->dev, COUNTER_STALE_COMMANDS);
  s->tx_dropped_states = FW_COUNTER(&h->dev, COUNTER_TX_DROPPED_STATES);
  s->tx_dropped_replies = FW_COUNTER(&h->dev, COUNTER_TX_DROPPED_REPLIES);
  s->tx_frames = FW_COUNTER(&h->dev, COUNTER_TX_FRAMES);
}
