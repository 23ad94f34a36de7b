/*
 * The grpo-ctrl serial protocol, version 2 (specified in ../PROTOCOL.md).
 *
 * A frame is   version u8 | type u8 | seq u32 | payload | crc32 u32
 * (little-endian; CRC-32/ISO-HDLC, as zlib's crc32, over everything before
 * it), COBS-encoded and followed by one 0x00 delimiter. Each sender numbers
 * every frame it sends, so the receiver can count lost frames.
 *
 * C99, no allocation, no stdio: the same file builds for a board and the host.
 */
#ifndef GRPO_PROTO_H
#define GRPO_PROTO_H

#include <stddef.h>
#include <stdint.h>

#define PROTO_VERSION 3
#define PROTO_MAX_CHANNELS 4
#define PROTO_MAX_PAYLOAD 96  /* INFO */
#define PROTO_HEADER_LEN 6
#define PROTO_CRC_LEN 4
#define PROTO_MAX_RAW (PROTO_HEADER_LEN + PROTO_MAX_PAYLOAD + PROTO_CRC_LEN)
/* COBS adds one byte per 254 (at most) plus one; then the delimiter */
#define PROTO_MAX_WIRE (PROTO_MAX_RAW + PROTO_MAX_RAW / 254 + 2)
#define PROTO_PRESET_LEN 16

/* Message types: host -> device below 0x80, device -> host from 0x80. */
enum {
  MSG_HELLO = 0x01,      /* u8 protocol version of the host */
  MSG_ARM = 0x02,        /* empty */
  MSG_DISARM = 0x03,     /* empty; also clears a fault */
  MSG_COMMAND = 0x04,    /* f32 actuator, u32 seq and u32 time of the state it answers */
  MSG_HEARTBEAT = 0x05,  /* empty; answered by STATUS */
  MSG_PARAM_GET = 0x06,  /* u16 id */
  MSG_PARAM_SET = 0x07,  /* u16 id, f32 value */
  MSG_STATE = 0x80,      /* streamed once per control period */
  MSG_INFO = 0x81,       /* answer to HELLO */
  MSG_ACK = 0x82,        /* answer to ARM and DISARM (and to a refused HELLO) */
  MSG_STATUS = 0x83,     /* answer to HEARTBEAT */
  MSG_FAULT = 0x84,      /* sent unprompted on entering the fault mode */
  MSG_PARAM = 0x86       /* answer to PARAM_GET and PARAM_SET */
};

/* Device modes, faults, STATE flags, ACK and PARAM results. */
enum { MODE_DISARMED = 0, MODE_ARMED = 1, MODE_FAULT = 2 };
enum {
  FAULT_NONE = 0,
  FAULT_WATCHDOG = 1,        /* no valid command for watchdog_us while armed */
  FAULT_POSITION_LIMIT = 2,  /* |position| beyond its limit while armed */
  FAULT_VELOCITY_LIMIT = 3,  /* |velocity| beyond its limit while armed */
  FAULT_BAD_COMMAND = 4      /* a NaN or infinite command (or the on-device
                                controller failed) */
};
enum {
  FLAG_FRESH = 1,    /* the command in effect answers the previous STATE */
  FLAG_CLAMPED = 2,  /* the command in effect was clamped to the limit */
  FLAG_LATE = 4,     /* this tick started more than a period late */
  FLAG_HELD = 8,     /* HIL only: the plant is held at its start state */
  FLAG_ON_DEVICE = 16  /* the command in effect is the on-device controller's */
};
enum { RESULT_OK = 0, RESULT_FAULT_ACTIVE = 1, RESULT_LIMITS = 2, RESULT_BAD_REQUEST = 3,
       RESULT_UNKNOWN_PARAM = 4, RESULT_READ_ONLY = 5, RESULT_OUT_OF_RANGE = 6,
       RESULT_BUSY = 7 };

/* Parameters (PARAM_GET / PARAM_SET), all carried as f32. */
enum {
  PARAM_WATCHDOG_US = 0,   /* rw while disarmed, >= one control period */
  PARAM_U_LIMIT = 1,       /* rw, command clamp, 0 < v <= hardware u_max */
  PARAM_POS_LIMIT0 = 2,    /* rw while disarmed, counts, 0 = none; +c for channel c */
  PARAM_VEL_LIMIT0 = 6,    /* rw while disarmed, counts/s, 0 = none; +c for channel c */
  PARAM_VEL_CUTOFF_HZ = 10,  /* rw, velocity low-pass cutoff, 0 = none */
  PARAM_PERIOD_US = 11,    /* read-only */
  PARAM_DEVICE_ID = 12,    /* read-only */
  PARAM_CONTROL_SOURCE = 13,  /* rw while disarmed: 0 host, 1 on-device controller */
  PARAM_COUNT = 14
};
enum { CONTROL_HOST = 0, CONTROL_ON_DEVICE = 1 };

typedef struct {
  uint8_t type;
  uint32_t seq;
  uint8_t len;                          /* payload length */
  uint8_t payload[PROTO_MAX_PAYLOAD];
} proto_frame;

typedef struct {
  uint64_t t_us;          /* device clock at the tick */
  uint32_t cmd_seq;       /* host seq of the command in effect */
  uint32_t latency_us;    /* the worst latency (a STATE's tick to the arrival
                             of the command answering it) among the commands
                             received since the last tick; 0xFFFFFFFF: none */
  float actuator;         /* value written to the actuator this tick */
  uint8_t mode, fault, flags, n;
  int32_t pos[PROTO_MAX_CHANNELS];  /* counts, zero at upright / centre */
  int32_t vel[PROTO_MAX_CHANNELS];  /* counts per second, device estimate */
} proto_state;

typedef struct {
  float u;
  uint32_t state_seq;     /* frame seq of the STATE this command answers */
  uint32_t state_t_us;    /* that STATE's t_us, low 32 bits (for the latency) */
} proto_command;

typedef struct {
  uint8_t protocol_version, system, n_channels, angle_mask;
  uint32_t device_id, period_us;
  float u_max;                                /* hardware actuator limit */
  float u_limit;                              /* command clamp now, <= u_max */
  float counts_per_unit[PROTO_MAX_CHANNELS];  /* per revolution or per metre */
  uint32_t watchdog_us;
  char preset[PROTO_PRESET_LEN];              /* NUL-padded */
  uint16_t firmware_version;
  uint8_t controller;                         /* 1: an on-device controller is linked */
  uint8_t control_source;                     /* CONTROL_HOST or CONTROL_ON_DEVICE */
  float vel_cutoff_hz;
  float pos_limit[PROTO_MAX_CHANNELS];        /* counts, 0 = none */
  float vel_limit[PROTO_MAX_CHANNELS];        /* counts/s, 0 = none */
} proto_info;

typedef struct {
  uint8_t acked_type;
  uint32_t acked_seq;
  uint8_t result, mode;
} proto_ack;

/* STATUS counters, in their wire order (PROTOCOL.md's counter table; the
 * names are the host codec's field names). An array, not twelve fields: on
 * AVR each 32-bit field copied by name costs ~36 B of code. */
enum {
  COUNTER_RX_FRAMES, COUNTER_RX_CRC_ERRORS, COUNTER_RX_BAD_FRAMES, COUNTER_RX_OVERFLOWS,
  COUNTER_TX_FRAMES, COUNTER_WATCHDOG_TRIPS, COUNTER_STALE_TICKS, COUNTER_LATE_TICKS,
  COUNTER_STALE_COMMANDS, COUNTER_IGNORED_COMMANDS, COUNTER_TX_DROPPED_STATES,
  COUNTER_TX_DROPPED_REPLIES, PROTO_COUNTERS
};

typedef struct {
  uint8_t mode, fault;
  uint64_t t_us, info_t_us;
  uint32_t counter[PROTO_COUNTERS];  /* COUNTER_* */
} proto_status;

typedef struct {
  uint16_t id;
  uint8_t result;
  float value;
} proto_param;

/* Payload lengths (STATE: STATE_FIXED_LEN + 8 n). */
#define PROTO_STATE_FIXED_LEN 24
#define PROTO_COMMAND_LEN 12
#define PROTO_INFO_LEN 96
#define PROTO_ACK_LEN 7
#define PROTO_STATUS_LEN 66
#define PROTO_PARAM_LEN 7
#define PROTO_PARAM_SET_LEN 6

uint32_t proto_crc32(const uint8_t *data, size_t n);
/* COBS without the delimiter (decode may write over its input: out == in).
 * encode returns the output length; decode
 * returns it too, or -1 if the input is not valid COBS or exceeds cap. */
size_t proto_cobs_encode(const uint8_t *in, size_t n, uint8_t *out);
int proto_cobs_decode(const uint8_t *in, size_t n, uint8_t *out, size_t cap);

/* Whole frame to wire bytes (COBS + 0x00); out needs PROTO_MAX_WIRE bytes.
 * Returns the byte count, 0 if the payload is too long. */
size_t proto_encode(const proto_frame *f, uint8_t *out);
/* The same for a payload of len bytes already at out + PROTO_WIRE_PAYLOAD
 * (where a device packs it: no frame to copy it from). */
#define PROTO_WIRE_PAYLOAD (1 + PROTO_HEADER_LEN)
size_t proto_encode_in_place(uint8_t *out, uint8_t type, uint32_t seq, uint8_t len);
/* The payload length a message of this type must have (STATE: given its n
 * byte), or -1 for an unknown type or bad n. */
int proto_expected_len(uint8_t type, const uint8_t *payload, uint8_t len);

/* Which types a decoder accepts: a device takes host-to-device types only, a
 * host device-to-host types only (a frame of the other direction is a bad
 * frame); tests may take both. */
enum { PROTO_FROM_HOST = 1, PROTO_FROM_DEVICE = 2, PROTO_FROM_EITHER = 3 };
/* the direction bit of a known type, 0 for an unknown one */
uint8_t proto_type_direction(uint8_t type);

/* Stream decoder: feed bytes one at a time; garbage is skipped up to the
 * next 0x00 and counted. */
typedef struct {
  uint8_t buf[PROTO_MAX_WIRE];
  uint8_t n;
  uint8_t overflow;
  uint8_t accept;          /* PROTO_FROM_* */
  uint32_t frames, crc_errors, bad_frames, overflows;
} proto_decoder;

void proto_decoder_init(proto_decoder *d, uint8_t accept);
/* Returns 1 when byte completes a valid frame, written to *out; else 0. */
int proto_decoder_push(proto_decoder *d, uint8_t byte, proto_frame *out);

/* Fixed layouts. pack returns the payload length; unpack returns 0 on
 * success, -1 if the length is wrong. */
uint8_t proto_pack_state(const proto_state *s, uint8_t *p);
int proto_unpack_state(const uint8_t *p, uint8_t len, proto_state *s);
uint8_t proto_pack_command(const proto_command *c, uint8_t *p);
int proto_unpack_command(const uint8_t *p, uint8_t len, proto_command *c);
uint8_t proto_pack_info(const proto_info *i, uint8_t *p);
int proto_unpack_info(const uint8_t *p, uint8_t len, proto_info *i);
uint8_t proto_pack_ack(const proto_ack *a, uint8_t *p);
int proto_unpack_ack(const uint8_t *p, uint8_t len, proto_ack *a);
uint8_t proto_pack_status(const proto_status *s, uint8_t *p);
int proto_unpack_status(const uint8_t *p, uint8_t len, proto_status *s);
uint8_t proto_pack_param(const proto_param *q, uint8_t *p);
int proto_unpack_param(const uint8_t *p, uint8_t len, proto_param *q);
/* PARAM_GET (id) and PARAM_SET (id, value) requests; result is left 0. */
uint8_t proto_pack_param_request(uint8_t type, const proto_param *q, uint8_t *p);
int proto_unpack_param_request(uint8_t type, const uint8_t *p, uint8_t len, proto_param *q);

#endif /* GRPO_PROTO_H */
