"""ONNX sequence and optional operators (``kiln.op.sequence``).

Sequences and optionals are graph values with their own StructInfo (``SequenceStructInfo``,
``OptionalStructInfo``); each operator becomes one host-function op. A tensor taken out of a
sequence or optional whose shape the graph does not know (elements that differ, a run-time
split) is ``match_cast`` to fresh symbolic dims (:func:`bind_dims`), bound when the step
runs, so the ops after it see named dims as after any run-time shape.

``SequenceMap`` applies its body to each element: with every input sequence's length known at
import time (built by SequenceConstruct / SplitToSequence of a static split, ...) the body is
imported once per element (``importer.convert_subgraph``, as Loop/Scan unroll) on
``sequence_at`` of the inputs, and the outputs are gathered with ``sequence_construct``.
With a length known only at run time it becomes the ONNX function that defines it (a Loop
over the length, appending the body's outputs to carried sequences), converted as any Loop:
the body then runs per element while the model runs, as the Loop converter decides.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx

from .... import graph as g
from .... import op, tir
from ..importer import convert_subgraph, onnx_dtype, value_type_sinfo
from ..registry import converter
from .dynamic import safe_name

#: Unrolling a SequenceMap over more elements than this is refused.
MAX_UNROLL = 4096


def bind_dims(ctx: Any, node: Any, value: Any, what: str) -> Any:
    """``value`` emitted; a tensor of unknown shape (known rank) is ``match_cast`` to fresh
    symbolic dims named after the node, bound when the step runs."""
    var = ctx.emit(value, f"{node.name}_{what}")
    sinfo = var.struct_info
    if isinstance(sinfo, g.TensorStructInfo) and sinfo.shape is None and sinfo.ndim >= 0:
        base = safe_name(f"{node.name}_{what}")
        dims = tuple(tir.Var(f"{base}_d{i}", "int64") for i in range(sinfo.ndim))
        return ctx.bb.match_cast(var, g.TensorStructInfo(dims, sinfo.dtype))
    return var


def _optional_tail(node: Any, i: int) -> list[Any]:
    return [node.input(i)] if node.has_input(i) else []


def _sequence_input(node: Any, i: int) -> Any:
    x = node.input(i)
    if not isinstance(x.struct_info, g.SequenceStructInfo):
        raise node.error(f"input {i} must be a sequence, got {x.struct_info}")
    return x


@converter("SequenceConstruct", since=11)
def sequence_construct(ctx: Any, node: Any) -> Any:
    return op.sequence_construct(node.inputs())


@converter("SequenceEmpty", since=11)
def sequence_empty(ctx: Any, node: Any) -> Any:
    return op.sequence_empty(dtype=onnx_dtype(node.attr("dtype", onnx.TensorProto.FLOAT),
                                              str(node)))


@converter("SequenceInsert", since=11)
def sequence_insert(ctx: Any, node: Any) -> Any:
    return op.sequence_insert(_sequence_input(node, 0), node.input(1), _optional_tail(node, 2))


@converter("SequenceErase", since=11)
def sequence_erase(ctx: Any, node: Any) -> Any:
    return op.sequence_erase(_sequence_input(node, 0), _optional_tail(node, 1))


@converter("SequenceAt", since=11)
def sequence_at(ctx: Any, node: Any) -> Any:
    return bind_dims(ctx, node, op.sequence_at(_sequence_input(node, 0), node.input(1)), "at")


@converter("SequenceLength", since=11)
def sequence_length(ctx: Any, node: Any) -> Any:
    seq = _sequence_input(node, 0)
    n = seq.struct_info.static_length
    if n is not None:
        return np.array(n, dtype=np.int64)
    return op.sequence_length(seq)


@converter("SplitToSequence", since=11)
def split_to_sequence(ctx: Any, node: Any) -> Any:
    split = node.const_value(1)
    # a split known here (an initializer too) is given as a constant: the op's inference then
    # knows the pieces (and binding the initializer later changes no type)
    tail = [g.const(np.asarray(split))] if split is not None else _optional_tail(node, 1)
    return op.split_to_sequence(node.input(0), tail,
                                axis=int(node.attr("axis", 0)),
                                keepdims=bool(node.attr("keepdims", 1)))


@converter("ConcatFromSequence", since=11)
def concat_from_sequence(ctx: Any, node: Any) -> Any:
    if "axis" not in node.attrs:
        raise node.error("the axis attribute is required")
    value = op.concat_from_sequence(_sequence_input(node, 0), axis=int(node.attr("axis")),
                                    new_axis=bool(node.attr("new_axis", 0)))
    return bind_dims(ctx, node, value, "concat")


# =============================================================================================
# optionals
# =============================================================================================
@converter("Optional", since=15)
def optional(ctx: Any, node: Any) -> Any:
    if node.has_input(0):
        return op.optional_wrap(node.input(0))
    tp = node.attrs.get("type")
    if tp is None:
        raise node.error("an Optional without an input needs the type attribute")
    sinfo = value_type_sinfo(tp, str(node))
    seq = isinstance(sinfo, g.SequenceStructInfo)
    tensor = sinfo.elem if seq else sinfo
    if not isinstance(tensor, g.TensorStructInfo):
        raise node.error(f"the type must be a tensor or a sequence of tensors, got {sinfo}")
    ndim = tensor.ndim if tensor.shape is None else len(tensor.shape)
    return op.optional_none(dtype=str(tensor.dtype), ndim=ndim, sequence=seq)


@converter("OptionalHasElement", since=15)
def optional_has_element(ctx: Any, node: Any) -> Any:
    if not node.has_input(0):
        return np.array(False)  # opset 18: an absent input is an empty optional
    x = node.input(0)
    if not isinstance(x.struct_info, g.OptionalStructInfo):
        return np.array(True)  # opset 18: a tensor or sequence is always there
    return op.optional_has_element(x)


@converter("OptionalGetElement", since=15)
def optional_get_element(ctx: Any, node: Any) -> Any:
    x = node.input(0)
    if not isinstance(x.struct_info, g.OptionalStructInfo):
        return x  # opset 18: a tensor or sequence is its own element
    return bind_dims(ctx, node, op.optional_get_element(x), "value")


# =============================================================================================
# SequenceMap
# =============================================================================================
@converter("SequenceMap", since=17)
def sequence_map(ctx: Any, node: Any) -> Any:
    body = node.attrs.get("body")
    if body is None:
        raise node.error("the body attribute is required")
    inputs = node.inputs()
    if len(body.input) != len(inputs):
        raise node.error(f"the body takes {len(body.input)} inputs, the node gives "
                         f"{len(inputs)}")
    seq_inputs = [i for i, x in enumerate(inputs)
                  if isinstance(x.struct_info, g.SequenceStructInfo)]
    if 0 not in seq_inputs:
        raise node.error("input 0 must be a sequence")
    lengths = {inputs[i].struct_info.static_length for i in seq_inputs}
    if None in lengths:
        return convert_subgraph(ctx, _as_loop(node, body, seq_inputs),
                                dict(zip(_outer_names(node), inputs)))
    if len(lengths) != 1:
        raise node.error(f"the input sequences differ in length: {sorted(lengths)}")
    n = lengths.pop()
    if n > MAX_UNROLL:
        raise node.error(f"{n} elements: more than {MAX_UNROLL} to unroll")
    outputs: list[list[Any]] = [[] for _ in body.output]
    for k in range(n):
        position = g.const(np.array(k, np.int64))
        bindings = {}
        for i, (formal, x) in enumerate(zip(body.input, inputs)):
            if i in seq_inputs:
                x = bind_dims(ctx, node, op.sequence_at(x, position), f"{k}_{i}")
            bindings[formal.name] = x
        for j, out in enumerate(convert_subgraph(ctx, body, bindings)):
            outputs[j].append(g.const(np.asarray(out)) if isinstance(out, np.ndarray) else out)
    if n == 0:
        raise node.error("the input sequences are empty: the element types of the outputs "
                         "are unknown")
    return [op.sequence_construct(vals) for vals in outputs]


def _outer_names(node: Any) -> list[str]:
    return [f"{node.name}__seqmap_in{i}" for i in range(node.num_inputs)]


def _as_loop(node: Any, body: Any, seq_inputs: list[int]) -> Any:
    """SequenceMap over run-time lengths as the ONNX function that defines it: a Loop over
    the first sequence's length whose body takes element ``i`` of every sequence input
    (``SequenceAt``), runs ``body`` and appends its outputs to the carried output sequences
    (``SequenceInsert``). Returned as a graph whose inputs are the node's inputs."""
    h = onnx.helper
    p = f"{node.name}__seqmap_"
    outer = _outer_names(node)
    nodes = [h.make_node("SequenceLength", [outer[0]], [p + "n"]),
             h.make_node("Constant", [], [p + "cond"],
                         value=h.make_tensor(p + "true", onnx.TensorProto.BOOL, [], [True]))]
    inner = []
    for i, formal in enumerate(body.input):
        if i in seq_inputs:
            inner.append(h.make_node("SequenceAt", [outer[i], p + "i"], [formal.name]))
        else:
            inner.append(h.make_node("Identity", [outer[i]], [formal.name]))
    inner.extend(body.node)
    carried_in, carried_out, empties = [], [], []
    for j, out in enumerate(body.output):
        tp = out.type
        elem = tp.sequence_type.elem_type if tp.HasField("sequence_type") else tp
        if not elem.HasField("tensor_type"):
            raise node.error(f"body output {out.name!r} must be a tensor or a sequence of "
                             "tensors")
        empties.append(h.make_node("SequenceEmpty", [], [f"{p}empty{j}"],
                                   dtype=elem.tensor_type.elem_type))
        carried_in.append(h.make_value_info(f"{p}acc{j}_in", h.make_sequence_type_proto(elem)))
        carried_out.append(h.make_value_info(f"{p}acc{j}_out",
                                             h.make_sequence_type_proto(elem)))
        inner.append(h.make_node("SequenceInsert", [f"{p}acc{j}_in", out.name],
                                 [f"{p}acc{j}_out"]))
    inner.append(h.make_node("Identity", [p + "cond_in"], [p + "cond_out"]))
    scalar = [h.make_tensor_value_info(p + "i", onnx.TensorProto.INT64, []),
              h.make_tensor_value_info(p + "cond_in", onnx.TensorProto.BOOL, [])]
    loop_body = h.make_graph(inner, f"{p}body", [*scalar, *carried_in],
                             [h.make_tensor_value_info(p + "cond_out", onnx.TensorProto.BOOL,
                                                       []), *carried_out],
                             initializer=list(body.initializer))
    nodes.extend(empties)
    outputs = [f"{p}out{j}" for j in range(len(body.output))]
    nodes.append(h.make_node("Loop", [p + "n", p + "cond", *(e.output[0] for e in empties)],
                             outputs, name=node.name, body=loop_body))
    graph_inputs = [h.make_value_info(name, onnx.TypeProto()) for name in outer]
    return h.make_graph(nodes, p + "graph", graph_inputs,
                        [h.make_value_info(o, onnx.TypeProto()) for o in outputs])
