"""C for the calls tensor intrinsics make: buffer element addresses and extern functions.

A tensor intrinsic's impl (see :mod:`kiln.tir.tensor_intrin`) calls an extern function with
the addresses of buffer elements and integer strides. The function is declared in TIR terms,
with its C definition (:func:`kiln.tir.tensor_intrin.register_extern`); the code generator looks
it up by name and emits the definition among the static helpers of every file whose functions
call it, so generated modules stay self-contained.
"""

from __future__ import annotations

import re
from typing import Any

from ...ir.errors import CodegenError
from ...tir import expr as E
from ...tir.tensor_intrin import (
    ADDRESS_OF,
    CALL_EXTERN,
    ELEM_OFFSET,
    extern_function,
    extern_functions,
)

#: ``Call`` ops handled here.
EXTERN_OPS = (ADDRESS_OF, CALL_EXTERN, ELEM_OFFSET)


def before_load(source: str, target: Any) -> None:
    """Run the ``before_load`` hooks of the registered extern functions ``source`` calls."""
    for fn in extern_functions():
        if fn.before_load is not None and re.search(rf"\b{re.escape(fn.name)}\(", source):
            fn.before_load(target)


def emit(emitter: Any, e: E.Call) -> str:
    """C for a ``kiln.address_of`` / ``kiln.elem_offset`` / ``kiln.call_extern`` call, written
    by ``emitter`` (the C expression emitter, :class:`kiln.codegen.c.expr.ExprEmitter`)."""
    if e.op in (ADDRESS_OF, ELEM_OFFSET):
        load = e.args[0] if len(e.args) == 1 else None
        if not isinstance(load, E.BufferLoad) or len(load.indices) != 1:
            raise CodegenError(f"{e.op} needs one flattened buffer load")
        if e.op == ELEM_OFFSET:
            return f"((int64_t)({emitter.expr(load.indices[0])}))"
        return f"({emitter.buffer_ptr(load.buffer)} + {emitter.expr(load.indices[0])})"
    name = e.args[0] if e.args else None
    if not isinstance(name, E.StringImm):
        raise CodegenError("call_extern needs the C function's name as its first argument")
    fn = extern_function(name.value)
    if fn is None:
        raise CodegenError(
            f"call_extern: no extern function {name.value!r} is registered "
            "(kiln.tir.tensor_intrin.register_extern)"
        )
    emitter.helpers._add(name.value, fn.c_source)
    args = ", ".join(emitter.expr(a) for a in e.args[1:])
    return f"{name.value}({args})"
