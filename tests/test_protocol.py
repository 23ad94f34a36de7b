"""The wire protocol: the C codec (firmware/proto.c) and the Python codec
(firmware_bridge/protocol.py) against PROTOCOL.md's test vectors, against
independent references (zlib's CRC-32, the COBS paper's examples), against
each other, and under 10^6+ random and corrupted bytes (the C one under
AddressSanitizer and UndefinedBehaviorSanitizer)."""
import json
import re
import shutil
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest

from grpo_ctrl.firmware_bridge import protocol as P
from grpo_ctrl.firmware_bridge._firmware import ffi, lib

ROOT = Path(__file__).resolve().parent.parent
FIRMWARE = ROOT / "firmware_bridge" / "firmware"


def doc_vectors():
    text = (ROOT / "firmware_bridge" / "PROTOCOL.md").read_text()
    block = text.split("<!-- vectors:begin -->")[1].split("<!-- vectors:end -->")[0]
    rows = re.findall(r"^\| ([\w-]+) \| (\d+) \| `(\{.*\})` \| `([0-9a-f ]+)` \|$", block, re.M)
    return [(name, int(seq), json.loads(fields), bytes.fromhex(wire)) for name, seq, fields, wire in rows]


VECTORS = doc_vectors()


def python_message(fields):
    f = dict(fields)
    cls = getattr(P, f.pop("type"))
    for k in ("pos", "vel", "counts_per_unit", "pos_limit", "vel_limit"):
        if k in f:
            f[k] = tuple(f[k])
    return cls(**f)


# ---------------------------------------------------------------- C helpers
_C_PACK = {"State": ("proto_state", lib.proto_pack_state, lib.proto_unpack_state),
           "Command": ("proto_command", lib.proto_pack_command, lib.proto_unpack_command),
           "Info": ("proto_info", lib.proto_pack_info, lib.proto_unpack_info),
           "Ack": ("proto_ack", lib.proto_pack_ack, lib.proto_unpack_ack),
           "Status": ("proto_status", lib.proto_pack_status, lib.proto_unpack_status),
           "Fault": ("proto_status", lib.proto_pack_status, lib.proto_unpack_status),
           "Param": ("proto_param", lib.proto_pack_param, lib.proto_unpack_param)}


def c_payload(fields) -> bytes:
    """The payload as the C codec packs it from the same fields."""
    f = dict(fields)
    kind = f.pop("type")
    buf = ffi.new("uint8_t[]", P.MAX_PAYLOAD)
    if kind in ("ParamGet", "ParamSet"):
        q = ffi.new("proto_param *", {"id": f["id"], "value": f.get("value", 0.0)})
        n = lib.proto_pack_param_request(getattr(P, kind).TYPE, q, buf)
        return bytes(buf[0:n])
    if kind not in _C_PACK:  # HELLO, ARM, DISARM, HEARTBEAT: the device only receives them
        return python_message(fields).pack()
    ctype, pack, _ = _C_PACK[kind]
    s = ffi.new(ctype + " *")
    for k, v in f.items():
        if k == "preset":
            s.preset = v.encode()
        elif ctype == "proto_status" and hasattr(lib, f"COUNTER_{k.upper()}"):
            s.counter[getattr(lib, f"COUNTER_{k.upper()}")] = v
        elif isinstance(v, list):
            for i, x in enumerate(v):
                getattr(s, k)[i] = x
        else:
            setattr(s, k, v)
    if kind == "State":
        s.n = len(f["pos"])
    return bytes(buf[0:pack(s, buf)])


def c_encode(type_, seq, payload) -> bytes:
    frame = ffi.new("proto_frame *", {"type": type_, "seq": seq, "len": len(payload)})
    frame.payload[0:len(payload)] = payload
    out = ffi.new("uint8_t[]", 128)
    return bytes(out[0:lib.proto_encode(frame, out)])


def c_decode(stream: bytes, accept=P.FROM_EITHER):
    """Frames the C stream decoder accepts, as (type, seq, payload), and its counters."""
    d = ffi.new("proto_decoder *")
    lib.proto_decoder_init(d, accept)
    out = ffi.new("proto_frame *")
    frames = []
    push = lib.proto_decoder_push
    for b in stream:
        if push(d, b, out):
            frames.append((out.type, out.seq, bytes(out.payload[0:out.len])))
    return frames, d


# ---------------------------------------------------------------- references
def test_crc32_matches_zlib_and_the_check_value():
    assert lib.proto_crc32(b"123456789", 9) == 0xCBF43926 == P.crc32(b"123456789")
    rng = np.random.default_rng(0)
    for n in (0, 1, 7, 64, 300):
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        assert lib.proto_crc32(data, n) == zlib.crc32(data) == P.crc32(data)


COBS_EXAMPLES = [("00", "0101"), ("0000", "010101"), ("11220033", "0311220233"),
                 ("11223344", "0511223344"), ("11000000", "0211010101")]


@pytest.mark.parametrize("raw,encoded", COBS_EXAMPLES)
def test_cobs_examples_from_the_paper(raw, encoded):
    raw, encoded = bytes.fromhex(raw), bytes.fromhex(encoded)
    assert P.cobs_encode(raw) == encoded and P.cobs_decode(encoded) == raw
    out = ffi.new("uint8_t[]", 64)
    n = lib.proto_cobs_encode(raw, len(raw), out)
    assert bytes(out[0:n]) == encoded
    n = lib.proto_cobs_decode(encoded, len(encoded), out, 64)
    assert bytes(out[0:n]) == raw


def test_cobs_round_trips_and_agrees_between_c_and_python():
    rng = np.random.default_rng(1)
    for n in (1, 5, 80, 253, 254, 255, 600):
        for density in (0.0, 0.3):
            data = rng.integers(1, 256, n, dtype=np.uint8)
            data[rng.random(n) < density] = 0
            data = data.tobytes()
            enc = P.cobs_encode(data)
            out = ffi.new("uint8_t[]", 2 * n + 8)
            k = lib.proto_cobs_encode(data, n, out)
            assert bytes(out[0:k]) == enc and 0 not in enc
            assert P.cobs_decode(enc) == data
            k = lib.proto_cobs_decode(enc, len(enc), out, 2 * n + 8)
            assert bytes(out[0:k]) == data


# ---------------------------------------------------------------- vectors
def test_protocol_md_has_a_vector_for_every_message_type():
    assert {fields["type"] for _, _, fields, _ in VECTORS} == {c.__name__ for c in P.MESSAGES.values()}


@pytest.mark.parametrize("name,seq,fields,wire", VECTORS, ids=[v[0] for v in VECTORS])
def test_vector_python(name, seq, fields, wire):
    msg = python_message(fields)
    assert P.encode(msg, seq) == wire
    (frame,) = P.Decoder(accept=P.direction(msg.TYPE)).feed(wire)
    assert (frame.type, frame.seq) == (msg.TYPE, seq)
    assert P.decode_message(frame) == msg


@pytest.mark.parametrize("name,seq,fields,wire", VECTORS, ids=[v[0] for v in VECTORS])
def test_vector_c(name, seq, fields, wire):
    type_ = getattr(P, fields["type"]).TYPE
    payload = c_payload(fields)
    assert c_encode(type_, seq, payload) == wire
    (decoded,), _ = c_decode(wire, lib.proto_type_direction(type_))
    assert decoded == (type_, seq, payload)
    if fields["type"] in _C_PACK:  # the C unpacker gives back the fields
        ctype, _, unpack = _C_PACK[fields["type"]]
        s = ffi.new(ctype + " *")
        assert unpack(payload, len(payload), s) == 0
        for k, v in fields.items():
            if k == "type":
                continue
            got = (s.counter[getattr(lib, f"COUNTER_{k.upper()}")]
                   if ctype == "proto_status" and k not in ("mode", "fault", "t_us", "info_t_us")
                   else getattr(s, k))
            if k == "preset":
                got = ffi.string(got).decode()
            elif isinstance(v, list):
                got = list(got)[:len(v)]
            assert got == pytest.approx(v), k


def test_wrong_lengths_are_rejected_by_both_unpackers():
    good = c_payload(VECTORS[[v[0] for v in VECTORS].index("state-pendulum")][2])
    s = ffi.new("proto_state *")
    assert lib.proto_unpack_state(good[:-1], len(good) - 1, s) == -1
    with pytest.raises(P.ProtocolError):
        P.State.unpack(good[:-1])
    bad_n = good[:23] + bytes([5]) + good[24:]
    assert lib.proto_unpack_state(bad_n, len(bad_n), s) == -1


# ---------------------------------------------------------------- fuzzing
def make_stream(n_bytes: int, seed: int):
    """Valid, corrupted and garbage frames, with the truth about each."""
    rng = np.random.default_rng(seed)
    types = list(P.MESSAGES)
    parts, truth, size, last = [], [], 0, 0
    while size < n_bytes:
        if rng.random() < 0.1:
            junk = rng.integers(0, 256, int(rng.integers(1, 100)), dtype=np.uint8)
            junk[rng.random(junk.size) < 0.25] = 0
            chunk = junk.tobytes()
        else:
            t = types[int(rng.integers(len(types)))]
            cls = P.MESSAGES[t]
            if cls is P.State:
                n = int(rng.integers(0, 5))
                payload = bytearray(rng.integers(0, 256, 24 + 8 * n, dtype=np.uint8).tobytes())
                payload[23] = n
            else:
                payload = rng.integers(0, 256, cls.FORMAT.size, dtype=np.uint8).tobytes()
            seq = len(truth)
            wire = bytearray(P.encode_frame(t, seq, bytes(payload)))
            original = bytes(wire)
            if rng.random() < 0.3:
                for _ in range(int(rng.integers(1, 4))):
                    wire[int(rng.integers(len(wire)))] ^= int(rng.integers(1, 256))
            truth.append({"frame": (t, seq, bytes(payload)), "intact": bytes(wire) == original,
                          "clean_start": last == 0})
            chunk = bytes(wire)
        parts.append(chunk)
        size += len(chunk)
        last = chunk[-1]
    return b"".join(parts), truth


def check_decoded(frames, truth):
    accepted = set()
    for t, seq, payload in frames:
        assert seq < len(truth) and truth[seq]["intact"], f"accepted a corrupted frame, seq {seq}"
        assert truth[seq]["frame"] == (t, seq, payload) and seq not in accepted
        accepted.add(seq)
    expected = {k for k, tr in enumerate(truth) if tr["intact"] and tr["clean_start"]}
    assert accepted == expected  # resynchronised on every good frame after a delimiter
    return len(accepted)


def test_python_and_c_decoders_survive_a_million_fuzzed_bytes():
    stream, truth = make_stream(1_000_000, seed=2)
    n_corrupt = sum(not t["intact"] for t in truth)
    assert len(stream) >= 1_000_000 and n_corrupt > 5000
    decoder = P.Decoder(accept=P.FROM_EITHER)
    py_frames = []
    for i in range(0, len(stream), 4096):  # arbitrary chunking, as reads come
        py_frames += [(f.type, f.seq, f.payload) for f in decoder.feed(stream[i:i + 4096])]
    n = check_decoded(py_frames, truth)
    c_frames, d = c_decode(stream)
    assert c_frames == py_frames and n > 10000
    assert (d.crc_errors, d.bad_frames, d.overflows) == (
        decoder.crc_errors, decoder.bad_frames, decoder.overflows)


def test_c_decoder_fuzzed_under_address_and_undefined_behaviour_sanitizers(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    assert cc, "a C compiler is needed"
    exe = tmp_path / "fuzz_proto"
    subprocess.run([cc, "-std=c99", "-Wall", "-Wextra", "-Werror", "-g", "-O1",
                    "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
                    str(FIRMWARE / "fuzz_proto.c"), str(FIRMWARE / "proto.c"), "-o", str(exe)],
                   check=True)
    for seed in (1, 2):
        r = subprocess.run([str(exe), "2000000", str(seed)], capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr
        stats = dict(kv.split("=") for kv in r.stdout.split())
        assert int(stats["bytes"]) >= 2_000_000 and int(stats["corrupted"]) > 10000
        assert int(stats["false_accepts"]) == 0 and int(stats["missed"]) == 0
        assert int(stats["accepted"]) == int(stats["expected"]) > 30000


def test_each_side_accepts_only_the_other_sides_types():
    """"Type is known" means known for this direction: a STATE sent to the
    device (or a COMMAND to the host) is a bad frame, not a valid one."""
    state = P.encode(P.State(1, 2, 3, 0.0, 0, 0, 0, (1,), (2,)), 7)
    command = P.encode(P.Command(0.1, 7, 1), 8)
    frames, d = c_decode(state + command, P.FROM_HOST)
    assert [f[0] for f in frames] == [P.Command.TYPE] and (d.frames, d.bad_frames) == (1, 1)
    frames, d = c_decode(state + command, P.FROM_DEVICE)
    assert [f[0] for f in frames] == [P.State.TYPE] and (d.frames, d.bad_frames) == (1, 1)
    host = P.Decoder()
    assert [f.type for f in host.feed(state + command)] == [P.State.TYPE]
    assert (host.frames, host.bad_frames) == (1, 1)
    device = P.Decoder(accept=P.FROM_HOST)
    assert [f.type for f in device.feed(state + command)] == [P.Command.TYPE]


def test_a_frame_of_another_version_is_dropped_and_its_version_kept():
    raw = bytes([1, P.Info.TYPE]) + (0).to_bytes(4, "little")
    wire = P.cobs_encode(raw + P.CRC.pack(P.crc32(raw))) + b"\x00"
    d = P.Decoder()
    assert d.feed(wire) == [] and d.bad_frames == 1 and d.other_version == 1
    assert c_decode(wire)[1].bad_frames == 1


def test_u16_and_u32_fields_with_high_bytes_round_trip():
    """get_u16 widens before it shifts (undefined with a 16-bit int for bytes
    >= 0x80; the AVR build is where it mattered)."""
    q = ffi.new("proto_param *")
    payload = P.ParamGet(0xFF80).pack()
    assert lib.proto_unpack_param_request(P.ParamGet.TYPE, payload, len(payload), q) == 0
    assert q.id == 0xFF80
    c = ffi.new("proto_command *")
    payload = P.Command(-1.5, 0xFFFFFFFE, 0x80808080).pack()
    assert lib.proto_unpack_command(payload, len(payload), c) == 0
    assert (c.u, c.state_seq, c.state_t_us) == (-1.5, 0xFFFFFFFE, 0x80808080)


# ---------------------------------------------------------------- Python decoder fuzzing
def fuzz_python_decoder(data: bytes, chunk: int = 4096):
    """Feed ``data`` to a host and a device decoder in chunks: nothing may
    raise, every accepted frame unpacks and round-trips through the encoder,
    and the counters add up to the chunks between delimiters. Returns the
    frames."""
    frames = []
    for accept in (P.FROM_DEVICE, P.FROM_HOST):
        d = P.Decoder(accept=accept)
        for i in range(0, len(data), chunk):
            for f in d.feed(data[i:i + chunk]):
                assert P.direction(f.type) == accept
                P.decode_message(f)                      # unpacks without error
                again = P.Decoder(accept=accept).feed(P.encode_frame(f.type, f.seq, f.payload))
                assert again == [f]                      # re-encodes to the same frame
                frames.append(f)
        chunks = sum(1 for c in data.split(b"\x00")[:-1] if c)
        assert d.frames + d.crc_errors + d.bad_frames + d.overflows == chunks
    return frames


def test_python_decoder_fuzzed_with_random_bytes_and_mutations():
    """Seeded random bytes and byte-level mutations of valid streams (CI
    size: ~1.2 x 10^6 bytes; benchmarks/fuzz_protocol.py runs 10^7)."""
    rng = np.random.default_rng(5)
    noise = rng.integers(0, 256, 400_000, dtype=np.uint8)
    noise[rng.random(noise.size) < 0.02] = 0
    fuzz_python_decoder(noise.tobytes())
    stream, _ = make_stream(400_000, seed=6)
    for rate in (1e-3, 1e-2):
        s = np.frombuffer(stream, np.uint8).copy()
        hit = rng.random(s.size) < rate
        s[hit] ^= rng.integers(1, 256, int(hit.sum()), dtype=np.uint8)
        assert len(fuzz_python_decoder(s.tobytes())) > 1000


def test_python_decoder_fuzzed_by_hypothesis():
    pytest.importorskip("hypothesis", reason="hypothesis is not installed: pip install hypothesis")
    from hypothesis import given, settings, strategies as st

    valid = [P.encode(msg, seq) for msg, seq in
             [(python_message(f), s) for _, s, f, _ in VECTORS]]

    @settings(max_examples=150, deadline=None, derandomize=True)
    @given(st.lists(st.one_of(st.binary(max_size=120), st.sampled_from(valid)), max_size=20),
           st.integers(1, 64))
    def check(parts, chunk):
        fuzz_python_decoder(b"".join(parts), chunk)

    check()
