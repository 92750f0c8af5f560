"""Small ONNX models for tests: one-call graph building with onnx.helper.

Frontend tests build many one- or few-node models; this keeps the boilerplate (graph, opset
import, IR version, optional checker run) in one place.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def onnx_model(nodes: Sequence[Any], inputs: Sequence[Any], outputs: Sequence[Any],
               inits: Sequence[Any] = (), opset: int = 18, ir_version: int = 8,
               check: bool = False) -> Any:
    """A ModelProto of graph "g" with ``nodes``, value infos ``inputs``/``outputs`` and
    initializers ``inits`` (TensorProtos), importing the default domain at ``opset``."""
    graph = helper.make_graph(list(nodes), "g", list(inputs), list(outputs),
                              initializer=list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = ir_version
    if check:
        onnx.checker.check_model(model)
    return model


def value_info(name: str, shape: Sequence[Any] | None, dtype: int | None = None) -> Any:
    """A tensor ValueInfoProto (float32 unless ``dtype``, an onnx.TensorProto element type)."""
    return helper.make_tensor_value_info(name, TensorProto.FLOAT if dtype is None else dtype,
                                         shape)


def constant_node(name: str, value: Any) -> Any:
    """A Constant node making ``name`` from numpy ``value``."""
    arr = np.asarray(value)
    return helper.make_node("Constant", [], [name],
                            value=numpy_helper.from_array(arr, name + "_value"))


def pad_amounts_chain(pad: int, rank: int, out: str, prefix: str = "") -> list[Any]:
    """The nodes torch exports for ``F.pad(x, [pad, pad], mode="reflect")`` on a rank-``rank``
    tensor: the ONNX pads (``out``) are computed from constants through ConstantOfShape ->
    Concat -> Reshape -> Slice(step -1) -> Transpose -> Reshape -> Cast. Value names start
    with ``prefix``."""
    p = prefix
    return [
        constant_node(p + "pad_lr", np.array([pad, pad], np.int64)),
        constant_node(p + "n_zero", np.array([2 * rank - 2], np.int64)),
        helper.make_node("ConstantOfShape", [p + "n_zero"], [p + "zeros"],
                         value=numpy_helper.from_array(np.array([0], np.int64))),
        helper.make_node("Concat", [p + "pad_lr", p + "zeros"], [p + "cat"], axis=0),
        constant_node(p + "shape_m12", np.array([-1, 2], np.int64)),
        helper.make_node("Reshape", [p + "cat", p + "shape_m12"], [p + "pairs"]),
        constant_node(p + "s_start", np.array([-1], np.int64)),
        constant_node(p + "s_end", np.array([-(2 ** 62)], np.int64)),
        constant_node(p + "s_axes", np.array([0], np.int64)),
        constant_node(p + "s_steps", np.array([-1], np.int64)),
        helper.make_node("Slice", [p + "pairs", p + "s_start", p + "s_end", p + "s_axes",
                                   p + "s_steps"], [p + "rev"]),
        helper.make_node("Transpose", [p + "rev"], [p + "rev_t"], perm=[1, 0]),
        constant_node(p + "shape_m1", np.array([-1], np.int64)),
        helper.make_node("Reshape", [p + "rev_t", p + "shape_m1"], [p + "pads_i"]),
        helper.make_node("Cast", [p + "pads_i"], [out], to=TensorProto.INT64),
    ]


def squeeze_if_last_dim_is_one(x: str, out: str) -> list[Any]:
    """``If(shape(x)[-1] == 1, Squeeze(x, -1), Identity(x))`` as torch exports a squeeze of a
    dim that may be 1: the branches differ in rank, so the condition must be known at import
    (value names start with ``x``)."""
    then_b = helper.make_graph([helper.make_node("Squeeze", [x, f"{x}_sq_axes"],
                                                 [f"{x}_sq"])],
                               f"{x}_then", [], [value_info(f"{x}_sq", None)])
    else_b = helper.make_graph([helper.make_node("Identity", [x], [f"{x}_id"])],
                               f"{x}_else", [], [value_info(f"{x}_id", None)])
    return [
        helper.make_node("Shape", [x], [f"{x}_shape"]),
        constant_node(f"{x}_last", np.array(-1, np.int64)),
        helper.make_node("Gather", [f"{x}_shape", f"{x}_last"], [f"{x}_last_dim"], axis=0),
        constant_node(f"{x}_one", np.array(1, np.int64)),
        helper.make_node("Equal", [f"{x}_last_dim", f"{x}_one"], [f"{x}_is1"]),
        constant_node(f"{x}_sq_axes", np.array([-1], np.int64)),
        helper.make_node("If", [f"{x}_is1"], [out], then_branch=then_b, else_branch=else_b),
    ]
