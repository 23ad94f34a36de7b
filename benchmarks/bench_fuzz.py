#!/usr/bin/env python3
"""Fuzz the wire protocol and the firmware core at benchmark size.

Four campaigns, each reporting the bytes it fed and what it found:

* ``c-decoder``: ``firmware/fuzz_proto.c``, the C stream decoder under
  AddressSanitizer and UndefinedBehaviorSanitizer: valid, corrupted and
  garbage frames with the truth about each (no false accept, no missed
  resynchronisation);
* ``c-core``: ``firmware/fuzz_fw.c``, ``fw_receive``/``fw_tick``/``fw_transmit``
  from random scripts under the same sanitizers, the core's safety
  invariants checked after every step;
* ``libfuzzer``: the same core harness as a coverage-guided libFuzzer target
  (clang; skipped with a message naming the packages if absent), for
  ``--libfuzzer-seconds``;
* ``python``: the host codec (``protocol.Decoder``) on random bytes and on
  mutated valid streams, both directions, counters checked.

    python benchmarks/bench_fuzz.py                # 10^7 bytes per campaign
    python benchmarks/bench_fuzz.py --bytes 1000000 --json fuzz.json
    grpo-ctrl bench fuzz

A finding is a non-zero exit of a harness (its message is printed) or an
exception in the Python decoder; the script exits 1 if there is any.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
FIRMWARE = ROOT / "firmware_bridge" / "firmware"
SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all"]


def build(cc: str, sources: list[str], exe: Path, extra=()) -> subprocess.CompletedProcess:
    return subprocess.run([cc, "-std=c99", "-g", "-O1", *SANITIZE, *extra,
                           *[str(FIRMWARE / s) for s in sources], "-lm", "-o", str(exe)],
                          capture_output=True, text=True)


def run_harness(exe: Path, n_bytes: int, seed: int) -> dict:
    t = time.perf_counter()
    r = subprocess.run([str(exe), str(n_bytes), str(seed)], capture_output=True, text=True)
    out = {"seconds": time.perf_counter() - t, "exit": r.returncode}
    if r.returncode == 0:
        out.update({k: int(v) for k, v in (kv.split("=") for kv in r.stdout.split())})
    else:
        out["finding"] = (r.stdout + r.stderr)[-2000:]
    return out


def libfuzzer(exe_dir: Path, seconds: int) -> dict:
    clang = shutil.which("clang")
    if clang is None:
        return {"skipped": "clang is not installed: apt-get install -y clang libclang-rt-14-dev"}
    exe = exe_dir / "fuzz_fw_libfuzzer"
    b = build(clang, ["fuzz_fw.c", "fw_core.c", "proto.c"], exe,
              ["-DFUZZ_LIBFUZZER", "-fsanitize=fuzzer"])
    if b.returncode != 0:
        return {"skipped": "clang could not link libFuzzer (apt-get install -y "
                           f"libclang-rt-14-dev): {b.stderr.strip()[-300:]}"}
    corpus = exe_dir / "corpus"
    corpus.mkdir(exist_ok=True)
    t = time.perf_counter()
    r = subprocess.run([str(exe), str(corpus), f"-max_total_time={seconds}", "-seed=1",
                        "-max_len=4096", "-print_final_stats=1"],
                       capture_output=True, text=True, cwd=exe_dir)
    out = {"seconds": time.perf_counter() - t, "exit": r.returncode}
    for line in r.stderr.splitlines():
        if line.startswith("stat::number_of_executed_units:"):
            out["runs"] = int(line.split(":")[-1])
        if line.startswith("stat::new_units_added:"):
            out["new_units"] = int(line.split(":")[-1])
    out["corpus_bytes"] = sum(p.stat().st_size for p in corpus.iterdir())
    if r.returncode != 0:
        out["finding"] = r.stderr[-2000:]
    return out


def python_decoder(n_bytes: int, seed: int) -> dict:
    sys.path.insert(0, str(ROOT / "tests"))
    from test_protocol import fuzz_python_decoder, make_stream  # the tests' checker

    rng = np.random.default_rng(seed)
    t = time.perf_counter()
    fed, frames = 0, 0
    try:
        noise = rng.integers(0, 256, n_bytes // 2, dtype=np.uint8)
        noise[rng.random(noise.size) < 0.02] = 0
        frames += len(fuzz_python_decoder(noise.tobytes()))
        fed += noise.size
        stream, _ = make_stream(n_bytes // 2, seed=seed)
        s = np.frombuffer(stream, np.uint8).copy()
        hit = rng.random(s.size) < 3e-3
        s[hit] ^= rng.integers(1, 256, int(hit.sum()), dtype=np.uint8)
        frames += len(fuzz_python_decoder(s.tobytes()))
        fed += s.size
    except Exception as e:  # noqa: BLE001 - any exception is a finding
        return {"bytes": fed, "seconds": time.perf_counter() - t, "finding": repr(e)}
    return {"bytes": fed, "frames_accepted": frames, "seconds": time.perf_counter() - t}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bytes", type=int, default=10_000_000, help="bytes per campaign")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--libfuzzer-seconds", type=int, default=60)
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    if args.bytes < 1000 or args.libfuzzer_seconds < 1:
        p.error("--bytes must be >= 1000 and --libfuzzer-seconds >= 1")
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        p.error("no C compiler: apt-get install -y gcc")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for name, sources in (("c-decoder", ["fuzz_proto.c", "proto.c"]),
                              ("c-core", ["fuzz_fw.c", "fw_core.c", "proto.c"])):
            exe = tmp / name
            b = build(cc, sources, exe)
            if b.returncode != 0:
                results[name] = {"finding": "build failed: " + b.stderr[-1000:]}
            else:
                results[name] = run_harness(exe, args.bytes, args.seed)
            print(name, json.dumps(results[name]), flush=True)
        results["libfuzzer"] = libfuzzer(tmp, args.libfuzzer_seconds)
        print("libfuzzer", json.dumps(results["libfuzzer"]), flush=True)
    results["python"] = python_decoder(args.bytes, args.seed)
    print("python", json.dumps(results["python"]), flush=True)
    findings = [k for k, v in results.items() if "finding" in v or v.get("exit", 0) != 0]
    print("findings:", ", ".join(findings) if findings else "none")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
