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

Ops: see ``_UNARY``, ``_BINARY``, ``_MOVES`` and ``_emit_node``; anything else
is refused with an error that names the op.
"""
from __future__ import annotations

import heapq
import re
from collections import Counter
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from grpo_ctrl.export import metadata, q15
from grpo_ctrl.files import atomic_write, check_folder
from grpo_ctrl.errors import UserError

# ONNX op -> C expression of its input {x} (float32 in, float32 out)
_UNARY = {
    "Neg": "(-{x})", "Abs": "fabsf({x})", "Sqrt": "sqrtf({x})",
    "Exp": "expf({x})", "Log": "logf({x})", "Tanh": "tanhf({x})", "Sin": "sinf({x})",
    "Cos": "cosf({x})", "Tan": "tanf({x})", "Atan": "atanf({x})", "Asin": "asinf({x})",
    "Acos": "acosf({x})", "Floor": "floorf({x})", "Ceil": "ceilf({x})",
    "Round": "nearbyintf({x})",  # ONNX rounds half to even, as nearbyintf does by default
    "Reciprocal": "(1.0f / {x})",
    # a compare, not fmaxf: the same value for every input (NaN gives 0 either way), and
    # no call per element where fmaxf is a library function (AVR, Cortex-M4)
    "Relu": "({x} > 0.0f ? {x} : 0.0f)",
    "Sigmoid": "(1.0f / (1.0f + expf(-{x})))",
    "Softplus": "({x} > 20.0f ? {x} : log1pf(expf({x})))",
    "Sign": "({x} > 0.0f ? 1.0f : ({x} < 0.0f ? -1.0f : 0.0f))",
    "Not": "({x} == 0.0f ? 1.0f : 0.0f)",
    "Erf": "erff({x})",
}
# ONNX op -> C expression of its inputs {a}, {b} (booleans are 0.0f / 1.0f)
_BINARY = {
    "Add": "({a} + {b})", "Sub": "({a} - {b})", "Mul": "({a} * {b})", "Div": "({a} / {b})",
    "Pow": "powf({a}, {b})", "Min": "fminf({a}, {b})", "Max": "fmaxf({a}, {b})",
    "Greater": "({a} > {b} ? 1.0f : 0.0f)", "Less": "({a} < {b} ? 1.0f : 0.0f)",
    "GreaterOrEqual": "({a} >= {b} ? 1.0f : 0.0f)", "LessOrEqual": "({a} <= {b} ? 1.0f : 0.0f)",
    "Equal": "({a} == {b} ? 1.0f : 0.0f)",
    "And": "(({a} != 0.0f) && ({b} != 0.0f) ? 1.0f : 0.0f)",
    "Or": "(({a} != 0.0f) || ({b} != 0.0f) ? 1.0f : 0.0f)",
    "Xor": "(({a} != 0.0f) != ({b} != 0.0f) ? 1.0f : 0.0f)",
}
# pure data movement: the output is a fixed selection of the first input's elements
_MOVES = {"Slice", "Gather", "Transpose", "Expand", "Tile"}
# same elements, new shape: the output shares its input's storage
_ALIASES = {"Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten"}
# reduction -> (how two partial results combine, what happens to the total of n)
_REDUCTIONS = {
    "ReduceSum": ("({a} + {b})", "{acc}"), "ReduceMean": ("({a} + {b})", "{acc} / {n}.0f"),
    "ReduceMax": ("fmaxf({a}, {b})", "{acc}"), "ReduceMin": ("fminf({a}, {b})", "{acc}"),
    "ReduceProd": ("({a} * {b})", "{acc}"),
}
_FOLDED_ONLY = {"Shape", "Size", "ConstantOfShape", "Range"}  # must reduce to constants
_SUM_REG = 12  # a blocked product's sums live in s12.. on an Arm FPU (_mac_macro)
# libm functions avr-libc 2.0 lacks: a definition each, compiled on AVR only
_AVR_LIBM_GAPS = {
    "log1pf": """static float avr_log1pf(float x)
{
  const float u = 1.0f + x;  /* Goldberg's correction for the rounding of 1 + x */
  return u == 1.0f ? x : logf(u) * (x / (u - 1.0f));
}""",
    "nearbyintf": """static float avr_nearbyintf(float x)
{
  const float f = floorf(x), d = x - f;  /* exact; half to even, as ONNX's Round */
  return d > 0.5f || (d == 0.5f && fmodf(f, 2.0f) != 0.0f) ? f + 1.0f : f;
}""",
    "erff": """static float avr_erff(float x)
{
  /* Abramowitz and Stegun 7.1.26, |error| <= 1.5e-7 */
  const float a = fabsf(x), t = 1.0f / (1.0f + 0.3275911f * a);
  const float p = t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f +
                  t * (-1.453152027f + t * 1.061405429f))));
  const float y = 1.0f - p * expf(-a * a);
  return x < 0.0f ? -y : y;
}""",
}
_OBS = "\0obs"  # storage of the graph input, the step function's obs argument (no ONNX name)
_LIBM_CALL = re.compile(r"\b([a-z0-9]+f)\(")
_FLOAT_TYPES = {TensorProto.FLOAT, TensorProto.BOOL}


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

    def summary(self) -> str:
        q = (f"; q15: {self.q15_macs} of the {self.macs} multiply-adds in 16-bit integers"
             if self.q15_macs else "")
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


def _float_literal(v) -> str:
    v = np.float32(v)
    if np.isnan(v):
        return "NAN"
    if np.isinf(v):
        return "INFINITY" if v > 0 else "(-INFINITY)"
    s = f"{float(v):.9g}"
    if not any(c in s for c in ".e"):
        s += ".0"
    s += "f"
    return f"({s})" if s.startswith("-") else s


def _eval_node(node: onnx.NodeProto, inputs: list, opsets) -> list[np.ndarray]:
    """Run one node with onnx's reference implementation."""
    from onnx.reference import ReferenceEvaluator

    feeds, infos = {}, []
    for name, value in zip(node.input, inputs):
        if name and name not in feeds:
            arr = np.asarray(value)
            feeds[name] = arr
            infos.append(helper.make_tensor_value_info(
                name, helper.np_dtype_to_tensor_dtype(arr.dtype), arr.shape))
    outs = [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None)
            for o in node.output if o]
    graph = helper.make_graph([node], "node", infos, outs)
    model = helper.make_model(graph, opset_imports=list(opsets))
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return [np.asarray(r) for r in ReferenceEvaluator(model).run(None, feeds)]


@dataclass
class _Tensor:
    """A value computed at run time: float32 (booleans as 0/1) of a static shape."""
    shape: tuple
    dtype: type          # np.float32 or np.bool_ (stored as 0.0f / 1.0f)
    root: str            # name of the storage it lives in (itself unless an alias)
    offset: int = 0      # into the scratch array, set by the allocator

    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


@dataclass
class _Emitter:
    opsets: list
    lines: list = field(default_factory=list)
    consts: list = field(default_factory=list)   # C definitions of constant arrays
    const_bytes: int = 0
    const_names: dict = field(default_factory=dict)
    name: str = "policy"  # the C name: prefix of the helper functions
    rom: str = "ROM"  # prefix of the flash qualifier and read macros (<NAME>_ROM, _ROM_F, _ROM_U16)
    pack: bool = False  # store large constant arrays packed (_packed): 3.5 B a float
    block: int = 1  # outputs of a matrix product computed per pass over its input
    packed: set = field(default_factory=set)  # C names of the arrays stored packed
    loads: set = field(default_factory=set)  # (inputs, outputs) of the <ROM>_MAC macros used
    then: dict = field(default_factory=dict)  # product's output -> the unary op it stores through
    macs: int = 0  # multiply-adds of the matrix products (SizeReport)
    packed_macs: int = 0
    q15: dict = field(default_factory=dict)  # product's output -> calibrated max of its input
    q15_macs: int = 0
    q15_io: int = 0
    q15_scratch: int = 0  # bytes of the largest q15 product's quantised input (on the stack)

    def const_at(self, name: str, arr: np.ndarray, idx: str) -> str:
        """C expression of element ``idx`` of constant ``name`` (a flash read on AVR)."""
        cname = self.const_array(name, arr)
        if cname in self.packed:
            return f"{self.rom}_PACKED({cname}, {idx})"
        return f"{self.rom}_F({cname}, {idx})"

    def const_array(self, name: str, arr: np.ndarray) -> str:
        """C name of a ``static const float`` array holding constant ``name``
        (or, packed, of its three arrays ``<name>_low``, ``_top``, ``_tab``)."""
        if name not in self.const_names:
            cname = f"k{len(self.const_names)}"
            flat = np.asarray(arr, np.float32).reshape(-1)
            shape = "x".join(str(d) for d in np.shape(arr)) or "scalar"
            packed = _packed(flat) if self.pack else None
            if packed is None:
                self.const_bytes += 4 * flat.size
                body = ", ".join(_float_literal(v) for v in flat)
                self.consts.append(f"/* {name} ({shape}) */\nstatic const float {cname}[{flat.size}] "
                                   f"{self.rom} = {{{_wrap(body)}}};")
            else:
                self.packed.add(cname)
                defs = [f"/* {name} ({shape}), packed: each float's three low bytes, a 4-bit index "
                        "per float into the table of its top bytes */"]
                for part, data in zip(("low", "top", "tab"), packed):
                    self.const_bytes += data.size
                    body = ", ".join(str(int(v)) for v in data)
                    defs.append(f"static const unsigned char {cname}_{part}[{data.size}] {self.rom} = "
                                f"{{{_wrap(body)}}};")
                self.consts.append("\n".join(defs))
            self.const_names[name] = cname
        return self.const_names[name]

    def word_table(self, what: str, words: np.ndarray) -> str:
        """C name of a ``static const uint32_t`` table (a q15 product's words)."""
        cname = f"k{len(self.const_names)}"
        self.const_names[(what, cname)] = cname
        self.const_bytes += 4 * words.size
        body = ", ".join(f"{int(v)}u" for v in words)
        self.consts.append(f"/* {what} */\nstatic const uint32_t {cname}[{words.size}] "
                           f"{self.rom} = {{{_wrap(body)}}};")
        return cname

    def index_table(self, what: str, indices: np.ndarray) -> str:
        """C name of a ``static const unsigned short`` table of element numbers."""
        cname = f"k{len(self.const_names)}"
        self.const_names[(what, cname)] = cname
        self.const_bytes += 2 * indices.size
        body = ", ".join(str(int(v)) for v in indices)
        self.consts.append(f"/* element numbers for {what} */\nstatic const unsigned short "
                           f"{cname}[{indices.size}] {self.rom} = {{{_wrap(body)}}};")
        return cname


def _packed(flat: np.ndarray):
    """A float32 array stored losslessly in 3.5 bytes a value: the three low
    bytes of each (mantissa and the exponent's lowest bit), and a 4-bit index
    into a table of the distinct top bytes (sign and the exponent's high
    seven bits), which trained weights spread over a few binades share. None
    where that does not apply: more than 16 top bytes, an array too small for
    the table to pay, or one too large for 16-bit flash offsets (AVR)."""
    n = flat.size
    bits = np.ascontiguousarray(flat, np.float32).view(np.uint32)
    top = (bits >> 24).astype(np.uint8)
    table, index = np.unique(top, return_inverse=True)
    if len(table) > 16 or n < 256 or 3 * n >= 1 << 16:
        return None
    low = np.stack([(bits >> s) & 0xFF for s in (0, 8, 16)], axis=1).astype(np.uint8).reshape(-1)
    index = np.append(index.astype(np.uint8), 0)[:n + n % 2]
    nibbles = (index[0::2] | (index[1::2] << 4)).astype(np.uint8)
    return low, nibbles, np.pad(table, (0, 16 - len(table))).astype(np.uint8)


def _wrap(body: str, width: int = 96) -> str:
    out, line = [], ""
    for item in body.split(", "):
        if len(line) + len(item) + 2 > width:
            out.append(line)
            line = ""
        line += item + ", "
    out.append(line)
    return "\n  " + "\n  ".join(s.rstrip() for s in out).rstrip(",") + "\n"


def _toposort(graph: onnx.GraphProto, known: set) -> list:
    """The nodes in an order where each comes after its inputs' producers
    (Kahn's algorithm, keeping the file's order where it already is one)."""
    produced_by = {o: i for i, n in enumerate(graph.node) for o in n.output if o}
    waiting_on = [{produced_by[x] for x in n.input if x and x not in known and x in produced_by}
                  for n in graph.node]
    users: dict[int, list[int]] = {i: [] for i in range(len(graph.node))}
    for i, deps in enumerate(waiting_on):
        for d in deps:
            users[d].append(i)
    ready = [i for i, deps in enumerate(waiting_on) if not deps]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(graph.node[i])
        for u in users[i]:
            waiting_on[u].discard(i)
            if not waiting_on[u]:
                heapq.heappush(ready, u)
    if len(order) != len(graph.node):
        raise UserError("the ONNX graph has a cycle; it is not a valid controller graph")
    return order


def _io_sizes(model: onnx.ModelProto) -> tuple[str, str, int]:
    g = model.graph
    inits = {t.name for t in g.initializer}
    inputs = [i for i in g.input if i.name not in inits]
    if len(inputs) != 1 or len(g.output) != 1:
        raise UserError(f"a controller graph has one input and one output; this one has "
                        f"{len(inputs)} and {len(g.output)}")
    shapes = []
    for v in (inputs[0], g.output[0]):
        t = v.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
        if t.elem_type != TensorProto.FLOAT or len(dims) != 2 or dims[1] is None:
            raise UserError(f"{v.name!r} must be float32 of shape (batch, n); it is "
                            f"{TensorProto.DataType.Name(t.elem_type)} {dims}")
        shapes.append(dims[1])
    if shapes[1] != 1:
        raise UserError(f"a controller returns one command per observation; the output has "
                        f"{shapes[1]} columns")
    return inputs[0].name, g.output[0].name, shapes[0]


def check_c_name(name: str) -> str:
    """``UserError`` unless ``name`` can prefix C file and function names."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise UserError(f"the C name {name!r} is not a C identifier; use letters, digits and _")
    return name


QUANTIZE = ("q15",)  # generate_c's quantize choices


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
    exactly: ``c_build.quantized_c`` measures by how much."""
    check_c_name(name)
    if quantize is not None and quantize not in QUANTIZE:
        raise UserError(f"unknown quantization {quantize!r}; choose {', '.join(QUANTIZE)}")
    in_name, out_name, nobs = _io_sizes(model)
    g = model.graph
    opsets = list(model.opset_import)
    consts: dict[str, np.ndarray] = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    tensors: dict[str, _Tensor] = {in_name: _Tensor((1, nobs), np.float32, _OBS)}
    em = _Emitter(opsets, name=name, rom=f"{name.upper()}_ROM", pack=pack, block=block)
    steps = []  # the nodes that compute at run time, in order
    uses = Counter(i for n in g.node for i in n.input if i)
    relu_outputs = set()  # never negative: the inputs a q15 product takes
    for node in _toposort(g, set(consts) | {in_name}):
        if node.domain not in ("", "ai.onnx"):
            raise UserError(f"op {node.domain}::{node.op_type} is not in the standard ONNX domain; "
                            "the C generator supports standard ops only")
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
               for a in node.attribute):
            raise UserError(f"op {node.op_type} has a subgraph (control flow); the C generator "
                            "supports straight-line graphs only")
        if node.op_type == "Constant":
            consts[node.output[0]] = _eval_node(node, [], opsets)[0]
            continue
        missing = [i for i in node.input if i and i not in consts and i not in tensors]
        if missing:
            raise UserError(f"node {node.name or node.op_type} reads {missing}, which nothing "
                            "produces")
        if node.op_type in ("Shape", "Size"):
            src = tensors.get(node.input[0])
            dummy = np.zeros(src.shape if src else consts[node.input[0]].shape, np.float32)
            consts[node.output[0]] = _eval_node(node, [dummy], opsets)[0]
            continue
        if all(not i or i in consts for i in node.input):
            values = _eval_node(node, [consts.get(i) for i in node.input], opsets)
            consts.update(zip(node.output, values))
            continue
        if node.op_type in _FOLDED_ONLY:
            raise UserError(f"op {node.op_type} ({node.name}) depends on the observation; the C "
                            "generator needs it to reduce to a constant")
        # shapes and dtypes of the outputs, from a run on zeros of the right shapes
        dummies = [consts[i] if i in consts else
                   np.zeros(tensors[i].shape, tensors[i].dtype) if i else None
                   for i in node.input]
        outs = _eval_node(node, dummies, opsets)
        for o, v in zip(node.output, outs):
            if o:
                if v.dtype not in (np.float32, np.bool_):
                    raise UserError(f"op {node.op_type} ({node.name}) yields {v.dtype} from the "
                                    "observation; the C generator handles float and bool values")
                tensors[o] = _Tensor(tuple(v.shape), v.dtype.type, o)
        if node.op_type in _ALIASES:
            tensors[node.output[0]].root = tensors[node.input[0]].root
        if node.op_type == "Relu":
            relu_outputs.add(node.output[0])
        if (node.op_type == "Relu" and steps and steps[-1].op_type in ("Gemm", "MatMul") and
                steps[-1].output[0] == node.input[0] and uses[node.input[0]] == 1 and
                node.input[0] != out_name):
            # the product applies it as it stores each output, in place: no pass
            # that loads and stores every element again (128 per step of an MLP)
            em.then[node.input[0]] = node.op_type
            tensors[node.output[0]].root = tensors[node.input[0]].root
            continue
        steps.append(node)
    if out_name in consts:
        raise UserError("the graph's output does not depend on the observation; that is not a "
                        "controller")
    if quantize == "q15":
        layers = [n for n in steps if _q15_applies(n, tensors, consts, relu_outputs)]
        if not layers:
            raise UserError("--quantize q15 applies to hidden layers whose input is a Relu's "
                            "output (Gemm/MatMul, one row, constant weights); this graph has none")
        if calibration is None:
            raise UserError("q15 needs calibration observations for its input scales")
        amax = q15.calibrate(model, [n.input[0] for n in layers], calibration)
        em.q15 = {n.output[0]: amax[n.input[0]] for n in layers}
    ram = _allocate(steps, tensors, out_name)
    for node in steps:
        if node.op_type not in _ALIASES:
            _emit_node(node, tensors, consts, em)
    out = tensors[out_name]
    body = "\n".join(em.lines)
    libm = sorted(set(_LIBM_CALL.findall(body)))
    size = SizeReport(em.const_bytes, 4 * ram + em.q15_scratch, libm, em.macs, em.packed_macs, em.q15_macs,
                      em.q15_io)
    meta = metadata.raw(model)
    return CSource(name, _c_file(name, em, body, ram, out, nobs, size, meta),
                   _h_file(name, nobs, size, meta), size)


def _allocate(steps, tensors: dict, out_name: str) -> int:
    """Offsets into one scratch array: a value's storage is live from the node
    that writes it to the last node that reads it (or any alias of it);
    values whose lives overlap get disjoint ranges. Largest first, each at
    the lowest offset that fits (the greedy-by-size placement of TFLite's
    arena planner): small values then fill the gaps between large ones."""
    start, end, size = {}, {}, {}
    for t, node in enumerate(steps):
        for i in node.input:
            if i in tensors:
                end[tensors[i].root] = t
        for o in node.output:
            if o in tensors and tensors[o].root == o:
                start[o], end[o], size[o] = t, t, tensors[o].size()
    end[tensors[out_name].root] = len(steps)
    placed: list[tuple[int, int, int, int]] = []  # (offset, size, start, end)
    offsets = {}
    for root in sorted(start, key=lambda r: (-size[r], start[r])):
        busy = sorted((o, s) for o, s, a, b in placed if a <= end[root] and start[root] <= b)
        offset = 0
        for o, s in busy:
            if offset + size[root] <= o:
                break
            offset = max(offset, o + s)
        placed.append((offset, size[root], start[root], end[root]))
        offsets[root] = offset
    for t in tensors.values():
        t.offset = offsets.get(t.root, 0)
    return max((o + s for o, s, _, _ in placed), default=0)


def _at(t: _Tensor, idx: str) -> str:
    """C expression of element ``idx`` of a run-time tensor."""
    if t.root == _OBS:
        return f"obs[{idx}]"
    if not t.offset:
        return f"ws[{idx}]"
    if idx.isdigit():
        return f"ws[{t.offset + int(idx)}]"
    return f"ws[{t.offset} + {idx}]"


def _operand(name: str, shape_out: tuple, tensors, consts, em, idx: str) -> str:
    """C expression of input ``name`` at output element ``idx`` (broadcast)."""
    if name in consts:
        arr = np.asarray(consts[name])
        if arr.dtype == np.bool_:
            arr = arr.astype(np.float32)
        if arr.size == 1:
            return _float_literal(arr.reshape(-1)[0])
        shape = arr.shape
        at = lambda i: em.const_at(name, arr, i)  # noqa: E731
    else:
        t = tensors[name]
        shape, at = t.shape, lambda i: _at(t, i)  # noqa: E731
        if t.size() == 1:
            return at("0")
    if int(np.prod(shape)) == int(np.prod(shape_out)):  # same elements, maybe with unit dims
        return at(idx)
    return at(_broadcast_index(shape, shape_out, idx))


def _broadcast_index(shape, shape_out, idx: str) -> str:
    """Index into ``shape`` at the flat output index ``idx`` of ``shape_out``."""
    shape = (1,) * (len(shape_out) - len(shape)) + tuple(shape)
    out_strides = np.cumprod((1,) + tuple(shape_out[::-1]))[:-1][::-1]
    in_strides = np.cumprod((1,) + shape[::-1])[:-1][::-1]
    total = int(np.prod(shape_out))
    terms = []
    for d, (n_in, n_out) in enumerate(zip(shape, shape_out)):
        if n_in == 1 or n_out == 1:
            continue
        coord = idx if out_strides[d] == 1 else f"{idx} / {out_strides[d]}"
        if out_strides[d] * n_out < total:  # not the outermost varying dimension
            coord = f"({coord}) % {n_out}" if out_strides[d] > 1 else f"{idx} % {n_out}"
        coord = f"({coord})"
        terms.append(coord + (f" * {in_strides[d]}" if in_strides[d] > 1 else ""))
    return " + ".join(terms) or "0"


def _loop(em: _Emitter, n: int, stmt: str) -> None:
    """``stmt`` for every output element i (just once, with i = 0 written out, for one)."""
    em.lines.append(f"  for (int i = 0; i < {n}; ++i) {stmt}" if n > 1 else f"  {stmt}")


def _emit_node(node: onnx.NodeProto, tensors, consts, em: _Emitter) -> None:
    op, out = node.op_type, tensors[node.output[0]]
    n = out.size()
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    em.lines.append(f"  /* {op} {node.name} -> {list(out.shape)} */")

    idx = "i" if n > 1 else "0"
    dst = _at(out, idx)

    def operand(name):
        return _operand(name, out.shape, tensors, consts, em, idx)

    if op in _UNARY or op == "Cast" or op in ("LeakyRelu", "Elu", "Selu", "HardSigmoid"):
        x = operand(node.input[0])
        if op == "Cast":
            to = attrs["to"]
            if to not in _FLOAT_TYPES:
                raise UserError(f"Cast to {TensorProto.DataType.Name(to)} is not supported by the "
                                "C generator (float and bool only)")
            expr = f"({x} != 0.0f ? 1.0f : 0.0f)" if to == TensorProto.BOOL else x
        elif op == "LeakyRelu":
            expr = f"({x} >= 0.0f ? {x} : {_float_literal(attrs.get('alpha', 0.01))} * {x})"
        elif op == "Elu":
            expr = f"({x} >= 0.0f ? {x} : {_float_literal(attrs.get('alpha', 1.0))} * (expf({x}) - 1.0f))"
        elif op == "Selu":
            a, gam = attrs.get("alpha", 1.67326319217681884765625), attrs.get("gamma", 1.05070102214813232421875)
            expr = (f"({_float_literal(gam)} * ({x} > 0.0f ? {x} : "
                    f"{_float_literal(a)} * (expf({x}) - 1.0f)))")
        elif op == "HardSigmoid":
            expr = (f"fmaxf(0.0f, fminf(1.0f, {_float_literal(attrs.get('alpha', 0.2))} * {x} + "
                    f"{_float_literal(attrs.get('beta', 0.5))}))")
        else:
            expr = _UNARY[op].format(x=x)
        _loop(em, n, f"{dst} = {expr};")
    elif op in _BINARY or (op in ("Min", "Max", "Sum", "Mean") and len(node.input) >= 1):
        names = [i for i in node.input if i]
        if op == "Pow" and node.input[1] in consts and np.asarray(consts[node.input[1]]).size == 1:
            p = float(np.asarray(consts[node.input[1]]).reshape(-1)[0])
            x = operand(names[0])
            expr = {2.0: f"({x} * {x})", 1.0: x, 0.5: f"sqrtf({x})", 3.0: f"({x} * {x} * {x})"}.get(
                p, f"powf({x}, {_float_literal(p)})")
        else:
            template = _BINARY.get(op, "({a} + {b})")
            expr = operand(names[0])
            for other in names[1:]:
                expr = template.format(a=expr, b=operand(other))
            if op == "Mean":
                expr = f"({expr} / {_float_literal(len(names))})"
        _loop(em, n, f"{dst} = {expr};")
    elif op == "Mod":
        if attrs.get("fmod", 0) != 1:
            raise UserError("Mod with fmod=0 on floats is not valid ONNX; the C generator "
                            "supports fmod=1")
        _loop(em, n, f"{dst} = fmodf({operand(node.input[0])}, {operand(node.input[1])});")
    elif op == "Where":
        c, a, b = (operand(i) for i in node.input)
        _loop(em, n, f"{dst} = {c} != 0.0f ? {a} : {b};")
    elif op == "Clip":
        expr = operand(node.input[0])
        if len(node.input) > 1 and node.input[1]:
            expr = f"fmaxf({expr}, {operand(node.input[1])})"
        if len(node.input) > 2 and node.input[2]:
            expr = f"fminf({expr}, {operand(node.input[2])})"
        _loop(em, n, f"{dst} = {expr};")
    elif op in ("Gemm", "MatMul"):
        _emit_matmul(node, attrs, tensors, consts, em, out)
    elif op in _MOVES or op == "Concat":
        _emit_move(node, tensors, consts, em, out)
    elif op in _REDUCTIONS:
        _emit_reduce(node, attrs, tensors, consts, em, out)
    else:
        raise UserError(f"op {op} ({node.name}) is not supported by the C generator; supported: "
                        f"{', '.join(sorted(supported_ops()))}")


def supported_ops() -> set[str]:
    return (set(_UNARY) | set(_BINARY) | _MOVES | _ALIASES | _FOLDED_ONLY | set(_REDUCTIONS) |
            {"Cast", "LeakyRelu", "Elu", "Selu", "HardSigmoid", "Sum", "Mean", "Mod", "Where",
             "Clip", "Gemm", "MatMul", "Concat", "Constant"})


def _emit_matmul(node, attrs, tensors, consts, em: _Emitter, out: _Tensor) -> None:
    """out (M, N) = alpha * op(A) op(B) + beta * C, one dot product per
    output: the sum runs over k = 0..K-1 in a local accumulator (a register,
    not a store and a load per product), in the order ONNX defines, so the
    result is the same bit for bit as summing into the output. A constant B
    is stored (N, K), row j the K weights of output j, read in order (on AVR
    a flash read that walks a pointer)."""
    a_name, b_name = node.input[0], node.input[1]
    shapes = [np.asarray(consts[x]).shape if x in consts else tensors[x].shape
              for x in (a_name, b_name)]
    if len(shapes[0]) != 2 or len(shapes[1]) != 2:
        raise UserError(f"{node.op_type} ({node.name}) on shapes {shapes}: the C generator "
                        "supports 2-D matrix products only")
    ta, tb = attrs.get("transA", 0), attrs.get("transB", 0)
    (ar, ac), (br, bc) = shapes
    M, K = (ac, ar) if ta else (ar, ac)
    N = br if tb else bc
    if node.output[0] in em.q15:
        _emit_q15(node, attrs, tensors, consts, em, out, K, N)
        return
    m = "m" if M > 1 else "0"
    j = "j" if N > 1 else "0"

    def elem(name, shape, row, col, trans):
        r, c = (col, row) if trans else (row, col)
        terms = [r if r == "0" or shape[1] == 1 else f"{r} * {shape[1]}", c]
        index = " + ".join(t for t in terms if t != "0") or "0"
        if name in consts:
            return em.const_at(name, consts[name], index)
        return _at(tensors[name], index)

    a = elem(a_name, shapes[0], m, "k", ta)
    # outputs per pass: B accumulators share each load of A (em.block), where
    # B is constant (and not packed) and A one run-time row (the policy's batch of 1)
    # (a single output, N = 1, is one sum through the same kernel)
    mac = (b_name in consts and em.block > 1 and M == 1 and not ta and a_name not in consts and
           (em.block <= 8 or em.block % 8 == 0) and em.block <= 32 - _SUM_REG)
    blk = em.block if mac and N % em.block == 0 and N > 1 else 1
    mac = mac and (blk > 1 or N == 1)
    if b_name in consts:
        b_nk = np.asarray(consts[b_name], np.float32)
        b_nk = b_nk if tb else b_nk.T
        if em.pack and _packed(b_nk.reshape(-1)) is not None:
            blk, mac = 1, False
        if mac:  # read in storage order through a pointer: _mac_macro's layout
            unroll = next(u for u in (4, 3, 2, 1) if K % u == 0)
            gs = min(8, blk)
            layout = b_nk.reshape(N // blk, blk // gs, gs, K // unroll, unroll)
            key = b_name + f' (N/{blk}, K/{unroll}, {blk // gs}, {unroll}, {gs})'
            walk = em.const_array(key, layout.transpose(0, 3, 1, 4, 2))
        else:
            b = em.const_at(b_name + ' (N x K)', b_nk, 'k' if N == 1 else f'j * {K} + k')
            if em.const_names[b_name + ' (N x K)'] in em.packed:
                em.packed_macs += M * N * K
    else:
        b = elem(b_name, shapes[1], "k", j, tb)
    em.macs += M * N * K
    row = f"m * {N} + " if M > 1 else ""
    dst = _at(out, f"{row}j" if N > 1 else (f"m * {N}" if M > 1 else "0"))
    value = "acc"
    then = em.then.get(node.output[0])

    def store(d, v, acc):  # d = v, through the Relu that follows where generate_c fused it
        if not then:
            return f"{d} = {v};"
        return (f"{acc} = {v}; " if v != acc else "") + f"{d} = {_UNARY[then].format(x=acc)};"

    if then:
        em.lines.append(f"  /* and the {then} that follows, as each output is stored */")
    alpha = float(attrs.get("alpha", 1.0))
    if alpha != 1.0:
        value = f"{_float_literal(alpha)} * acc"
    if len(node.input) > 2 and node.input[2]:
        beta = float(attrs.get("beta", 1.0))
        c_name = node.input[2]
        c_size = np.asarray(consts[c_name]).size if c_name in consts else tensors[c_name].size()
        if c_size == 1:
            c_idx = "0"
        elif c_size == M * N:
            c_idx = f"{row}j"
        else:  # a row (N,) or (1, N), or a column (M, 1)
            c_idx = "j" if c_size == N else "m"
        if N == 1:
            c_idx = c_idx.replace(" + j", "").replace("j", "0")
        if c_name in consts and c_size == 1:
            c = _float_literal(np.asarray(consts[c_name]).reshape(-1)[0])
        else:
            c = (em.const_at(c_name, consts[c_name], c_idx) if c_name in consts
                 else _at(tensors[c_name], c_idx))
        value += f" + {c}" if beta == 1.0 else f" + {_float_literal(beta)} * {c}"
    if mac:
        def at_j(text, r):  # output j + r
            return re.sub(r"\bj\b", f"(j + {r})", text) if r else text
        accs = [f"acc{r}" for r in range(blk)]
        em.loads.add((unroll, blk))
        lines = [" ".join(f"{em.rom}_SUM({acc}, \"s{_SUM_REG + r}\");"
                          for r, acc in enumerate(accs)),
                 f"for (int k = 0; k < {K}; k += {unroll}) "
                 f"{em.rom}_MAC{unroll}X{blk}(ap, wp, {', '.join(accs)});"] + \
                [store(at_j(dst, r), at_j(value, r).replace('acc', acc, 1), acc)
                 for r, acc in enumerate(accs)]
        lines = [f"const float *wp = {walk};", f"for (int j = 0; j < {N}; j += {blk}) {{",
                 f"  const float *ap = &{_at(tensors[a_name], '0')};"] + \
                ["  " + x for x in lines] + ["}"]
        lines = ["{"] + ["  " + x for x in lines] + ["}"]
    else:
        lines = ["float acc = 0.0f;",
                 f"for (int k = 0; k < {K}; ++k) acc += {a} * {b};",
                 store(dst, value, "acc")]
        if N > 1:
            lines = [f"for (int j = 0; j < {N}; ++j) {{"] + ["  " + x for x in lines] + ["}"]
        else:
            lines = ["{"] + ["  " + x for x in lines] + ["}"]
    if M > 1:
        lines = [f"for (int m = 0; m < {M}; ++m) {{"] + ["  " + x for x in lines] + ["}"]
    em.lines.extend("  " + x for x in lines)


def _q15_applies(node, tensors, consts, relu_outputs) -> bool:
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


def _emit_q15(node, attrs, tensors, consts, em: _Emitter, out: _Tensor, K: int, N: int) -> None:
    """out (1, N) = A W + b in q15 (``q15``): A's K inputs quantised into
    pairs, then per two outputs one pass over the pairs, four inputs a step
    into each output's 64-bit sum (``<ROM>_Q15_MAC4X2``), and
    each sum back to float as it is stored (through the Relu that follows,
    where generate_c fused it)."""
    w = np.asarray(consts[node.input[1]], np.float32)
    w_nk = w if attrs.get("transB", 0) else w.T
    bias = None
    if len(node.input) > 2 and node.input[2]:
        bias = np.broadcast_to(np.asarray(consts[node.input[2]], np.float64).reshape(-1), (N,)) * \
            float(attrs.get("beta", 1.0))
    layer = q15.quantize_layer(w_nk, bias, em.q15[node.output[0]])
    pairs = layer.wq.shape[1] // 2  # input words, K rounded up to a multiple of 4, halved
    what = f"{node.op_type} {node.name}"
    words = em.word_table(f"{what}: weights, q15 at 2^{layer.sw}, two to a word",
                          q15.packed_weights(layer))
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


def _emit_reduce(node, attrs, tensors, consts, em: _Emitter, out: _Tensor) -> None:
    """Each output element folds its inputs in index order: one loop per
    output row when the reduced elements lie at a fixed stride."""
    src = tensors[node.input[0]]
    rank = len(src.shape)
    axes = attrs.get("axes")
    if axes is None and len(node.input) > 1 and node.input[1]:
        if node.input[1] not in consts:
            raise UserError(f"{node.op_type} ({node.name}) has axes that depend on the "
                            "observation; the C generator needs them constant")
        axes = np.asarray(consts[node.input[1]]).reshape(-1).tolist()
    if not axes:
        axes = [] if attrs.get("noop_with_empty_axes", 0) else list(range(rank))
    axes = sorted(int(a) % rank for a in axes)
    kept = [d for d in range(rank) if d not in axes]
    numbers = np.arange(src.size()).reshape(src.shape).transpose(kept + axes)
    rows = numbers.reshape(out.size(), -1)  # rows[r]: source elements of output r
    combine, finish = _REDUCTIONS[node.op_type]
    n = rows.shape[1]
    step = np.diff(rows, axis=1)
    row_step = np.diff(rows[:, 0])
    if (n == 1 or np.all(step == step[0, 0])) and (len(rows) == 1 or
                                                   np.all(row_step == row_step[0])):
        k_step = int(step[0, 0]) if n > 1 else 0
        r_step = int(row_step[0]) if len(rows) > 1 else 0
        first = int(rows[0, 0])
        r = "r" if len(rows) > 1 else "0"
        start = _affine(first, r, r_step)
        k_term = _affine(0, "k", k_step)
        body = f"float acc = {_at(src, start)};\n"
        if n > 1:
            at_k = _at(src, k_term if start == "0" else f"{start} + {k_term}")
            body += f"for (int k = 1; k < {n}; ++k) acc = {combine.format(a='acc', b=at_k)};\n"
        body += f"{_at(out, r)} = {finish.format(acc='acc', n=n)};"
        body = "\n".join("    " + line for line in body.splitlines())
        if len(rows) > 1:
            em.lines.append(f"  for (int r = 0; r < {len(rows)}; ++r) {{\n{body}\n  }}")
        else:
            em.lines.append("  {\n" + body + "\n  }")
        return
    if n > 64:
        raise UserError(f"{node.op_type} ({node.name}) folds {n} irregularly placed elements per "
                        "output; the C generator unrolls at most 64")
    for o, row in enumerate(rows):
        expr = _at(src, str(int(row[0])))
        for k in row[1:]:
            expr = combine.format(a=expr, b=_at(src, str(int(k))))
        em.lines.append(f"  {_at(out, str(o))} = {finish.format(acc=expr, n=n)};")


def _affine(base: int, var: str, scale: int) -> str:
    """C text of base + var * scale, simplified."""
    if var == "0" or scale == 0:
        return str(base)
    term = var if scale == 1 else f"{var} * {scale}"
    return term if base == 0 else f"{base} + {term}"


def _emit_move(node, tensors, consts, em: _Emitter, out: _Tensor) -> None:
    """Data movement as copies: the source of every output element is found by
    running the node on element numbers instead of values."""
    sources = [i for i in (node.input if node.op_type == "Concat" else node.input[:1])]
    numbered, base = [], 0
    for s in sources:
        shape = np.asarray(consts[s]).shape if s in consts else tensors[s].shape
        size = int(np.prod(shape, dtype=np.int64))
        numbered.append((np.arange(base, base + size, dtype=np.float64).reshape(shape)))
        base += size
    if base >= 2 ** 24:
        raise UserError(f"{node.op_type} ({node.name}) moves too many elements for the C generator")
    inputs = ([a.astype(np.float32) for a in numbered] if node.op_type == "Concat" else
              [numbered[0].astype(np.float32)] + [consts.get(i) for i in node.input[1:]])
    if node.op_type != "Concat" and any(i and i not in consts for i in node.input[1:]):
        raise UserError(f"{node.op_type} ({node.name}) has indices that depend on the observation; "
                        "the C generator needs them constant")
    where = _eval_node(node, inputs, em.opsets)[0].reshape(-1).astype(np.int64)
    starts = np.cumsum([0] + [a.size for a in numbered])
    runs = []  # (out start, source name, source start, length)
    for o, w in enumerate(where):
        k = int(np.searchsorted(starts, w, side="right") - 1)
        src, s = sources[k], int(w - starts[k])
        if runs and runs[-1][1] == src and runs[-1][2] + runs[-1][3] == s and \
                runs[-1][0] + runs[-1][3] == o:
            runs[-1][3] += 1
        else:
            runs.append([o, src, s, 1])
    if len(runs) > 16 and len(sources) == 1 and sources[0] not in consts and len(where) < 65536:
        # scattered copies: one loop over a table of source element numbers
        table = em.index_table(f"{node.op_type} {node.name}", where)
        em.lines.append(f"  for (int i = 0; i < {len(where)}; ++i) "
                        f"{_at(out, 'i')} = {_at(tensors[sources[0]], f'{em.rom}_U16({table}, i)')};")
        return
    for o, src, s, length in runs:
        if src in consts:
            arr = np.asarray(consts[src], np.float32).reshape(-1)
            if length == 1:
                em.lines.append(f"  {_at(out, str(o))} = {_float_literal(arr[s])};")
                continue
            at = lambda i, src=src: em.const_at(src, consts[src], i)  # noqa: E731
        else:
            at = lambda i, t=tensors[src]: _at(t, i)  # noqa: E731
        if length == 1:
            em.lines.append(f"  {_at(out, str(o))} = {at(str(s))};")
        else:
            em.lines.append(f"  for (int i = 0; i < {length}; ++i) "
                            f"{_at(out, f'{o} + i' if o else 'i')} = {at(f'{s} + i' if s else 'i')};")


def _meta_comment(meta: dict) -> str:
    return "\n".join(f" *   {k}: {v}" for k, v in meta.items()) or " *   (none)"


def _c_file(name, em: _Emitter, body, ram, out: _Tensor, nobs, size: SizeReport, meta) -> str:
    scratch = f"  float ws[{ram}];\n" if ram else ""
    consts = "\n\n".join(em.consts)
    rom = em.rom
    gaps = "".join(f"/* not in avr-libc */\n{_AVR_LIBM_GAPS[f]}\n#define {f} avr_{f}\n"
                   for f in size.libm if f in _AVR_LIBM_GAPS)
    unpack = "" if not em.packed else f"""
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "packed weights (grpo-ctrl firmware's pack) assume a little-endian target"
#endif
/* element i of a packed float array (the generator's _packed): lossless;
 * the bytes put together in memory order (8-bit AVR: no 32-bit shifts) */
static float {name}_unpack(const unsigned char *low, const unsigned char *top,
                           const unsigned char *tab, unsigned int i)
{{
  const unsigned char t = {rom}_U8(top, i >> 1);
  const unsigned char *p = low + 3u * i;
  union {{ unsigned char b[4]; float f; }} v;
  v.b[0] = {rom}_U8(p, 0);
  v.b[1] = {rom}_U8(p, 1);
  v.b[2] = {rom}_U8(p, 2);
  v.b[3] = {rom}_U8(tab, i & 1u ? t >> 4 : t & 15u);
  return v.f;
}}
#define {rom}_PACKED(a, i) {name}_unpack(a##_low, a##_top, a##_tab, (unsigned int)(i))
"""
    fixed = q15.runtime(name, rom) if em.q15 else ""
    loads = "".join(_mac_macro(rom, u, blk) for u, blk in sorted(em.loads))
    if em.loads:  # a blocked product's sums, where the kernel wants them (_mac_macro)
        loads = f"""#if defined(__GNUC__) && defined(__arm__) && defined(__ARM_FP) && (__ARM_FP & 4)
#define {rom}_SUM(c, reg) register float c __asm__(reg) = 0.0f
#else
#define {rom}_SUM(c, reg) float c = 0.0f
#endif
""" + loads
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
