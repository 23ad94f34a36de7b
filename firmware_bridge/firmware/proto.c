/* The protocol codec: CRC, COBS, framing and the fixed payload layouts. */
#include "proto.h"

#include <string.h>

/* ---------------------------------------------------------------- CRC-32
 * CRC-32/ISO-HDLC (zlib, Ethernet): reflected polynomial 0xEDB88320, initial
 * and final XOR 0xFFFFFFFF, a byte at a time. On AVR through two 16-entry
 * tables in flash (the Uno has no kilobyte of flash to spare with a policy
 * linked in); elsewhere through the 256-entry table (1 KB: on a Cortex-M4 a
 * STATE's CRC in half the cycles of the nibble-at-a-time loop). */
#if defined(__AVR__)  /* constants stay in flash: RAM is 2 KB */
#include <avr/pgmspace.h>
/* the byte table's entries for the low and the high nibble: the table is
 * linear, T[b] = T[b & 15] ^ T[b & 0xF0], so a byte takes two flash reads and
 * a shift by 8 (byte moves; a 32-bit shift by 4 is a loop on AVR) */
static const uint32_t CRC_LOW[16] PROGMEM = {
    0x00000000u, 0x77073096u, 0xEE0E612Cu, 0x990951BAu, 0x076DC419u, 0x706AF48Fu,
    0xE963A535u, 0x9E6495A3u, 0x0EDB8832u, 0x79DCB8A4u, 0xE0D5E91Eu, 0x97D2D988u,
    0x09B64C2Bu, 0x7EB17CBDu, 0xE7B82D07u, 0x90BF1D91u};
static const uint32_t CRC_HIGH[16] PROGMEM = {
    0x00000000u, 0x1DB71064u, 0x3B6E20C8u, 0x26D930ACu, 0x76DC4190u, 0x6B6B51F4u,
    0x4DB26158u, 0x5005713Cu, 0xEDB88320u, 0xF00F9344u, 0xD6D6A3E8u, 0xCB61B38Cu,
    0x9B64C2B0u, 0x86D3D2D4u, 0xA00AE278u, 0xBDBDF21Cu};

uint32_t proto_crc32(const uint8_t *data, size_t n)
{
  uint32_t crc = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    const uint8_t b = (uint8_t)crc ^ data[i];
    crc = (crc >> 8) ^ pgm_read_dword(&CRC_LOW[b & 15u]) ^ pgm_read_dword(&CRC_HIGH[b >> 4]);
  }
  return crc ^ 0xFFFFFFFFu;
}
#else
static const uint32_t CRC_BYTE[256] = {
    0x00000000u, 0x77073096u, 0xEE0E612Cu, 0x990951BAu, 0x076DC419u, 0x706AF48Fu,
    0xE963A535u, 0x9E6495A3u, 0x0EDB8832u, 0x79DCB8A4u, 0xE0D5E91Eu, 0x97D2D988u,
    0x09B64C2Bu, 0x7EB17CBDu, 0xE7B82D07u, 0x90BF1D91u, 0x1DB71064u, 0x6AB020F2u,
    0xF3B97148u, 0x84BE41DEu, 0x1ADAD47Du, 0x6DDDE4EBu, 0xF4D4B551u, 0x83D385C7u,
    0x136C9856u, 0x646BA8C0u, 0xFD62F97Au, 0x8A65C9ECu, 0x14015C4Fu, 0x63066CD9u,
    0xFA0F3D63u, 0x8D080DF5u, 0x3B6E20C8u, 0x4C69105Eu, 0xD56041E4u, 0xA2677172u,
    0x3C03E4D1u, 0x4B04D447u, 0xD20D85FDu, 0xA50AB56Bu, 0x35B5A8FAu, 0x42B2986Cu,
    0xDBBBC9D6u, 0xACBCF940u, 0x32D86CE3u, 0x45DF5C75u, 0xDCD60DCFu, 0xABD13D59u,
    0x26D930ACu, 0x51DE003Au, 0xC8D75180u, 0xBFD06116u, 0x21B4F4B5u, 0x56B3C423u,
    0xCFBA9599u, 0xB8BDA50Fu, 0x2802B89Eu, 0x5F058808u, 0xC60CD9B2u, 0xB10BE924u,
    0x2F6F7C87u, 0x58684C11u, 0xC1611DABu, 0xB6662D3Du, 0x76DC4190u, 0x01DB7106u,
    0x98D220BCu, 0xEFD5102Au, 0x71B18589u, 0x06B6B51Fu, 0x9FBFE4A5u, 0xE8B8D433u,
    0x7807C9A2u, 0x0F00F934u, 0x9609A88Eu, 0xE10E9818u, 0x7F6A0DBBu, 0x086D3D2Du,
    0x91646C97u, 0xE6635C01u, 0x6B6B51F4u, 0x1C6C6162u, 0x856530D8u, 0xF262004Eu,
    0x6C0695EDu, 0x1B01A57Bu, 0x8208F4C1u, 0xF50FC457u, 0x65B0D9C6u, 0x12B7E950u,
    0x8BBEB8EAu, 0xFCB9887Cu, 0x62DD1DDFu, 0x15DA2D49u, 0x8CD37CF3u, 0xFBD44C65u,
    0x4DB26158u, 0x3AB551CEu, 0xA3BC0074u, 0xD4BB30E2u, 0x4ADFA541u, 0x3DD895D7u,
    0xA4D1C46Du, 0xD3D6F4FBu, 0x4369E96Au, 0x346ED9FCu, 0xAD678846u, 0xDA60B8D0u,
    0x44042D73u, 0x33031DE5u, 0xAA0A4C5Fu, 0xDD0D7CC9u, 0x5005713Cu, 0x270241AAu,
    0xBE0B1010u, 0xC90C2086u, 0x5768B525u, 0x206F85B3u, 0xB966D409u, 0xCE61E49Fu,
    0x5EDEF90Eu, 0x29D9C998u, 0xB0D09822u, 0xC7D7A8B4u, 0x59B33D17u, 0x2EB40D81u,
    0xB7BD5C3Bu, 0xC0BA6CADu, 0xEDB88320u, 0x9ABFB3B6u, 0x03B6E20Cu, 0x74B1D29Au,
    0xEAD54739u, 0x9DD277AFu, 0x04DB2615u, 0x73DC1683u, 0xE3630B12u, 0x94643B84u,
    0x0D6D6A3Eu, 0x7A6A5AA8u, 0xE40ECF0Bu, 0x9309FF9Du, 0x0A00AE27u, 0x7D079EB1u,
    0xF00F9344u, 0x8708A3D2u, 0x1E01F268u, 0x6906C2FEu, 0xF762575Du, 0x806567CBu,
    0x196C3671u, 0x6E6B06E7u, 0xFED41B76u, 0x89D32BE0u, 0x10DA7A5Au, 0x67DD4ACCu,
    0xF9B9DF6Fu, 0x8EBEEFF9u, 0x17B7BE43u, 0x60B08ED5u, 0xD6D6A3E8u, 0xA1D1937Eu,
    0x38D8C2C4u, 0x4FDFF252u, 0xD1BB67F1u, 0xA6BC5767u, 0x3FB506DDu, 0x48B2364Bu,
    0xD80D2BDAu, 0xAF0A1B4Cu, 0x36034AF6u, 0x41047A60u, 0xDF60EFC3u, 0xA867DF55u,
    0x316E8EEFu, 0x4669BE79u, 0xCB61B38Cu, 0xBC66831Au, 0x256FD2A0u, 0x5268E236u,
    0xCC0C7795u, 0xBB0B4703u, 0x220216B9u, 0x5505262Fu, 0xC5BA3BBEu, 0xB2BD0B28u,
    0x2BB45A92u, 0x5CB36A04u, 0xC2D7FFA7u, 0xB5D0CF31u, 0x2CD99E8Bu, 0x5BDEAE1Du,
    0x9B64C2B0u, 0xEC63F226u, 0x756AA39Cu, 0x026D930Au, 0x9C0906A9u, 0xEB0E363Fu,
    0x72076785u, 0x05005713u, 0x95BF4A82u, 0xE2B87A14u, 0x7BB12BAEu, 0x0CB61B38u,
    0x92D28E9Bu, 0xE5D5BE0Du, 0x7CDCEFB7u, 0x0BDBDF21u, 0x86D3D2D4u, 0xF1D4E242u,
    0x68DDB3F8u, 0x1FDA836Eu, 0x81BE16CDu, 0xF6B9265Bu, 0x6FB077E1u, 0x18B74777u,
    0x88085AE6u, 0xFF0F6A70u, 0x66063BCAu, 0x11010B5Cu, 0x8F659EFFu, 0xF862AE69u,
    0x616BFFD3u, 0x166CCF45u, 0xA00AE278u, 0xD70DD2EEu, 0x4E048354u, 0x3903B3C2u,
    0xA7672661u, 0xD06016F7u, 0x4969474Du, 0x3E6E77DBu, 0xAED16A4Au, 0xD9D65ADCu,
    0x40DF0B66u, 0x37D83BF0u, 0xA9BCAE53u, 0xDEBB9EC5u, 0x47B2CF7Fu, 0x30B5FFE9u,
    0xBDBDF21Cu, 0xCABAC28Au, 0x53B39330u, 0x24B4A3A6u, 0xBAD03605u, 0xCDD70693u,
    0x54DE5729u, 0x23D967BFu, 0xB3667A2Eu, 0xC4614AB8u, 0x5D681B02u, 0x2A6F2B94u,
    0xB40BBE37u, 0xC30C8EA1u, 0x5A05DF1Bu, 0x2D02EF8Du};

uint32_t proto_crc32(const uint8_t *data, size_t n)
{
  uint32_t crc = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) crc = (crc >> 8) ^ CRC_BYTE[(crc ^ data[i]) & 0xFFu];
  return crc ^ 0xFFFFFFFFu;
}
#endif

/* ---------------------------------------------------------------- COBS */
size_t proto_cobs_encode(const uint8_t *in, size_t n, uint8_t *out)
{
  /* pointers rather than indices (a third fewer instructions a byte on a
   * Cortex-M4); every write lands at or behind the next byte read, so that
   * proto_encode_in_place may encode into the buffer one place back */
  const uint8_t *const end = in + n;
  uint8_t *code_at = out, *o = out + 1;
  uint8_t code = 1;
  while (in < end) {
    const uint8_t b = *in++;
    if (b == 0) {
      *code_at = code;
      code_at = o++;
      code = 1;
    } else {
      *o++ = b;
      if (++code == 0xFF) {
        *code_at = code;
        code_at = o++;
        code = 1;
      }
    }
  }
  *code_at = code;
  return (size_t)(o - out);
}

int proto_cobs_decode(const uint8_t *in, size_t n, uint8_t *out, size_t cap)
{
  size_t i = 0, o = 0;
  while (i < n) {
    const uint8_t code = in[i++];
    if (code == 0) return -1;
    for (uint8_t k = 1; k < code; ++k) {
      if (i >= n || in[i] == 0 || o >= cap) return -1;
      out[o++] = in[i++];
    }
    if (code != 0xFF && i < n) {
      if (o >= cap) return -1;
      out[o++] = 0;
    }
  }
  return (int)o;
}

/* ---------------------------------------------------------------- little-endian
 * On a little-endian machine (AVR, Cortex-M, x86) the wire's byte order is
 * the machine's and each field is a copy: shifts of a uint64_t are library
 * calls on AVR, and byte-wise shifts of a uint32_t cost ~40 B a field there.
 * Elsewhere, shifts (bytes widened to unsigned first: a uint8_t promotes to
 * int, and with a 16-bit int p[1] << 8 overflows for bytes >= 0x80). */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__ && !defined(PROTO_SHIFTS)
static void put_u16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }
static void put_u32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put_u64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static uint16_t get_u16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static uint32_t get_u32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t get_u64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }
#else
static void put_u16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static void put_u32(uint8_t *p, uint32_t v)
{
  for (int k = 0; k < 4; ++k) p[k] = (uint8_t)(v >> (8 * k));
}
static void put_u64(uint8_t *p, uint64_t v)
{
  put_u32(p, (uint32_t)v);
  put_u32(p + 4, (uint32_t)(v >> 32));
}
static uint16_t get_u16(const uint8_t *p) { return (uint16_t)((unsigned)p[0] | ((unsigned)p[1] << 8)); }
static uint32_t get_u32(const uint8_t *p)
{
  return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static uint64_t get_u64(const uint8_t *p)
{
  return (uint64_t)get_u32(p) | ((uint64_t)get_u32(p + 4) << 32);
}
#endif
static void put_f32(uint8_t *p, float f)
{
  uint32_t v;
  memcpy(&v, &f, 4);
  put_u32(p, v);
}
static float get_f32(const uint8_t *p)
{
  const uint32_t v = get_u32(p);
  float f;
  memcpy(&f, &v, 4);
  return f;
}

/* ---------------------------------------------------------------- frames */
size_t proto_encode(const proto_frame *f, uint8_t *out)
{
  if (f->len > PROTO_MAX_PAYLOAD) return 0;
  memcpy(out + PROTO_WIRE_PAYLOAD, f->payload, f->len);
  return proto_encode_in_place(out, f->type, f->seq, f->len);
}

size_t proto_encode_in_place(uint8_t *out, uint8_t type, uint32_t seq, uint8_t len)
{
  /* the raw frame is assembled at out + 1 and COBS-encoded in place: below
   * 254 bytes each input byte becomes one output byte one place back, read
   * before it is overwritten (no second buffer on a 2 KB chip's stack) */
  uint8_t *raw = out + 1;
  if (len > PROTO_MAX_PAYLOAD) return 0;
  raw[0] = PROTO_VERSION;
  raw[1] = type;
  put_u32(raw + 2, seq);
  const size_t n = (size_t)PROTO_HEADER_LEN + len;
  put_u32(raw + n, proto_crc32(raw, n));
  const size_t w = proto_cobs_encode(raw, n + PROTO_CRC_LEN, out);
  out[w] = 0;
  return w + 1;
}

uint8_t proto_type_direction(uint8_t type)
{
  switch (type) {
  case MSG_HELLO: case MSG_ARM: case MSG_DISARM: case MSG_COMMAND: case MSG_HEARTBEAT:
  case MSG_PARAM_GET: case MSG_PARAM_SET: return PROTO_FROM_HOST;
  case MSG_STATE: case MSG_INFO: case MSG_ACK: case MSG_STATUS: case MSG_FAULT:
  case MSG_PARAM: return PROTO_FROM_DEVICE;
  default: return 0;
  }
}

int proto_expected_len(uint8_t type, const uint8_t *payload, uint8_t len)
{
  switch (type) {
  case MSG_HELLO: return 1;
  case MSG_ARM: case MSG_DISARM: case MSG_HEARTBEAT: return 0;
  case MSG_COMMAND: return PROTO_COMMAND_LEN;
  case MSG_PARAM_GET: return 2;
  case MSG_PARAM_SET: return PROTO_PARAM_SET_LEN;
  case MSG_STATE: {
    if (len < PROTO_STATE_FIXED_LEN) return -1;
    const uint8_t n = payload[23];
    if (n > PROTO_MAX_CHANNELS) return -1;
    return PROTO_STATE_FIXED_LEN + 8 * n;
  }
  case MSG_INFO: return PROTO_INFO_LEN;
  case MSG_ACK: return PROTO_ACK_LEN;
  case MSG_STATUS: case MSG_FAULT: return PROTO_STATUS_LEN;
  case MSG_PARAM: return PROTO_PARAM_LEN;
  default: return -1;
  }
}

void proto_decoder_init(proto_decoder *d, uint8_t accept)
{
  memset(d, 0, sizeof *d);
  d->accept = accept;
}

int proto_decoder_push(proto_decoder *d, uint8_t byte, proto_frame *out)
{
  if (byte != 0) {
    if (d->n < sizeof d->buf) d->buf[d->n++] = byte;
    else d->overflow = 1;
    return 0;
  }
  /* a delimiter: judge what came since the last one */
  const size_t n = d->n;
  const uint8_t overflow = d->overflow;
  d->n = 0;
  d->overflow = 0;
  if (n == 0) return 0;            /* back-to-back delimiters: nothing lost */
  if (overflow) { d->overflows++; return 0; }
  /* decoded in place (COBS output never runs ahead of its input): no
   * second buffer on the stack */
  uint8_t *raw = d->buf;
  const int r = proto_cobs_decode(d->buf, n, raw, PROTO_MAX_RAW);
  if (r < PROTO_HEADER_LEN + PROTO_CRC_LEN) { d->bad_frames++; return 0; }
  const size_t body = (size_t)r - PROTO_CRC_LEN;
  if (proto_crc32(raw, body) != get_u32(raw + body)) { d->crc_errors++; return 0; }
  const uint8_t len = (uint8_t)(body - PROTO_HEADER_LEN);
  if (raw[0] != PROTO_VERSION || !(proto_type_direction(raw[1]) & d->accept) ||
      proto_expected_len(raw[1], raw + PROTO_HEADER_LEN, len) != (int)len) {
    d->bad_frames++;
    return 0;
  }
  out->type = raw[1];
  out->seq = get_u32(raw + 2);
  out->len = len;
  memcpy(out->payload, raw + PROTO_HEADER_LEN, len);
  d->frames++;
  return 1;
}

/* ---------------------------------------------------------------- layouts */
uint8_t proto_pack_state(const proto_state *s, uint8_t *p)
{
  const uint8_t n = s->n > PROTO_MAX_CHANNELS ? PROTO_MAX_CHANNELS : s->n;
  put_u64(p, s->t_us);
  put_u32(p + 8, s->cmd_seq);
  put_u32(p + 12, s->latency_us);
  put_f32(p + 16, s->actuator);
  p[20] = s->mode;
  p[21] = s->fault;
  p[22] = s->flags;
  p[23] = n;
  for (uint8_t c = 0; c < n; ++c) {
    put_u32(p + 24 + 8 * c, (uint32_t)s->pos[c]);
    put_u32(p + 28 + 8 * c, (uint32_t)s->vel[c]);
  }
  return (uint8_t)(PROTO_STATE_FIXED_LEN + 8 * n);
}

int proto_unpack_state(const uint8_t *p, uint8_t len, proto_state *s)
{
  if (proto_expected_len(MSG_STATE, p, len) != (int)len) return -1;
  memset(s, 0, sizeof *s);
  s->t_us = get_u64(p);
  s->cmd_seq = get_u32(p + 8);
  s->latency_us = get_u32(p + 12);
  s->actuator = get_f32(p + 16);
  s->mode = p[20];
  s->fault = p[21];
  s->flags = p[22];
  s->n = p[23];
  for (uint8_t c = 0; c < s->n; ++c) {
    s->pos[c] = (int32_t)get_u32(p + 24 + 8 * c);
    s->vel[c] = (int32_t)get_u32(p + 28 + 8 * c);
  }
  return 0;
}

uint8_t proto_pack_command(const proto_command *c, uint8_t *p)
{
  put_f32(p, c->u);
  put_u32(p + 4, c->state_seq);
  put_u32(p + 8, c->state_t_us);
  return PROTO_COMMAND_LEN;
}

int proto_unpack_command(const uint8_t *p, uint8_t len, proto_command *c)
{
  if (len != PROTO_COMMAND_LEN) return -1;
  c->u = get_f32(p);
  c->state_seq = get_u32(p + 4);
  c->state_t_us = get_u32(p + 8);
  return 0;
}

uint8_t proto_pack_info(const proto_info *i, uint8_t *p)
{
  p[0] = i->protocol_version;
  p[1] = i->system;
  p[2] = i->n_channels;
  p[3] = i->angle_mask;
  put_u32(p + 4, i->device_id);
  put_u32(p + 8, i->period_us);
  put_f32(p + 12, i->u_max);
  put_f32(p + 16, i->u_limit);
  for (int c = 0; c < PROTO_MAX_CHANNELS; ++c) {
    put_f32(p + 20 + 4 * c, i->counts_per_unit[c]);
    put_f32(p + 64 + 4 * c, i->pos_limit[c]);
    put_f32(p + 80 + 4 * c, i->vel_limit[c]);
  }
  put_u32(p + 36, i->watchdog_us);
  memcpy(p + 40, i->preset, PROTO_PRESET_LEN);
  put_u16(p + 56, i->firmware_version);
  p[58] = i->controller;
  p[59] = i->control_source;
  put_f32(p + 60, i->vel_cutoff_hz);
  return PROTO_INFO_LEN;
}

int proto_unpack_info(const uint8_t *p, uint8_t len, proto_info *i)
{
  if (len != PROTO_INFO_LEN) return -1;
  i->protocol_version = p[0];
  i->system = p[1];
  i->n_channels = p[2];
  i->angle_mask = p[3];
  i->device_id = get_u32(p + 4);
  i->period_us = get_u32(p + 8);
  i->u_max = get_f32(p + 12);
  i->u_limit = get_f32(p + 16);
  for (int c = 0; c < PROTO_MAX_CHANNELS; ++c) {
    i->counts_per_unit[c] = get_f32(p + 20 + 4 * c);
    i->pos_limit[c] = get_f32(p + 64 + 4 * c);
    i->vel_limit[c] = get_f32(p + 80 + 4 * c);
  }
  i->watchdog_us = get_u32(p + 36);
  memcpy(i->preset, p + 40, PROTO_PRESET_LEN);
  i->firmware_version = get_u16(p + 56);
  i->controller = p[58];
  i->control_source = p[59];
  i->vel_cutoff_hz = get_f32(p + 60);
  return 0;
}

uint8_t proto_pack_ack(const proto_ack *a, uint8_t *p)
{
  p[0] = a->acked_type;
  put_u32(p + 1, a->acked_seq);
  p[5] = a->result;
  p[6] = a->mode;
  return PROTO_ACK_LEN;
}

int proto_unpack_ack(const uint8_t *p, uint8_t len, proto_ack *a)
{
  if (len != PROTO_ACK_LEN) return -1;
  a->acked_type = p[0];
  a->acked_seq = get_u32(p + 1);
  a->result = p[5];
  a->mode = p[6];
  return 0;
}

uint8_t proto_pack_status(const proto_status *s, uint8_t *p)
{
  p[0] = s->mode;
  p[1] = s->fault;
  put_u64(p + 2, s->t_us);
  put_u64(p + 10, s->info_t_us);
  for (int k = 0; k < PROTO_COUNTERS; ++k) put_u32(p + 18 + 4 * k, s->counter[k]);
  return PROTO_STATUS_LEN;
}

int proto_unpack_status(const uint8_t *p, uint8_t len, proto_status *s)
{
  if (len != PROTO_STATUS_LEN) return -1;
  s->mode = p[0];
  s->fault = p[1];
  s->t_us = get_u64(p + 2);
  s->info_t_us = get_u64(p + 10);
  for (int k = 0; k < PROTO_COUNTERS; ++k) s->counter[k] = get_u32(p + 18 + 4 * k);
  return 0;
}

uint8_t proto_pack_param(const proto_param *q, uint8_t *p)
{
  put_u16(p, q->id);
  p[2] = q->result;
  put_f32(p + 3, q->value);
  return PROTO_PARAM_LEN;
}

int proto_unpack_param(const uint8_t *p, uint8_t len, proto_param *q)
{
  if (len != PROTO_PARAM_LEN) return -1;
  q->id = get_u16(p);
  q->result = p[2];
  q->value = get_f32(p + 3);
  return 0;
}

uint8_t proto_pack_param_request(uint8_t type, const proto_param *q, uint8_t *p)
{
  put_u16(p, q->id);
  if (type != MSG_PARAM_SET) return 2;
  put_f32(p + 2, q->value);
  return PROTO_PARAM_SET_LEN;
}

int proto_unpack_param_request(uint8_t type, const uint8_t *p, uint8_t len, proto_param *q)
{
  if (proto_expected_len(type, p, len) != (int)len ||
      (type != MSG_PARAM_GET && type != MSG_PARAM_SET))
    return -1;
  q->id = get_u16(p);
  q->result = 0;
  q->value = type == MSG_PARAM_SET ? get_f32(p + 2) : 0.0f;
  return 0;
}
