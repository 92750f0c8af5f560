"""Vector kernels on the NPU through TIR: element-wise and broadcast ops, fused element-wise
chains and casts as TE PrimFuncs, scheduled into the L0 scopes, tensorized onto the vector
intrinsics (:mod:`kiln.tir.tensor_intrin.npu_vector`), then generated into instructions.

The route (PassContext option ``"npu.lowering": "tir"``, the default) for the ops of
:data:`~.ops.ELEMENTWISE_OPS` and ``cast`` (registered with
:func:`~.lowering.register_tir_lowering`), and for the element-wise kernels that are no graph
op of their own -- the chains :mod:`.region` fuses, the cast a product's operand needs
(:func:`~.ops.cast_kernel`) -- through :func:`~.vector.register_elementwise_kernel`:

1. :func:`elementwise_prim_func`: the kernel over the result's dims collapsed as the emitter
   collapses them (:func:`~.vector.plan_elementwise`: at most three, plus the outer dims the
   blocks iterate over): per operand ``X<k>`` (1 in its broadcast dims) a zero-padded copy
   ``X<k>_pad`` whose last three dims are whole blocks; one stage ``S<i>`` per vector
   instruction (:class:`~.vector.VecStep`) over the padded dims, its value the instruction's
   semantics (:func:`~kiln.tir.tensor_intrin.npu_vector.vector_value`) of the operands, an
   immediate or the previous stage; a final ``vcast`` stage when the chain computes in
   another dtype than its result's; ``C``, the crop of the last stage.
2. :func:`schedule_elementwise`: the last stage's dims split by the emitter's block
   (:func:`~.vector.plan_elementwise`: the same blocks, so the same bits), block loops
   ``outer..., o0, o1, o2`` outside the block's ``i0, i1, i2``; every stage ``cache_write``'d
   into ``npu.l0.acc`` and ``compute_at``'ed under ``o2`` (the crop ``reverse_compute_at``'ed
   there: the block's store), every operand ``cache_read`` into its L0 buffer
   (``npu.l0.input`` / ``npu.l0.weight`` alternately, as the emitter) under ``o2`` with its
   padding inlined into the copy; the block loops fused into one loop annotated
   ``software_pipeline = nbuf`` (each iteration a pipeline step); each stage tensorized onto
   its vector intrinsic.
3. :func:`emit_vector_scheduled`: the program generator (below).

The generator walks the fused block loop: per iteration, on the core of the block
(round-robin), the copies into L0 become ``dma.load`` s (issued first: they read DRAM and
write the step's own slot), each tensorized stage its instruction over the block's valid part
(what the store moves: the crop's predicate clips the padded tail), a fence between two, and
the crop one ``dma.store``, in the token protocol of :class:`~.emit.Pipeline`. Each L0 buffer
gets a region of ``nbuf`` slots of its full tile in its memory, in the order the copies appear
(per memory, as the emitter's); the accumulator slot holds the stored stage's block first and
the others after it (8-byte aligned, :func:`~.vector.acc_layout`): the stages computing in one
dtype share that block, each writing over its producer, which only it reads. The result is the
emitter's instruction stream: the same bits and cycles (the tests compare both).

Not covered (the emitter's kernels run): element-wise ops in a dtype the vector unit lacks
(the emitted lowering puts them on the scalar unit) and a kernel with an immediate its dtype
cannot hold exactly (``x + 0.5`` in int32: :func:`~.vector.emit_elementwise`). The row
kernels (softmax, layer_norm, row means) are :mod:`.tir_rows`', pooling and depthwise
convolutions :mod:`.tir_pool`'s; both reuse this generator's walk.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

from ... import te
from ...ir.errors import KilnError
from ...npu.isa import UNIT_VECTOR
from ...tir import expr as E
from ...tir.buffer import Buffer
from ...tir.function import PrimFunc
from ...tir.schedule import Schedule
from ...tir.stmt import BlockRealize, BufferStore, Evaluate, For, SeqStmt, Stmt
from ...tir.tensor_intrin import ADDRESS_OF
from ...tir.tensor_intrin.npu import SCOPE_ACC, SCOPE_INPUT, SCOPE_WEIGHT
from ...tir.tensor_intrin.npu_vector import (
    NPU_VECTOR,
    NPU_VIEW,
    REDUCTIONS,
    VecOperand,
    vector_intrin,
    vector_value,
)
from .emit import DramTensor, DramView, KernelBuilder, KernelInfo, Pipeline, block, itemsize
from .feedback import lower_with_feedback
from .lowering import LoweringContext, NotSupported, register_tir_lowering
from .ops import (
    ELEMENTWISE_OPS,
    check_broadcast_shape,
    elementwise_steps,
    lower_cast,
    lower_elementwise,
)
from .tir_program import PIPELINE_KEY, SCOPE_MEMORY, affine_copy, evaluate, prefix_length
from .vector import (
    ElementwisePlan,
    VecStep,
    acc_layout,
    emit_elementwise,
    plan_elementwise_candidates,
    register_elementwise_kernel,
    traffic_cycles,
)

__all__ = ["CopyNest", "Staged", "VectorGenerator", "VectorKernel", "buffer_shape",
           "elementwise_prim_func", "elementwise_tir", "emit_vector_scheduled", "is_tensorized",
           "loop_nest", "lower_vector_tir", "pad3", "scheduled_elementwise",
           "schedule_elementwise", "vector_kernel"]

#: The L0 scope of each memory the emitter puts element-wise operands in.
MEMORY_SCOPE = {"input": SCOPE_INPUT, "weight": SCOPE_WEIGHT}


@dataclass(frozen=True)
class VectorKernel:
    """An element-wise kernel as the TE builder needs it: the collapsed ``dims`` (the
    plan's), per operand its dtype and which dims it keeps (False: broadcast), the vector
    ``steps`` computing in ``cdt`` and the result's dtype ``out_dtype`` (another one: a final
    ``vcast``), the ``tile`` of the last three dims and each operand's L0 scope."""

    dims: tuple[int, ...]
    in_dtypes: tuple[str, ...]
    in_masks: tuple[tuple[bool, ...], ...]
    steps: tuple[VecStep, ...]
    cdt: str
    out_dtype: str
    tile: tuple[int, int, int]
    scopes: tuple[str, ...]

    @property
    def padded(self) -> tuple[int, ...]:
        """The dims with the last three rounded up to whole blocks."""
        lead = len(self.dims) - 3
        return self.dims[:lead] + tuple(-(-d // t) * t for d, t in zip(self.dims[lead:],
                                                                         self.tile))

    @property
    def stages(self) -> list[str]:
        """The stage names, in order (the last one is what the crop reads)."""
        n = len(self.steps) + (self.cdt != self.out_dtype)
        return [f"S{i}" for i in range(n)]


def _imm(dtype: str, value: float, opcode: str) -> E.PrimExpr:
    c = E.make_const(dtype, value)
    if float(c.value) != float(value):
        raise NotSupported(f"{opcode}: immediate {value} is not a {dtype}")
    return c


def _operand(k: VectorKernel, src: tuple[Any, ...], i: int, opcode: str) -> VecOperand:
    if src[0] == "imm":
        dt = k.cdt if opcode != "vcast" else k.in_dtypes[0]
        _imm(dt, src[1], opcode)
        return VecOperand(None, value=float(src[1]))
    if src[0] == "out":
        if i == 0:
            raise NotSupported(f"{opcode}: the first step reads no previous result")
        return VecOperand(SCOPE_ACC)
    return VecOperand(k.scopes[src[1]], tuple(k.in_masks[src[1]][-3:]))  # type: ignore[arg-type]


def _src_dtype(k: VectorKernel, step: VecStep) -> str:
    """The dtype a step reads (a ``vcast`` reads its operand's; every other step the chain's)."""
    if step.opcode == "vcast":
        src = step.srcs[0]
        return k.in_dtypes[src[1]] if src[0] == "in" else k.cdt
    return k.cdt


def elementwise_prim_func(k: VectorKernel) -> PrimFunc:
    """Step 1 of the module docstring."""
    lead = len(k.dims) - 3
    pdims = k.padded
    xs, pads = [], []
    for n, (dt, mask) in enumerate(zip(k.in_dtypes, k.in_masks)):
        shape = tuple(d if m else 1 for d, m in zip(k.dims, mask))
        x = te.placeholder(shape, dt, name=f"X{n}")
        tails = [d for d in range(lead, len(k.dims)) if mask[d] and pdims[d] != k.dims[d]]

        def pad(*i: Any, x: Any = x, tails: list[int] = tails, dt: str = dt) -> Any:
            if not tails:
                return x[i]
            cond = i[tails[0]] < k.dims[tails[0]]
            for d in tails[1:]:
                cond = E.logical_and(cond, i[d] < k.dims[d])
            return te.if_then_else(cond, x[i], E.make_const(dt, 0))

        xs.append(x)
        pads.append(te.compute(tuple(p if m else 1 for p, m in zip(pdims, mask)), pad,
                               name=f"X{n}_pad"))
    stages: list[Any] = []
    steps = list(k.steps)
    if k.cdt != k.out_dtype:
        steps.append(VecStep("vcast", (("out",),), (("mode", "rne"),)))
    for i, step in enumerate(steps):
        dst_dt = k.out_dtype if i == len(k.steps) else k.cdt
        src_dt = _src_dtype(k, step) if i < len(k.steps) else k.cdt

        def value(*idx: Any, step: VecStep = step, i: int = i, dst_dt: str = dst_dt,
                  src_dt: str = src_dt) -> Any:
            vals = []
            for src in step.srcs:
                if src[0] == "imm":
                    vals.append(_imm(src_dt, src[1], step.opcode))
                elif src[0] == "out":
                    if not stages:
                        raise NotSupported(f"{step.opcode}: the first step reads no previous "
                                           "result")
                    vals.append(stages[-1][idx])
                else:
                    mask = k.in_masks[src[1]]
                    vals.append(pads[src[1]][tuple(v if m else 0 for v, m in zip(idx, mask))])
            return vector_value(step.opcode, dst_dt, vals, dict(step.extra).get("mode", ""))

        stages.append(te.compute(pdims, value, name=f"S{i}"))
    last = stages[-1]
    c = te.compute(k.dims, lambda *i: last[i], name="C")
    return te.create_prim_func([*xs, c])


def _read_index(sch: Schedule, blk: Any, name: str) -> int:
    reads = sch.get(blk).reads
    for n, r in enumerate(reads):
        if r.buffer.name == name:
            return n
    raise KilnError(f"block {sch.get(blk).name_hint!r} reads no buffer {name!r}")


def schedule_elementwise(func: PrimFunc, k: VectorKernel, nbuf: int) -> Schedule:
    """Step 2 of the module docstring on :func:`elementwise_prim_func`'s result."""
    sch = Schedule(func)
    names = k.stages
    last = sch.get_block(names[-1])
    loops = sch.get_loops(last)
    lead = len(k.dims) - 3
    outer, inner = [], []
    for lp, t in zip(loops[lead:], k.tile):
        o, i = sch.split(lp, [None, t])
        outer.append(o)
        inner.append(i)
    sch.reorder(*loops[:lead], *outer, *inner)
    anchor = outer[-1]
    sch.compute_inline(sch.cache_write(last, 0, SCOPE_ACC))
    sch.reverse_compute_at(sch.get_block("C"), anchor)
    for name in reversed(names[:-1]):
        blk = sch.get_block(name)
        sch.compute_inline(sch.cache_write(blk, 0, SCOPE_ACC))
        sch.compute_at(blk, anchor, preserve_unit_loops=True)
    consumer = {}
    for i, step in enumerate(k.steps):
        for src in step.srcs:
            if src[0] == "in":
                consumer[src[1]] = names[i]
    for n, scope in enumerate(k.scopes):
        blk = sch.get_block(consumer[n])
        copy = sch.cache_read(blk, _read_index(sch, blk, f"X{n}_pad"), scope)
        sch.compute_at(copy, anchor, preserve_unit_loops=True)
        sch.compute_inline(sch.get_block(f"X{n}_pad"))
    fused = sch.fuse(*loops[:lead], *outer)
    sch.annotate(fused, PIPELINE_KEY, nbuf)
    steps = list(k.steps)
    if k.cdt != k.out_dtype:
        steps.append(VecStep("vcast", (("out",),), (("mode", "rne"),)))
    for i, (name, step) in enumerate(zip(names, steps)):
        dst_dt = k.out_dtype if i == len(k.steps) else k.cdt
        src_dt = _src_dtype(k, step) if i < len(k.steps) else k.cdt
        operands = tuple(_operand(k, s, i, step.opcode) for s in step.srcs)
        intrin = vector_intrin(step.opcode, dst_dt, src_dt, operands,
                               dict(step.extra).get("mode", ""))
        blk = sch.get_block(name)
        sch.tensorize(sch.get_loops(blk)[-3], intrin)  # the block's three loops
    return sch


def vector_kernel(plan: ElementwisePlan, inputs: list[Any], steps: list[VecStep], cdt: str,
                  out_dtype: str) -> VectorKernel:
    """The kernel of ``steps`` over ``inputs`` under the emitter's ``plan``."""
    masks = tuple(tuple(s != 0 for s in st) for st in plan.in_strides)
    scopes = tuple(MEMORY_SCOPE[m] for m in plan.mem_of)
    return VectorKernel(plan.dims, tuple(x.dtype for x in inputs), masks, tuple(steps), cdt,
                        out_dtype, plan.tile, scopes)


@functools.lru_cache(maxsize=512)
def scheduled_elementwise(k: VectorKernel, nbuf: int) -> Schedule:
    """The scheduled PrimFunc of ``k`` (its vector intrinsics registered on the way). Kept
    per kernel: a model repeats its kernels, and the partitioning probes lower each op
    before the build does (the schedule depends on the kernel only, not on DRAM)."""
    return schedule_elementwise(elementwise_prim_func(k), k, nbuf)


# ---------------------------------------------------------------------------------------------
# the program generator
# ---------------------------------------------------------------------------------------------
@dataclass
class Staged:
    """A block of an L0 buffer in this step: byte ``addr`` in ``mem``, buffer index
    ``origin`` its first element, ``extent`` the valid elements per dim (row-major)."""

    mem: str
    addr: int
    origin: tuple[int, ...]
    extent: tuple[int, ...]

    def strides(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """Element strides of the last three dims as the vector unit reads them: row-major
        over the extents, 0 where the buffer has extent 1 (a broadcast operand)."""
        out, acc = [], 1
        for n, full in zip(reversed(self.extent[-3:]), reversed(shape[-3:])):
            out.append(acc if full != 1 else 0)
            acc *= n
        return tuple(reversed(out))

    def dense(self) -> tuple[int, ...]:
        out, acc = [], 1
        for n in reversed(self.extent[-3:]):
            out.append(acc)
            acc *= n
        return tuple(reversed(out))


@dataclass
class CopyNest:
    """An affine copy nest: per loop its extent, valid prefix, and the step of each buffer's
    index; the indices at the origin; the buffers."""

    name: str
    dst: Buffer
    src: Buffer
    base_d: tuple[int, ...]
    base_s: tuple[int, ...]
    coef_d: list[tuple[int, ...]]
    coef_s: list[tuple[int, ...]]
    extents: list[int]
    valid: list[int]
    fill: float = 0.0
    #: the padding condition (with the block predicate) and what evaluates it (a box copy)
    cond: Any = None
    loops: tuple[For, ...] = ()
    realize: Any = None

    def per_dim(self, values: list[int], fill: int = 1) -> tuple[int, ...]:
        """``values`` (one per loop) per destination buffer dim (``fill`` where no loop
        moves it)."""
        out = [fill] * len(self.base_d)
        for cf, v in zip(self.coef_d, values):
            if sorted(cf) != [0] * (len(cf) - 1) + [1]:
                raise NotSupported(f"copy {self.name!r} does not move its buffer densely")
            out[cf.index(1)] = v
        return tuple(out)


def loop_nest(stmt: Stmt) -> tuple[list[For], BlockRealize | None]:
    loops = []
    while isinstance(stmt, For):
        loops.append(stmt)
        stmt = stmt.body
    return loops, stmt if isinstance(stmt, BlockRealize) else None


def is_tensorized(stmt: Stmt) -> bool:
    return isinstance(stmt, BlockRealize) and \
        bool(stmt.block.annotations.get("kiln.tensor_intrin"))


class VectorGenerator:
    """The walk's state: loop values, the per-core pipelines, the L0 regions and this step's
    staged blocks."""

    def __init__(self, kb: KernelBuilder, dram: dict[Buffer, DramTensor | DramView]):
        self.kb, self.cfg = kb, kb.config
        self.dram = dram
        self.env: dict[Any, int] = {}
        self.pipes = [Pipeline(kb, c, UNIT_VECTOR) for c in range(self.cfg.cores)]
        self.blocks = 0
        self.region: dict[Buffer, tuple[str, int, int]] = {}  # buffer -> mem, base, slot bytes
        self.used: dict[str, int] = {}
        self.staged: dict[Buffer, Staged] = {}

    def walk(self, stmt: Stmt) -> None:
        if isinstance(stmt, SeqStmt):
            for s in stmt.seq:
                self.walk(s)
        elif isinstance(stmt, For):
            if PIPELINE_KEY in stmt.annotations:
                return self.pipeline(stmt)
            lo, n = evaluate(stmt.min, self.env), evaluate(stmt.extent, self.env)
            for v in range(lo, lo + n):
                self.env[stmt.loop_var] = v
                self.walk(stmt.body)
            self.env.pop(stmt.loop_var, None)
        elif isinstance(stmt, BlockRealize) and not stmt.block.iter_vars:
            self.walk(stmt.block.body)
        else:
            raise NotSupported(f"the NPU vector generator lowers loops around a pipelined "
                               f"block loop, not {type(stmt).__name__}")

    def pipeline(self, loop: For) -> None:
        nbuf = int(loop.annotations[PIPELINE_KEY])
        if nbuf != self.kb.nbuf:
            raise NotSupported(f"loop {loop.loop_var.name!r} asks for {nbuf} pipeline slots, "
                               f"the kernel builder has {self.kb.nbuf}")
        lo, n = evaluate(loop.min, self.env), evaluate(loop.extent, self.env)
        body = list(loop.body.seq) if isinstance(loop.body, SeqStmt) else [loop.body]
        for v in range(lo, lo + n):
            self.env[loop.loop_var] = v
            self.step(body)
        self.env.pop(loop.loop_var, None)

    # -- one block ---------------------------------------------------------------------------
    def step(self, body: list[Stmt]) -> None:
        core = self.blocks % self.cfg.cores
        self.blocks += 1
        p = self.pipes[core]
        loads, computes, stores = [], [], []
        for s in body:
            loops, realize = loop_nest(s)
            if realize is not None and is_tensorized(realize):
                # unit loops of the outer dims may stay around a stage (compute_at keeps them)
                if any(evaluate(lp.extent, self.env) != 1 for lp in loops):
                    raise NotSupported(f"stage {realize.block.name_hint!r} is tensorized "
                                       "inside a loop: one instruction per block")
                computes.append((loops, realize))
                continue
            if realize is None:
                raise NotSupported("a pipelined step holds neither copies nor tensorized "
                                   "blocks")
            c = self.match_copy(loops, realize)
            if c.src.scope == "global" and c.dst.scope in MEMORY_SCOPE.values():
                loads.append(c)
            elif c.src.scope == SCOPE_ACC and c.dst.scope == "global":
                stores.append(c)
            else:
                raise NotSupported(f"copy {c.name!r} from {c.src.scope!r} to {c.dst.scope!r}")
        if len(stores) != 1 or not computes:
            raise NotSupported("a vector step computes and stores one block")
        store = stores[0]
        valid = store.per_dim(store.valid)
        slot = p.load_slot()
        self.staged = {}
        for c in loads:
            self.load(core, c, slot)
        p.loaded()
        p.compute_begin()
        self.place_acc(p, store, computes, valid)
        self.compute_and_store(core, p, computes, store, valid)

    def compute_and_store(self, core: int, p: Pipeline, computes: list[Any], store: CopyNest,
                          valid: tuple[int, ...]) -> None:
        """A step's stages (``(loops, realize)``: one instruction each, a fence between two:
        each reads its producer's block) at the loops' first values, then its store."""
        for i, (loops, realize) in enumerate(computes):
            if i:
                self.kb.fence(core, UNIT_VECTOR)
            for lp in loops:
                self.env[lp.loop_var] = evaluate(lp.min, self.env)
            self.compute(core, realize, valid)
            for lp in loops:
                self.env.pop(lp.loop_var, None)
        p.computed()
        p.produced()
        p.store_begin()
        self.store(core, store)
        p.stored()

    def match_copy(self, loops: list[For], realize: BlockRealize, prefix: bool = True
                   ) -> CopyNest:
        """The affine form of copy nest ``loops``/``realize``: its indices at the nest's
        origin and one step along each loop, checked at the far corner; per loop the prefix
        where the padding condition (and the block predicate) holds (``prefix=False``: not
        computed -- padding before the data too, any fill; see :meth:`box`)."""
        b = realize.block
        store = b.body
        if not isinstance(store, BufferStore) or b.init is not None:
            raise NotSupported(f"block {b.name_hint!r} is neither a copy nor tensorized")
        value, cond = store.value, realize.predicate
        fill_value = 0.0
        if isinstance(value, E.Select):
            fill = value.false_value
            if not isinstance(fill, (E.IntImm, E.FloatImm)) or (prefix and fill.value != 0):
                raise NotSupported(f"copy {b.name_hint!r} pads with {fill}, not zero")
            fill_value = float(fill.value)
            cond, value = E.logical_and(cond, value.condition), value.true_value
        if not isinstance(value, E.BufferLoad):
            raise NotSupported(f"block {b.name_hint!r} is neither a copy nor tensorized")
        if len(loops) > 3 + len(store.indices):
            raise NotSupported(f"copy {b.name_hint!r} has too many loops")
        extents = [evaluate(lp.extent, self.env) for lp in loops]

        def at(point: list[int], *exprs: Any) -> list[Any]:
            for lp, x in zip(loops, point):
                self.env[lp.loop_var] = evaluate(lp.min, self.env) + x
            for iv, val in zip(b.iter_vars, realize.iter_values):
                self.env[iv.var] = evaluate(val, self.env)
            return [evaluate(e, self.env) if not isinstance(e, tuple) else
                    tuple(evaluate(i, self.env) for i in e) for e in exprs]

        dst_idx, src_idx = tuple(store.indices), tuple(value.indices)
        base_d, base_s, coef_d, coef_s = affine_copy(
            lambda pt: tuple(at(pt, dst_idx, src_idx)), extents, b.name_hint)
        zero, far = [0] * len(loops), [n - 1 for n in extents]
        if not prefix:
            for lp in loops:
                self.env.pop(lp.loop_var, None)
            return CopyNest(b.name_hint, store.buffer, value.buffer, base_d, base_s, coef_d,
                            coef_s, extents, list(extents), fill_value, cond, tuple(loops),
                            realize)
        if at(zero, cond)[0] and at(far, cond)[0]:
            # a prefix box holding at both corners holds everywhere: a whole block (most are)
            for lp in loops:
                self.env.pop(lp.loop_var, None)
            return CopyNest(b.name_hint, store.buffer, value.buffer, base_d, base_s, coef_d,
                            coef_s, extents, list(extents))
        valid = []
        for d, n in enumerate(extents):
            def holds(x: int, d: int = d) -> bool:
                pt = zero.copy()
                pt[d] = x
                return bool(at(pt, cond)[0])
            valid.append(prefix_length(holds, n))
        if all(valid) and not at([v - 1 for v in valid], cond)[0]:
            raise NotSupported(f"copy {b.name_hint!r}: its padding condition is not a box")
        for lp in loops:
            self.env.pop(lp.loop_var, None)
        return CopyNest(b.name_hint, store.buffer, value.buffer, base_d, base_s, coef_d, coef_s,
                     extents, valid)

    def box(self, c: CopyNest, extents: list[int]) -> tuple[list[int], list[int]] | None:
        """Per loop of copy ``c``, the range ``[lo, hi)`` within ``extents`` where its
        padding condition holds, or None where it holds nowhere. The condition is a
        conjunction of bounds (a window's padding on either side, a tail), each an affine
        index compared with a constant: monotone along the one loop it varies with, whose
        bound a bisection finds (a bound varying with several loops is refused)."""
        b = c.realize.block
        parts, todo = [], [c.cond]
        while todo:
            e = todo.pop()
            if isinstance(e, E.And):
                todo += [e.a, e.b]
            else:
                parts.append(e)

        def holds(e: Any, point: list[int]) -> bool:
            for lp, x in zip(c.loops, point):
                self.env[lp.loop_var] = evaluate(lp.min, self.env) + x
            for iv, val in zip(b.iter_vars, c.realize.iter_values):
                self.env[iv.var] = evaluate(val, self.env)
            return bool(evaluate(e, self.env))

        def first(e: Any, d: int, n: int, want: bool) -> int:
            """The first x along loop ``d`` where ``e`` is ``want`` (it is at ``n - 1``)."""
            lo, hi = 0, n - 1
            while lo < hi:
                mid = (lo + hi) // 2
                if holds(e, zero[:d] + [mid] + zero[d + 1:]) == want:
                    hi = mid
                else:
                    lo = mid + 1
            return lo

        zero = [0] * len(extents)
        lo, hi = [0] * len(extents), list(extents)
        try:
            for e in parts:
                at0 = holds(e, zero)
                moves = []
                for d, n in enumerate(extents):
                    if n > 1 and holds(e, zero[:d] + [n - 1] + zero[d + 1:]) != at0:
                        moves.append(d)
                if len(moves) > 1:
                    raise NotSupported(f"copy {c.name!r}: a padding bound on several loops")
                if not moves:
                    if not at0:
                        return None
                    continue
                d = moves[0]
                if at0:  # an upper bound: holds up to the first x where it fails
                    hi[d] = min(hi[d], first(e, d, extents[d], False))
                else:  # a lower bound
                    lo[d] = max(lo[d], first(e, d, extents[d], True))
        finally:
            for lp in c.loops:
                self.env.pop(lp.loop_var, None)
        if any(a >= z for a, z in zip(lo, hi)):
            return None
        return lo, hi

    def dram_at(self, buf: Buffer, index: tuple[int, ...]) -> tuple[Any, int, tuple[int, ...]]:
        t = self.dram.get(buf)
        if t is None:
            raise KilnError(f"NPU vector generator: buffer {buf.name!r} has no DRAM tensor")
        return t, sum(i * s for i, s in zip(index, t.strides)), tuple(t.strides[-3:])

    def load(self, core: int, c: CopyNest, slot: int) -> None:
        if c.coef_d != c.coef_s:
            raise NotSupported(f"copy {c.name!r} reorders its dims (a DMA of the vector "
                               "kernels moves a block as it is)")
        full = c.per_dim(c.extents)
        valid = c.per_dim(c.valid)
        isz = itemsize(str(c.dst.dtype))
        nbytes = math.prod(full) * isz
        if c.dst not in self.region:
            mem = SCOPE_MEMORY[c.dst.scope]
            base = self.used.get(mem, 0)
            self.used[mem] = base + self.kb.nbuf * nbytes
            if self.used[mem] > self.cfg.memory(mem).size:
                raise NotSupported(f"{self.kb.nbuf} slots of {nbytes} B for {c.dst.name!r} "
                                   f"exceed {mem}")
            self.region[c.dst] = (mem, base, nbytes)
        mem, base, slot_bytes = self.region[c.dst]
        if slot_bytes != nbytes:
            raise NotSupported(f"copy {c.name!r}: blocks of {c.dst.name!r} change size")
        tile = Staged(mem, base + slot * nbytes, c.base_d, valid)
        self.staged[c.dst] = tile
        t, offset, strides = self.dram_at(c.src, c.base_s)
        self.kb.load(core, shape=pad3(valid), dst=block(mem, tile.addr, str(c.dst.dtype),
                                                         tile.dense()),
                     src=t.at(offset, strides))

    def place_acc(self, p: Pipeline, store: CopyNest,
                  computes: list[tuple[list[For], BlockRealize]],
                  valid: tuple[int, ...]) -> None:
        """The step's accumulator slot: the stored stage's block first, every other stage in
        one block after it (see the module docstring)."""
        out = store.src
        work = {}
        for _, r in computes:
            dst = self.call(r).args[2].args[0].buffer
            if dst.scope != SCOPE_ACC:
                raise NotSupported(f"block {r.block.name_hint!r} writes {dst.scope!r}, not the "
                                   "accumulators")
            if dst is not out:
                work[dst] = None
        dtypes = {str(b.dtype) for b in work}
        if len(dtypes) > 1:
            raise NotSupported(f"the stages compute in {sorted(dtypes)}: one dtype shares the "
                               "working block")
        wdt = dtypes.pop() if dtypes else str(out.dtype)
        tile = tuple(int(x) for x in _full_tile(computes[-1][1], self.env))
        slot_bytes, work_at = acc_layout(tile, str(out.dtype), wdt)
        if self.kb.nbuf * slot_bytes > self.cfg.memory("acc").size:
            raise NotSupported(f"{self.kb.nbuf} accumulator slots of {slot_bytes} B exceed acc")
        base = p.out_slot() * slot_bytes
        origin = store.base_s
        self.staged[out] = Staged("acc", base, origin, valid)
        at = base + work_at if wdt != str(out.dtype) else base
        for b in work:
            self.staged[b] = Staged("acc", at, origin, valid)

    @staticmethod
    def call(realize: BlockRealize) -> E.Call:
        body = realize.block.body
        if not (isinstance(body, Evaluate) and isinstance(body.value, E.Call)
                and body.value.op == NPU_VECTOR):
            raise NotSupported(f"block {realize.block.name_hint!r} is tensorized onto "
                               f"{realize.block.annotations.get('kiln.tensor_intrin')!r}, not a "
                               "vector instruction")
        return body.value

    def operand(self, ref: Any) -> Any:
        if isinstance(ref, E.Call) and ref.op == NPU_VIEW:
            return self.view(ref)
        if isinstance(ref, E.Call) and ref.op == ADDRESS_OF:
            ld = ref.args[0]
            idx = tuple(evaluate(i, self.env) for i in ld.indices)
            tile = self.staged.get(ld.buffer)
            if tile is None:
                raise NotSupported(f"a vector instruction reads {ld.buffer.name!r}, which holds "
                                   "nothing in this step")
            if idx != tuple(o if n != 1 else 0 for o, n in
                            zip(tile.origin, buffer_shape(ld.buffer))):
                raise NotSupported(f"a vector instruction reads {ld.buffer.name!r} at {idx}, "
                                   f"not its block's first element {tile.origin}")
            # an accumulator block is dense (the stages' own); an operand's repeats its
            # broadcast dims
            strides = tile.dense() if tile.mem == "acc" else \
                tile.strides(buffer_shape(ld.buffer))
            return block(tile.mem, tile.addr, str(ld.buffer.dtype), strides)
        if isinstance(ref, (E.IntImm, E.FloatImm)):
            return float(ref.value)
        raise NotSupported(f"vector operand {ref} is neither a block nor an immediate")

    def view(self, ref: E.Call) -> Any:
        """A strided view operand: the staged tile's element at the view's first index, its
        strides -- row-major over the tile's extents -- times the view's steps."""
        ld = ref.args[0].args[0]
        idx = tuple(evaluate(i, self.env) for i in ld.indices)
        tile = self.staged.get(ld.buffer)
        if tile is None:
            raise NotSupported(f"a vector instruction reads {ld.buffer.name!r}, which holds "
                               "nothing in this step")
        isz = itemsize(str(ld.buffer.dtype))
        dense = _row_major(tile.extent)
        if not all(0 <= i - o < n for i, o, n in zip(idx, tile.origin, tile.extent)):
            raise NotSupported(f"a view of {ld.buffer.name!r} starts outside its staged tile")
        addr = tile.addr + sum((i - o) * st for i, o, st in zip(idx, tile.origin, dense)) * isz
        spec = [evaluate(a, self.env) for a in ref.args[1:]]
        strides = tuple(dense[dim] * step for dim, step in zip(spec[0::2], spec[1::2]))
        return block(tile.mem, addr, str(ld.buffer.dtype), strides)

    def compute(self, core: int, realize: BlockRealize, valid: tuple[int, ...]) -> None:
        b = realize.block
        for iv, val in zip(b.iter_vars, realize.iter_values):
            self.env[iv.var] = evaluate(val, self.env)
        call = self.call(realize)
        opcode, mode, dst, *srcs = call.args[:-3]
        ext = tuple(evaluate(e, self.env) for e in call.args[-3:])
        # the instruction covers the block's valid part: the stage's extents clipped by what
        # the step stores (a per-row stage or a reduction's source keeps its own extent)
        shape = tuple(min(e, v) for e, v in zip(ext, pad3(valid)))
        if opcode.value in REDUCTIONS:  # its source's rows, each reduced whole
            shape = shape[:-1] + ext[-1:]
        ops = [self.operand(s) for s in srcs]
        out = self.operand(dst)
        if opcode.value == "vmac":  # dst += a * b: the first operand is dst's block itself
            if ops[0] != out:
                raise NotSupported(f"block {b.name_hint!r}: vmac accumulates into another "
                                   "block than it writes")
            ops = ops[1:]
        args = dict(zip(("a", "b"), ops))
        if mode.value:
            args["mode"] = mode.value
        if opcode.value in REDUCTIONS:  # the whole row in one instruction: the init runs
            args["acc"] = 0
        self.kb.emit(core, opcode.value, shape=shape, dst=out, **args)

    def store(self, core: int, c: CopyNest) -> None:
        if c.coef_d != c.coef_s:
            raise NotSupported(f"store {c.name!r} reorders its dims")
        valid = c.per_dim(c.valid)
        tile = self.staged[c.src]
        t, offset, strides = self.dram_at(c.dst, c.base_d)
        self.kb.emit(core, "dma.store", shape=pad3(valid), dst=t.at(offset, strides),
                     src=block(tile.mem, tile.addr, str(c.src.dtype), tile.dense()))

    def finish(self) -> None:
        for p in self.pipes:
            p.finish()


def _row_major(extents: tuple[int, ...]) -> tuple[int, ...]:
    out, acc = [], 1
    for n in reversed(extents):
        out.append(acc)
        acc *= n
    return tuple(reversed(out))


def pad3(extents: tuple[int, ...]) -> tuple[int, ...]:
    """The last three of ``extents``, 1 in front where fewer (an instruction's 3-D shape)."""
    e = tuple(extents)[-3:]
    return (1,) * (3 - len(e)) + e


def buffer_shape(buf: Buffer) -> tuple[int, ...]:
    return tuple(int(getattr(n, "value", n)) for n in buf.shape)


def _full_tile(realize: BlockRealize, env: dict[Any, int]) -> tuple[int, ...]:
    """The extents a tensorized stage computes (its call's last three arguments)."""
    body = realize.block.body
    return tuple(evaluate(e, env) for e in body.value.args[-3:])  # type: ignore[attr-defined]


def emit_vector_scheduled(kb: KernelBuilder, func: PrimFunc,
                          dram: dict[str, DramTensor | DramView]) -> None:
    """Emit scheduled vector PrimFunc ``func`` into ``kb``'s streams (see the module
    docstring); ``dram`` maps each parameter buffer's name to its DRAM tensor or view.
    Raises NotSupported for what the generator cannot lower."""
    by_buffer = {}
    for buf in func.buffer_map.values():
        if buf.name not in dram:
            raise KilnError(f"NPU vector generator: no DRAM tensor for parameter {buf.name!r}")
        by_buffer[buf] = dram[buf.name]
    gen = VectorGenerator(kb, by_buffer)
    gen.walk(func.body)
    gen.finish()


# ---------------------------------------------------------------------------------------------
# the lowerings
# ---------------------------------------------------------------------------------------------
def _views(plan: ElementwisePlan, out: Any, inputs: list[Any]) -> dict[str, DramView]:
    """The DRAM of ``C`` and each ``X<k>`` over the plan's collapsed dims (an operand's
    broadcast dims of extent 1)."""
    def view(t: Any, strides: tuple[int, ...], full: bool) -> DramView:
        base = t.tensor if isinstance(t, DramView) else t
        off = t.offset if isinstance(t, DramView) else 0
        shape = tuple(d if (full or s) else 1 for d, s in zip(plan.dims, strides))
        return DramView(base, off, shape, strides)

    out_v = view(out, plan.out_strides, True)
    return {"C": out_v, **{f"X{n}": view(x, s, False)
                           for n, (x, s) in enumerate(zip(inputs, plan.in_strides))}}


def lower_vector_tir(ctx: LoweringContext, op: str, out: Any, inputs: list[Any],
                     steps: list[VecStep], compute_dtype: str | None = None) -> None:
    """``out = steps(inputs)`` (as :func:`~.vector.emit_elementwise`) through TIR: planned,
    scheduled and generated; the kernel is recorded in ``ctx.tir``. Raises NotSupported
    before emitting anything when the route does not cover it."""
    cdt = compute_dtype or out.dtype
    kb = ctx.kb

    def attempt(plan: ElementwisePlan) -> None:
        k = vector_kernel(plan, inputs, steps, cdt, out.dtype)
        sch = scheduled_elementwise(k, kb.nbuf)
        emit_vector_scheduled(kb, sch.func, _views(plan, out, inputs))
        bound = traffic_cycles(kb, plan.nbytes)
        kb.end_kernel(KernelInfo(ctx.label(op), op, "TIR: " + plan.describe(), bound, bound))
        ctx.tir.append((op, sch))

    # a block the program generator refuses (its slots counted as scheduled) takes the next
    lower_with_feedback(ctx, op, plan_elementwise_candidates(ctx.config, kb.nbuf, out, inputs,
                                                             cdt, steps),
                        attempt, ElementwisePlan.describe)


def _covered(inputs: list[Any], steps: list[VecStep], cdt: str) -> bool:
    """Whether the TIR route takes the kernel: every immediate exact in its dtype (checked
    before anything is emitted; the rest of the route raises nothing a kernel the emitter
    takes would)."""
    for st in steps:
        for src in st.srcs:
            if src[0] == "imm":
                dt = cdt if st.opcode != "vcast" else inputs[0].dtype
                if float(E.make_const(dt, src[1]).value) != float(src[1]):
                    return False
    return True


@register_elementwise_kernel("tir")
def elementwise_tir(ctx: LoweringContext, op: str, out: Any, inputs: list[Any],
                    steps: list[VecStep], compute_dtype: str | None = None) -> None:
    """The TIR route's element-wise kernels (:func:`lower_vector_tir`), the fused chains and
    a product's operand cast included; a kernel with an immediate its dtype cannot hold is
    emitted (:func:`~.vector.emit_elementwise`)."""
    cdt = compute_dtype or out.dtype
    if not _covered(inputs, steps, cdt):
        return emit_elementwise(ctx, op, out, inputs, steps, compute_dtype)
    lower_vector_tir(ctx, op, out, inputs, steps, compute_dtype)


@register_tir_lowering(ELEMENTWISE_OPS)
def lower_elementwise_tir(ctx: LoweringContext, call: Any, args: list[Any], out: DramTensor
                          ) -> None:
    """Element-wise and broadcast ops through TIR; what the vector unit cannot run goes to
    the emitted lowering (the scalar unit)."""
    if any(not ctx.config.supports_vector_dtype(dt) for dt in
           [out.dtype] + [str(a.dtype) for a in args if isinstance(a, DramTensor)]):
        return lower_elementwise(ctx, call, args, out)
    inputs: list[Any] = []
    steps = elementwise_steps(ctx, call, args, out.dtype, None, inputs)
    check_broadcast_shape(call.op.name, inputs, out)
    elementwise_tir(ctx, call.op.name, out, inputs, steps)


@register_tir_lowering("cast")
def lower_cast_tir(ctx: LoweringContext, call: Any, args: list[Any], out: DramTensor) -> None:
    """``cast`` through TIR (``vcast``, rounding toward zero); a dtype the vector unit lacks
    goes to the emitted lowering (the scalar unit)."""
    x = args[0]
    if not isinstance(x, DramTensor) or any(not ctx.config.supports_vector_dtype(dt)
                                            for dt in (x.dtype, out.dtype)):
        return lower_cast(ctx, call, args, out)
    elementwise_tir(ctx, "cast", out, [x], [VecStep("vcast", (("in", 0),), (("mode", "rtz"),))])
