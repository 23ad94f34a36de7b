"""cffi build script (API mode, out-of-line) for the firmware core and its
simulated hardware back-end: the extension ``firmware_bridge._firmware``.

Run by setuptools at install time through ``cffi_modules``. It compiles the
portable core (``firmware/proto.c``, ``firmware/fw_core.c``), the HIL
back-end (``firmware/hw_sim.c``) and, again, the plant from ``csrc/`` that
the back-end drives through ``csrc/pendsim.h``.
"""
from cffi import FFI

CDEF = """
#define PROTO_VERSION ...
#define PROTO_MAX_CHANNELS ...
#define PROTO_MAX_PAYLOAD ...
#define PROTO_MAX_WIRE ...
#define PROTO_PRESET_LEN ...

typedef struct { uint8_t type; uint32_t seq; uint8_t len; uint8_t payload[64]; } proto_frame;
typedef struct {
  uint64_t t_us; uint32_t cmd_seq; uint32_t latency_us; float actuator;
  uint8_t mode, fault, flags, n; int32_t pos[4]; int32_t vel[4];
} proto_state;
typedef struct { float u; uint32_t state_seq; } proto_command;
typedef struct {
  uint8_t protocol_version, system, n_channels, angle_mask; uint32_t device_id, period_us;
  float u_max; float counts_per_unit[4]; uint32_t watchdog_us; char preset[16];
  uint16_t firmware_version;
} proto_info;
typedef struct { uint8_t acked_type; uint32_t acked_seq; uint8_t result, mode; } proto_ack;
typedef struct {
  uint8_t mode, fault; uint64_t t_us, last_cmd_t_us;
  uint32_t rx_frames, rx_crc_errors, rx_bad_frames, rx_overflows;
  uint32_t tx_frames, watchdog_trips, stale_ticks, late_ticks;
} proto_status;
typedef struct { uint16_t id; uint8_t result; float value; } proto_param;
typedef struct {
  uint8_t buf[...]; size_t n; int overflow;
  uint32_t frames, crc_errors, bad_frames, overflows;
} proto_decoder;

uint32_t proto_crc32(const uint8_t *data, size_t n);
size_t proto_cobs_encode(const uint8_t *in, size_t n, uint8_t *out);
int proto_cobs_decode(const uint8_t *in, size_t n, uint8_t *out, size_t cap);
size_t proto_encode(const proto_frame *f, uint8_t *out);
void proto_decoder_init(proto_decoder *d);
int proto_decoder_push(proto_decoder *d, uint8_t byte, proto_frame *out);
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
uint8_t proto_pack_param_request(uint8_t type, const proto_param *q, uint8_t *p);
int proto_unpack_param_request(uint8_t type, const uint8_t *p, uint8_t len, proto_param *q);

typedef struct {
  double corrupt_rate, drop_rate, latency_us, spike_rate, spike_us, disconnect_after_s;
  int both_ways;
} hil_faults;
typedef struct {
  int system; char preset[16]; double rate_hz; int set_x0; double x0[4];
  int hold_until_armed; uint64_t seed; uint32_t device_id; uint32_t watchdog_us;
  float pos_limit[4]; float vel_limit[4]; float vel_cutoff_hz; hil_faults faults; int fd; int realtime;
  size_t trace_cap; uint64_t *trace_t_us; double *trace_x; float *trace_u;
  uint8_t *trace_mode, *trace_fault;
} hil_options;
typedef struct {
  uint64_t t_us, ticks, late_ticks, arms;
  uint8_t mode, fault, disconnected, n_channels, realtime;
  uint32_t rx_frames, rx_crc_errors, rx_bad_frames, watchdog_trips, stale_ticks;
  uint32_t tx_frames, tx_dropped, tx_corrupted_bytes, tx_overflow, rx_corrupted_bytes;
  uint32_t period_us; float u_max; size_t trace_len;
} hil_stats;
typedef struct hil_sim hil_sim;
size_t hil_sizeof(void);
int hil_init(hil_sim *h, const hil_options *o);
void hil_run(hil_sim *h, double duration_s);
void hil_stop(hil_sim *h);
void hil_get_stats(const hil_sim *h, hil_stats *s);
"""

ffibuilder = FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source(
    "firmware_bridge._firmware",
    '#include "proto.h"\n#include "hil.h"\n',
    # setuptools wants paths relative to the project root
    sources=["firmware_bridge/firmware/proto.c", "firmware_bridge/firmware/fw_core.c",
             "firmware_bridge/firmware/hw_sim.c", "csrc/pendsim.c", "csrc/plants.c"],
    include_dirs=["firmware_bridge/firmware", "csrc"],
    extra_compile_args=["-O2", "-std=c99", "-Wall", "-Wextra"],
    libraries=["m"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
