"""Seeded mutations of a model and its inputs, as an attacker or a careless exporter makes them.

Every mutation takes a random generator, a ModelProto (edited in place; the caller passes a
copy) and the inputs (a dict, edited in place) and returns what it did, in words, for the case
log. Model mutations touch one thing each -- an attribute, a declared dim, a graph edge, the
opset, an initializer -- and may leave the inputs as they were; input mutations leave the model
alone and break the arrays it runs on (values, dtypes, shapes, sizes). :func:`damage_bytes`
damages serialized bytes (a model file, a saved executable).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
from onnx import AttributeProto as A
from onnx import TensorProto, helper, numpy_helper

#: Integers chosen for int attributes and dims: edges of types and of sizes.
SPECIAL_INTS = (0, 1, 2, 3, -1, -2, 7, 100, 10**6, 2**31 - 1, -(2**31), 2**32 + 1, 2**62,
                2**63 - 1, -(2**63))
SPECIAL_FLOATS = (0.0, -0.0, 1.0, -1.0, 1e-30, 1e30, 3.4e38, float("inf"), float("-inf"),
                  float("nan"))
STRINGS = (b"", b"NOTSET", b"SAME_UPPER", b"SAME_LOWER", b"VALID", b"none", b"add", b"max",
           b"linear", b"nearest", b"cubic", b"constant", b"reflect", b"edge", b"\xff\xfe\x00",
           b"ij,jk->ik", b"...i,i->...", b"i,,->", b"a" * 300)


def _pick(rng: np.random.Generator, seq: Any) -> Any:
    return seq[int(rng.integers(len(seq)))]


def _special_int(rng: np.random.Generator) -> int:
    return int(_pick(rng, SPECIAL_INTS)) if rng.random() < 0.6 else int(rng.integers(-8, 9))


def _ints(rng: np.random.Generator, old: list[int]) -> list[int]:
    choice = rng.random()
    if choice < 0.2:
        return []
    if choice < 0.4:  # another length
        return [_special_int(rng) for _ in range(int(rng.integers(1, 7)))]
    out = list(old) or [1]
    out[int(rng.integers(len(out)))] = _special_int(rng)
    return out


# ---- attributes -----------------------------------------------------------------------------
def _nodes(graph: Any) -> list[Any]:
    """The nodes of ``graph`` and of its subgraphs (If/Loop/Scan bodies)."""
    out = []
    for node in graph.node:
        out.append(node)
        for a in node.attribute:
            if a.HasField("g"):
                out.extend(_nodes(a.g))
            for sub in a.graphs:
                out.extend(_nodes(sub))
    return out


def _schema_attrs(node: Any) -> list[Any]:
    try:
        return list(onnx.defs.get_schema(node.op_type, domain=node.domain).attributes.values())
    except Exception:  # noqa: BLE001 - unknown op or domain: no schema
        return []


def _set_value(rng: np.random.Generator, attr: Any, kind: int) -> None:
    """Give ``attr`` a random value of attribute type ``kind`` (clearing its old value)."""
    old_ints, old_floats = list(attr.ints), list(attr.floats)
    name = attr.name
    attr.Clear()
    attr.name = name
    attr.type = kind
    if kind == A.INT:
        attr.i = _special_int(rng)
    elif kind == A.INTS:
        attr.ints.extend(_ints(rng, old_ints))
    elif kind == A.FLOAT:
        attr.f = float(_pick(rng, SPECIAL_FLOATS))
    elif kind == A.FLOATS:
        n = int(rng.integers(0, 6)) if rng.random() < 0.5 else len(old_floats)
        attr.floats.extend(float(_pick(rng, SPECIAL_FLOATS)) for _ in range(n))
    elif kind == A.STRING:
        attr.s = _pick(rng, STRINGS)
    elif kind == A.STRINGS:
        attr.strings.extend(_pick(rng, STRINGS) for _ in range(int(rng.integers(0, 4))))
    elif kind == A.TENSOR:
        data = np.asarray(rng.integers(-3, 4, int(rng.integers(0, 5))), dtype=np.int64)
        t = numpy_helper.from_array(data, "value")
        if rng.random() < 0.5:  # dims that disagree with the data
            del t.dims[:]
            t.dims.extend([_special_int(rng) for _ in range(int(rng.integers(0, 3)))])
        attr.t.CopyFrom(t)
    else:  # a graph: an empty body
        attr.type = A.GRAPH
        attr.g.CopyFrom(helper.make_graph([], "empty", [], []))


def mutate_attribute(rng: np.random.Generator, model: Any, feeds: dict) -> str:
    """Change, retype, remove or add one attribute of one node."""
    nodes = _nodes(model.graph)
    if not nodes:
        return "no node to mutate"
    node = _pick(rng, nodes)
    kinds = (A.INT, A.INTS, A.FLOAT, A.FLOATS, A.STRING, A.STRINGS, A.TENSOR)
    choice = rng.random()
    if node.attribute and choice < 0.55:
        attr = _pick(rng, node.attribute)
        _set_value(rng, attr, attr.type if attr.type in kinds else A.INT)
        return f"{node.op_type} {node.name!r}: attribute {attr.name} := {_show(attr)}"
    if node.attribute and choice < 0.7:
        attr = _pick(rng, node.attribute)
        kind = _pick(rng, kinds)
        _set_value(rng, attr, kind)
        return f"{node.op_type} {node.name!r}: attribute {attr.name} retyped := {_show(attr)}"
    if node.attribute and choice < 0.8:
        k = int(rng.integers(len(node.attribute)))
        name = node.attribute[k].name
        del node.attribute[k]
        return f"{node.op_type} {node.name!r}: attribute {name} removed"
    schema = [a for a in _schema_attrs(node) if a.name not in {x.name for x in node.attribute}]
    attr = node.attribute.add()
    if schema and rng.random() < 0.8:
        spec = _pick(rng, schema)
        attr.name = spec.name
        kind = int(spec.type) if int(spec.type) in kinds else A.INT
    else:
        attr.name, kind = "fuzz_unknown", A.INT
    _set_value(rng, attr, kind)
    return f"{node.op_type} {node.name!r}: attribute {attr.name} added := {_show(attr)}"


def _show(attr: Any) -> str:
    try:
        value = helper.get_attribute_value(attr)
    except Exception:  # noqa: BLE001
        return "?"
    text = repr(value)
    return text if len(text) < 60 else text[:57] + "..."


# ---- declared shapes ------------------------------------------------------------------------
def _graph_inputs(model: Any) -> list[Any]:
    inits = {i.name for i in model.graph.initializer}
    return [vi for vi in model.graph.input if vi.name not in inits]


def mutate_dims(rng: np.random.Generator, model: Any, feeds: dict) -> str:
    """Change the declared shape or element type of one graph input; sometimes make the input
    array match the new declaration."""
    inputs = [vi for vi in _graph_inputs(model) if vi.type.HasField("tensor_type")]
    if not inputs:
        return "no tensor input"
    vi = _pick(rng, inputs)
    tt = vi.type.tensor_type
    dims = tt.shape.dim
    choice = rng.random()
    if choice < 0.1:
        tt.elem_type = int(_pick(rng, (TensorProto.FLOAT, TensorProto.INT64, TensorProto.INT32,
                                       TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BOOL,
                                       TensorProto.UINT8, TensorProto.STRING, 0, 99)))
        return f"input {vi.name}: elem_type := {tt.elem_type}"
    if choice < 0.2:
        if dims and rng.random() < 0.5:
            del dims[int(rng.integers(len(dims)))]
        else:
            dims.add().dim_value = int(rng.integers(1, 4))
        what = f"input {vi.name}: rank := {len(dims)}"
    elif choice < 0.25:
        tt.ClearField("shape")
        return f"input {vi.name}: shape removed"
    elif not dims:
        return f"input {vi.name}: a scalar, left alone"
    else:
        d = dims[int(rng.integers(len(dims)))]
        if rng.random() < 0.4:
            d.dim_param = str(_pick(rng, ("N", "M", "batch", "", "N")))
        else:
            d.dim_value = int(_pick(rng, (0, 1, 2, 3, 5, 2**31 - 1, 2**32 + 1, 2**40)))
        what = f"input {vi.name}: dims := {[x.dim_param or x.dim_value for x in dims]}"
    declared = [x.dim_value if x.HasField("dim_value") else None for x in dims]
    if (vi.name in feeds and rng.random() < 0.6 and None not in declared
            and int(np.prod(declared, dtype=np.float64)) <= 1 << 16):
        old = feeds[vi.name]
        feeds[vi.name] = np.resize(old, declared).astype(old.dtype) if old.size else np.zeros(
            declared, old.dtype)
        what += " (input resized)"
    return what


# ---- graph edges ----------------------------------------------------------------------------
def mutate_edges(rng: np.random.Generator, model: Any, feeds: dict) -> str:
    """Rewire, drop, add or rename one node input or output, or reorder two nodes."""
    graph = model.graph
    if not graph.node:
        return "no node"
    k = int(rng.integers(len(graph.node)))
    node = graph.node[k]
    names = [vi.name for vi in graph.input] + [i.name for i in graph.initializer]
    names += [o for n in graph.node[:k] for o in n.output]
    choice = rng.random()
    if node.input and choice < 0.3:
        i = int(rng.integers(len(node.input)))
        new = _pick(rng, names) if names and rng.random() < 0.8 else "undefined_value"
        old, node.input[i] = node.input[i], new
        return f"{node.op_type} {node.name!r}: input {i} {old!r} -> {new!r}"
    if node.input and choice < 0.45:
        i = int(rng.integers(len(node.input)))
        node.input[i] = ""
        return f"{node.op_type} {node.name!r}: input {i} omitted ('')"
    if node.input and choice < 0.55:
        del node.input[-1]
        return f"{node.op_type} {node.name!r}: last input removed"
    if choice < 0.65:
        node.input.append(_pick(rng, names) if names else "x")
        return f"{node.op_type} {node.name!r}: extra input"
    if node.output and choice < 0.75:
        i = int(rng.integers(len(node.output)))
        node.output[i] = _pick(rng, names) if names and rng.random() < 0.5 else "renamed"
        return f"{node.op_type} {node.name!r}: output {i} renamed to {node.output[i]!r}"
    if choice < 0.85 and len(graph.node) > 1:
        j = int(rng.integers(len(graph.node)))
        a, b = type(node)(), type(node)()
        a.CopyFrom(graph.node[k])
        b.CopyFrom(graph.node[j])
        graph.node[k].CopyFrom(b)
        graph.node[j].CopyFrom(a)
        return f"nodes {k} and {j} swapped"
    if choice < 0.92 and graph.output:
        del graph.output[int(rng.integers(len(graph.output)))]
        return "a graph output removed"
    outs = [o for n in graph.node for o in n.output if o]
    if outs:
        graph.output.append(helper.make_empty_tensor_value_info(_pick(rng, outs)))
        return f"graph output {graph.output[-1].name!r} added"
    return "nothing"


# ---- opsets ---------------------------------------------------------------------------------
def mutate_opset(rng: np.random.Generator, model: Any, feeds: dict) -> str:
    """Another opset version for the default domain, an unknown domain, another IR version."""
    choice = rng.random()
    if choice < 0.7:
        for imp in model.opset_import:
            if imp.domain in ("", "ai.onnx"):
                imp.version = int(_pick(rng, (1, 5, 6, 7, 9, 10, 11, 12, 13, 14, 17, 19, 21, 23,
                                              25, 26, 0, 1000)))
                return f"opset := {imp.version}"
        return "no default-domain opset"
    if choice < 0.85:
        imp = model.opset_import.add()
        imp.domain, imp.version = "com.fuzz", 1
        if model.graph.node:
            model.graph.node[int(rng.integers(len(model.graph.node)))].domain = "com.fuzz"
        return "a node moved to an unknown domain"
    model.ir_version = int(_pick(rng, (0, 1, 3, 99)))
    return f"ir_version := {model.ir_version}"


# ---- initializers ---------------------------------------------------------------------------
def mutate_initializer(rng: np.random.Generator, model: Any, feeds: dict) -> str:
    """Dims that disagree with the data, a wrong data type, truncated raw data, NaN/Inf data,
    an initializer shadowing an input with another shape, a removed or duplicated one."""
    graph = model.graph
    choice = rng.random()
    inputs = _graph_inputs(model)
    if inputs and (choice < 0.2 or not graph.initializer):
        vi = _pick(rng, inputs)
        shape = [int(v) for v in rng.integers(0, 4, int(rng.integers(0, 4)))]
        graph.initializer.append(numpy_helper.from_array(
            rng.standard_normal(shape).astype(np.float32), vi.name))
        return f"initializer shadows input {vi.name!r} with shape {shape}"
    if not graph.initializer:
        return "no initializer"
    init = _pick(rng, graph.initializer)
    if choice < 0.4:
        init.dims[:] = [_special_int(rng) for _ in range(max(len(init.dims), 1))]
        return f"initializer {init.name!r}: dims := {list(init.dims)}"
    if choice < 0.5:
        init.data_type = int(_pick(rng, (TensorProto.FLOAT, TensorProto.INT64, TensorProto.INT8,
                                          TensorProto.DOUBLE, TensorProto.STRING, 0, 77)))
        return f"initializer {init.name!r}: data_type := {init.data_type}"
    if choice < 0.6 and init.raw_data:
        cut = int(rng.integers(len(init.raw_data)))
        init.raw_data = init.raw_data[:cut]
        return f"initializer {init.name!r}: raw data cut to {cut} bytes"
    if choice < 0.75:
        try:
            arr = numpy_helper.to_array(init).copy()
        except Exception:  # noqa: BLE001
            return "unreadable initializer"
        if arr.size and arr.dtype.kind == "f":
            arr.reshape(-1)[int(rng.integers(arr.size))] = _pick(rng, (np.nan, np.inf, -np.inf))
        elif arr.size and arr.dtype.kind in "iu":
            info = np.iinfo(arr.dtype)
            arr.reshape(-1)[int(rng.integers(arr.size))] = _pick(rng, (info.min, info.max,
                                                                       info.max // 2))
        init.CopyFrom(numpy_helper.from_array(arr, init.name))
        return f"initializer {init.name!r}: an extreme value"
    if choice < 0.9:
        name = init.name
        graph.initializer.remove(init)
        return f"initializer {name!r} removed"
    graph.initializer.append(init)
    return f"initializer {init.name!r} duplicated"


# ---- run-time inputs ------------------------------------------------------------------------
def _fresh_values(rng: np.random.Generator, arr: np.ndarray) -> np.ndarray:
    if arr.dtype.kind == "f":
        out = rng.standard_normal(arr.shape) * float(_pick(rng, (1.0, 1e-3, 1e3, 1e30)))
        return out.astype(arr.dtype)
    if arr.dtype.kind in "iu":
        info = np.iinfo(arr.dtype)
        lo, hi = max(info.min, -(2**31)), min(info.max, 2**31)
        return rng.integers(lo, hi, arr.shape, endpoint=False).astype(arr.dtype)
    if arr.dtype.kind == "b":
        return rng.random(arr.shape) < 0.5
    return arr


def mutate_inputs(rng: np.random.Generator, model: Any, feeds: dict) -> str:
    """Break one run-time input: new values (NaN/Inf, extremes, random indices), another dtype
    or shape, an empty or huge one, a missing or extra input, not an array at all."""
    if not feeds:
        return "no input"
    name = _pick(rng, sorted(feeds))
    arr = feeds[name]
    choice = rng.random()
    if choice < 0.25:
        feeds[name] = _fresh_values(rng, arr)
        return f"input {name}: new values"
    if choice < 0.4 and arr.size:
        out = arr.copy()
        flat = out.reshape(-1)
        if out.dtype.kind == "f":
            flat[int(rng.integers(flat.size))] = _pick(rng, (np.nan, np.inf, -np.inf, 3e38))
        elif out.dtype.kind in "iu":
            info = np.iinfo(out.dtype)
            flat[int(rng.integers(flat.size))] = _pick(rng, (info.min, info.max, info.min + 1,
                                                             0, 1))
        feeds[name] = out
        return f"input {name}: an extreme value"
    if choice < 0.5:
        dtype = _pick(rng, (np.float32, np.float64, np.int64, np.int32, np.float16, np.bool_,
                            np.uint8))
        feeds[name] = arr.astype(dtype)
        return f"input {name}: dtype := {np.dtype(dtype).name}"
    if choice < 0.65:
        shape = list(arr.shape)
        if shape and rng.random() < 0.6:
            k = int(rng.integers(len(shape)))
            shape[k] = int(_pick(rng, (0, 1, shape[k] + 1, max(shape[k] - 1, 0), 2 * shape[k])))
        elif shape and rng.random() < 0.5:
            shape.pop()
        else:
            shape.append(int(rng.integers(1, 3)))
        if int(np.prod(shape, dtype=np.float64)) > 1 << 20:
            return "too big"
        feeds[name] = np.resize(arr, shape) if arr.size else np.zeros(shape, arr.dtype)
        return f"input {name}: shape := {tuple(shape)}"
    if choice < 0.72:
        # a huge array that takes no memory (a broadcast view): kiln must refuse it, not copy it
        shape = list(arr.shape) or [1]
        shape[int(rng.integers(len(shape)))] = 2**31 + 7
        feeds[name] = np.broadcast_to(np.zeros((), arr.dtype), shape)
        return f"input {name}: a huge broadcast view {tuple(shape)}"
    if choice < 0.8:
        del feeds[name]
        return f"input {name}: missing"
    if choice < 0.87:
        feeds["fuzz_extra"] = arr
        return "an extra input"
    if choice < 0.94 and arr.ndim >= 1:
        # a 0-d input has no non-contiguous view; it falls through to the next mutation
        feeds[name] = arr.T if arr.ndim >= 2 else arr[::-1]
        return f"input {name}: a non-contiguous view"
    feeds[name] = _pick(rng, (None, "text", [1, 2, 3], 3.5, {"a": 1}))
    return f"input {name}: not an array ({type(feeds[name]).__name__})"


# ---- bytes ----------------------------------------------------------------------------------
def damage_bytes(rng: np.random.Generator, data: bytes) -> tuple[bytes, str]:
    """Flip, overwrite, insert or drop bytes, or truncate."""
    buf = bytearray(data)
    if not buf:
        return bytes(rng.integers(0, 256, 16, dtype=np.uint8)), "random bytes"
    choice = rng.random()
    if choice < 0.35:
        n = int(rng.integers(1, 9))
        for _ in range(n):
            i = int(rng.integers(len(buf)))
            buf[i] ^= 1 << int(rng.integers(8))
        return bytes(buf), f"{n} bit(s) flipped"
    if choice < 0.55:
        i = int(rng.integers(len(buf)))
        n = int(rng.integers(1, 33))
        buf[i:i + n] = bytes(rng.integers(0, 256, n, dtype=np.uint8))
        return bytes(buf), f"{n} byte(s) overwritten at {i}"
    if choice < 0.7:
        i = int(rng.integers(len(buf) + 1))
        n = int(rng.integers(1, 17))
        buf[i:i] = bytes(rng.integers(0, 256, n, dtype=np.uint8))
        return bytes(buf), f"{n} byte(s) inserted at {i}"
    if choice < 0.85:
        cut = int(rng.integers(len(buf)))
        return bytes(buf[:cut]), f"truncated to {cut} bytes"
    i = int(rng.integers(len(buf)))
    n = int(rng.integers(1, 65))
    del buf[i:i + n]
    return bytes(buf), f"{n} byte(s) dropped at {i}"


#: Model mutations by name (each also gets the inputs, which it may change to match).
MODEL_MUTATIONS: dict[str, Callable[[np.random.Generator, Any, dict], str]] = {
    "attribute": mutate_attribute,
    "dims": mutate_dims,
    "edges": mutate_edges,
    "opset": mutate_opset,
    "initializer": mutate_initializer,
}
