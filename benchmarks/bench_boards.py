#!/usr/bin/env python3
"""Flash, RAM and time per control tick on each board, measured on emulators.

For each board whose toolchain and emulator are installed:

* sizes: the firmware image (``grpo-ctrl firmware``'s build), without and
  with the default 3-64-64-1 rig policy linked in;
* time: ``firmware/board/target_check.c`` on the emulated chip: ``fw_tick``
  (armed, a fresh command each period), decoding one COMMAND frame
  (``fw_receive``), and one ``policy_step``. On the Uno these are CPU cycles
  (simavr is cycle-counting, Timer1 at the CPU clock). On the Cortex-M4F
  they are instructions: QEMU models neither the M4's pipeline nor DWT's
  CYCCNT, so the check counts SysTick periods at the model's 25 MHz under
  ``-icount shift=0`` (one instruction per ns of virtual time, 40 a
  period). An M4 takes at least one cycle per instruction (the policy's
  inner loop, an input load, two VLDMs of eight weights, 16 VMUL, 16 VADD
  and the loop: 38 instructions, about 56 cycles by the Cortex-M4 TRM's
  timings), so the shares printed are lower bounds.

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

POLICY = Path(__file__).resolve().parent.parent / "tests" / "data" / "pendulum-rig-grpo.onnx"
# board -> (control rate for the goal, clocks to express it at, goal share)
GOALS = {"uno": (200, {"ATmega328P 16 MHz": 16e6}, 0.25),
         "mps2-an386": (1000, {"MPS2 25 MHz": 25e6, "STM32F4 168 MHz": 168e6}, 0.10)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    model = onnx.load(POLICY)
    obs = operating_observations("pendulum", "rig", 4)
    results = {}
    for name, b in boards.BOARDS.items():
        missing = boards.emulator_missing(b)
        if missing:
            print(f"{name}: skipped: {missing}")
            continue
        src = boards.controller_c(b, model)
        fit = boards.measure(b, src)
        r = boards.target_check(b, src, obs)
        unit = "cycles" if name == "uno" else "instructions"
        rate, clocks, goal = GOALS[name]
        print(f"\n{b.description}")
        print(f"  flash {fit.firmware.flash} B firmware, {fit.total.flash} B with the 3-64-64-1 "
              f"policy ({fit.const_bytes} B weights) of {b.flash} B; static RAM "
              f"{fit.total.ram} B + {fit.scratch} B policy scratch" +
              (f"; deepest stack in the check {r['stack']} B" if "stack" in r else ""))
        print(f"  core + policy alone (the check image): flash {r['image'].flash} B, static RAM "
              f"{r['image'].ram} B")
        print(f"  fw_tick {r['tick']:.0f}, fw_receive (one COMMAND) {r['receive']:.0f}, "
              f"policy_step {r['policy']:.0f}, fw_tick in on-device control (policy "
              f"included) {r['ondevice']:.0f} {unit}")
        shares = {}
        for clock, hz in clocks.items():
            budget = hz / rate
            host = (r["tick"] + r["receive"]) / budget
            device = r["ondevice"] / budget
            shares[clock] = {"host_computed": host, "on_device": device}
            print(f"  at {rate} Hz on {clock}: host-computed {100 * host:.1f} %, on-device "
                  f"{100 * device:.1f} % of the period (goal < {100 * goal:.0f} %)"
                  + ("" if name == "uno" else ", lower bounds"))
        results[name] = {"unit": unit, "tick": r["tick"], "ondevice": r["ondevice"],
                         "receive": r["receive"],
                         "policy": r["policy"], "stack": r.get("stack"),
                         "flash_firmware": fit.firmware.flash, "flash_with_policy": fit.total.flash,
                         "ram_static": fit.total.ram, "check_image_flash": r["image"].flash,
                         "check_image_ram": r["image"].ram, "policy_scratch": fit.scratch,
                         "rate_hz": rate, "shares": shares}
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
