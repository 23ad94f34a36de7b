/*
 * Fuzz harness for the protocol decoder (tests/test_protocol.py builds it
 * with -fsanitize=address,undefined and runs it).
 *
 * It writes a byte stream of valid frames, corrupted frames (1 to 3 bytes
 * changed) and random garbage, keeps the truth about each frame, feeds the
 * stream to proto_decoder_push and checks that
 *   - every frame the decoder accepts is an intact frame, byte for byte;
 *   - every intact frame that starts right after a 0x00 is accepted
 *     (resynchronisation: garbage costs nothing beyond the next delimiter).
 * Usage: fuzz_proto [bytes] [seed]. Prints a summary; exit status 1 on a
 * violation.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_rng.h"
#include "proto.h"

static const uint8_t TYPES[] = {MSG_HELLO, MSG_ARM, MSG_DISARM, MSG_COMMAND, MSG_HEARTBEAT,
                                MSG_PARAM_GET, MSG_PARAM_SET, MSG_STATE, MSG_INFO, MSG_ACK,
                                MSG_STATUS, MSG_FAULT, MSG_PARAM};

typedef struct {
  proto_frame f;
  int intact, clean_start;
} truth;

int main(int argc, char **argv)
{
  const size_t want = argc > 1 ? (size_t)strtoull(argv[1], 0, 10) : 1000000u;
  fuzz_rng_seed(argc > 2 ? argv[2] : 0);
  uint8_t *stream = malloc(want + 4096);
  const size_t max_frames = want / 8 + 16;
  truth *frames = malloc(max_frames * sizeof *frames);
  if (!stream || !frames) return 2;
  size_t n = 0, nf = 0, garbage_runs = 0, corrupted = 0;

  while (n < want && nf < max_frames) {
    const uint32_t what = rnd() % 10;
    if (what == 0) {  /* garbage, zeros included */
      const size_t len = 1 + rnd() % 100;
      for (size_t i = 0; i < len; ++i) stream[n++] = (uint8_t)(rnd() % 4 ? rnd() : 0);
      garbage_runs++;
      continue;
    }
    truth *t = &frames[nf];
    memset(t, 0, sizeof *t);
    t->f.type = TYPES[rnd() % sizeof TYPES];
    t->f.seq = (uint32_t)nf;
    uint8_t probe[PROTO_MAX_PAYLOAD];
    memset(probe, 0, sizeof probe);
    probe[23] = (uint8_t)(rnd() % (PROTO_MAX_CHANNELS + 1));
    t->f.len = (uint8_t)proto_expected_len(t->f.type, probe, PROTO_STATE_FIXED_LEN);
    for (int i = 0; i < t->f.len; ++i) t->f.payload[i] = (uint8_t)(rnd() % 3 ? rnd() : 0);
    if (t->f.type == MSG_STATE) t->f.payload[23] = probe[23];
    uint8_t wire[PROTO_MAX_WIRE];
    const size_t w = proto_encode(&t->f, wire);
    t->clean_start = n == 0 || stream[n - 1] == 0;
    t->intact = rnd() % 10 >= 3;
    if (!t->intact) {  /* change 1 to 3 bytes, the delimiter included */
      uint8_t original[PROTO_MAX_WIRE];
      memcpy(original, wire, w);
      const int k = 1 + (int)(rnd() % 3);
      for (int i = 0; i < k; ++i) wire[rnd() % w] ^= (uint8_t)(1 + rnd() % 255);
      t->intact = memcmp(original, wire, w) == 0;  /* two changes may cancel */
      corrupted += !t->intact;
    }
    memcpy(stream + n, wire, w);
    n += w;
    nf++;
  }

  proto_decoder d;
  proto_decoder_init(&d, PROTO_FROM_EITHER);
  proto_frame out;
  size_t accepted = 0, false_accepts = 0, expected = 0, missed = 0;
  char *seen = calloc(nf, 1);
  if (!seen) return 2;
  for (size_t i = 0; i < n; ++i) {
    if (!proto_decoder_push(&d, stream[i], &out)) continue;
    accepted++;
    const truth *t = out.seq < nf ? &frames[out.seq] : 0;
    if (!t || !t->intact || t->f.type != out.type || t->f.len != out.len ||
        memcmp(t->f.payload, out.payload, out.len) != 0 || seen[out.seq]) {
      false_accepts++;
      continue;
    }
    seen[out.seq] = 1;
  }
  for (size_t k = 0; k < nf; ++k) {
    if (frames[k].intact && frames[k].clean_start) {
      expected++;
      if (!seen[k]) missed++;
    }
  }
  printf("bytes=%zu frames=%zu corrupted=%zu garbage_runs=%zu accepted=%zu expected=%zu "
         "missed=%zu false_accepts=%zu crc_errors=%u bad_frames=%u overflows=%u\n",
         n, nf, corrupted, garbage_runs, accepted, expected, missed, false_accepts,
         (unsigned)d.crc_errors, (unsigned)d.bad_frames, (unsigned)d.overflows);
  free(seen);
  free(frames);
  free(stream);
  return false_accepts || missed ? 1 : 0;
}
