"""GPU lowering pass: split a lowered function into kernels and extract their launch shapes.

The input is loop TIR (blocks converted, buffers flattened) whose loops bound with
``Schedule.bind`` say what runs on GPU blocks and threads. The output keeps the function's
signature; its body is the *host* part: ``Allocate``\\ s of global workspace and, in order, one
:class:`~kiln.tir.gpu.KernelLaunch` per kernel. A kernel is

- a top-level statement whose outermost loops are bound to ``blockIdx`` (each tag once, the
  loops perfectly nested: a block of one kernel never waits for another block) and whose
  ``threadIdx`` loops lie anywhere below: its grid is the ``blockIdx`` extents (symbolic
  allowed: computed at run time from the function's symbolic dims), its block the largest
  constant extent bound to each ``threadIdx`` tag (a loop bound to a tag inside a loop bound
  to the same tag, a copy the threads share, gets the same thread index and may not be
  longer than the outer loop);
- or a run of top-level statements with no binding at all, which becomes a kernel of one
  thread (slow, never wrong: what a stage no GPU schedule covers gets).

Each bound loop becomes a ``LetStmt`` of its variable from the thread index variable (SPMD
form: the body is what every thread runs); a ``threadIdx`` loop shorter than its block extent
is guarded by ``if threadIdx < extent``. Allocations inside a kernel are placed by scope:

- ``shared``: the kernel's shared memory (``KernelLaunch.shared``), allowed only outside every
  ``threadIdx`` loop and of constant size; the total must fit the target's shared memory;
- any other scope inside the ``threadIdx`` loops: a private array of the thread (constant size,
  at most :data:`PRIVATE_LIMIT` bytes);
- any other scope in a kernel of one thread: global workspace, hoisted to the host part (its
  size must not depend on the kernel's loops).

The target's limits are checked here (threads per block, block and grid extents, shared
memory, kernel parameter bytes); a violation is a ``LoweringError`` naming the kernel.
"""

from __future__ import annotations

from typing import Any

from ...arith import Analyzer
from ...ir.dtype import DataType
from ...ir.errors import LoweringError
from ..buffer import Buffer
from ..expr import BufferLoad, PrimExpr, Var, add, cast, const, lt
from ..function import PrimFunc
from ..functor import Mutator, collect_vars, post_order_visit
from ..gpu import KernelLaunch, axis_of, index_var, is_block_tag, is_thread_tag
from ..schedule.analysis import as_int
from ..stmt import (
    THREAD_TAG,
    Allocate,
    BufferStore,
    For,
    ForKind,
    IfThenElse,
    LetStmt,
    SeqStmt,
    Stmt,
    seq,
)
from .hoist_allocations import alloc_size

#: Largest private (per-thread) array, in bytes.
PRIVATE_LIMIT = 16 * 1024


def _tag(loop: For) -> str | None:
    if loop.kind != ForKind.THREAD_BINDING:
        return None
    return str(loop.annotations.get(THREAD_TAG))


def _has_binding(stmt: Stmt) -> bool:
    found = [False]

    def visit(n: Any) -> None:
        if isinstance(n, For) and n.kind == ForKind.THREAD_BINDING:
            found[0] = True

    post_order_visit(stmt, visit)
    return found[0]


def buffers_used(stmt: Any) -> dict[Var, Buffer]:
    """The buffers loaded or stored in ``stmt``, by data variable, in first-use order."""
    out: dict[Var, Buffer] = {}

    def visit(n: Any) -> None:
        if isinstance(n, (BufferLoad, BufferStore)):
            out.setdefault(n.buffer.data, n.buffer)

    post_order_visit(stmt, visit)
    return out


def byte_size(buf: Buffer) -> int | None:
    """Bytes of a constant-size allocation of ``buf`` (None when its size is symbolic)."""
    n = as_int(alloc_size(buf))
    return None if n is None else n * max(1, buf.dtype.element.itemsize)


class _Spmd(Mutator):
    """Bound loops -> lets of thread index variables; allocations placed by scope."""

    def __init__(self, kernel: str, block_dims: dict[str, PrimExpr], single_thread: bool):
        self.kernel = kernel
        self.block_dims = block_dims
        self.single_thread = single_thread
        self.env: dict[str, Var] = {}
        self.bound: list[str] = []  # threadIdx tags bound around the statement being visited
        self.bound_loops: list[For] = []  # ... and their loops
        self.loops: list[Var] = []
        self.shared: list[Buffer] = []
        self.hoisted: list[Buffer] = []

    def thread_var(self, tag: str) -> Var:
        if tag not in self.env:
            self.env[tag] = index_var(tag)
        return self.env[tag]

    def visit_For(self, loop: For) -> Stmt:
        tag = _tag(loop)
        if tag is None:
            self.loops.append(loop.loop_var)
            try:
                return self.generic_visit(loop)
            finally:
                self.loops.pop()
        tv = self.thread_var(tag)
        if is_thread_tag(tag):
            self._check_nested(loop, tag)
            self.bound.append(tag)
            self.bound_loops.append(loop)
        try:
            body = self.visit(loop.body)
        finally:
            if is_thread_tag(tag):
                self.bound.pop()
                self.bound_loops.pop()
        v = loop.loop_var
        out: Stmt = LetStmt(v, add(loop.min, cast(v.dtype, tv)), body)
        if is_thread_tag(tag):
            if not Analyzer().can_prove(loop.extent >= self.block_dims[tag]):
                out = IfThenElse(lt(tv, cast(tv.dtype, loop.extent)), out)
        return out

    def _check_nested(self, loop: For, tag: str) -> None:
        """A loop bound to a tag inside a loop bound to the same tag (a copy shared by the
        threads, ``loop_transform.check_shared_copy``) runs on the threads of the outer loop:
        it may not have more iterations than they are."""
        for outer in self.bound_loops:
            if _tag(outer) == tag and not Analyzer().can_prove(loop.extent <= outer.extent):
                raise LoweringError(
                    f"kernel {self.kernel}: loop {loop.loop_var.name!r} bound to {tag} has "
                    f"{loop.extent} iterations inside loop {outer.loop_var.name!r} bound to "
                    f"the same tag with {outer.extent}; its iterations beyond would run on no "
                    "thread")

    def visit_Allocate(self, alloc: Allocate) -> Stmt:
        buf = alloc.buffer
        body = self.visit(alloc.body)
        size = byte_size(buf)
        if buf.scope == "shared":
            if self.bound:
                raise LoweringError(
                    f"kernel {self.kernel}: shared buffer {buf.name!r} is allocated inside the "
                    f"{self.bound[-1]} loop; shared memory belongs to the whole block (allocate "
                    "it outside the threadIdx loops)")
            if size is None:
                raise LoweringError(f"kernel {self.kernel}: shared buffer {buf.name!r} has a "
                                    f"size that is not a constant ({alloc_size(buf)})")
            self.shared.append(buf)
            return body
        needed = {t for t, d in self.block_dims.items() if as_int(d) != 1}
        per_thread = needed <= set(self.bound)
        if size is not None and size <= PRIVATE_LIMIT and per_thread:
            return alloc if body is alloc.body else Allocate(buf, body)
        if self.single_thread and not self.bound:
            used = {id(v) for v in self.loops}
            if any(id(v) in used or v in self.env.values() for v in collect_vars(
                    alloc_size(buf))):
                raise LoweringError(
                    f"kernel {self.kernel}: buffer {buf.name!r} has a size that depends on a "
                    f"loop of the kernel ({alloc_size(buf)})")
            self.hoisted.append(buf)
            return body
        if not per_thread:
            raise LoweringError(
                f"kernel {self.kernel}: buffer {buf.name!r} (scope {buf.scope!r}) is allocated "
                "outside the threadIdx loops of the kernel; to share it among the threads of a "
                "block give it the 'shared' scope, else allocate it inside the thread loops")
        raise LoweringError(
            f"kernel {self.kernel}: buffer {buf.name!r} takes "
            f"{'a symbolic number of' if size is None else size} bytes per thread (private "
            f"arrays may take at most {PRIVATE_LIMIT})")


def _grid_chain(stmt: Stmt) -> tuple[list[For], Stmt]:
    """The perfectly nested ``blockIdx`` loops at the top of ``stmt`` and what is inside."""
    chain: list[For] = []
    while isinstance(stmt, For) and _tag(stmt) and is_block_tag(_tag(stmt) or ""):
        chain.append(stmt)
        stmt = stmt.body
    return chain, stmt


def _check_no_grid_loops(stmt: Stmt, kernel: str) -> None:
    def visit(n: Any) -> None:
        if isinstance(n, For) and _tag(n) and is_block_tag(_tag(n) or ""):
            raise LoweringError(
                f"kernel {kernel}: loop {n.loop_var.name!r} is bound to {_tag(n)} below other "
                "statements; blockIdx loops must be the outermost loops of a kernel, perfectly "
                "nested (blocks cannot wait for each other)")

    post_order_visit(stmt, visit)


def _thread_extents(stmt: Stmt) -> dict[str, list[PrimExpr]]:
    out: dict[str, list[PrimExpr]] = {}

    def visit(n: Any) -> None:
        if isinstance(n, For) and _tag(n) and is_thread_tag(_tag(n) or ""):
            out.setdefault(_tag(n) or "", []).append(n.extent)

    post_order_visit(stmt, visit)
    return out


class KernelBuilder:
    """Makes the :class:`KernelLaunch` of each top-level statement (see module docstring)."""

    def __init__(self, name: str, target: Any):
        self.name = name
        self.target = target
        self.limits = target.gpu
        self.kernels: list[KernelLaunch] = []
        self.hoisted: list[Buffer] = []

    def kernel(self, stmt: Stmt) -> KernelLaunch:
        kname = f"{self.name}_kernel{len(self.kernels)}"
        limits = self.limits
        chain, inner = _grid_chain(stmt)
        _check_no_grid_loops(inner, kname)
        grid: list[PrimExpr] = [const("int64", 1)] * 3
        seen: set[str] = set()
        for lp in chain:
            tag = _tag(lp) or ""
            if tag in seen:
                raise LoweringError(f"kernel {kname}: {tag} is bound twice")
            seen.add(tag)
            ext = lp.extent if lp.extent.dtype == DataType("int64") else cast("int64", lp.extent)
            grid[axis_of(tag)] = ext
            limit = limits.max_grid_dims[axis_of(tag)]
            if as_int(ext) is not None and not 0 < as_int(ext) <= limit:  # type: ignore
                raise LoweringError(f"kernel {kname}: {tag} extent {ext} is outside the "
                                    f"target's grid limit [1, {limit}]")
        block_dims: dict[str, PrimExpr] = {}
        block = [1, 1, 1]
        for tag, extents in _thread_extents(inner).items():
            values = [as_int(e) for e in extents]
            if any(v is None for v in values):
                raise LoweringError(
                    f"kernel {kname}: a loop bound to {tag} has the symbolic extent "
                    f"{next(e for e, v in zip(extents, values) if v is None)}; thread extents "
                    "must be constants (split the loop by a constant factor)")
            dim = max(values)  # type: ignore[type-var]
            if dim > limits.max_block_dims[axis_of(tag)]:
                raise LoweringError(f"kernel {kname}: {tag} extent {dim} exceeds the target's "
                                    f"limit {limits.max_block_dims[axis_of(tag)]}")
            block_dims[tag] = const("int64", dim)
            block[axis_of(tag)] = dim  # type: ignore[call-overload]
        threads = block[0] * block[1] * block[2]
        if threads > limits.max_threads_per_block:
            raise LoweringError(f"kernel {kname}: {threads} threads per block exceed the "
                                f"target's limit of {limits.max_threads_per_block}")
        single = not chain and not block_dims
        spmd = _Spmd(kname, block_dims, single)
        body = spmd.visit(stmt)
        shared_bytes = sum(byte_size(b) or 0 for b in spmd.shared)
        if shared_bytes > limits.shared_memory_per_block_optin:
            raise LoweringError(f"kernel {kname}: {shared_bytes} bytes of shared memory exceed "
                                f"the target's {limits.shared_memory_per_block_optin}")
        self.hoisted += spmd.hoisted
        env = tuple((spmd.env[t], t) for t in sorted(spmd.env))
        launch = KernelLaunch(kname, tuple(grid), tuple(const("int64", b) for b in block), env,
                              body, tuple(spmd.shared))
        self.kernels.append(launch)
        return launch

    def host(self, stmt: Stmt) -> Stmt:
        """The host part of ``stmt``: workspace allocations around kernel launches."""
        if isinstance(stmt, Allocate):
            inner = self.host(stmt.body)
            if stmt.buffer.scope == "shared":
                return self._attach_shared(inner, stmt.buffer)
            return Allocate(stmt.buffer, inner)
        items = list(stmt.seq) if isinstance(stmt, SeqStmt) else [stmt]
        out: list[Stmt] = []
        unbound: list[Stmt] = []

        def flush() -> None:
            if unbound:
                out.append(self.kernel(seq(*unbound)))
                unbound.clear()

        for item in items:
            if isinstance(item, Allocate) and _has_binding(item):
                flush()
                out.append(self.host(item))
            elif _has_binding(item):
                flush()
                if not (isinstance(item, For) and _tag(item)):
                    raise LoweringError(
                        f"{self.name}: a top-level statement holds loops bound to GPU threads "
                        "below a loop or branch that is not bound itself; bind the outermost "
                        "loops of each stage (host code cannot run them)")
                out.append(self.kernel(item))
            else:
                unbound.append(item)
        flush()
        return seq(*out)

    def _attach_shared(self, host: Stmt, buf: Buffer) -> Stmt:
        """A shared buffer allocated at the top level (its users under no common loop) goes
        into the one kernel that uses it."""
        users = [k for k in self.kernels if buf.data in buffers_used(k.body)]
        if len(users) != 1:
            raise LoweringError(f"{self.name}: shared buffer {buf.name!r} is used by "
                                f"{len(users)} kernels; shared memory lives for one kernel")
        old = users[0]
        if buf.scope == "shared" and (byte_size(buf) or 0) + sum(
                byte_size(b) or 0 for b in old.shared) > self.limits.shared_memory_per_block_optin:
            raise LoweringError(f"kernel {old.name}: shared memory exceeds the target's "
                                f"{self.limits.shared_memory_per_block_optin} bytes")
        new = old.replace(shared=old.shared + (buf,))
        self.kernels[self.kernels.index(old)] = new

        class _Swap(Mutator):
            def visit_KernelLaunch(self, k: KernelLaunch) -> Stmt:
                return new if k is old else k

        return _Swap().visit(host)


def extract_kernels(func: PrimFunc, target: Any) -> PrimFunc:
    """Return ``func`` with its body split into host allocations and
    :class:`~kiln.tir.gpu.KernelLaunch` statements (see the module docstring)."""
    name = str(func.attrs.get("global_symbol") or func.attrs.get("op_name") or "func")
    builder = KernelBuilder(name, target)
    host = builder.host(func.body)
    for buf in reversed(builder.hoisted):
        host = Allocate(buf, host)
    return func.with_body(host)
