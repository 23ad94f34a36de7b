"""What the generated C does on a Cortex-M4F: a blocked matrix product's
inner step as one asm statement (VLDM, VMUL, VADD; cycles by the Cortex-M4
TRM, ``firmware_bridge.m4_cycles``), with its sums pinned to FPU registers;
plain C with the same roundings elsewhere.
"""
from __future__ import annotations

_SUM_REG = 12  # a blocked product's sums live in s12.. on an Arm FPU (_mac_macro)


def _mac_macro(rom: str, u: int, blk: int) -> str:
    """``<ROM>_MAC<u>X<blk>(ap, wp, c0, ...)``: the next u inputs at ap
    (run-time floats) times the next u x blk weights at wp (constants) added
    into the blk sums c_r, each in input order; ap and wp advanced past what
    was read. The inner step of a blocked matrix product. The weights are
    stored for it in groups of eight outputs (fewer when blk is): per group,
    per input, the group's weights side by side.

    Where the FPU is an Arm VFP (Cortex-M4F) it is an asm statement per
    group: the first loads the u inputs into s8.. with one VLDM, then per
    input a VLDM of the group's weights into s0.., that many VMUL, then the
    VADDs. By the Cortex-M4 TRM (the firmware bridge's m4_cycles) that is 3
    cycles a multiply-add and no stall (VLDM 1 + n; VMUL, VADD 1 each, one
    more only where the next instruction reads the result), and 1 + u cycles
    for the inputs; VMLA or VFMA would be 3 cycles alone, and VFMA rounds
    once, not as the host's C does. GCC, left to this, emits a VLDR (2
    cycles) a weight or, given the VLDMs, spills sums and shuffles registers
    (16 sums, the weights and the inputs fill the FPU's 32); so the sums are
    declared with ``<ROM>_SUM``, pinned to s12.. where this kernel runs. Elsewhere
    plain C: the same two roundings a product, in the same order."""
    gs = min(8, blk)
    cs = [f"c{r}" for r in range(blk)]
    vs = [f"v{i}_" for i in range(u)]
    span = lambda first, n: f"s{first}" if n == 1 else f"s{first}-s{first + n - 1}"  # noqa: E731
    statements = []
    for g in range(blk // gs):
        first = g == 0
        # operands: the pointers, the inputs (outputs of the first statement), the sums
        ptr = ['"+r"(ap)', '"+r"(wp)'] if first else ['"+r"(wp)']
        wp_op = 1 if first else 0
        outs = ptr + ([f'"=t"({v})' for v in vs] if first else []) + \
            [f'"+t"({c})' for c in cs[g * gs:(g + 1) * gs]]
        sums = {r: f"%{len(outs) - gs + r}" for r in range(gs)}
        ins = ([] if first else [f'"t"({v})' for v in vs]) + \
            ([f'"m"(*(const float (*)[{u}])(ap))'] if first else []) + \
            [f'"m"(*(const float (*)[{u * gs}])(wp))']
        asm = [f"vldmia %0!, {{{span(8, u)}}}"] if first else []
        if gs == 1:  # one sum: the u weights in one load, the adds in input order
            asm += [f"vldmia %1!, {{{span(0, u)}}}"] + \
                   [f"vmul.f32 s{i}, s{8 + i}, s{i}" for i in range(u)] + \
                   [f"vadd.f32 {sums[0]}, {sums[0]}, s{i}" for i in range(u)]
        for i in range(u if gs > 1 else 0):
            asm += [f"vldmia %{wp_op}!, {{{span(0, gs)}}}"]
            asm += [f"vmul.f32 s{r}, s{8 + i}, s{r}" for r in range(gs)]
            asm += [f"vadd.f32 {sums[r]}, {sums[r]}, s{r}" for r in range(gs)]
        text = " \\\n            ".join(f'"{x}\\n\\t"' for x in asm)
        clobbers = ", ".join(f'"s{r}"' for r in range(gs if gs > 1 else u))
        statements.append(f"""    __asm__({text} \\
            : {', '.join(outs)} \\
            : {', '.join(ins)} \\
            : {clobbers}); \\""")
    pins = ", ".join(f'{v} __asm__("s{8 + i}")' for i, v in enumerate(vs))
    plain = " ".join(f"c{g * gs + r} += (ap)[{i}] * {rom}_F(wp, {(g * u + i) * gs + r});"
                     for g in range(blk // gs) for i in range(u) for r in range(gs))
    name = f"{rom}_MAC{u}X{blk}(ap, wp, {', '.join(cs)})"
    return f"""#if defined(__GNUC__) && defined(__arm__) && defined(__ARM_FP) && (__ARM_FP & 4)
#define {name} do {{ \\
    register float {pins}; \\
{chr(10).join(statements)}
  }} while (0)
#else
#define {name} do {{ \\
    {plain} \\
    (ap) += {u}; \\
    (wp) += {u * blk}; \\
  }} while (0)
#endif
"""


def kernels(rom: str, loads: set) -> str:
    """The ``<ROM>_MAC<u>X<blk>`` kernels of the blocked products (``loads``:
    their (inputs, outputs) per pass) and ``<ROM>_SUM``, which declares their sums."""
    out = "".join(_mac_macro(rom, u, blk) for u, blk in sorted(loads))
    if loads:  # a blocked product's sums, where the kernel wants them (_mac_macro)
        out = f"""#if defined(__GNUC__) && defined(__arm__) && defined(__ARM_FP) && (__ARM_FP & 4)
#define {rom}_SUM(c, reg) register float c __asm__(reg) = 0.0f
#else
#define {rom}_SUM(c, reg) float c = 0.0f
#endif
""" + out
    return out
