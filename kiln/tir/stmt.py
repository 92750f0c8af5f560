"""TIR statements, including TensorIR-style blocks.

A ``Block`` is the unit schedules work on: it names its iteration variables (spatial or
reduction), the buffer regions it reads and writes, an optional ``init`` statement (run at the
first iteration of its reduction variables) and buffers it allocates. A ``BlockRealize`` binds a
block's iteration variables to expressions of the surrounding loop variables. Lowering
(``kiln.tir.transform``) turns blocks into plain loops before codegen.
"""

from __future__ import annotations

from dataclasses import field
from enum import IntEnum
from typing import Any

from ..ir.dtype import DataType
from ..ir.node import Node, node, set_field
from .buffer import Buffer, BufferRegion
from .expr import IterVar, PrimExpr, Var, convert


class Stmt(Node):
    """Base of all statements."""


class ForKind(IntEnum):
    SERIAL = 0
    PARALLEL = 1
    VECTORIZED = 2
    UNROLLED = 3
    #: Bound to a GPU thread index (annotation :data:`THREAD_TAG`; see ``Schedule.bind``).
    THREAD_BINDING = 4


#: Loop annotation: the C compiler unrolls a serial loop by this many iterations (``#pragma GCC
#: unroll N``) -- a partial unroll left to the compiler, where ``ForKind.UNROLLED`` unrolls the
#: whole loop.
UNROLL_BY = "kiln.unroll_by"
#: Loop annotation: the last statement of the loop's body (the partitioned tail tile of a row)
#: runs this many iterations at once, its copies jammed into one loop nest (see
#: :mod:`kiln.tir.transform.jam_tails`). Only for loops whose iterations are independent.
JAM_TAILS = "kiln.jam_tails"
#: Loop annotation: FMAs inside the loop that accumulate into an array on the stack (a register
#: tile) keep both factors in registers (see ``Helpers.tile_fma`` in the C backend).
FMA_IN_REGISTERS = "kiln.fma_in_registers"
#: Loop annotation of a ``ForKind.THREAD_BINDING`` loop: the thread index it runs on
#: (``"blockIdx.x"``, ``"threadIdx.y"``...; see :mod:`kiln.tir.gpu`).
THREAD_TAG = "kiln.thread_tag"


@node
class BufferStore(Stmt):
    buffer: Buffer
    value: PrimExpr
    indices: tuple[PrimExpr, ...]

    def __post_init__(self):
        set_field(self, "value", convert(self.value))
        set_field(self, "indices", tuple(convert(i) for i in self.indices))


@node
class Evaluate(Stmt):
    value: PrimExpr

    def __post_init__(self):
        set_field(self, "value", convert(self.value))


@node
class For(Stmt):
    """``for loop_var in [min, min + extent)``, of a kind (serial/parallel/vectorized/unrolled)."""

    loop_var: Var
    min: PrimExpr
    extent: PrimExpr
    kind: ForKind
    body: Stmt
    annotations: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        set_field(self, "min", convert(self.min))
        set_field(self, "extent", convert(self.extent))
        if not isinstance(self.kind, ForKind):
            set_field(self, "kind", ForKind(self.kind))


@node
class SeqStmt(Stmt):
    seq: tuple[Stmt, ...]

    def __post_init__(self):
        set_field(self, "seq", tuple(self.seq))


@node
class IfThenElse(Stmt):
    condition: PrimExpr
    then_case: Stmt
    else_case: Stmt | None = None


@node
class LetStmt(Stmt):
    var: Var
    value: PrimExpr
    body: Stmt


@node
class Allocate(Stmt):
    """Storage for ``buffer`` (its ``data`` var) lives for the duration of ``body``."""

    buffer: Buffer
    body: Stmt


@node
class AssertStmt(Stmt):
    condition: PrimExpr
    message: str
    body: Stmt


@node
class Block(Stmt):
    """A TensorIR block. ``init`` runs before the first reduction iteration."""

    iter_vars: tuple[IterVar, ...]
    reads: tuple[BufferRegion, ...]
    writes: tuple[BufferRegion, ...]
    name_hint: str
    body: Stmt
    init: Stmt | None = None
    alloc_buffers: tuple[Buffer, ...] = ()
    annotations: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        for name in ("iter_vars", "reads", "writes", "alloc_buffers"):
            set_field(self, name, tuple(getattr(self, name)))


@node
class BlockRealize(Stmt):
    """Runs ``block`` with its iter vars bound to ``iter_values`` when ``predicate`` holds."""

    iter_values: tuple[PrimExpr, ...]
    predicate: PrimExpr
    block: Block

    def __post_init__(self):
        set_field(self, "iter_values", tuple(convert(v) for v in self.iter_values))
        set_field(self, "predicate", convert(self.predicate))


def seq(*stmts: Stmt) -> Stmt:
    """A SeqStmt of the given statements, flattened; a single statement is returned as is."""
    flat: list[Stmt] = []
    for s in stmts:
        if s is None:
            continue
        if isinstance(s, SeqStmt):
            flat.extend(s.seq)
        else:
            flat.append(s)
    return flat[0] if len(flat) == 1 else SeqStmt(tuple(flat))


def true_predicate() -> PrimExpr:
    return convert(True)


__all__ = [
    "Allocate", "AssertStmt", "Block", "BlockRealize", "BufferStore", "DataType", "Evaluate",
    "For", "ForKind", "IfThenElse", "LetStmt", "SeqStmt", "Stmt", "seq", "true_predicate",
]
