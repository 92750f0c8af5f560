"""Small ONNX models for tests: one-call graph building with onnx.helper.

Frontend tests build many one- or few-node models; this keeps the boilerplate (graph, opset
import, IR version, optional checker run) in one place.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import onnx
from onnx import TensorProto, helper


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
