"""Text of te tensors and operations, printed with the TIR expression printer."""

from __future__ import annotations

import json
from typing import Any

from ..ir.node import register_printer
from ..tir.printer import TIRPrinter
from .tensor import ComputeOp, PlaceholderOp, Tensor


def _shape(p: TIRPrinter, shape: Any) -> str:
    dims = ", ".join(p.expr(d) for d in shape)
    return f"({dims},)" if len(shape) == 1 else f"({dims})"


def _op(p: TIRPrinter, op: Any) -> str:
    if isinstance(op, PlaceholderOp):
        return (
            f"placeholder({_shape(p, op.shape)}, {json.dumps(str(op.dtype))}, "
            f"name={json.dumps(op.name)})"
        )
    if isinstance(op, ComputeOp):
        args = ", ".join(p.name(iv.var) for iv in op.axis)
        parts = [_shape(p, op.shape), f"lambda {args}: {p.expr(op.body)}",
                 f"name={json.dumps(op.name)}"]
        if op.tag:
            parts.append(f"tag={json.dumps(op.tag)}")
        if op.attrs:
            parts.append(f"attrs={p.value(op.attrs)}")
        return f"compute({', '.join(parts)})"
    return f"<{type(op).__name__}>"


def script(node: Any, name: str | None = None) -> str:
    """``Tensor(C: Buffer(...), op=compute(...))`` and the op forms above."""
    p = TIRPrinter()
    if isinstance(node, Tensor):
        return f"Tensor({p.buffer_decl(node.buffer)}, op={_op(p, node.op)})"
    return _op(p, node)


register_printer("kiln.te", script)
