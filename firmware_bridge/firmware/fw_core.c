/* The device firmware core (see fw_core.h). */
#include "fw_core.h"

#include <math.h>
#include <string.h>

#define LATENCY_UNKNOWN 0xFFFFFFFFu
#define WATCHDOG_MAX_US 10000000u  /* 10 s */
#define TWO_PI 6.2831853f
/* Out of line, for code size on AVR (where the Uno's sketch, linked with
 * LTO, must leave room for a policy): a function with a large local (a
 * payload struct) inlined into a large caller makes the caller's frame larger
 * than one AVR displacement reaches (63 bytes), and each access beyond costs
 * two more instructions (send_info: ~300 bytes in fw_receive at -Os); and LTO
 * would otherwise inline fw_receive and fw_tick into the sketch's one loop,
 * with the same effect (~300 bytes). No effect on behaviour. */
#if defined(__GNUC__)
#define FW_NOINLINE __attribute__((noinline))
#else
#define FW_NOINLINE
#endif

/* [two periods, 10 s]; 0 means two periods. One period would trip on the
 * first command that arrives a microsecond late. */
static uint32_t clamp_watchdog(uint32_t w, uint32_t period_us)
{
  const uint32_t lo = period_us > WATCHDOG_MAX_US / 2 ? WATCHDOG_MAX_US : 2 * period_us;
  if (w < lo) return lo;
  return w > WATCHDOG_MAX_US ? WATCHDOG_MAX_US : w;
}

/* now - then of the 64-bit clock, in us, saturated to 2^32 - 1 (also for a
 * clock that went back). Times are compared in 32 bits after one subtraction
 * (here, or modulo 2^32 for the watchdog): 64-bit arithmetic is large on an
 * 8-bit AVR. */
static uint32_t elapsed_us(uint64_t now, uint64_t then)
{
  const uint64_t diff = now - then;
  return diff > 0xFFFFFFFFu ? 0xFFFFFFFFu : (uint32_t)diff;
}

/* The velocity low-pass coefficient 1 - exp(-2 pi fc dt) for a tick dt_us
 * after the previous one (1 without a filter). */
static float vel_alpha(const fw_device *d, uint32_t dt_us)
{
  const float fc = d->cfg.vel_cutoff_hz;
  return fc > 0 ? 1.0f - expf(-TWO_PI * fc * ((float)dt_us * 1e-6f)) : 1.0f;
}

/* The coefficient for the nominal period, computed once per change of the
 * cutoff: a tick on time (within 1/16 period) needs no expf. */
static void set_vel_cutoff(fw_device *d, float fc)
{
  d->cfg.vel_cutoff_hz = fc;
  d->vel_alpha = vel_alpha(d, d->cfg.period_us);
}

void fw_init(fw_device *d, const fw_config *cfg, const fw_hw *hw)
{
  memset(d, 0, sizeof *d);
  d->cfg = *cfg;
  if (d->cfg.n_channels > PROTO_MAX_CHANNELS) d->cfg.n_channels = PROTO_MAX_CHANNELS;
  d->cfg.watchdog_us = clamp_watchdog(d->cfg.watchdog_us, d->cfg.period_us);
  set_vel_cutoff(d, d->cfg.vel_cutoff_hz >= 0.0f ? d->cfg.vel_cutoff_hz : 0.0f);  /* NaN: 0 */
  for (uint8_t c = 0; c < d->cfg.n_channels; ++c) {  /* the observation's units, once */
    const float cpu = d->cfg.counts_per_unit[c];
    const int angle = d->cfg.angle_mask >> c & 1;
    if (!(cpu > 0)) continue;  /* an absent channel: 0 */
    d->obs_unit[c] = (angle ? TWO_PI : 1.0f) / cpu;
    /* whole turns off first: float keeps the fraction */
    if (angle && cpu >= 1.0f && cpu < 2147483648.0f && (float)(int32_t)cpu == cpu)
      d->obs_turn[c] = (int32_t)cpu;
  }
  d->hw = *hw;
  proto_decoder_init(&d->rx, PROTO_FROM_HOST);
  d->mode = MODE_DISARMED;
  d->control_source = CONTROL_HOST;
  d->u_limit = cfg->u_max;
  d->rx_latency_max_us = LATENCY_UNKNOWN;
  d->hw.write_actuator(d->hw.ctx, 0.0f);
}

/* ---------------------------------------------------------------- output */
/* One more of STATUS counter `which` (a function: on AVR an inline 32-bit
 * increment of a field is 20 to 40 bytes, nine of them ~240 bytes under LTO) */
static FW_NOINLINE void count(fw_device *d, uint8_t which) { FW_COUNTER(d, which)++; }

/* position i of the ring (i < 2 FW_TX_BUF), without a division */
static uint16_t ring(uint16_t i) { return i < FW_TX_BUF ? i : (uint16_t)(i - FW_TX_BUF); }

/* Forget the oldest k queued frames' bookkeeping entry k (shift the rest). */
static void tx_forget(fw_device *d, uint8_t k)
{
  d->tx_frames_queued--;
  for (uint8_t j = k; j < d->tx_frames_queued; ++j) {
    d->tx_len[j] = d->tx_len[j + 1];
    d->tx_is_state[j] = d->tx_is_state[j + 1];
  }
}

/* Drop queued frame k (not begun on the line): the bytes after it move up. */
static void tx_remove(fw_device *d, uint8_t k)
{
  uint16_t start = d->tx_head;
  for (uint8_t j = 0; j < k; ++j) start = ring((uint16_t)(start + d->tx_len[j]));
  const uint8_t len = d->tx_len[k];
  uint16_t from = ring((uint16_t)(start + len));
  const uint16_t end = ring((uint16_t)(d->tx_head + d->tx_bytes));
  while (from != end) {
    d->tx_buf[start] = d->tx_buf[from];
    start = ring((uint16_t)(start + 1));
    from = ring((uint16_t)(from + 1));
  }
  d->tx_bytes = (uint16_t)(d->tx_bytes - len);
  tx_forget(d, k);
}

void fw_transmit(fw_device *d)
{
  while (d->tx_bytes) {
    const size_t room = d->hw.serial_room ? d->hw.serial_room(d->hw.ctx) : d->tx_bytes;
    if (room == 0) return;
    uint16_t n = (uint16_t)(FW_TX_BUF - d->tx_head);  /* contiguous part */
    if (n > d->tx_bytes) n = d->tx_bytes;
    if (n > room) n = (uint16_t)room;
    d->hw.serial_write(d->hw.ctx, d->tx_buf + d->tx_head, n);
    d->tx_head = ring((uint16_t)(d->tx_head + n));
    d->tx_bytes = (uint16_t)(d->tx_bytes - n);
    uint16_t sent = (uint16_t)(d->tx_sent + n);
    while (d->tx_frames_queued && sent >= d->tx_len[0]) {  /* frames now fully out */
      sent = (uint16_t)(sent - d->tx_len[0]);
      tx_forget(d, 0);
    }
    d->tx_sent = (uint8_t)sent;
  }
}

/* where a reply or STATE is packed: in the wire buffer, framed around it */
#define TX_PAYLOAD(d) ((d)->tx_wire + PROTO_WIRE_PAYLOAD)

/* Number the frame packed at TX_PAYLOAD and queue it; never blocks. Room is
 * made by dropping the oldest queued STATE not yet begun; what still does not
 * fit is dropped and counted (its sequence number is used, so the host counts
 * it lost). */
static void send(fw_device *d, uint8_t type, uint8_t len)
{
  const uint8_t n = (uint8_t)proto_encode_in_place(d->tx_wire, type, d->tx_seq++, len);
  const uint8_t is_state = type == MSG_STATE;
  count(d, COUNTER_TX_FRAMES);
  while (d->tx_bytes + n > FW_TX_BUF || d->tx_frames_queued == FW_TX_FRAMES) {
    uint8_t k = d->tx_sent ? 1 : 0;
    while (k < d->tx_frames_queued && !d->tx_is_state[k]) ++k;
    if (k == d->tx_frames_queued) {  /* no STATE to give up */
      count(d, is_state ? COUNTER_TX_DROPPED_STATES : COUNTER_TX_DROPPED_REPLIES);
      return;
    }
    tx_remove(d, k);
    count(d, COUNTER_TX_DROPPED_STATES);
  }
  /* into the ring in at most two pieces (where it wraps) */
  const uint16_t at = ring((uint16_t)(d->tx_head + d->tx_bytes));
  const uint8_t first = FW_TX_BUF - at < n ? (uint8_t)(FW_TX_BUF - at) : n;
  memcpy(d->tx_buf + at, d->tx_wire, first);
  memcpy(d->tx_buf, d->tx_wire + first, (size_t)(n - first));
  d->tx_bytes = (uint16_t)(d->tx_bytes + n);
  d->tx_len[d->tx_frames_queued] = n;
  d->tx_is_state[d->tx_frames_queued] = is_state;
  d->tx_frames_queued++;
  fw_transmit(d);
}

static void send_ack(fw_device *d, const proto_frame *req, uint8_t result)
{
  const proto_ack a = {req->type, req->seq, result, d->mode};
  send(d, MSG_ACK, proto_pack_ack(&a, TX_PAYLOAD(d)));
}

static void send_status(fw_device *d, uint8_t type)
{
  proto_status s;
  s.mode = d->mode;
  s.fault = d->fault;
  s.t_us = d->hw.micros(d->hw.ctx);
  s.info_t_us = d->info_t_us;
  memcpy(s.counter + COUNTER_TX_FRAMES, d->counter, sizeof d->counter);
  s.counter[COUNTER_RX_FRAMES] = d->rx.frames;
  s.counter[COUNTER_RX_CRC_ERRORS] = d->rx.crc_errors;
  s.counter[COUNTER_RX_BAD_FRAMES] = d->rx.bad_frames;
  s.counter[COUNTER_RX_OVERFLOWS] = d->rx.overflows;
  /* COUNTER_TX_FRAMES = this frame's seq: the frames numbered before it */
  send(d, type, proto_pack_status(&s, TX_PAYLOAD(d)));
}

static FW_NOINLINE void send_info(fw_device *d)
{
  proto_info i;
  memset(&i, 0, sizeof i);
  i.protocol_version = PROTO_VERSION;
  i.system = d->cfg.system;
  i.n_channels = d->cfg.n_channels;
  i.angle_mask = d->cfg.angle_mask;
  i.device_id = d->cfg.device_id;
  i.period_us = d->cfg.period_us;
  i.u_max = d->cfg.u_max;
  i.u_limit = d->u_limit;
  memcpy(i.counts_per_unit, d->cfg.counts_per_unit, sizeof i.counts_per_unit);
  i.watchdog_us = d->cfg.watchdog_us;
  memcpy(i.preset, d->cfg.preset, PROTO_PRESET_LEN);
  i.firmware_version = FW_VERSION;
  i.controller = d->hw.controller != 0;
  i.control_source = d->control_source;
  i.vel_cutoff_hz = d->cfg.vel_cutoff_hz;
  memcpy(i.pos_limit, d->cfg.pos_limit, sizeof i.pos_limit);
  memcpy(i.vel_limit, d->cfg.vel_limit, sizeof i.vel_limit);
  send(d, MSG_INFO, proto_pack_info(&i, TX_PAYLOAD(d)));
}

/* ---------------------------------------------------------------- modes */
static void stop_actuator(fw_device *d)
{
  d->applied_u = 0.0f;
  d->have_pending = 0;
  d->have_cmd_seq = 0;  /* a new host may number its commands from anywhere */
  d->hw.write_actuator(d->hw.ctx, 0.0f);
}

static void enter_fault(fw_device *d, uint8_t fault)
{
  stop_actuator(d);
  d->mode = MODE_FAULT;
  d->fault = fault;
  if (fault == FAULT_WATCHDOG) count(d, COUNTER_WATCHDOG_TRIPS);
  send_status(d, MSG_FAULT);
}

/* The fault the current measurement calls for, or FAULT_NONE. */
static uint8_t limit_fault(const fw_device *d)
{
  if (!d->have_prev) return FAULT_NONE;
  for (int c = 0; c < d->cfg.n_channels; ++c) {
    const float p = d->cfg.pos_limit[c], v = d->cfg.vel_limit[c];
    if (p > 0 && fabsf((float)d->prev_counts[c]) > p) return FAULT_POSITION_LIMIT;
    if (v > 0 && fabsf(d->vel[c]) > v) return FAULT_VELOCITY_LIMIT;
  }
  return FAULT_NONE;
}

static float clamp_u(const fw_device *d, float u, uint8_t *clamped)
{
  const float limit = d->u_limit;
  *clamped = 1;
  if (u > limit) return limit;
  if (u < -limit) return -limit;
  *clamped = 0;
  return u;
}

/* ---------------------------------------------------------------- parameters */
static uint8_t param_get(const fw_device *d, uint16_t id, float *value)
{
  if (id == PARAM_WATCHDOG_US) *value = (float)d->cfg.watchdog_us;
  else if (id == PARAM_U_LIMIT) *value = d->u_limit;
  else if (id >= PARAM_POS_LIMIT0 && id < PARAM_POS_LIMIT0 + PROTO_MAX_CHANNELS)
    *value = d->cfg.pos_limit[id - PARAM_POS_LIMIT0];
  else if (id >= PARAM_VEL_LIMIT0 && id < PARAM_VEL_LIMIT0 + PROTO_MAX_CHANNELS)
    *value = d->cfg.vel_limit[id - PARAM_VEL_LIMIT0];
  else if (id == PARAM_VEL_CUTOFF_HZ) *value = d->cfg.vel_cutoff_hz;
  else if (id == PARAM_PERIOD_US) *value = (float)d->cfg.period_us;
  else if (id == PARAM_DEVICE_ID) *value = (float)d->cfg.device_id;
  else if (id == PARAM_CONTROL_SOURCE) *value = (float)d->control_source;
  else return RESULT_UNKNOWN_PARAM;
  return RESULT_OK;
}

static uint8_t param_set(fw_device *d, uint16_t id, float v)
{
  float ignored;
  if (param_get(d, id, &ignored) != RESULT_OK) return RESULT_UNKNOWN_PARAM;
  if (id == PARAM_PERIOD_US || id == PARAM_DEVICE_ID) return RESULT_READ_ONLY;
  if (!isfinite(v)) return RESULT_OUT_OF_RANGE;
  if (id == PARAM_U_LIMIT) {  /* lowering the clamp is safe at any time: at once */
    if (!(v > 0 && v <= d->cfg.u_max)) return RESULT_OUT_OF_RANGE;
    d->u_limit = v;
    uint8_t clamped;
    const float u = clamp_u(d, d->applied_u, &clamped);
    if (clamped) {
      d->applied_u = u;
      d->applied_flags |= FLAG_CLAMPED;
      d->hw.write_actuator(d->hw.ctx, u);
    }
    return RESULT_OK;
  }
  if (id == PARAM_VEL_CUTOFF_HZ) {
    if (!(v >= 0 && v <= 1e5f)) return RESULT_OUT_OF_RANGE;
    set_vel_cutoff(d, v);
    return RESULT_OK;
  }
  if (d->mode == MODE_ARMED) return RESULT_BUSY;  /* safety settings: disarmed only */
  if (id == PARAM_WATCHDOG_US) {
    if (v != floorf(v)) return RESULT_BAD_REQUEST;  /* whole microseconds only */
    if (!(v >= 2.0f * (float)d->cfg.period_us && v <= (float)WATCHDOG_MAX_US))
      return RESULT_OUT_OF_RANGE;
    d->cfg.watchdog_us = (uint32_t)v;
  } else if (id == PARAM_CONTROL_SOURCE) {
    if (v != CONTROL_HOST && v != CONTROL_ON_DEVICE) return RESULT_OUT_OF_RANGE;
    if (v == CONTROL_ON_DEVICE && !d->hw.controller) return RESULT_BAD_REQUEST;
    d->control_source = (uint8_t)v;
  } else {
    if (v < 0) return RESULT_OUT_OF_RANGE;
    if (id < PARAM_VEL_LIMIT0) d->cfg.pos_limit[id - PARAM_POS_LIMIT0] = v;
    else d->cfg.vel_limit[id - PARAM_VEL_LIMIT0] = v;
  }
  return RESULT_OK;
}

/* ---------------------------------------------------------------- input */
static void on_command(fw_device *d, const proto_frame *f, uint32_t now)
{
  proto_command c;
  if (proto_unpack_command(f->payload, f->len, &c) != 0) return;
  if (d->mode != MODE_ARMED) {
    count(d, COUNTER_IGNORED_COMMANDS);
    return;
  }
  /* only a command newer than the last accepted one (by frame seq, modulo
   * 2^32: 1 .. 2^31 - 1 ahead) counts: a duplicate, a stale or a reordered
   * frame neither applies nor feeds the watchdog */
  /* and only one that answers a STATE this device sent: its echoed time is
   * not after the newest STATE's (modulo 2^32, at most 2^31 - 1 before) and,
   * taken as that many us before the newest STATE (info: the one 64-bit
   * step), not before start-up (info did not wrap) */
  const uint64_t newest = d->prev_t_us;
  const uint32_t before_newest = (uint32_t)newest - c.state_t_us;
  const uint64_t info = newest - before_newest;
  if ((d->have_cmd_seq && (uint32_t)(f->seq - d->last_cmd_seq - 1u) >= 0x7FFFFFFFu) ||
      !d->have_prev || before_newest >= 0x80000000u || info > newest) {
    count(d, COUNTER_STALE_COMMANDS);
    return;
  }
  d->have_cmd_seq = 1;
  d->last_cmd_seq = f->seq;
  /* the watchdog counts from the time of the STATE answered (PROTOCOL.md),
   * in 64 bits as placed above */
  d->info_t_us = info;
  /* latency: this arrival minus the time of the STATE answered, as the
   * command echoes it (low 32 bits, modulo 2^32) */
  uint32_t latency = now - c.state_t_us;
  if (latency == LATENCY_UNKNOWN) latency--;
  if (d->rx_latency_max_us == LATENCY_UNKNOWN || latency > d->rx_latency_max_us)
    d->rx_latency_max_us = latency;
  if (d->control_source == CONTROL_ON_DEVICE) return;  /* a keep-alive: the value is moot */
  if (!isfinite(c.u)) {
    enter_fault(d, FAULT_BAD_COMMAND);
    return;
  }
  d->pending_u = c.u;
  d->pending_seq = f->seq;
  d->pending_fresh = d->have_state && c.state_seq == d->last_state_seq;
  d->have_pending = 1;
}

static void on_frame(fw_device *d, const proto_frame *f)
{
  const uint64_t now = d->hw.micros(d->hw.ctx);
  switch (f->type) {
  case MSG_COMMAND: on_command(d, f, (uint32_t)now); break;
  case MSG_HELLO:
    if (f->payload[0] == PROTO_VERSION) send_info(d);
    else send_ack(d, f, RESULT_BAD_REQUEST);  /* a host of another version */
    break;
  case MSG_HEARTBEAT: send_status(d, MSG_STATUS); break;
  case MSG_ARM:
    if (d->mode == MODE_FAULT) {
      send_ack(d, f, RESULT_FAULT_ACTIVE);
    } else if (limit_fault(d) != FAULT_NONE) {
      send_ack(d, f, RESULT_LIMITS);
    } else {
      if (d->mode != MODE_ARMED) {
        stop_actuator(d);
        d->mode = MODE_ARMED;
        d->info_t_us = now;  /* the first command is due within the watchdog time */
        d->applied_flags = 0;
      }
      send_ack(d, f, RESULT_OK);
    }
    break;
  case MSG_DISARM:
    stop_actuator(d);
    d->mode = MODE_DISARMED;
    d->fault = FAULT_NONE;
    send_ack(d, f, RESULT_OK);
    break;
  case MSG_PARAM_GET:
  case MSG_PARAM_SET: {
    proto_param q;
    if (proto_unpack_param_request(f->type, f->payload, f->len, &q) != 0) break;
    q.result = f->type == MSG_PARAM_SET ? param_set(d, q.id, q.value) : RESULT_OK;
    /* reply with the value now in effect (0 for an unknown id) */
    const uint8_t known = param_get(d, q.id, &q.value);
    if (known != RESULT_OK) {
      q.result = known;
      q.value = 0.0f;
    }
    send(d, MSG_PARAM, proto_pack_param(&q, TX_PAYLOAD(d)));
    break;
  }
  default: break;  /* the decoder passes host-to-device types only */
  }
}

FW_NOINLINE void fw_receive(fw_device *d, const uint8_t *bytes, size_t n)
{
  for (size_t i = 0; i < n; ++i)
    if (proto_decoder_push(&d->rx, bytes[i], &d->rx_frame)) on_frame(d, &d->rx_frame);
}

/* ---------------------------------------------------------------- sensing */
/* a - b of two counters that may wrap, modulo 2^32 as a signed value,
 * without signed overflow */
static float count_delta(int32_t a, int32_t b)
{
  const uint32_t diff = (uint32_t)a - (uint32_t)b;
  return diff < 0x80000000u ? (float)diff : -(float)((uint32_t)0 - diff);
}

/* The observation layouts: per entry the channel and what of it. */
enum { OBS_COS = 0x00, OBS_SIN = 0x10, OBS_POS = 0x20, OBS_VEL = 0x30, OBS_END = 0xFF };
static const uint8_t OBS_LAYOUT[3][FW_MAX_OBS + 1] = {
    /* pendulum: cos th, sin th, thd */
    {OBS_COS, OBS_SIN, OBS_VEL, OBS_END},
    /* cart-pole: x, xd, cos th, sin th, thd (channel 0 the cart, 1 the pole) */
    {OBS_POS, OBS_VEL, OBS_COS | 1, OBS_SIN | 1, OBS_VEL | 1, OBS_END},
    /* Furuta: cos th, sin th, cos al, sin al, thd, ald (0 the arm th, 1 the pendulum al) */
    {OBS_COS, OBS_SIN, OBS_COS | 1, OBS_SIN | 1, OBS_VEL, OBS_VEL | 1, OBS_END}};

uint8_t fw_observation(const fw_device *d, float *obs)
{
  const uint8_t *layout = OBS_LAYOUT[d->cfg.system < 3 ? d->cfg.system : 2];
  uint8_t i = 0;
  for (; layout[i] != OBS_END; ++i) {
    const uint8_t c = layout[i] & 15u, what = layout[i] & 0xF0u;
    if (what == OBS_VEL) {
      obs[i] = d->vel[c] * d->obs_unit[c];
      continue;
    }
    int32_t n = d->prev_counts[c];
    const int32_t turn = d->obs_turn[c];
    if (turn && (n >= turn || n <= -turn)) n %= turn;  /* a 32-bit division: only when due */
    const float q = (float)n * d->obs_unit[c];
    obs[i] = what == OBS_COS ? cosf(q) : what == OBS_SIN ? sinf(q) : q;
  }
  return i;
}

/* ---------------------------------------------------------------- the tick */
/* The watchdog's measure: how old the information the actuator would act on
 * is at this tick's due time, so that a tick the device itself ran late
 * does not count against the host; at most watchdog_us of lateness is
 * forgiven (a back-end that passes a wrong due time still trips within
 * twice the watchdog). Information from after the due time (a late STATE
 * answered before this tick, an ARM that came late) is 0 old: it is never
 * after the tick's start (an accepted command answers a STATE already sent),
 * so it is at most watchdog_us after the due time; anything else is past
 * information, however old (a command may answer a STATE up to 2^31 - 1 us
 * before the newest). In 32 bits, modulo 2^32 (64-bit arithmetic costs ~300
 * bytes more on AVR): exact for ages below 2^32 - watchdog_us, as the device
 * ticks every period and trips within 10 s. */
static uint32_t info_age_us(const fw_device *d, uint32_t now, uint32_t late_us)
{
  if (late_us > d->cfg.watchdog_us) late_us = d->cfg.watchdog_us;
  const uint32_t due = now - late_us;
  const uint32_t after_due = (uint32_t)d->info_t_us - due;
  return after_due <= d->cfg.watchdog_us ? 0 : due - (uint32_t)d->info_t_us;
}

/* The command for this tick in CONTROL_HOST: the newest one received. */
static void apply_host_command(fw_device *d)
{
  if (d->have_pending) {
    uint8_t clamped;
    d->applied_u = clamp_u(d, d->pending_u, &clamped);
    d->applied_seq = d->pending_seq;
    d->applied_flags = (uint8_t)((d->pending_fresh ? FLAG_FRESH : 0) | (clamped ? FLAG_CLAMPED : 0));
    d->have_pending = 0;
  } else {
    d->applied_flags &= (uint8_t)~FLAG_FRESH;  /* holding the last command */
  }
  if (!(d->applied_flags & FLAG_FRESH)) count(d, COUNTER_STALE_TICKS);
}

/* The command for this tick in CONTROL_ON_DEVICE: the linked controller's. */
static void apply_device_command(fw_device *d)
{
  float obs[FW_MAX_OBS];
  float u = 0.0f;
  fw_observation(d, obs);
  if (d->hw.controller(d->hw.ctx, obs, &u) != 0 || !isfinite(u)) {
    enter_fault(d, FAULT_BAD_COMMAND);
    return;
  }
  uint8_t clamped;
  d->applied_u = clamp_u(d, u, &clamped);
  d->applied_seq = d->last_cmd_seq;
  d->applied_flags = (uint8_t)(FLAG_FRESH | FLAG_ON_DEVICE | (clamped ? FLAG_CLAMPED : 0));
}

FW_NOINLINE void fw_tick(fw_device *d, uint32_t due_us)
{
  const uint64_t now = d->hw.micros(d->hw.ctx);
  int32_t counts[PROTO_MAX_CHANNELS] = {0};
  d->hw.read_sensors(d->hw.ctx, counts);
  const uint32_t dt = elapsed_us(now, d->prev_t_us);
  /* (a tick 71 minutes after the last one, or a clock that went back, keeps
   * the estimate as it was) */
  if (d->have_prev && dt != 0 && dt != 0xFFFFFFFFu) {
    /* finite difference through a first-order low-pass: one count per
     * period is a large velocity step, the filter smooths it */
    const uint32_t off = dt > d->cfg.period_us ? dt - d->cfg.period_us : d->cfg.period_us - dt;
    /* a tick off its time (after a stall, two ticks close together) gets the
     * coefficient of its own dt: a short dt must not weigh in fully */
    const float alpha = off <= d->cfg.period_us / 16 ? d->vel_alpha : vel_alpha(d, dt);
    const float per_s = 1e6f / (float)dt;
    for (int c = 0; c < d->cfg.n_channels; ++c) {
      const float raw = count_delta(counts[c], d->prev_counts[c]) * per_s;
      d->vel[c] += alpha * (raw - d->vel[c]);
    }
  }
  memcpy(d->prev_counts, counts, sizeof counts);
  d->prev_t_us = now;
  d->have_prev = 1;
  d->ticks++;
  uint32_t late_us = (uint32_t)now - due_us;  /* modulo 2^32; a due time ahead: on time */
  if (late_us >= 0x80000000u) late_us = 0;
  const uint8_t late = late_us >= d->cfg.period_us;
  if (late) count(d, COUNTER_LATE_TICKS);

  if (d->mode == MODE_ARMED) {
    const uint8_t limit = limit_fault(d);
    if (info_age_us(d, (uint32_t)now, late_us) > d->cfg.watchdog_us) enter_fault(d, FAULT_WATCHDOG);
    else if (limit != FAULT_NONE) enter_fault(d, limit);
  }
  if (d->mode == MODE_ARMED) {
    if (d->control_source == CONTROL_ON_DEVICE) apply_device_command(d);
    else apply_host_command(d);
  }
  if (d->mode != MODE_ARMED) {
    d->applied_u = 0.0f;
    d->applied_flags = 0;
  }
  d->hw.write_actuator(d->hw.ctx, d->applied_u);

  proto_state s;
  s.t_us = now;
  s.cmd_seq = d->applied_seq;
  s.latency_us = d->rx_latency_max_us;
  d->rx_latency_max_us = LATENCY_UNKNOWN;
  s.actuator = d->applied_u;
  s.mode = d->mode;
  s.fault = d->fault;
  s.flags = (uint8_t)(d->applied_flags | (late ? FLAG_LATE : 0) | d->extra_flags);
  s.n = d->cfg.n_channels;
  memcpy(s.pos, counts, sizeof s.pos);
  memset(s.vel, 0, sizeof s.vel);
  for (int c = 0; c < s.n; ++c) {  /* the channels the frame carries (a float conversion each) */
    const float v = d->vel[c];  /* saturate: lroundf beyond int32 is undefined */
    s.vel[c] = v >= 2147483520.0f ? INT32_MAX : v <= -2147483520.0f ? INT32_MIN : (int32_t)lroundf(v);
  }
  const uint32_t seq = d->tx_seq;
  send(d, MSG_STATE, proto_pack_state(&s, TX_PAYLOAD(d)));
  d->last_state_seq = seq;
  d->have_state = 1;
}
