"""C functions that TIR calls by name, and buffer element addresses (tensor intrinsics).

A tensor intrinsic's impl (see :mod:`kiln.tir.tensor_intrin`) calls a C helper function with
the addresses of buffer elements and integer strides. The helper's C text is registered here
once by name (:func:`register_c_function`); the code generator emits it among the static
helpers of every file whose functions call it, so generated modules stay self-contained.
Helpers that need instructions beyond the file's ``-march=native`` (AMX) enable them with
``__attribute__((target(...)))`` on the function itself.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...ir.errors import CodegenError
from ...tir import expr as E
from ...tir.tensor_intrin import ADDRESS_OF, CALL_EXTERN, ELEM_OFFSET

if TYPE_CHECKING:
    from .expr import ExprEmitter

#: ``Call`` ops handled here.
EXTERN_OPS = (ADDRESS_OF, CALL_EXTERN, ELEM_OFFSET)

_FUNCTIONS: dict[str, str] = {}
_BEFORE_LOAD: dict[str, Callable[[Any], None]] = {}


def register_c_function(name: str, code: str, override: bool = False,
                        before_load: Callable[[Any], None] | None = None) -> None:
    """Make ``call_extern(..., name, ...)`` emit ``code`` (the definition of ``name``).

    ``before_load(target)`` runs when a module calling ``name`` is built, before it is loaded
    (the AMX helpers request the tile-data permission there and raise when it is refused).
    """
    if name in _FUNCTIONS and _FUNCTIONS[name] != code and not override:
        raise CodegenError(f"a different C function {name!r} is already registered")
    _FUNCTIONS[name] = code
    if before_load is not None:
        _BEFORE_LOAD[name] = before_load
    else:
        _BEFORE_LOAD.pop(name, None)


def before_load(source: str, target: Any) -> None:
    """Run the ``before_load`` hooks of the registered functions ``source`` calls."""
    for name, hook in _BEFORE_LOAD.items():
        if re.search(rf"\b{re.escape(name)}\(", source):
            hook(target)


def c_function(name: str) -> str | None:
    """The registered C text of ``name`` (None when unknown)."""
    return _FUNCTIONS.get(name)


def emit(emitter: ExprEmitter, e: E.Call) -> str:
    """C for a ``kiln.address_of`` / ``kiln.elem_offset`` / ``kiln.call_extern`` call."""
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
    code = _FUNCTIONS.get(name.value)
    if code is None:
        raise CodegenError(
            f"call_extern: no C function {name.value!r} is registered "
            "(kiln.codegen.c.externs.register_c_function)"
        )
    emitter.helpers._add(name.value, code)
    args = ", ".join(emitter.expr(a) for a in e.args[1:])
    return f"{name.value}({args})"
