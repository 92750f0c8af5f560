"""GPU lowering pass: a multi-stage pipeline of asynchronous global->shared copies.

A GEMM's reduction loop copies tiles of A and B into shared memory, waits at a barrier, then
computes on them. ``prefetch_copies`` overlaps the next step's global loads with this step's
compute through registers; on GPUs with ``cp.async`` (sm_80 and later) the copies can go from
global to shared memory directly, several steps ahead, without the registers or the threads
waiting for them. A loop annotated :data:`ASYNC_STAGES` ``S`` (2, 3 or 4;
``Schedule.annotate(loop, ASYNC_STAGES, S)``) gets ``S`` copies ("stages") of each shared tile
it copies, and is rewritten (TVM's and CUTLASS's multi-stage main loop):

    for s in 0 .. S-2:                     # prologue: the first S-1 steps' tiles in flight
        copy(min + s) -> stage s; commit
    for k in loop:
        wait until at most S-2 groups are in flight   # this thread's copies of step k landed
        barrier                            # everyone's landed; everyone finished step k-1
        if k + S-1 < end: copy(k + S-1) -> stage (k - min + S-1) % S   # = step k-1's stage
        commit                             # (an empty group at the end keeps the count)
        compute(k) on stage (k - min) % S

One barrier per step: the stage a step's copies overwrite is the one the previous step
computed on, and every thread has passed the barrier after finishing that. The loop is marked
:data:`PIPELINED` so that ``thread_sync`` leaves its barriers as they are (it would otherwise
put one between the copies and the compute, which read different stages).

A step whose compute is ``wgmma`` (:data:`~kiln.tir.tensor_intrin.gpu.WGMMA`, asynchronous
itself) need not wait for its products: with 3 or more stages the pipeline leaves each step's
group in flight (the call's last argument ``pending``, ``k < end - 1``: ``wgmma.wait_group
1`` waits for the step before's; the last step waits for all) so that the tensor cores run
step k while the threads wait for step k+1's tiles. A stage is then read until the step after
it has waited, so the copies run one step less ahead (step k + S-2 into the stage of step
k-2, ``S-3`` groups of copies left in flight by the wait).

A copy becomes asynchronous (:data:`kiln.tir.gpu.ASYNC_COPY`: CUDA ``cp.async``, OpenCL a
plain copy, so PoCL checks the data movement and the stage rotation) when its innermost loop is
vectorized over 4, 8 or 16 bytes of a plain load from global memory (no conversion, no
computation), contiguous in both buffers and aligned to the chunk in both (proved from the
indices; the shared stages are rounded up to 16 bytes). Any other copy (a gather, a transposed
read) stays a synchronous copy into the same stage: the rotation stays correct, only that copy
does not overlap. The loop body must have the shape ``prefetch_copies`` requires (the copies,
then the rest) and a constant extent; the shared buffers it copies into must be allocated
outside the loop and used nowhere else. Anything else is a ``LoweringError`` naming the loop.
Runs on flattened loop TIR, before vectorization.
"""

from __future__ import annotations

from typing import Any

from ...arith.analyzer import Analyzer
from ...ir.errors import LoweringError
from ..buffer import Buffer
from ..expr import BufferLoad, Call, FloorMod, PrimExpr, Range, Var, add, const, lt
from ..function import PrimFunc
from ..functor import Mutator, post_order_visit, substitute
from ..gpu import async_commit, async_copy, async_wait, barrier
from ..schedule.analysis import as_int
from ..stmt import Allocate, BufferStore, For, ForKind, IfThenElse, LetStmt, Stmt, seq
from ..tensor_intrin.gpu import WGMMA
from ..tensor_intrin.intrin import address_of
from .hoist_allocations import alloc_size
from .prefetch_copies import fresh_definitions, split_shared_copies

#: Loop annotation: pipeline the loop's shared copies over this many stages (2, 3, 4).
ASYNC_STAGES = "kiln.gpu.async_stages"
#: Loop annotation this pass leaves on the loops it pipelined: their barriers are placed.
PIPELINED = "kiln.gpu.pipelined"
#: Stage counts the pass accepts.
STAGE_COUNTS = (2, 3, 4)
#: Annotation on the outer loop of a copy that stayed synchronous: why (the GPU code
#: generator writes it as a comment).
NOT_ASYNC = "kiln.not_async"
#: The sizes of one asynchronous copy (``cp.async``: 4, 8 or 16 bytes).
CHUNK_BYTES = (4, 8, 16)


def stage_elements(buffer: Buffer) -> int:
    """Elements of one stage of shared ``buffer`` (flattened, of constant size): its size
    rounded up to 16 bytes, so that every stage starts as aligned as the first."""
    size = as_int(alloc_size(buffer))
    if size is None:
        raise LoweringError(f"async copies: shared buffer {buffer.name!r} has no constant size")
    per = max(1, 16 // max(1, buffer.dtype.element.itemsize))
    return -(-size // per) * per


class _Staged(Mutator):
    """Accesses of the staged buffers moved to stage ``stage`` (an expression)."""

    def __init__(self, stages: dict[Var, tuple[Buffer, int]], stage: PrimExpr):
        self.stages = stages
        self.stage = stage

    def _moved(self, buffer: Buffer, indices: tuple[PrimExpr, ...]
               ) -> tuple[Buffer, tuple[PrimExpr, ...]] | None:
        hit = self.stages.get(buffer.data)
        if hit is None:
            return None
        new, size = hit
        (index,) = indices
        return new, (add(index, self.stage * const(index.dtype, size)),)

    def visit_BufferLoad(self, n: BufferLoad) -> PrimExpr:
        n = self.generic_visit(n)
        moved = self._moved(n.buffer, n.indices)
        return n if moved is None else BufferLoad(moved[0], moved[1])

    def visit_BufferStore(self, n: BufferStore) -> Stmt:
        n = self.generic_visit(n)
        moved = self._moved(n.buffer, n.indices)
        return n if moved is None else BufferStore(moved[0], n.value, moved[1])


class _Copy:
    """One copy statement of the pipelined ``loop`` (one store into a shared buffer)."""

    def __init__(self, stmt: Stmt, loop: For):
        self.stmt = stmt
        self.loop = loop
        stores: list[BufferStore] = []
        post_order_visit(stmt, lambda n: stores.append(n) if isinstance(n, BufferStore)
                         else None, exprs=False)
        self.store = stores[0]
        #: why the copy stays synchronous ("" when it is asynchronous)
        self.why_sync = ""

    def asynchronous(self, stmt: Stmt) -> Stmt:
        """``stmt`` (this copy at one step, in its stage) with its vector loop replaced by one
        asynchronous copy, when :meth:`_chunk` allows it; else ``stmt``."""
        out = self._rewrite(stmt, {}, Analyzer())
        if out is not None:
            return out
        if isinstance(stmt, For):
            return stmt.replace(annotations={**stmt.annotations, NOT_ASYNC: self.why_sync})
        return stmt

    def _rewrite(self, s: Stmt, env: dict[Var, PrimExpr], an: Analyzer) -> Stmt | None:
        if isinstance(s, For):
            if s.kind == ForKind.VECTORIZED:
                return self._chunk(s, env, an)
            extent = as_int(s.extent)
            if extent is not None and as_int(s.min) is not None:
                an.bind(s.loop_var, Range(s.min, s.extent))
            body = self._rewrite(s.body, env, an)
            return None if body is None else s.replace(body=body)
        if isinstance(s, LetStmt):
            inner = dict(env)
            inner[s.var] = substitute(s.value, env)
            body = self._rewrite(s.body, inner, an)
            return None if body is None else s.replace(body=body)
        if isinstance(s, Allocate):
            body = self._rewrite(s.body, env, an)
            return None if body is None else s.replace(body=body)
        if isinstance(s, IfThenElse) and s.else_case is None:
            then = self._rewrite(s.then_case, env, an)
            return None if then is None else s.replace(then_case=then)
        self.why_sync = "its innermost loop is not vectorized"
        return None

    def _chunk(self, vec: For, env: dict[Var, PrimExpr], an: Analyzer) -> Stmt | None:
        lanes = as_int(vec.extent)
        lets: list[LetStmt] = []
        body = vec.body
        while isinstance(body, LetStmt):
            lets.append(body)
            body = body.body
        value = body.value if isinstance(body, BufferStore) else None
        if lanes is None or as_int(vec.min) != 0 or value is None:
            self.why_sync = "its vector loop is not one store"
            return None
        dst = body.buffer
        el = dst.dtype.element
        nbytes = lanes * max(1, el.itemsize)
        if not (isinstance(value, BufferLoad) and value.buffer.scope == "global"
                and value.buffer.dtype.element == el and nbytes in CHUNK_BYTES):
            self.why_sync = (f"it is not a plain {el} load from global memory of "
                             f"{'/'.join(map(str, CHUNK_BYTES))} bytes")
            return None
        full = dict(env)
        for let in lets:
            full[let.var] = substitute(let.value, full)
        v = vec.loop_var
        zero, one, last = (const(v.dtype, x) for x in (0, 1, lanes - 1))
        starts = []
        for index in (body.indices[0], value.indices[0]):
            flat = substitute(index, full)
            at = [an.simplify(substitute(flat, {v: x})) for x in (zero, one, last)]
            if not (an.can_prove_equal(at[1] - at[0], 1) and
                    an.can_prove_equal(at[2] - at[0], lanes - 1)):
                self.why_sync = "its elements are not contiguous in both buffers"
                return None
            if not an.can_prove_equal(FloorMod(at[0], const(at[0].dtype, lanes)), 0):
                self.why_sync = f"its {nbytes}-byte chunks are not provably aligned"
                return None
            starts.append(substitute(index, {v: zero}))
        copy = async_copy(address_of(dst, starts[0]),
                          address_of(value.buffer, starts[1]), nbytes)
        out: Stmt = copy
        for let in reversed(lets):
            out = LetStmt(let.var, substitute(let.value, {v: zero}), out)
        return out


def _pipeline(loop: For, stages: int, staged: dict[Var, tuple[Buffer, int]]) -> Stmt:
    if stages not in STAGE_COUNTS:
        raise LoweringError(f"async copies of loop {loop.loop_var.name!r}: {stages} stages "
                            f"(one of {STAGE_COUNTS})")
    extent = as_int(loop.extent)
    if extent is None:
        raise LoweringError(f"async copies of loop {loop.loop_var.name!r}: its extent is not "
                            "a constant")
    head, rest = split_shared_copies(loop, "async copies")
    copies = [_Copy(s, loop) for s in head]
    for c in copies:
        buf = c.store.buffer
        if buf.data in staged and staged[buf.data][0].shape[0] != stages * staged[buf.data][1]:
            raise LoweringError(f"async copies: shared buffer {buf.name!r} is pipelined twice")
        size = stage_elements(buf)
        staged[buf.data] = (buf.replace(shape=(const("int64", stages * size),)), size)
    k, lo = loop.loop_var, loop.min
    lag = 1 if stages >= 3 and _wgmma_calls(rest) else 0
    if lag:
        pending = lt(k, add(lo, loop.extent - 1))
        rest = [_Pending(pending).visit(s) for s in rest]

    def issue(step: PrimExpr, stage: PrimExpr) -> list[Stmt]:
        out = []
        for c in copies:
            stmt = _Staged(staged, stage).visit(substitute(c.stmt, {k: step}))
            out.append(fresh_definitions(c.asynchronous(stmt)))
        return out

    prologue: list[Stmt] = []
    for s in range(stages - 1 - lag):
        if s < extent:
            prologue += issue(add(lo, s), const(k.dtype, s))
        prologue.append(async_commit())
    ahead = add(k, stages - 1 - lag)
    later = FloorMod(add(k - lo, stages - 1 - lag), const(k.dtype, stages))
    body = seq(async_wait(stages - 2 - lag), barrier(),
               IfThenElse(lt(ahead, add(lo, loop.extent)), seq(*issue(ahead, later))),
               async_commit(),
               *[_Staged(staged, FloorMod(k - lo, const(k.dtype, stages))).visit(s)
                 for s in rest])
    ann = {key: v for key, v in loop.annotations.items() if key != ASYNC_STAGES}
    ann[PIPELINED] = 1
    return seq(*prologue, loop.replace(body=body, annotations=ann))


class _Pending(Mutator):
    """:data:`WGMMA` calls that leave their group in flight while ``pending`` holds."""

    def __init__(self, pending: PrimExpr):
        self.pending = pending

    def visit_Call(self, n: Call) -> PrimExpr:
        n = self.generic_visit(n)
        if n.op == WGMMA:
            return n.replace(args=(*n.args, self.pending))
        return n


def _wgmma_calls(rest: list[Stmt]) -> bool:
    """Whether the compute ``rest`` of a pipelined loop issues :data:`WGMMA` products."""
    found: list[Call] = []
    for s in rest:
        post_order_visit(s, lambda n: found.append(n) if isinstance(n, Call) and n.op == WGMMA
                         else None)
    return bool(found)


class _Pipelines(Mutator):
    def __init__(self) -> None:
        self.staged: dict[Var, tuple[Buffer, int]] = {}

    def visit_For(self, loop: For) -> Stmt:
        loop = self.generic_visit(loop)
        stages = loop.annotations.get(ASYNC_STAGES)
        if stages:
            return _pipeline(loop, int(stages), self.staged)
        return loop

    def visit_Allocate(self, n: Allocate) -> Stmt:
        n = self.generic_visit(n)
        hit = self.staged.get(n.buffer.data)
        if hit is None:
            return n
        new = hit[0]
        stale: list[Any] = []

        def visit(x: Any) -> None:
            if isinstance(x, (BufferLoad, BufferStore)) and x.buffer.data is new.data \
                    and x.buffer is not new:
                stale.append(x)

        post_order_visit(n.body, visit)
        if stale:
            raise LoweringError(f"async copies: shared buffer {new.name!r} is used outside "
                                "the loop that pipelines it")
        return n.replace(buffer=new)


def pipeline_async_copies(func: PrimFunc) -> PrimFunc:
    """Return ``func`` with its loops annotated :data:`ASYNC_STAGES` pipelined (see the module
    docstring)."""
    pipelines = _Pipelines()
    body = pipelines.visit(func.body)
    return func if body is func.body else func.with_body(body)
