#!/usr/bin/env python3
"""Flash, RAM and time per control tick on each board, measured on emulators.

For each board whose toolchain and emulator are installed:

* sizes: the firmware image (``grpo-ctrl firmware``'s build), without and
  with the default 3-64-64-1 rig policy linked in;
* time: ``firmware/board/target_check.c`` on the emulated chip: ``fw_tick``
  (armed, a fresh command each period), decoding one COMMAND frame
  (``fw_receive``), and one ``policy_step``. On the Uno these are CPU cycles
  (simavr is cycle-counting, Timer1 at the CPU clock). On the Cortex-M4F
  they are instructions (QEMU models neither the M4's pipeline nor DWT's
  CYCCNT: the check counts SysTick periods at the model's 25 MHz under
  ``-icount shift=0``, one instruction per ns of virtual time, 40 a
  period; an M4 takes at least one cycle an instruction, so shares of those
  are lower bounds) and estimated cycles: the Cortex-M4 TRM's timings
  applied to QEMU's trace of every executed instruction
  (``firmware_bridge/m4_cycles.py``, its docstring has the cost model).

Each board twice: the policy as exported (float) and with its 64 x 64
hidden layer in 16-bit fixed point (``--quantize q15``: SMLALD on the
Cortex-M4, plain C integers on AVR), with its measured error.

Then the Uno with the distilled 3-4-4-1 rig policy
(``tests/data/pendulum-rig-distilled-3-4-4-1.onnx``) in float and with the
whole MLP in integers (``--quantize int16``, ``export/int16.py``): flash with
the policy linked in, ``policy_step`` and the on-device tick in cycles, beside
``board_fit.tick_estimate`` (the default policy's 4352 multiply-adds are over
int16's ``MAX_MACS``). In the JSON: ``"uno int16"``.

Clocks: the Uno's 16 MHz; for the Cortex-M4F both QEMU's mps2-an386 model
(25 MHz, what the PIL runs) and the realistic board the goal is judged at,
an STM32F4 at 168 MHz (Qube-class controllers run M4Fs at 120-180 MHz).

Shares of the period: host-computed mode is fw_receive + fw_tick per tick;
on-device mode is fw_tick with the core calling the policy (the observation
built from the counts, the policy, the clamp). Goals (issue 11): < 25 % of the
5 ms period at 200 Hz on the Uno, < 10 % of 1 ms at 1 kHz on the M4 (at
168 MHz). The Uno's policy is the one ``grpo-ctrl firmware`` links: its
64 x 64 layer packed (3.5 B a weight, lossless), so that it fits.

    python benchmarks/bench_boards.py        # or: grpo-ctrl bench boards
    python benchmarks/bench_boards.py --json boards.json
    python benchmarks/bench_boards.py --uno-widths 1,2,3,4,8,12,16,24,64

``--uno-widths``: the Uno's on-device tick on simavr for the rig policy's
graph with random 3-H-H-1 weights, against ``boards.uno_tick_estimate`` (the
model ``grpo-ctrl firmware --board uno`` reports with) and the 25 % goal.

Load does not change these counts (they are emulated cycles/instructions).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import onnx

from grpo_ctrl.export.verify import operating_observations
from grpo_ctrl.firmware_bridge import boards

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
POLICY = DATA / "pendulum-rig-grpo.onnx"
# --quantize int16 on the Uno: the distilled rig policy (the default 3-64-64-1's
# 4352 multiply-adds exceed int16's unrolled code, int16.MAX_MACS)
DISTILLED = DATA / "pendulum-rig-distilled-3-4-4-1.onnx"
# board -> (control rate for the goal, clocks to express it at, goal share)
GOALS = {"uno": (200, {"ATmega328P 16 MHz": 16e6}, 0.25),
         "mps2-an386": (1000, {"MPS2 25 MHz": 25e6, "STM32F4 168 MHz": 168e6}, 0.10)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--uno-widths", metavar="H,H,...",
                    help="only the Uno's on-device tick for 3-H-H-1 networks of these widths")
    args = ap.parse_args()
    model = onnx.load(POLICY)
    obs = operating_observations("pendulum", "rig", 4)
    if args.uno_widths:
        return uno_widths(model, obs, [int(h) for h in args.uno_widths.split(",")])
    results = {}
    for (name, b), quantize in [(kv, q) for kv in boards.BOARDS.items() for q in (None, "q15")]:
        missing = boards.emulator_missing(b)
        if missing:
            print(f"{name}: skipped: {missing}")
            continue
        src = boards.controller_c(b, model, quantize)
        fit = boards.measure(b, src)
        r = boards.target_check(b, src, obs, cycles=True)
        unit = "cycles" if name == "uno" else "instructions"
        rate, clocks, goal = GOALS[name]
        print(f"\n{b.description}" + (f", the policy's hidden layer in {quantize} "
                                      f"(--quantize {quantize}: {src.error})" if quantize else ""))
        print(f"  flash {fit.firmware.flash} B firmware, {fit.total.flash} B with the 3-64-64-1 "
              f"policy ({fit.const_bytes} B weights) of {b.flash} B; static RAM "
              f"{fit.total.ram} B + {fit.scratch} B policy scratch" +
              (f"; deepest stack in the check {r['stack']} B" if "stack" in r else ""))
        print(f"  core + policy alone (the check image): flash {r['image'].flash} B, static RAM "
              f"{r['image'].ram} B")
        print(f"  fw_tick {r['tick']:.0f}, fw_receive (one COMMAND) {r['receive']:.0f}, "
              f"policy_step {r['policy']:.0f}, fw_tick in on-device control (policy "
              f"included) {r['ondevice']:.0f} {unit}")
        counts = {"instructions, a lower bound": r} if name != "uno" else {"cycles": r}
        if "cycles" in r:
            c = r["cycles"]
            print("  estimated cycles (Cortex-M4 TRM timings on QEMU's trace): " + ", ".join(
                f"{k} {c[k]['cycles']:.0f} ({c[k]['instructions']:.0f} instructions, "
                f"{c[k]['refills']:.0f} taken branches)" for k in boards.MEASURED))
            top = list(c["ondevice"]["by_symbol"].items())[:8]
            print("  on-device tick by function (cycles): " +
                  ", ".join(f"{k} {v:.0f}" for k, v in top))
            counts["estimated cycles"] = {k: c[k]["cycles"] for k in boards.MEASURED}
        shares = {}
        for clock, hz in clocks.items():
            budget = hz / rate
            for what, n in counts.items():
                host = (n["tick"] + n["receive"]) / budget
                device = n["ondevice"] / budget
                shares.setdefault(clock, {})[what] = {"host_computed": host, "on_device": device}
                print(f"  at {rate} Hz on {clock}, {what}: host-computed {100 * host:.1f} %, "
                      f"on-device {100 * device:.1f} % of the period (goal < {100 * goal:.0f} %)")
        results[name + (f" {quantize}" if quantize else "")] = {"unit": unit, "tick": r["tick"], "ondevice": r["ondevice"],
                         "receive": r["receive"],
                         "policy": r["policy"], "stack": r.get("stack"),
                         "flash_firmware": fit.firmware.flash, "flash_with_policy": fit.total.flash,
                         "ram_static": fit.total.ram, "check_image_flash": r["image"].flash,
                         "check_image_ram": r["image"].ram, "policy_scratch": fit.scratch,
                         "rate_hz": rate, "shares": shares,
                         "cycles": r.get("cycles")}
    if "uno" in results:
        results["uno int16"] = uno_int16(obs)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


def uno_int16(obs) -> dict:
    """The Uno with the distilled 3-4-4-1 rig policy in float and in int16
    (``--quantize int16``: the whole MLP in integers): flash, policy_step and
    the on-device tick on simavr."""
    b = boards.BOARDS["uno"]
    budget = b.clock_hz / GOALS["uno"][0]
    model = onnx.load(DISTILLED)
    out = {}
    print(f"\n{b.description}, the distilled 3-4-4-1 rig policy ({DISTILLED.name})")
    for quantize in (None, "int16"):
        src = boards.controller_c(b, model, quantize)
        fit = boards.measure(b, src)
        r = boards.target_check(b, src, obs)
        name = quantize or "float"
        print(f"  {name}" + (f" (--quantize int16: {src.error})" if quantize else "") +
              f": flash {fit.total.flash} B with the policy ({fit.firmware.flash} B without; "
              f"{fit.const_bytes} B weights); policy_step {r['policy']:.0f}, on-device tick "
              f"{r['ondevice']:.0f} cycles = {100 * r['ondevice'] / budget:.1f} % of the 5 ms "
              f"period (goal 25 %); estimate {boards.tick_estimate(b, src.size):.0f}" +
              (f"; deepest stack in the check {r['stack']} B" if "stack" in r else ""))
        out[name] = {"unit": "cycles", "tick": r["tick"], "ondevice": r["ondevice"],
                     "policy": r["policy"], "stack": r.get("stack"),
                     "flash_firmware": fit.firmware.flash, "flash_with_policy": fit.total.flash,
                     "weights": fit.const_bytes, "estimate": boards.tick_estimate(b, src.size),
                     "on_device_share": r["ondevice"] / budget}
    return out


def uno_widths(model, obs, widths: list[int]) -> int:
    b = boards.BOARDS["uno"]
    budget = b.clock_hz / GOALS["uno"][0]
    print(f"Uno on-device tick on simavr, 3-H-H-1 (the rig graph, random weights); "
          f"{budget:.0f} cycles a period at {GOALS['uno'][0]} Hz")
    for h in widths:
        src = boards.controller_c(b, boards.widened(model, h))
        r = boards.target_check(b, src, obs)
        est = boards.uno_tick_estimate(src.size.macs, src.size.packed_macs)
        print(f"  H = {h:3d}: {src.size.macs:5d} multiply-adds, fw_tick alone {r['tick']:.0f}, "
              f"policy_step {r['policy']:.0f}, on-device tick {r['ondevice']:.0f} cycles = "
              f"{100 * r['ondevice'] / budget:.1f} % of the period (goal 25 %); estimate "
              f"{est:.0f} ({100 * (est / r['ondevice'] - 1):+.1f} %)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
