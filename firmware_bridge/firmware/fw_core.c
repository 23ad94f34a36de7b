/* The device firmware core (see fw_core.h). */
#include "fw_core.h"

#include <math.h>
#include <string.h>

#define LATENCY_UNKNOWN 0xFFFFFFFFu

static uint32_t watchdog_us(const fw_device *d)
{
  return d->cfg.watchdog_us ? d->cfg.watchdog_us : 2 * d->cfg.period_us;
}

void fw_init(fw_device *d, const fw_config *cfg, const fw_hw *hw)
{
  memset(d, 0, sizeof *d);
  d->cfg = *cfg;
  if (d->cfg.n_channels > PROTO_MAX_CHANNELS) d->cfg.n_channels = PROTO_MAX_CHANNELS;
  d->cfg.watchdog_us = watchdog_us(d);
  if (!(d->cfg.vel_cutoff_hz >= 0.0f)) d->cfg.vel_cutoff_hz = 0.0f;
  d->hw = *hw;
  proto_decoder_init(&d->rx);
  d->mode = MODE_DISARMED;
  d->u_limit = cfg->u_max;
  d->rx_latency_max_us = LATENCY_UNKNOWN;
  d->hw.write_actuator(d->hw.ctx, 0.0f);
}

/* ---------------------------------------------------------------- output */
static void send(fw_device *d, uint8_t type, const uint8_t *payload, uint8_t len)
{
  proto_frame f;
  uint8_t wire[PROTO_MAX_WIRE];
  f.type = type;
  f.seq = d->tx_seq++;
  f.len = len;
  memcpy(f.payload, payload, len);
  const size_t n = proto_encode(&f, wire);
  d->hw.serial_write(d->hw.ctx, wire, n);
  d->tx_frames++;
}

static void send_ack(fw_device *d, const proto_frame *req, uint8_t result)
{
  const proto_ack a = {req->type, req->seq, result, d->mode};
  uint8_t p[PROTO_ACK_LEN];
  send(d, MSG_ACK, p, proto_pack_ack(&a, p));
}

static void send_status(fw_device *d, uint8_t type)
{
  proto_status s;
  uint8_t p[PROTO_STATUS_LEN];
  s.mode = d->mode;
  s.fault = d->fault;
  s.t_us = d->hw.micros(d->hw.ctx);
  s.last_cmd_t_us = d->last_cmd_t_us;
  s.rx_frames = d->rx.frames;
  s.rx_crc_errors = d->rx.crc_errors;
  s.rx_bad_frames = d->rx.bad_frames;
  s.rx_overflows = d->rx.overflows;
  s.tx_frames = d->tx_frames;
  s.watchdog_trips = d->watchdog_trips;
  s.stale_ticks = d->stale_ticks;
  s.late_ticks = d->late_ticks;
  send(d, type, p, proto_pack_status(&s, p));
}

static void send_info(fw_device *d)
{
  proto_info i;
  uint8_t p[PROTO_INFO_LEN];
  memset(&i, 0, sizeof i);
  i.protocol_version = PROTO_VERSION;
  i.system = d->cfg.system;
  i.n_channels = d->cfg.n_channels;
  i.angle_mask = d->cfg.angle_mask;
  i.device_id = d->cfg.device_id;
  i.period_us = d->cfg.period_us;
  i.u_max = d->u_limit;
  memcpy(i.counts_per_unit, d->cfg.counts_per_unit, sizeof i.counts_per_unit);
  i.watchdog_us = d->cfg.watchdog_us;
  memcpy(i.preset, d->cfg.preset, PROTO_PRESET_LEN);
  i.firmware_version = FW_VERSION;
  send(d, MSG_INFO, p, proto_pack_info(&i, p));
}

/* ---------------------------------------------------------------- modes */
static void stop_actuator(fw_device *d)
{
  d->applied_u = 0.0f;
  d->have_pending = 0;
  d->hw.write_actuator(d->hw.ctx, 0.0f);
}

static void enter_fault(fw_device *d, uint8_t fault)
{
  stop_actuator(d);
  d->mode = MODE_FAULT;
  d->fault = fault;
  if (fault == FAULT_WATCHDOG) d->watchdog_trips++;
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
  else return RESULT_UNKNOWN_PARAM;
  return RESULT_OK;
}

static uint8_t param_set(fw_device *d, uint16_t id, float v)
{
  float ignored;
  if (param_get(d, id, &ignored) != RESULT_OK) return RESULT_UNKNOWN_PARAM;
  if (id == PARAM_PERIOD_US || id == PARAM_DEVICE_ID) return RESULT_READ_ONLY;
  if (!isfinite(v)) return RESULT_OUT_OF_RANGE;
  if (id == PARAM_U_LIMIT) {  /* lowering the clamp is safe at any time */
    if (!(v > 0 && v <= d->cfg.u_max)) return RESULT_OUT_OF_RANGE;
    d->u_limit = v;
    return RESULT_OK;
  }
  if (id == PARAM_VEL_CUTOFF_HZ) {
    if (!(v >= 0 && v <= 1e5f)) return RESULT_OUT_OF_RANGE;
    d->cfg.vel_cutoff_hz = v;
    return RESULT_OK;
  }
  if (d->mode == MODE_ARMED) return RESULT_BUSY;  /* safety settings: disarmed only */
  if (id == PARAM_WATCHDOG_US) {
    if (!(v >= (float)d->cfg.period_us && v <= 10e6f)) return RESULT_OUT_OF_RANGE;
    d->cfg.watchdog_us = (uint32_t)v;
  } else {
    if (v < 0) return RESULT_OUT_OF_RANGE;
    if (id < PARAM_VEL_LIMIT0) d->cfg.pos_limit[id - PARAM_POS_LIMIT0] = v;
    else d->cfg.vel_limit[id - PARAM_VEL_LIMIT0] = v;
  }
  return RESULT_OK;
}

/* ---------------------------------------------------------------- input */
static void on_command(fw_device *d, const proto_frame *f, uint64_t now)
{
  proto_command c;
  if (d->mode != MODE_ARMED || proto_unpack_command(f->payload, f->len, &c) != 0) return;
  if (!isfinite(c.u)) {
    enter_fault(d, FAULT_BAD_COMMAND);
    return;
  }
  d->pending_clamped = c.u > d->u_limit || c.u < -d->u_limit;
  d->pending_u = c.u > d->u_limit ? d->u_limit : (c.u < -d->u_limit ? -d->u_limit : c.u);
  d->pending_seq = f->seq;
  d->pending_fresh_for = c.state_seq == d->last_state_seq && d->hist_n > 0;
  /* the latency of this command: its STATE's tick to now. Every command
   * counts, including a late one that a fresher one overwrites. */
  for (uint32_t k = 0; k < FW_STATE_HISTORY && k < d->hist_n; ++k) {
    if (d->hist_seq[k] == c.state_seq) {
      const uint32_t latency = (uint32_t)(now - d->hist_t_us[k]);
      if (d->rx_latency_max_us == LATENCY_UNKNOWN || latency > d->rx_latency_max_us)
        d->rx_latency_max_us = latency;
      break;
    }
  }
  d->have_pending = 1;
  d->last_cmd_t_us = now;
}

static void on_frame(fw_device *d, const proto_frame *f)
{
  const uint64_t now = d->hw.micros(d->hw.ctx);
  switch (f->type) {
  case MSG_COMMAND: on_command(d, f, now); break;
  case MSG_HELLO: send_info(d); break;
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
        d->last_cmd_t_us = now;  /* the first command is due within the watchdog time */
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
    uint8_t p[PROTO_PARAM_LEN];
    if (proto_unpack_param_request(f->type, f->payload, f->len, &q) != 0) break;
    q.result = f->type == MSG_PARAM_SET ? param_set(d, q.id, q.value) : RESULT_OK;
    /* reply with the value now in effect (0 for an unknown id) */
    const uint8_t known = param_get(d, q.id, &q.value);
    if (known != RESULT_OK) {
      q.result = known;
      q.value = 0.0f;
    }
    send(d, MSG_PARAM, p, proto_pack_param(&q, p));
    break;
  }
  default: break;  /* device-to-host types echoed back: ignore */
  }
}

void fw_receive(fw_device *d, const uint8_t *bytes, size_t n)
{
  proto_frame f;
  for (size_t i = 0; i < n; ++i)
    if (proto_decoder_push(&d->rx, bytes[i], &f)) on_frame(d, &f);
}

/* ---------------------------------------------------------------- the tick */
void fw_tick(fw_device *d)
{
  const uint64_t now = d->hw.micros(d->hw.ctx);
  int32_t counts[PROTO_MAX_CHANNELS] = {0};
  d->hw.read_sensors(d->hw.ctx, counts);
  if (d->have_prev && now > d->prev_t_us) {
    /* finite difference through a first-order low-pass: one count per
     * period is a large velocity step, the filter smooths it */
    const float dt = (float)(now - d->prev_t_us) * 1e-6f;
    const float fc = d->cfg.vel_cutoff_hz;
    const float alpha = fc > 0 ? 1.0f - expf(-6.2831853f * fc * dt) : 1.0f;
    for (int c = 0; c < d->cfg.n_channels; ++c) {
      const float raw = (float)(counts[c] - d->prev_counts[c]) / dt;
      d->vel[c] += alpha * (raw - d->vel[c]);
    }
  }
  memcpy(d->prev_counts, counts, sizeof counts);
  d->prev_t_us = now;
  d->have_prev = 1;
  d->ticks++;
  if (d->tick_late) d->late_ticks++;

  if (d->mode == MODE_ARMED) {
    const uint8_t limit = limit_fault(d);
    if (now - d->last_cmd_t_us >= d->cfg.watchdog_us) enter_fault(d, FAULT_WATCHDOG);
    else if (limit != FAULT_NONE) enter_fault(d, limit);
  }
  if (d->mode == MODE_ARMED) {
    if (d->have_pending) {
      d->applied_u = d->pending_u;
      d->applied_seq = d->pending_seq;
      d->applied_flags = (uint8_t)((d->pending_fresh_for ? FLAG_FRESH : 0) |
                                   (d->pending_clamped ? FLAG_CLAMPED : 0));
      d->have_pending = 0;
    } else {
      d->applied_flags &= (uint8_t)~FLAG_FRESH;  /* holding the last command */
    }
    if (!(d->applied_flags & FLAG_FRESH)) d->stale_ticks++;
  } else {
    d->applied_u = 0.0f;
    d->applied_flags = 0;
  }
  d->hw.write_actuator(d->hw.ctx, d->applied_u);

  proto_state s;
  uint8_t p[PROTO_MAX_PAYLOAD];
  s.t_us = now;
  s.cmd_seq = d->applied_seq;
  s.latency_us = d->rx_latency_max_us;
  d->rx_latency_max_us = LATENCY_UNKNOWN;
  s.actuator = d->applied_u;
  s.mode = d->mode;
  s.fault = d->fault;
  s.flags = (uint8_t)(d->applied_flags | (d->tick_late ? FLAG_LATE : 0) | d->extra_flags);
  s.n = d->cfg.n_channels;
  for (int c = 0; c < PROTO_MAX_CHANNELS; ++c) {
    s.pos[c] = counts[c];
    const float v = d->vel[c];  /* saturate: lroundf beyond int32 is undefined */
    s.vel[c] = v >= 2147483520.0f ? INT32_MAX : v <= -2147483520.0f ? INT32_MIN : (int32_t)lroundf(v);
  }
  const uint32_t seq = d->tx_seq;
  send(d, MSG_STATE, p, proto_pack_state(&s, p));
  d->last_state_seq = seq;
  d->hist_seq[d->hist_n % FW_STATE_HISTORY] = seq;
  d->hist_t_us[d->hist_n % FW_STATE_HISTORY] = now;
  d->hist_n++;
}
