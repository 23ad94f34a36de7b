"""Fixed-point (q15) matrix products for the generated C: ``generate_c(...,
quantize="q15")``.

A hidden layer ``relu(W h + b)`` whose input ``h`` is the output of a Relu
(so never negative) is computed in integers: the weights as 16-bit integers
``round(W 2^sw)`` with one power-of-two scale per layer (the largest that
keeps every weight within +-32767), the input as unsigned 16-bit integers
``round(h 2^sa)`` clamped to 65535, with ``sa`` the largest power of two that
keeps the calibrated maximum of ``h`` times ``MARGIN`` within 65535 (a value
beyond saturates). The Relu's output being non-negative is what buys the
16th bit: each input is stored as the signed ``q - 32768`` (a zero point, as
TFLite's asymmetric quantization has) and ``32768 * sum(Wq)`` is folded into
the constant a sum starts from, with the bias ``round(b 2^(sw+sa))``.

Two products at a time go into a 64-bit sum: ``SMLALD`` on a Cortex-M4 with
the DSP extension (ACLE ``__smlald``, one instruction, one cycle by the
Cortex-M4 TRM), the same integer arithmetic in plain C elsewhere (the host,
AVR), so that every target computes the same sums bit for bit. A 64-bit sum
cannot overflow (each product is below 2^30: it would take 2^33 inputs), so
there is no saturation inside a product; the sum is brought back to float
through a 32-bit window: an offset ``2^bits`` larger than any sum's magnitude
(``bound``: every input at its extreme) makes it positive, a right shift of
``shift`` bits (rounded) fits it in 31, and a float multiply by a power of two
gives the layer's output, to which the Relu applies as before.

The first layer (its input is the normalised observation, signed and of
several ranges: 11 bits of it cost the rig policy 4e-3 of its torque limit)
and the output layer (the command) stay float. What is quantised is measured:
``c_build.quantized_c`` runs the C on the host against onnxruntime and the
header says so (``stamp``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper

from grpo_ctrl.errors import UserError
from grpo_ctrl.export.c_graph import _UNARY, _at, _float_literal, node_comment

MARGIN = 1.25     # headroom over the calibrated maximum of a layer's input
TOLERANCE = 1e-3  # of u_max: the largest |q15 C - onnxruntime| an export accepts


@dataclass
class Layer:
    """One q15 matrix product: ``out[j] = (sum_k Wq[j,k] (q[k] - 32768) +
    init[j] - offset) / 2^(sw + sa)``, computed as ``_out_code`` says."""
    sa: int               # input scale: q = round(h 2^sa), 0..65535
    sw: int               # weight scale: Wq = round(W 2^sw), |Wq| <= 32767
    wq: np.ndarray        # (N, K') int64, K' = K rounded up to a multiple of 4 (zero columns)
    init: list            # per output, the sum's start (Python ints, positive, < 2^63)
    shift: int            # right shift that brings the offset sum within 31 bits
    base: int             # offset >> shift
    bound: int            # largest |sum| over every input

    @property
    def out_scale(self) -> float:
        """What one unit of the shifted sum is worth."""
        return 2.0 ** (self.shift - self.sw - self.sa)


def scale_for(limit: float, amax: float) -> int:
    """The largest power-of-two exponent s with amax 2^s <= limit (0 if amax is 0)."""
    if not amax > 0:
        return 0
    return int(max(-30, min(30, math.floor(math.log2(limit / amax)))))


def quantize_layer(w_nk: np.ndarray, bias: np.ndarray | None, amax: float) -> Layer:
    """The q15 form of ``W h + b`` (W (N, K), b (N,) or None) for inputs ``h``
    in [0, amax] (amax: calibrated maximum, MARGIN added here)."""
    w = np.asarray(w_nk, np.float64)
    n, k = w.shape
    sa = scale_for(65535.0, MARGIN * amax)
    sw = scale_for(32767.0, float(np.max(np.abs(w))))
    wq = np.round(w * 2.0 ** sw).astype(np.int64)
    wq = np.concatenate([wq, np.zeros((n, -k % 4), np.int64)], axis=1)
    b = np.zeros(n) if bias is None else np.asarray(bias, np.float64).reshape(-1)
    bq = [int(round(math.ldexp(float(v), sw + sa))) for v in b]
    # q in 0..65535: |sum Wq q + bq| <= sum |Wq| 65535 + |bq|
    bound = max(int(np.sum(np.abs(wq[j]))) * 65535 + abs(bq[j]) for j in range(n))
    bits = bound.bit_length()            # offset 2^bits > bound: the sum is in (0, 2^(bits+1))
    shift = max(0, bits + 1 - 31)        # ... and shifted, below 2^31
    offset = 1 << bits
    rnd = (1 << (shift - 1)) if shift else 0
    init = [bq[j] + 32768 * int(np.sum(wq[j])) + offset + rnd for j in range(n)]
    return Layer(sa, sw, wq, init, shift, offset >> shift, bound)


def emulate(layer: Layer, h: np.ndarray) -> np.ndarray:
    """What the C computes for inputs ``h`` (B, K) float32 (before any Relu):
    the reference the tests hold the C to."""
    h = np.asarray(h, np.float32)
    v = h * np.float32(2.0 ** layer.sa) + np.float32(0.5)
    q = np.floor(np.minimum(v, np.float32(65535.0))).astype(np.int64) - 32768
    q = np.concatenate([q, np.zeros((len(q), layer.wq.shape[1] - q.shape[1]), np.int64)], axis=1)
    sums = q @ layer.wq.T + np.array(layer.init, np.int64)
    window = (sums >> layer.shift) - layer.base
    return window.astype(np.float32) * np.float32(layer.out_scale)


def calibrate(model: onnx.ModelProto, names: list[str], obs: np.ndarray) -> dict[str, float]:
    """Largest value of each intermediate tensor ``names`` over observations
    ``obs`` (N, nobs), by onnxruntime."""
    import onnxruntime as ort

    m = onnx.ModelProto.FromString(model.SerializeToString())
    known = {o.name for o in m.graph.output}
    for name in names:
        if name not in known:
            m.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
    session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    values = session.run(names, {session.get_inputs()[0].name: np.asarray(obs, np.float32)})
    return {n: float(np.max(v)) for n, v in zip(names, values)}


def runtime(name: str, rom: str) -> str:
    """The C helpers every q15 product uses: the input's quantisation, the
    dual multiply-add into a 64-bit sum, the sum back to float."""
    return f"""
/* q15 (grpo-ctrl export --quantize q15): v = h 2^sa, h a Relu's output (+0 or
 * more, never NaN), rounded and clamped to 0..65535, stored as the signed
 * q - 32768 */
#if defined(__GNUC__) && defined(__ARM_FP) && (__ARM_FP & 4) && defined(__ARM_FEATURE_SAT)
static uint32_t {name}_q15_input(float v)
{{
  /* VCVT to integer (toward zero, saturating), USAT to 0..65535: the
   * conversion and the clamp below without a compare and branch */
  uint32_t q;
  v += 0.5f;
  __asm__("vcvt.s32.f32 %1, %1\\n\\tvmov %0, %1\\n\\tusat %0, #16, %0" : "=r"(q), "+t"(v));
  return q ^ 0x8000u;
}}
#else
static uint32_t {name}_q15_input(float v)
{{
  v += 0.5f;
  return (v < 65535.0f ? (uint32_t)v : 65535u) ^ 0x8000u;
}}
#endif

#if defined(__ARM_FEATURE_DSP) && __ARM_FEATURE_DSP
#include <arm_acle.h>
#if defined(__GNUC__) && defined(__thumb2__)
/* the step of a product, two outputs by four inputs: the two input words
 * (four q15) in one LDM, the two outputs' four weight words in another, four
 * SMLALDs: 12 cycles for 8 multiply-adds by the Cortex-M4 TRM (LDM 1 + N,
 * SMLALD 1), against 3 a multiply-add in float; GCC, given __smlald, spills
 * its 64-bit sums */
#define {rom}_Q15_MAC4X2(ap, wp, c0, c1) \\
  __asm__("ldmia %[a]!, {{r4, r5}}\\n\\t" \\
          "ldmia %[w]!, {{r8, r9, r10, r11}}\\n\\t" \\
          "smlald %Q[x], %R[x], r8, r4\\n\\t" \\
          "smlald %Q[y], %R[y], r10, r4\\n\\t" \\
          "smlald %Q[x], %R[x], r9, r5\\n\\t" \\
          "smlald %Q[y], %R[y], r11, r5\\n\\t" \\
          : [a] "+r"(ap), [w] "+r"(wp), [x] "+r"(c0), [y] "+r"(c1) \\
          : "m"(*(const uint32_t(*)[2])(ap)), "m"(*(const uint32_t(*)[4])(wp)) \\
          : "r4", "r5", "r8", "r9", "r10", "r11")
#endif
/* c += lo(w) lo(a) + hi(w) hi(a), the halves signed 16-bit: one SMLALD */
#define {rom}_Q15_MAC2(c, w, a) ((c) = __smlald((int32_t)(w), (int32_t)(a), (c)))
#else
/* the same sums in plain C (host, AVR): bit for bit the SMLALD's. The two
 * products add in 32 bits (each at most 32767 x 32768: no overflow), and
 * 16 x 16 -> 32-bit multiplies (avr-gcc: __mulhisi3, not a 32-bit multiply) */
static int16_t {name}_q15_half(uint32_t x)
{{
  return (int16_t)((int32_t)(x & 0x7FFFu) - (int32_t)(x & 0x8000u));
}}
#define {rom}_Q15_MAC2(c, w, a) \\
  ((c) += (int32_t){name}_q15_half(w) * {name}_q15_half(a) + \\
          (int32_t){name}_q15_half((w) >> 16) * {name}_q15_half((a) >> 16))
#endif
#if !defined({rom}_Q15_MAC4X2)
#define {rom}_Q15_MAC4X2(ap, wp, c0, c1) do {{ \\
    {rom}_Q15_MAC2(c0, {rom}_U32(wp, 0), (ap)[0]); \\
    {rom}_Q15_MAC2(c0, {rom}_U32(wp, 1), (ap)[1]); \\
    {rom}_Q15_MAC2(c1, {rom}_U32(wp, 2), (ap)[0]); \\
    {rom}_Q15_MAC2(c1, {rom}_U32(wp, 3), (ap)[1]); \\
    (ap) += 2; \\
    (wp) += 4; \\
  }} while (0)
#endif
/* a sum (made positive by its offset) shifted into 31 bits, less the offset's share */
#define {rom}_Q15_OUT(c, shift, base) \\
  ((float)((int32_t)(uint32_t)((uint64_t)(c) >> (shift)) - (int32_t)(base)))
"""


def packed_weights(layer: Layer) -> np.ndarray:
    """The weights as uint32 words of two (the lower input in the low half),
    in the order ``<ROM>_Q15_MAC4X2`` reads them: per two outputs, per four
    inputs, the first output's two words, then the second's."""
    u = (layer.wq & 0xFFFF).astype(np.uint64)
    words = (u[:, 0::2] | (u[:, 1::2] << 16)).astype(np.uint32)  # (N, K'/2)
    n, pairs = words.shape
    return words.reshape(n // 2, 2, pairs // 2, 2).transpose(0, 2, 1, 3).reshape(-1)


def summary(err: float | None, u_max: float | None, samples: int, tol: float = TOLERANCE) -> str:
    """One line on the measured error of a q15 C (``err`` None: not measured)."""
    if err is None:
        return "error against onnxruntime not measured (no host C compiler)"
    rel = f" = {err / u_max:.2g} of u_max" if u_max else ""
    return (f"max |C - onnxruntime| = {err:.3g}{rel} over {samples} observations across the "
            f"plant's operating range (tolerance {tol:g} of u_max)")


def stamp(h: str, line: str, quantize: str = "q15") -> str:
    """The header with ``summary``'s line written in."""
    words, out = line.split(), []
    what = ("q15 (hidden layers in 16-bit fixed point)" if quantize == "q15" else
            "int16 (every layer in 16-bit integers, 32-bit sums)")
    cur = f" * {what}, measured on the host at export:"
    for w in words:
        if len(cur) + 1 + len(w) > 90:
            out.append(cur)
            cur = " *  "
        cur += " " + w
    out.append(cur)
    return h.replace(" * Observation order:", "\n".join(out) + "\n *\n * Observation order:", 1)


def check_error(err: float, u_max: float | None, quantize: str = "q15",
                tol: float = TOLERANCE) -> None:
    """UserError when the quantised C strays further than ``tol`` of u_max."""
    limit = tol * (u_max or 1.0)
    if not err <= limit:
        raise UserError(f"the {quantize} C differs from onnxruntime by {err:.3g} (> {limit:.3g}, "
                        f"{tol:g} of the command's limit); export it without --quantize")


# ---------------------------------------------------------------- the generated C of a layer
def applies(node, tensors, consts, relu_outputs) -> bool:
    """Whether generate_c's q15 takes this product: a Gemm/MatMul of one
    run-time row that a Relu made non-negative by constant 2-D weights, with
    an even number of outputs (a hidden layer, not the command: the kernel
    computes two a pass), alpha 1 and a constant bias (or none)."""
    if node.op_type not in ("Gemm", "MatMul") or node.input[0] not in relu_outputs:
        return False
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    a, b = tensors.get(node.input[0]), consts.get(node.input[1])
    if a is None or b is None or np.ndim(b) != 2 or len(a.shape) != 2 or a.shape[0] != 1:
        return False
    n = np.shape(b)[0] if attrs.get("transB", 0) else np.shape(b)[1]
    c = node.input[2] if len(node.input) > 2 and node.input[2] else None
    return (n % 2 == 0 and not attrs.get("transA", 0) and float(attrs.get("alpha", 1.0)) == 1.0 and
            (c is None or (c in consts and np.size(consts[c]) in (1, n))))


def emit_layer(node, tensors, consts, em) -> None:
    """out (1, N) = A W + b in q15 (this module): A's K inputs quantised into
    pairs, then per two outputs one pass over the pairs, four inputs a step
    into each output's 64-bit sum (``<ROM>_Q15_MAC4X2``), and
    each sum back to float as it is stored (through the Relu that follows,
    where generate_c fused it)."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    out = tensors[node.output[0]]
    em.lines.append(node_comment(node, out))
    w = np.asarray(consts[node.input[1]], np.float32)
    w_nk = w if attrs.get("transB", 0) else w.T
    N, K = w_nk.shape
    bias = None
    if len(node.input) > 2 and node.input[2]:
        bias = np.broadcast_to(np.asarray(consts[node.input[2]], np.float64).reshape(-1), (N,)) * \
            float(attrs.get("beta", 1.0))
    layer = quantize_layer(w_nk, bias, em.q15[node.output[0]])
    pairs = layer.wq.shape[1] // 2  # input words, K rounded up to a multiple of 4, halved
    what = f"{node.op_type} {node.name}"
    words = em.word_table(f"{what}: weights, q15 at 2^{layer.sw}, two to a word",
                          packed_weights(layer))
    init = np.array(layer.init, np.uint64)
    lo = em.word_table(f"{what}: each sum's start (bias, zero point, offset), low words",
                       init & np.uint64(0xFFFFFFFF))
    hi = em.word_table(f"{what}: ... high words", init >> np.uint64(32))
    em.macs += N * K
    em.q15_macs += N * K
    em.q15_io += N + K
    em.q15_scratch = max(em.q15_scratch, 4 * pairs)
    rom, then = em.rom, em.then.get(node.output[0])
    a = tensors[node.input[0]]
    s = _float_literal(2.0 ** layer.sa)
    qin = f"{em.name}_q15_input"
    lines = [f"/* q15: inputs at 2^{layer.sa} (calibrated max {em.q15[node.output[0]]:.4g}), "
             f"weights at 2^{layer.sw}, sums within +-{layer.bound} */",
             f"uint32_t aq[{pairs}];",
             f"for (int k = 0; k < {K // 2}; ++k) aq[k] = {qin}({_at(a, '2 * k')} * {s}) | "
             f"{qin}({_at(a, '2 * k + 1')} * {s}) << 16;"]
    if K % 2:
        lines.append(f"aq[{K // 2}] = {qin}({_at(a, str(K - 1))} * {s});")
    if pairs > (K + 1) // 2:
        lines.append(f"aq[{pairs - 1}] = 0;")
    j = "j" if N > 2 else "0"
    at_j = ["j", "j + 1"] if j == "j" else ["0", "1"]
    start = [f"c{r} = (int64_t)((uint64_t){rom}_U32({hi}, {at_j[r]}) << 32 | "
             f"{rom}_U32({lo}, {at_j[r]}))" for r in range(2)]
    body = ["const uint32_t *ap = aq;", f"int64_t {', '.join(start)};",
            f"for (int k = 0; k < {pairs // 2}; ++k) {rom}_Q15_MAC4X2(ap, wp, c0, c1);"]
    scale = _float_literal(layer.out_scale)
    for r in range(2):
        value = f"{rom}_Q15_OUT(c{r}, {layer.shift}, {layer.base}u) * {scale}"
        dst = _at(out, at_j[r])
        if then:
            body += [f"{{ const float acc = {value}; {dst} = {_UNARY[then].format(x='acc')}; }}"]
        else:
            body += [f"{dst} = {value};"]
    blk = 2
    if N > blk:
        body = [f"for (int j = 0; j < {N}; j += {blk}) {{"] + ["  " + x for x in body] + ["}"]
    lines += [f"const uint32_t *wp = {words};"] + body
    if then:
        em.lines.append(f"  /* and the {then} that follows, as each output is stored */")
    em.lines.extend(["  {"] + ["    " + x for x in lines] + ["  }"])
