"""Verified ONNX graph -> dependency-free C99 (one source, one header).

Every controller, trained or hand-written, reaches C the same way: the graph
that ``verify`` checked against torch is walked node by node in topological
order, with the batch dimension fixed at 1, and each node becomes a few lines
of C. What depends only on constants (shape arithmetic, index tensors,
folded weights) is evaluated here, with ``onnx.reference``, and never reaches
the C. The result has

* weights as ``static const float`` arrays, no malloc, no stdio, only libm;
  on AVR they carry ``PROGMEM`` and are read with ``pgm_read_float`` (avr-gcc
  would otherwise copy every const array into the few KB of SRAM), elsewhere
  they are plain const and the read macro is an array access;
* one function ``int <name>_step(const float *obs, float *action)``;
* one scratch array on the stack, sized by a liveness-aware allocator, so RAM
  is the largest set of intermediate values alive at once.

The graph walk, the ops' C and the allocator are ``c_graph``'s (ops: its
``_UNARY``, ``_BINARY``, ``_MOVES`` and ``_emit_node``; anything else is
refused with an error that names the op); what a target needs, ``c_avr``'s
(flash reads, libm gaps, packed weights), ``c_cortex_m4``'s (the blocked
product's assembly kernel) and ``q15``'s (fixed-point layers). This module
puts them together: ``generate_c`` and the source and header it writes.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from grpo_ctrl.errors import UserError
from grpo_ctrl.export import int16, metadata, q15
from grpo_ctrl.export import c_avr, c_cortex_m4
from grpo_ctrl.export.c_avr import _packed  # noqa: F401  (tests read it here)
from grpo_ctrl.export.c_cortex_m4 import _mac_macro  # noqa: F401  (tests read it here)
from grpo_ctrl.export.c_graph import (_ALIASES, _Emitter, _Tensor, _allocate, _at, _emit_node,
                                      _float_literal, _io_sizes, walk)
from grpo_ctrl.files import atomic_write, check_folder

_LIBM_CALL = re.compile(r"\b([a-z0-9]+f)\(")


@dataclass
class SizeReport:
    """What the generator knows exactly. Code size depends on the compiler
    and the target (an estimate was off by 2-9x), so it is measured where a
    toolchain is at hand: ``c_build.cross_size`` and ``grpo-ctrl firmware``."""
    const_bytes: int     # weights and index tables (flash)
    ram_bytes: int       # scratch on the stack: the largest set of live intermediates (and q15 inputs)
    libm: list[str]
    macs: int = 0        # multiply-adds of the matrix products per step
    packed_macs: int = 0  # of those, the ones whose weight is read packed (3.5 B)
    q15_macs: int = 0    # of those, the ones computed in q15 (generate_c's quantize)
    q15_io: int = 0      # inputs quantised plus outputs converted back, of the q15 products
    int16_macs: int = 0  # of those, the ones in generate_c's quantize="int16" (the whole MLP)

    def summary(self) -> str:
        q = (f"; q15: {self.q15_macs} of the {self.macs} multiply-adds in 16-bit integers"
             if self.q15_macs else "")
        if self.int16_macs:
            q = f"; int16: all {self.int16_macs} multiply-adds in 16-bit integers, 32-bit sums"
        return (f"{self.const_bytes} B constants (flash), RAM {self.ram_bytes} B scratch "
                f"on the stack; code size depends on the target (measured by grpo-ctrl "
                f"firmware); libm: {', '.join(self.libm) or 'none'}{q}")


@dataclass
class CSource:
    name: str
    c: str
    h: str
    size: SizeReport
    error: str = ""  # q15: the measured error against onnxruntime (c_build.quantized_c)

def check_c_name(name: str) -> str:
    """``UserError`` unless ``name`` can prefix C file and function names."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise UserError(f"the C name {name!r} is not a C identifier; use letters, digits and _")
    return name


# generate_c's quantize choices, each the module whose TOLERANCE is the largest
# |C - onnxruntime| an export accepts (a fraction of u_max)
QUANTIZE_MODULES = {"q15": q15, "int16": int16}
QUANTIZE = tuple(QUANTIZE_MODULES)


def generate_c(model: onnx.ModelProto, name: str = "policy", pack: bool = False,
               block: int = 1, quantize: str | None = None,
               calibration: np.ndarray | None = None) -> CSource:
    """C99 source and header computing ``model`` for one observation.
    ``pack``: large weight arrays stored losslessly in 3.5 bytes a float
    (``_packed``) rather than 4, for a chip short of flash (the Uno); every
    read then unpacks (a few table lookups), so it is off by default.
    ``block``: a matrix product with a constant B computes this many outputs
    per pass over its input, each in its own accumulator (the same sums in
    the same order): fewer loads where registers are plenty (Cortex-M4F:
    16), more spills where every float operation is a call (AVR: 1). Its
    weights are then read in storage order through a pointer, and its input
    up to four at a time (``_mac_macro``: VLDMs, the multiplies, the adds in
    one asm statement on an Arm FPU; plain C elsewhere).
    ``quantize="q15"``: the hidden layers whose input is a Relu's output
    (in an MLP, all but the first and the output layer) in 16-bit fixed
    point (``q15``: SMLALD on a Cortex-M4, the same integers in plain C
    elsewhere), their input scales from the largest values over
    ``calibration`` (observations (N, nobs)); no longer the float graph
    exactly: ``c_build.quantized_c`` measures by how much.
    ``quantize="int16"``: the whole MLP in integers (``int16``: 16-bit
    weights and activations, 32-bit sums, the normalisation folded into the
    input's quantisation; for chips without an FPU), from the same
    calibration."""
    check_c_name(name)
    if quantize is not None and quantize not in QUANTIZE:
        raise UserError(f"unknown quantization {quantize!r}; choose {', '.join(QUANTIZE)}")
    in_name, out_name, nobs = _io_sizes(model)
    if quantize == "int16":
        return _int16_c(model, name, nobs, calibration)
    em = _Emitter(list(model.opset_import), name=name, rom=f"{name.upper()}_ROM", pack=pack,
                  block=block)
    steps, tensors, consts, relu_outputs = walk(model, em, in_name, out_name, nobs)
    if quantize == "q15":
        layers = [n for n in steps if q15.applies(n, tensors, consts, relu_outputs)]
        if not layers:
            raise UserError("--quantize q15 applies to hidden layers whose input is a Relu's "
                            "output (Gemm/MatMul, one row, constant weights); this graph has none")
        if calibration is None:
            raise UserError("q15 needs calibration observations for its input scales")
        amax = q15.calibrate(model, [n.input[0] for n in layers], calibration)
        em.q15 = {n.output[0]: amax[n.input[0]] for n in layers}
    ram = _allocate(steps, tensors, out_name)
    for node in steps:
        if node.output[0] in em.q15:
            q15.emit_layer(node, tensors, consts, em)
        elif node.op_type not in _ALIASES:
            _emit_node(node, tensors, consts, em)
    out = tensors[out_name]
    body = "\n".join(em.lines)
    libm = sorted(set(_LIBM_CALL.findall(body)))
    size = SizeReport(em.const_bytes, 4 * ram + em.q15_scratch, libm, em.macs, em.packed_macs, em.q15_macs,
                      em.q15_io)
    meta = metadata.raw(model)
    return CSource(name, _c_file(name, em, body, ram, out, nobs, size, meta),
                   _h_file(name, nobs, size, meta), size)


def _int16_c(model: onnx.ModelProto, name: str, nobs: int, calibration) -> CSource:
    """generate_c(quantize="int16"): the whole MLP in integers (``int16``)."""
    if calibration is None:
        raise UserError("int16 needs calibration observations for its input scales")
    net = int16.quantize(int16.parse(model), calibration)
    libm = ["tanhf"] if net.mlp.tanh else []
    ram = 2 * (nobs + sum(layer.wq.shape[0] for layer in net.layers[:-1]))
    size = SizeReport(0, ram, libm, net.macs, int16_macs=net.macs)
    meta = metadata.raw(model)
    src = CSource(name, int16.c_file(name, net, size.summary(), nobs), _h_file(name, nobs, size, meta),
                  size)
    src.net = net
    return src


def _meta_comment(meta: dict) -> str:
    return "\n".join(f" *   {k}: {v}" for k, v in meta.items()) or " *   (none)"


def _c_file(name, em: _Emitter, body, ram, out: _Tensor, nobs, size: SizeReport, meta) -> str:
    scratch = f"  float ws[{ram}];\n" if ram else ""
    consts = "\n\n".join(em.consts)
    rom = em.rom
    gaps = c_avr.libm_gaps(size.libm)
    unpack = c_avr.unpack_function(name, rom) if em.packed else ""
    fixed = q15.runtime(name, rom) if em.q15 else ""
    loads = c_cortex_m4.kernels(rom, em.loads)
    return f"""/* Generated by grpo-ctrl export from a verified ONNX graph; do not edit.
 * {size.summary()}
 */
#include <math.h>
{"#include <stdint.h>" + chr(10) if em.q15 else ""}
#include "{name}.h"

#if defined(__AVR__)
/* constants stay in flash: avr-gcc copies a plain const array into SRAM */
#include <avr/pgmspace.h>
#define {rom} PROGMEM
#define {rom}_F(a, i) pgm_read_float(&(a)[i])
#define {rom}_U16(a, i) pgm_read_word(&(a)[i])
#define {rom}_U8(a, i) pgm_read_byte(&(a)[i])
#define {rom}_U32(a, i) pgm_read_dword(&(a)[i])
{gaps}#else
#define {rom}
#define {rom}_F(a, i) ((a)[i])
#define {rom}_U16(a, i) ((a)[i])
#define {rom}_U8(a, i) ((a)[i])
#define {rom}_U32(a, i) ((a)[i])
#endif
{loads}{unpack}{fixed}
{consts}

int {name}_step(const float *obs, float *action) {{
  for (int i = 0; i < {nobs}; ++i) {{
    if (!isfinite(obs[i])) {{
      action[0] = 0.0f;
      return 1;
    }}
  }}
{scratch}{body}
  action[0] = {_at(out, "0")};
  return 0;
}}
"""


def _h_file(name, nobs, size: SizeReport, meta) -> str:
    guard = f"{name.upper()}_H"
    parsed = metadata.parse(meta) if meta else {}
    names = parsed.get("obs_names") or [f"obs[{k}]" for k in range(nobs)]
    order = "\n".join(f" *   obs[{k}] = {v}" for k, v in enumerate(names))
    defines = f"#define {name.upper()}_NOBS {nobs}\n"
    if "u_max" in parsed:
        defines += f"#define {name.upper()}_U_MAX {_float_literal(parsed['u_max'])}\n"
    if "dt" in parsed:
        defines += f"#define {name.upper()}_DT {_float_literal(parsed['dt'])}\n"
    return f"""/* Generated by grpo-ctrl export from a verified ONNX graph; do not edit.
 *
 * C99, no allocation, no stdio; link with libm (-lm). Compile without
 * -ffast-math: the step function checks its input with isfinite().
 *
 * Size: {size.summary()}.
 *
 * Observation order:
{order}
 *
 * Exported model metadata:
{_meta_comment(meta)}
 */
#ifndef {guard}
#define {guard}

{defines}
/* One control step: obs[{nobs}] as the device measures it -> action[0], the
 * command in physical units, clipped to the actuator limits. Returns 0, or 1
 * (and a command of 0) when an observation is NaN or infinite. */
int {name}_step(const float *obs, float *action);

#endif /* {guard} */
"""


def write_c(model: onnx.ModelProto, outdir: str | Path, name: str = "policy") -> CSource:
    """Generate and write ``OUTDIR/<name>.c`` and ``OUTDIR/<name>.h``."""
    return write_c_source(generate_c(model, name), outdir, name)


def write_c_source(src: CSource, outdir: str | Path, name: str = "policy") -> CSource:
    """Write generated C (``generate_c(model, name)``) as ``OUTDIR/<name>.c``
    and ``OUTDIR/<name>.h``."""
    outdir = check_folder(outdir)
    try:
        outdir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create the folder {str(outdir)!r}: {e.strerror or e}") from None
    atomic_write(outdir / f"{name}.h", src.h)
    atomic_write(outdir / f"{name}.c", src.c)
    return src
