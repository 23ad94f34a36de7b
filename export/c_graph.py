"""The graph walk of the C generator (``c_codegen.generate_c``): the ONNX
graph in topological order, what depends only on constants evaluated here
(``onnx.reference``), each run-time node's C (the float ops, matrix
products, reductions, data movement), the constants' arrays and the
liveness-aware scratch allocator. The targets' parts live beside it:
``c_avr`` (flash reads, libm gaps, packed weights), ``c_cortex_m4`` (the
matrix product's assembly kernel) and ``q15`` (fixed-point layers).
"""
from __future__ import annotations

import heapq
import re
import warnings
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from grpo_ctrl.errors import UserError
from grpo_ctrl.export.c_avr import _packed
from grpo_ctrl.export.c_cortex_m4 import _SUM_REG

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
_OBS = "\0obs"  # storage of the graph input, the step function's obs argument (no ONNX name)
_LIBM_CALL = re.compile(r"\b([a-z0-9]+f)\(")
_FLOAT_TYPES = {TensorProto.FLOAT, TensorProto.BOOL}


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


def walk(model: onnx.ModelProto, em: "_Emitter", in_name: str, out_name: str, nobs: int):
    """The run-time nodes of ``model`` in order (``steps``), after folding
    every node that depends on constants only (into ``consts``) and giving
    every run-time value its shape (``tensors``); a Relu right after the
    product it reads is fused into it (``em.then``). Also returns the Relu
    outputs (the inputs a q15 product may take)."""
    g = model.graph
    opsets = list(model.opset_import)
    consts: dict[str, np.ndarray] = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    tensors: dict[str, _Tensor] = {in_name: _Tensor((1, nobs), np.float32, _OBS)}
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
    return steps, tensors, consts, relu_outputs


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


def node_comment(node: onnx.NodeProto, out: _Tensor) -> str:
    """The line that opens a node's code: its op, name and output shape."""
    return f"  /* {node.op_type} {node.name} -> {list(out.shape)} */"


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
    em.lines.append(node_comment(node, out))

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
