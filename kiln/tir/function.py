"""PrimFunc: a TIR function over buffers."""

from __future__ import annotations

from dataclasses import field
from typing import Any

from ..ir.node import Node, node, set_field
from .buffer import Buffer
from .expr import Var
from .stmt import Stmt

#: PrimFunc attr: ``((condition, message), ...)``, conditions on the function's symbolic dims
#: that its body relies on but its buffer shapes do not state (a broadcast dim that must be 1
#: or equal to the other operand's, a contracted dim both operands must share). The kernel
#: checks them before it computes anything and fails with ``message`` and the dims' values (see
#: ``kiln/codegen/c/func.py``); ``te.compute(..., attrs={ASSUME_ATTR: ...})`` declares them,
#: and FuseTIR carries them into fused kernels.
ASSUME_ATTR = "kiln.assume"


@node
class PrimFunc(Node):
    """A loop-level function.

    ``params`` are variables: a handle var per buffer argument (mapped to its Buffer in
    ``buffer_map``) or a scalar var. By convention (as produced by ``te.create_prim_func`` and
    expected by ``call_tir``) the inputs come first and the outputs last; ``attrs`` carry
    facts such as ``global_symbol``, ``op_pattern``, ``op_name`` and ``num_outputs``.
    """

    params: tuple[Var, ...]
    buffer_map: dict[Var, Buffer]
    body: Stmt
    attrs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        set_field(self, "params", tuple(self.params))
        set_field(self, "buffer_map", dict(self.buffer_map))
        set_field(self, "attrs", dict(self.attrs))

    @property
    def buffers(self) -> list[Buffer]:
        """The Buffer of each buffer parameter, in parameter order."""
        return [self.buffer_map[p] for p in self.params if p in self.buffer_map]

    def with_attr(self, key: str, value: Any) -> PrimFunc:
        attrs = dict(self.attrs)
        attrs[key] = value
        return self.replace(attrs=attrs)

    def with_body(self, body: Stmt) -> PrimFunc:
        return self.replace(body=body)
