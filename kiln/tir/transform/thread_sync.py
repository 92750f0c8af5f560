"""GPU lowering pass: insert barriers where the threads of a block exchange data through memory.

In a kernel's SPMD body every thread runs the same statements; when one thread writes an
element that another thread then reads (or overwrites one that another still has to read),
all threads must wait at a barrier in between (``__syncthreads()``, OpenCL's ``barrier``).
This pass (TVM's ThreadSync) walks each kernel and inserts the barriers:

- between two statements of a sequence, when the second accesses memory the statements since
  the last barrier wrote, or writes memory they read;
- at the end of a loop body, when an iteration's last accesses conflict with the next one's
  first (a tile of shared memory overwritten while threads still read the previous one).

Memory here is the kernel's shared memory, through which the threads of a block exchange
data (exchanging it through global memory inside one kernel is up to the schedule, as in
TVM). Two accesses with the same index expression (``let`` variables replaced by their values,
so ``threadIdx.x`` under another name is recognized) are made by the same thread and need no
barrier. Statements under a branch or a loop whose condition or bounds depend
on the thread index do not run on every thread, and a barrier there would hang the block: a
conflict inside such a region (or a warp shuffle, which needs the whole warp) is a
``LoweringError``. Kernels of one thread per block need no barrier. An asynchronous copy
(``gpu.async_copy``) is no access where it is issued: its data lands at a later wait (a barrier
right after the copy would not make it visible), so the pass that issues it places the waits
and barriers it needs; the loops ``async_copies`` pipelined (annotated ``PIPELINED``) are left
as they are (their stages rotate, which an index comparison cannot tell apart).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ...ir.errors import LoweringError
from ...ir.node import structural_equal
from ..expr import BufferLoad, Call, PrimExpr, Var
from ..function import PrimFunc
from ..functor import Mutator, collect_vars, post_order_visit, substitute
from ..gpu import (
    ASYNC_COPY,
    SHFL,
    SHFL_DOWN,
    KernelLaunch,
    barrier,
    is_barrier,
    is_thread_tag,
)
from ..stmt import (
    Allocate,
    BufferStore,
    Evaluate,
    For,
    IfThenElse,
    LetStmt,
    SeqStmt,
    Stmt,
    seq,
)
from .async_copies import PIPELINED


class Access(NamedTuple):
    """One load or store of a buffer (its data variable) at an index."""

    data: Var
    index: PrimExpr
    write: bool


def conflict(earlier: list[Access], later: list[Access]) -> bool:
    """Whether ``later`` may touch, from another thread, memory ``earlier`` touched, one of
    the two writing it."""
    if not earlier or not later:
        return False
    for a in earlier:
        for b in later:
            if a.data is b.data and (a.write or b.write) and not structural_equal(
                    a.index, b.index, map_free_vars=False):
                return True
    return False


def _has_shuffle(stmt: Stmt) -> bool:
    found = [False]

    def visit(n: Any) -> None:
        if isinstance(n, Call) and n.op in (SHFL, SHFL_DOWN):
            found[0] = True

    post_order_visit(stmt, visit)
    return found[0]


class _Sync:
    def __init__(self, kernel: KernelLaunch):
        self.kernel = kernel
        self.varying: set[Var] = {v for v, tag in kernel.env if is_thread_tag(tag)}
        self.shared: set[Var] = {b.data for b in kernel.shared}
        self.private: set[Var] = set()

        def find(n: Any) -> None:
            if isinstance(n, Allocate) and n.buffer.scope != "shared":
                self.private.add(n.buffer.data)

        post_order_visit(kernel.body, find)

    # ---- what varies between the threads of a block ---------------------------------------
    def is_varying(self, e: Any) -> bool:
        if any(v in self.varying for v in collect_vars(e)):
            return True
        found = [False]

        def visit(n: Any) -> None:
            if isinstance(n, BufferLoad) and n.buffer.data in self.private:
                found[0] = True

        post_order_visit(e, visit)
        return found[0]

    # ---- memory accesses --------------------------------------------------------------------
    def accesses(self, stmt: Any, env: dict[Var, PrimExpr] | None = None) -> list[Access]:
        env = dict(env or {})
        out: list[Access] = []
        shared = self.shared

        def expr(e: Any) -> None:
            def visit(n: Any) -> None:
                if isinstance(n, BufferLoad) and n.buffer.data in shared:
                    out.append(Access(n.buffer.data, substitute(n.indices[0], env), False))

            post_order_visit(e, visit)

        def walk(s: Any) -> None:
            if isinstance(s, SeqStmt):
                for x in s.seq:
                    walk(x)
            elif isinstance(s, LetStmt):
                expr(s.value)
                env[s.var] = substitute(s.value, env)
                walk(s.body)
            elif isinstance(s, BufferStore):
                expr(s.value)
                expr(s.indices)
                if s.buffer.data in shared:
                    out.append(Access(s.buffer.data, substitute(s.indices[0], env), True))
            elif isinstance(s, For):
                expr((s.min, s.extent))
                walk(s.body)
            elif isinstance(s, IfThenElse):
                expr(s.condition)
                walk(s.then_case)
                walk(s.else_case)
            elif isinstance(s, Allocate):
                walk(s.body)
            elif (isinstance(s, Evaluate) and isinstance(s.value, Call)
                  and s.value.op == ASYNC_COPY):
                pass  # lands at a later wait, not here: ordered by whoever placed the wait
            elif s is not None:
                expr(s)

        walk(stmt)
        return out

    def has_barrier(self, s: Stmt) -> bool:
        """Whether every thread that runs ``s`` surely passes a barrier in it."""
        if is_barrier(s):
            return True
        if isinstance(s, SeqStmt):
            return any(self.has_barrier(x) for x in s.seq)
        if isinstance(s, (LetStmt, Allocate)):
            return self.has_barrier(s.body)
        return False

    def head(self, s: Stmt, env: dict[Var, PrimExpr]) -> list[Access]:
        """Accesses that may come before the first barrier of ``s``."""
        return self._edge(s, env, first=True)

    def tail(self, s: Stmt, env: dict[Var, PrimExpr]) -> list[Access]:
        """Accesses that may come after the last barrier of ``s``."""
        return self._edge(s, env, first=False)

    def _edge(self, s: Stmt, env: dict[Var, PrimExpr], first: bool) -> list[Access]:
        if isinstance(s, SeqStmt):
            out: list[Access] = []
            for x in (s.seq if first else reversed(s.seq)):
                if self.has_barrier(x):
                    edge = self._edge(x, env, first)
                    return out + edge if first else edge + out
                out = out + self.accesses(x, env) if first else self.accesses(x, env) + out
            return out
        if isinstance(s, (LetStmt, Allocate)) and self.has_barrier(s.body):
            inner = dict(env)
            if isinstance(s, LetStmt):
                inner[s.var] = substitute(s.value, env)
            return self._edge(s.body, inner, first)
        return self.accesses(s, env)

    # ---- the walk ---------------------------------------------------------------------------
    def fail(self, what: str) -> None:
        raise LoweringError(
            f"kernel {self.kernel.name}: {what} under a branch or loop that depends on the "
            "thread index, where not every thread of the block gets (a barrier there would "
            "hang the block); restructure the schedule so that the threads exchange data "
            "outside such regions")

    def process(self, s: Stmt, uniform: bool, env: dict[Var, PrimExpr]) -> Stmt:
        if isinstance(s, SeqStmt):
            items = [self.process(x, uniform, env) for x in s.seq]
            return self.sequence(items, uniform, env)
        if isinstance(s, LetStmt):
            if self.is_varying(s.value):
                self.varying.add(s.var)
            inner = dict(env)
            inner[s.var] = substitute(s.value, env)
            body = self.process(s.body, uniform, inner)
            return s if body is s.body else s.replace(body=body)
        if isinstance(s, Allocate):
            body = self.process(s.body, uniform, env)
            return s if body is s.body else s.replace(body=body)
        if isinstance(s, For):
            if s.annotations.get(PIPELINED):
                return s  # async_copies placed its barriers (and waits)
            varying = self.is_varying((s.min, s.extent))
            if varying:
                self.varying.add(s.loop_var)
                if uniform and _has_shuffle(s.body):
                    self.fail("a warp shuffle")
            body = self.process(s.body, uniform and not varying, env)
            if conflict(self.tail(body, env), self.head(body, env)):
                if not uniform or varying:
                    self.fail("threads exchange data between loop iterations")
                body = seq(body, barrier())
            return s if body is s.body else s.replace(body=body)
        if isinstance(s, IfThenElse):
            varying = self.is_varying(s.condition)
            if uniform and varying and _has_shuffle(s):
                self.fail("a warp shuffle")
            inner = uniform and not varying
            then = self.process(s.then_case, inner, env)
            other = None if s.else_case is None else self.process(s.else_case, inner, env)
            if then is s.then_case and other is s.else_case:
                return s
            return s.replace(then_case=then, else_case=other)
        return s

    def sequence(self, items: list[Stmt], uniform: bool, env: dict[Var, PrimExpr]) -> Stmt:
        out: list[Stmt] = []
        pending: list[Access] = []
        for item in items:
            if is_barrier(item):
                pending = []
                out.append(item)
                continue
            if conflict(pending, self.head(item, env)):
                if not uniform:
                    self.fail("threads exchange data")
                out.append(barrier())
                pending = []
            out.append(item)
            if self.has_barrier(item):
                pending = self.tail(item, env)
            else:
                pending = pending + self.accesses(item, env)
        return seq(*out)


def insert_thread_sync(func: PrimFunc) -> PrimFunc:
    """Return ``func`` (after ``extract_kernels``) with the barriers its kernels need."""

    class _Kernels(Mutator):
        def visit_KernelLaunch(self, k: KernelLaunch) -> Stmt:
            if k.threads_per_block == 1 or (not k.shared and not _has_shuffle(k.body)):
                return k
            body = _Sync(k).process(k.body, True, {})
            return k if body is k.body else k.replace(body=body)

    body = _Kernels().visit(func.body)
    return func if body is func.body else func.with_body(body)
