"""GPU lowering pass: load the next step's shared tiles into registers during this step.

A GEMM's reduction loop copies tiles of A and B into shared memory, waits at a barrier, then
computes on them; the threads stall on global memory at every step. A loop annotated with
:data:`PREFETCH` (``Schedule.annotate(loop, PREFETCH, 1)``) is pipelined over two stages,
registers then shared memory (the "double buffering" of GPUs without ``cp.async``):

    R = tile(min)                       # prologue: each thread's part of the first tiles
    for k in loop:
        shared = R                      # stage 2: registers -> shared memory
        if k + 1 < end: R = tile(k + 1) # stage 1: issue the next step's global loads ...
        compute(k)                      # ... which complete while the block computes
        (barriers where ``thread_sync`` puts them: before compute, at the end of the step)

The loop body must begin with the copies (statements whose one store writes a ``shared``
buffer; the *stages* of the copy: thread-bound loops, serial or vector loops of constant
extent, lets and guards), then the rest. Each copy gets a private register array ``R`` of the
elements one thread copies per step. Runs on flattened loop TIR, before vectorization (the
vector loops of a copy then load and store whole vectors). A loop that does not have this
shape is a ``LoweringError`` naming it (the schedule asked for something it cannot have).
"""

from __future__ import annotations

import math
from typing import Any

from ...ir.errors import LoweringError
from ..buffer import Buffer
from ..expr import BufferLoad, PrimExpr, Var, add, const, lt
from ..function import PrimFunc
from ..functor import Mutator, post_order_visit, substitute
from ..schedule.analysis import as_int
from ..stmt import Allocate, BufferStore, For, ForKind, IfThenElse, LetStmt, SeqStmt, Stmt, seq

#: Loop annotation asking for the two-stage pipeline of the module docstring.
PREFETCH = "kiln.gpu.prefetch"


def _stores(stmt: Stmt) -> list[BufferStore]:
    out: list[BufferStore] = []
    post_order_visit(stmt, lambda n: out.append(n) if isinstance(n, BufferStore) else None,
                     exprs=False)
    return out


def is_shared_copy(stmt: Stmt) -> bool:
    """Whether ``stmt`` is a copy into shared memory: its one store writes a shared buffer."""
    stores = _stores(stmt)
    return len(stores) == 1 and stores[0].buffer.scope == "shared"


def fresh_definitions(stmt: Stmt) -> Stmt:
    """``stmt`` with new variables for the loops and lets it defines (a copy of a statement
    placed next to the original defines each variable once)."""
    defined: dict[Var, Var] = {}

    def visit(n: Any) -> None:
        if isinstance(n, For):
            defined[n.loop_var] = Var(n.loop_var.name, n.loop_var.dtype)
        elif isinstance(n, LetStmt):
            defined[n.var] = Var(n.var.name, n.var.dtype)

    post_order_visit(stmt, visit, exprs=False)
    return substitute(stmt, defined)


class _Copy:
    """One copy statement split into its register load and its shared store."""

    def __init__(self, stmt: Stmt, loop: For):
        self.stmt = stmt
        self.loop = loop
        self.store = _stores(stmt)[0]
        self.serial: list[For] = []
        self._find_serial(stmt)
        extents = [as_int(lp.extent) for lp in self.serial]
        if any(e is None for e in extents) or any(as_int(lp.min) != 0 for lp in self.serial):
            raise self.error("its loops must start at 0 and have constant extents")
        self.elements = math.prod(extents)  # type: ignore[arg-type]
        index: PrimExpr = const("int64", 0)
        for lp in self.serial:
            index = add(index * lp.extent.astype("int64"), lp.loop_var.astype("int64"))
        self.index = index
        dst = self.store.buffer
        self.registers = Buffer(f"{dst.name}_prefetch", (self.elements,), dst.dtype, None, (),
                                None, "local")

    def error(self, why: str) -> LoweringError:
        return LoweringError(
            f"prefetch of loop {self.loop.loop_var.name!r}: the copy into "
            f"{self.store.buffer.name!r} cannot be staged in registers: {why}")

    def _find_serial(self, s: Stmt) -> None:
        if isinstance(s, For):
            if s.kind != ForKind.THREAD_BINDING:
                self.serial.append(s)
            self._find_serial(s.body)
        elif isinstance(s, (LetStmt, Allocate)):
            self._find_serial(s.body)
        elif isinstance(s, IfThenElse):
            if s.else_case is not None:
                raise self.error("it branches")
            self._find_serial(s.then_case)
        elif isinstance(s, SeqStmt):
            raise self.error("it is not one loop nest")

    def _with_store(self, new: Stmt) -> Stmt:
        old = self.store

        class _Swap(Mutator):
            def visit_BufferStore(self, n: BufferStore) -> Stmt:
                return new if n is old else n

        return _Swap().visit(self.stmt)

    def load(self) -> Stmt:
        """The copy's global loads into the registers."""
        return self._with_store(BufferStore(self.registers, self.store.value, (self.index,)))

    def save(self) -> Stmt:
        """The registers stored into shared memory where the copy stored."""
        value = BufferLoad(self.registers, (self.index,))
        return self._with_store(BufferStore(self.store.buffer, value, self.store.indices))


def split_shared_copies(loop: For, what: str) -> tuple[list[Stmt], list[Stmt]]:
    """A pipelined loop's body as its leading copies into shared memory and the statements
    that use them (a :class:`LoweringError` naming ``what`` of the loop when either part is
    empty): the form both register prefetch and async copies pipeline."""
    items = list(loop.body.seq) if isinstance(loop.body, SeqStmt) else [loop.body]
    n = 0
    while n < len(items) and is_shared_copy(items[n]):
        n += 1
    if n == 0 or n == len(items):
        raise LoweringError(
            f"{what} of loop {loop.loop_var.name!r}: its body must begin with copies into "
            "shared memory followed by the statements that use them")
    return items[:n], items[n:]


def _pipeline(loop: For) -> Stmt:
    head, rest = split_shared_copies(loop, "prefetch")
    copies = [_Copy(s, loop) for s in head]
    k = loop.loop_var
    first = [fresh_definitions(substitute(c.load(), {k: loop.min})) for c in copies]
    following = [fresh_definitions(substitute(c.load(), {k: add(k, 1)})) for c in copies]
    body = seq(*[c.save() for c in copies],
               IfThenElse(lt(add(k, 1), add(loop.min, loop.extent)), seq(*following)),
               *rest)
    ann = {key: v for key, v in loop.annotations.items() if key != PREFETCH}
    out: Stmt = seq(*first, loop.replace(body=body, annotations=ann))
    for c in reversed(copies):
        out = Allocate(c.registers, out)
    return out


class _Prefetch(Mutator):
    def visit_For(self, loop: For) -> Stmt:
        loop = self.generic_visit(loop)
        if loop.annotations.get(PREFETCH):
            return _pipeline(loop)
        return loop


def prefetch_shared_copies(func: PrimFunc) -> PrimFunc:
    """Return ``func`` with its loops annotated :data:`PREFETCH` pipelined (see the module
    docstring)."""
    body = _Prefetch().visit(func.body)
    return func if body is func.body else func.with_body(body)
