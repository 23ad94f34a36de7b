"""Cortex-M4F cycles, estimated from the instructions QEMU executes.

QEMU has no cycle model (``-icount`` counts instructions, and the M4's DWT
cycle counter is not implemented), so the estimate applies the Cortex-M4
Technical Reference Manual's per-instruction timings (ARM DDI 0439, r0p1:
table 3-1, "Cortex-M4 instruction set summary", and table 7-1, "FPU
instruction set") to the trace of every executed instruction:
``qemu-system-arm -singlestep -d exec,nochain`` logs one line per
instruction (each its own translation block, none chained), and
``arm-none-eabi-objdump -d`` of the image says what the instruction at each
address is.

The cost model (``cost``), in cycles:

* integer data processing, multiply and multiply-accumulate (MUL, MLA,
  UMULL, ...), IT, compares: 1;
* SDIV, UDIV: 12 (the TRM gives 2-12: the divider stops early; the upper end);
* LDR, STR and their byte/halfword forms: 2 (the TRM lets neighbouring
  loads and stores pipeline to 1 each; not credited); LDRD, STRD: 3;
* LDM, STM, PUSH, POP: 1 + N registers;
* a branch that is taken (B, BL, BX, BLX, CBZ/CBNZ when taken, a POP or LDR
  into PC): 1 + P, and TBB/TBH 2 + P, where P, the pipeline refill, is 1-3
  by the TRM (alignment and width of the target, and whether the address
  was speculated); P = ``REFILL`` = 2 here, and ``refills`` counts them so
  that P = 3 is the estimate plus that count; a branch not taken: 1;
* VLDR, VSTR: 2; VLDM, VSTM, VPUSH, VPOP: 1 + N words;
* VADD, VSUB, VMUL, VNMUL, VABS, VNEG, VCMP, VCVT, VMOV (one register),
  VMRS, VMSR: 1; VMOV of two core registers: 2;
* VMLA, VMLS, VNMLA, VNMLS, VFMA, VFMS, VFNMA, VFNMS: 3; VDIV, VSQRT: 14;
* and, from the TRM's FPU chapter, a floating-point arithmetic instruction
  (add, subtract, multiply, divide, square root, multiply-accumulate,
  conversion) takes one cycle more when the next instruction reads its
  result (``FP_RESULT_STALL``).

Not modelled: memory wait states (the estimate is for zero-wait-state
memory: SRAM, an STM32F4's CCM, or flash behind its ART accelerator on
hits; at 168 MHz its flash has five wait states on a miss), bus contention
and interrupts. Conditional instructions in an IT block are charged as
executed, whether or not their condition held.
"""
from __future__ import annotations

import re
import subprocess
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

REFILL = 2           # P: the pipeline refill after a taken branch (TRM: 1-3)
FP_RESULT_STALL = 1  # extra cycle when the next instruction reads an FP result
_FP_ARITH = ("vadd", "vsub", "vmul", "vnmul", "vdiv", "vsqrt", "vmla", "vmls", "vnmla",
             "vnmls", "vfma", "vfms", "vfnma", "vfnms", "vcvt")
_FP_3 = ("vmla", "vmls", "vnmla", "vnmls", "vfma", "vfms", "vfnma", "vfnms")
_CONDS = "eq|ne|cs|cc|hs|lo|mi|pl|vs|vc|hi|ls|ge|lt|gt|le|al"
_BRANCH = re.compile(rf"^(b|bl|blx|bx)({_CONDS})?$")
_NO_DEST = ("vstr", "vstm", "vpush", "vcmp", "str", "stm", "push", "cmp", "cmn", "tst", "teq")
_REG = re.compile(r"\b([rsd][0-9]{1,2}|ip|lr|sp|pc)\b")


@dataclass(frozen=True)
class Insn:
    mnemonic: str   # as objdump prints it, without the .n/.w/.f32 qualifiers
    operands: str
    size: int       # bytes: 2 or 4


def disassemble(elf: Path) -> dict[int, Insn]:
    """Address -> instruction, from ``arm-none-eabi-objdump -d``."""
    text = subprocess.run(["arm-none-eabi-objdump", "-d", str(elf)], capture_output=True,
                          text=True, check=True).stdout
    out = {}
    for line in text.splitlines():
        parts = line.split("\t")
        m = re.match(r"^ *([0-9a-f]+):$", parts[0])
        if not m or len(parts) < 3:
            continue
        size = 2 * len(parts[1].split())
        mnemonic = parts[2].strip().split(".")[0]
        operands = parts[3].split("@")[0].split(";")[0].strip() if len(parts) > 3 else ""
        out[int(m.group(1), 16)] = Insn(mnemonic, operands, size)
    return out


def _count_regs(operands: str) -> int:
    """Words a register list {..} moves (a d register is two)."""
    inside = operands[operands.find("{") + 1:operands.find("}")]
    n = 0
    for item in inside.split(","):
        item = item.strip()
        m = re.fullmatch(r"([rsd])(\d+)-[rsd](\d+)", item)
        if m:
            k = int(m.group(3)) - int(m.group(2)) + 1
        else:
            k = 1
        n += 2 * k if item.startswith("d") else k
    return n


def cost(insn: Insn, taken: bool) -> tuple[int, bool]:
    """Cycles of one executed instruction (``taken``: the next one executed
    is not the one after it in memory) and whether it refilled the pipeline."""
    m, ops = insn.mnemonic, insn.operands
    if m.startswith(("pop", "ldm")):
        writes_pc = "pc" in ops[ops.find("{"):]
    else:
        writes_pc = bool(re.match(r"pc\b", ops)) and not m.startswith(("cmp", "str", "tst"))
    if _BRANCH.match(m) or m in ("cbz", "cbnz"):
        return (1 + REFILL, True) if taken else (1, False)
    if m.startswith(("tbb", "tbh")):
        return 2 + REFILL, True
    if m.startswith(("vldm", "vstm", "vpush", "vpop")):
        return 1 + _count_regs(ops), False
    if m.startswith(("vldr", "vstr")):
        return 2, False
    if m.startswith(_FP_3):
        return 3, False
    if m.startswith(("vdiv", "vsqrt")):
        return 14, False
    if m.startswith("vmov"):
        core = len(re.findall(r"\b(r[0-9]{1,2}|ip|lr)\b", ops))
        return (2 if core >= 2 else 1), False
    if m.startswith(("ldm", "stm", "push", "pop")):
        c = 1 + _count_regs(ops)
        return (c + REFILL, True) if writes_pc else (c, False)
    if m.startswith(("ldrd", "strd")):
        return 3, False
    if m.startswith(("ldr", "str")):
        return (2 + REFILL, True) if writes_pc else (2, False)
    if m.startswith(("sdiv", "udiv")):
        return 12, False
    if writes_pc:
        return 1 + REFILL, True
    return 1, False


def _fp_stall(prev: Insn, nxt: Insn) -> int:
    """FP_RESULT_STALL when ``nxt`` reads the result of FP arithmetic ``prev``."""
    if not prev.mnemonic.startswith(_FP_ARITH):
        return 0
    dest = _REG.findall(prev.operands)[:1]
    regs = _REG.findall(nxt.operands)
    sources = regs if nxt.mnemonic.startswith(_NO_DEST) else regs[1:]
    return FP_RESULT_STALL if dest and dest[0] in sources else 0


@dataclass
class Calls:
    """The executed cost of each call of one function."""
    instructions: list = field(default_factory=list)
    cycles: list = field(default_factory=list)
    refills: list = field(default_factory=list)   # taken branches (each P cycles)
    by_symbol: dict = field(default_factory=lambda: defaultdict(int))  # cycles, all calls

    def mean(self, what: str) -> float:
        values = getattr(self, what)
        return sum(values) / len(values)


def trace_pcs(log: Path) -> list[tuple[int, str]]:
    """(pc, symbol) of each executed instruction, from QEMU's
    ``-singlestep -d exec,nochain`` log."""
    out = []
    pat = re.compile(r"^Trace \d+: 0x[0-9a-f]+ "
                     r"\[[0-9a-f]+/([0-9a-f]+)/[0-9a-f]+/[0-9a-f]+\] ?(\S*)")
    with open(log) as f:
        for line in f:
            m = pat.match(line)
            if m:
                out.append((int(m.group(1), 16), m.group(2)))
    return out


def calls(pcs: list, code: dict[int, Insn], entries: dict[str, int]) -> dict[str, Calls]:
    """Cost of every call of the functions ``entries`` (name -> address): from
    the entry to the return to the instruction after the call (calls made
    inside are included; the measured functions must not nest)."""
    by_addr = {a: n for n, a in entries.items()}
    res = {n: Calls() for n in entries}
    current, ret, ins, cyc, ref = None, None, 0, 0, 0
    for i, (pc, sym) in enumerate(pcs):
        if current is None:
            if pc in by_addr and i:
                prev = code[pcs[i - 1][0]]
                current, ret, ins, cyc, ref = by_addr[pc], pcs[i - 1][0] + prev.size, 0, 0, 0
            else:
                continue
        elif pc == ret:
            c = res[current]
            c.instructions.append(ins)
            c.cycles.append(cyc)
            c.refills.append(ref)
            current = None
            continue
        insn = code[pc]
        nxt = pcs[i + 1][0] if i + 1 < len(pcs) else pc + insn.size
        cycles, refill = cost(insn, nxt != pc + insn.size)
        if nxt in code:
            cycles += _fp_stall(insn, code[nxt])
        ins += 1
        cyc += cycles
        ref += refill
        res[current].by_symbol[sym or hex(pc)] += cycles
    return res


def symbols(elf: Path) -> dict[str, int]:
    """Function name -> entry address (the Thumb bit cleared), from ``nm``."""
    text = subprocess.run(["arm-none-eabi-nm", str(elf)], capture_output=True, text=True,
                          check=True).stdout
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in "tT":
            out[parts[2]] = int(parts[0], 16) & ~1
    return out
