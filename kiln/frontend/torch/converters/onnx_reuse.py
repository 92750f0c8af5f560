"""ATen ops whose meaning an ONNX converter already implements, reused through the ONNX
frontend's public registry rather than written twice.

The ONNX converters are functions of ``(ctx, node)`` that read ``node.input(i)``,
``node.attr(name)`` and emit through ``ctx.emit``; :class:`OnnxCall` gives them the torch
node's operands in that shape, so e.g. ``aten.atan`` runs ONNX ``Atan``'s float64 evaluation.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

from ....ir.errors import KilnError
from ...onnx import lookup_converter

#: The ONNX opset whose converters are reused.
OPSET = 21


class OnnxCall:
    """An ONNX node's view over given operands and attributes, for one ONNX converter call."""

    def __init__(self, torch_node: Any, op_type: str, inputs: Sequence[Any],
                 attrs: dict[str, Any] | None = None, num_outputs: int = 1):
        self.torch_node = torch_node
        #: what ONNX converters read of the node's protobuf: its output names
        self.proto = SimpleNamespace(output=[f"out{i}" for i in range(num_outputs)])
        self.num_outputs = num_outputs
        self.op_type = op_type
        self._inputs = list(inputs)
        self.attrs = dict(attrs or {})
        self.name = torch_node.name
        self.opset = OPSET

    def __str__(self) -> str:
        return str(self.torch_node)

    def error(self, message: str) -> KilnError:
        return self.torch_node.error(message)

    @property
    def num_inputs(self) -> int:
        return len(self._inputs)

    def has_input(self, i: int) -> bool:
        return i < len(self._inputs) and self._inputs[i] is not None

    def input(self, i: int) -> Any:
        return self._inputs[i] if i < len(self._inputs) else None

    def inputs(self) -> list[Any]:
        return list(self._inputs)

    def attr(self, name: str, default: Any = None) -> Any:
        return self.attrs.get(name, default)


def onnx_op(ctx: Any, node: Any, op_type: str, inputs: Sequence[Any],
            attrs: dict[str, Any] | None = None, num_outputs: int = 1) -> Any:
    """The result of ONNX ``op_type``'s converter on ``inputs`` (kiln Exprs; None for an
    absent optional input) with ``num_outputs`` outputs asked for."""
    fn = lookup_converter(op_type, OPSET)
    if fn is None:
        raise node.error(f"no ONNX converter for {op_type} to reuse")
    return fn(ctx, OnnxCall(node, op_type, inputs, attrs, num_outputs))
