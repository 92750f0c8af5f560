"""Tensor intrinsics: hardware instructions (or hand-tuned C kernels) that compute a whole
small tile, described in TIR so that a schedule can swap a block for them.

An intrinsic is two PrimFuncs over the same buffer parameters:

- ``desc``: the semantics, as a small loop nest around one block (e.g. ``C[i, j] += A[i, k] *
  B[k, j]`` for ``i < 6, j < 16, k < K``). Its buffers may declare symbolic strides and its
  loops symbolic extents (free variables of ``desc``): matching binds them.
- ``impl``: the replacement body, usually one :func:`call_extern` of a helper function taking
  :func:`address_of` the first element of each buffer and the bound strides/extents. The
  helper is declared here too (:func:`register_extern`): its name, its C definition and what
  must happen before a module calling it is loaded. Code generators look it up by name
  (:func:`extern_function`), so an intrinsic describes itself completely in TIR terms.

:meth:`kiln.tir.Schedule.tensorize` matches a block's body against ``desc`` (see
:mod:`kiln.tir.schedule.tensorize`) and replaces it by ``impl`` with each buffer bound to the
matched region of the real buffer. The CPU intrinsics live in :mod:`.x86` (imported, so
registered, by the package); an NPU backend registers its own the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ...ir.errors import ScheduleError
from ..buffer import Buffer
from ..expr import BufferLoad, Call, PrimExpr, StringImm, convert
from ..function import PrimFunc
from ..stmt import BlockRealize, For, Stmt

#: ``Call`` op of :func:`address_of` (a ``handle``: the address of one buffer element).
ADDRESS_OF = "kiln.address_of"
#: ``Call`` op of :func:`call_extern` (first argument: the C function's name).
CALL_EXTERN = "kiln.call_extern"
#: ``Call`` op of :func:`elem_offset` (an ``int64``: the flat index of one buffer element).
ELEM_OFFSET = "kiln.elem_offset"


def address_of(buffer: Buffer, *indices: PrimExpr | int) -> PrimExpr:
    """The address of ``buffer[indices]`` (a ``handle`` expression; C: ``ptr + offset``)."""
    if len(indices) != buffer.ndim:
        raise ScheduleError(
            f"address_of: buffer {buffer.name!r} has {buffer.ndim} dimensions, got "
            f"{len(indices)} indices"
        )
    return Call("handle", ADDRESS_OF, (BufferLoad(buffer, tuple(convert(i) for i in indices)),))


def elem_offset(buffer: Buffer, *indices: PrimExpr | int) -> PrimExpr:
    """The flat element index of ``buffer[indices]`` (``int64``), computed after lowering.

    Tensorize states the strides it passes to an intrinsic as differences of these, so they
    stay right when a later pass gives the buffer another shape (compacted caches).
    """
    if len(indices) != buffer.ndim:
        raise ScheduleError(
            f"elem_offset: buffer {buffer.name!r} has {buffer.ndim} dimensions, got "
            f"{len(indices)} indices"
        )
    return Call("int64", ELEM_OFFSET, (BufferLoad(buffer, tuple(convert(i) for i in indices)),))


def call_extern(dtype: str, name: str, *args: PrimExpr | int) -> PrimExpr:
    """A call of the C function ``name`` (declared through the C codegen's extern registry)."""
    return Call(dtype, CALL_EXTERN, (StringImm(name), *(convert(a) for a in args)))


@dataclass(frozen=True)
class TensorIntrin:
    """A registered intrinsic: ``desc`` (semantics) and ``impl`` (replacement), see above.

    ``features`` are the CPU flags (``/proc/cpuinfo`` names) the impl needs to run natively.
    """

    name: str
    desc: PrimFunc
    impl: PrimFunc
    features: tuple[str, ...] = field(default=())

    @property
    def desc_nest(self) -> Stmt:
        """The loop nest around the desc's block (the body of its root block)."""
        return root_body(self.desc)


def root_body(func: PrimFunc) -> Stmt:
    """The body of ``func``'s root block (``func.body`` when it has none)."""
    body = func.body
    if isinstance(body, BlockRealize) and not body.block.iter_vars:
        return body.block.body
    return body


_REGISTRY: dict[str, TensorIntrin] = {}


def _check(name: str, desc: PrimFunc, impl: PrimFunc) -> None:
    dbufs, ibufs = desc.buffers, impl.buffers
    if len(dbufs) != len(ibufs):
        raise ScheduleError(
            f"tensor intrinsic {name!r}: desc has {len(dbufs)} buffers, impl has {len(ibufs)}"
        )
    for d, i in zip(dbufs, ibufs):
        if d.dtype != i.dtype or d.ndim != i.ndim:
            raise ScheduleError(
                f"tensor intrinsic {name!r}: desc buffer {d.name!r} ({d.dtype}, {d.ndim}-D) and "
                f"impl buffer {i.name!r} ({i.dtype}, {i.ndim}-D) differ"
            )
    stmt = root_body(desc)
    while isinstance(stmt, For):
        stmt = stmt.body
    if not isinstance(stmt, BlockRealize):
        raise ScheduleError(
            f"tensor intrinsic {name!r}: desc must be a loop nest around one block, found "
            f"{type(stmt).__name__}"
        )


def register(name: str, desc: PrimFunc, impl: PrimFunc, features: tuple[str, ...] = (),
             override: bool = False) -> TensorIntrin:
    """Register an intrinsic under ``name`` (``override`` replaces an existing one)."""
    if name in _REGISTRY and not override:
        raise ScheduleError(f"tensor intrinsic {name!r} is already registered")
    _check(name, desc, impl)
    intrin = TensorIntrin(name, desc, impl, tuple(features))
    _REGISTRY[name] = intrin
    return intrin


def get(name: str) -> TensorIntrin:
    """The intrinsic registered as ``name``; a ScheduleError lists the known ones."""
    intrin = _REGISTRY.get(name)
    if intrin is None:
        known = ", ".join(sorted(_REGISTRY)) or "none"
        raise ScheduleError(f"no tensor intrinsic named {name!r}; registered: {known}")
    return intrin


def names() -> list[str]:
    """Names of the registered intrinsics."""
    return sorted(_REGISTRY)


# ---------------------------------------------------------------------------------------------
# extern functions: what call_extern calls
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ExternFunction:
    """A function ``call_extern`` calls by name: ``c_source``, its definition (emitted among
    the static helpers of every generated C file that calls it, so modules stay
    self-contained; one that needs instructions beyond the file's ``-march=native`` enables
    them with ``__attribute__((target(...)))``), and ``before_load(target)``, run when a module
    calling it is built, before it is loaded (the AMX helpers ask for the tile-data permission
    there and raise when it is refused)."""

    name: str
    c_source: str
    before_load: Callable[[Any], None] | None = None


_EXTERNS: dict[str, ExternFunction] = {}


def register_extern(name: str, c_source: str, override: bool = False,
                    before_load: Callable[[Any], None] | None = None) -> ExternFunction:
    """Declare the function ``call_extern(..., name, ...)`` calls (see :class:`ExternFunction`);
    a different definition under a taken name is an error unless ``override``."""
    old = _EXTERNS.get(name)
    if old is not None and old.c_source != c_source and not override:
        raise ScheduleError(f"a different extern function {name!r} is already registered")
    fn = ExternFunction(name, c_source, before_load)
    _EXTERNS[name] = fn
    return fn


def extern_function(name: str) -> ExternFunction | None:
    """The extern function registered as ``name`` (None when unknown)."""
    return _EXTERNS.get(name)


def extern_functions() -> list[ExternFunction]:
    """Every registered extern function."""
    return list(_EXTERNS.values())


__all__ = [
    "ADDRESS_OF", "CALL_EXTERN", "ELEM_OFFSET", "ExternFunction", "TensorIntrin", "address_of",
    "call_extern", "elem_offset", "extern_function", "extern_functions", "get", "names",
    "register", "register_extern", "root_body",
]
