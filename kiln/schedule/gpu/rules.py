"""Generic GPU schedule rules: every PrimFunc gets a correct schedule without tuning.

Each rule takes a ``tir.Schedule`` and the target and binds loops of the function's stages
(the nests directly under the root block) to GPU blocks and threads; the thread counts come
from the target's limits. A stage no rule takes stays unbound, and lowering runs it as a kernel
of one thread: slow, never wrong.

- :func:`inline_stages`: element-wise producer stages are computed inside their consumers
  (when that keeps expressions small) and element-wise consumers folded into their producer,
  so a fused function is as few nests as possible.
- :func:`schedule_injective_block`: a nest of spatial loops is fused into one loop, split into
  ``blockIdx.x`` x ``threadIdx.x`` (x 4 vectorized elements per thread where the innermost
  extent allows: ``float4`` loads and stores), ``blockIdx.x`` capped at the grid limit with a
  grid-stride loop above it.
- :func:`schedule_reduction_block`: a reduction whose inputs are contiguous along the reduced
  axes (a row reduction: softmax's max and sum, layer_norm's mean, a sum over the last axis)
  gives each output a block of threads: the reduction loop split with its inner part bound to
  ``threadIdx.x`` (a cross-thread reduction: warp shuffles on CUDA, a shared-memory tree on
  OpenCL). Other reductions (a sum over a leading axis, a matmul, a convolution) give each
  output one thread running the whole reduction, consecutive threads writing consecutive
  outputs (coalesced). float16/bfloat16 reductions sum in float32 either way (the
  cross-thread reduction's accumulators, or a float32 register per thread), rounded once at
  the store.
- :func:`schedule_outer_parallel`: any other nest whose outermost loop is data parallel (every
  block under it binds its variable to spatial iteration variables only) runs one iteration
  per thread.

These are phase 1's rules: correct for every operator, fast for element-wise work and row
reductions. Operator-specific schedules (GEMM with shared-memory tiles, implicit-GEMM
convolution...) are registered per op (see :mod:`kiln.schedule.gpu`) and take precedence.
"""

from __future__ import annotations

import math
from typing import Any

from ...ir.errors import ScheduleError
from ...tir.expr import BufferLoad, IntImm, IterType
from ...tir.functor import collect_vars, post_order_visit
from ...tir.schedule.analysis import as_int
from ...tir.schedule.rfactor import split_reduction_update
from ...tir.stmt import BlockRealize, ForKind
from ...tir.transform.cross_thread_reduction import accumulator_dtype
from ..cpu.generic import inline_injective_stages

#: Threads per block the rules use (capped by the target's limit): enough warps per block to
#: hide latency, small enough for several blocks per multiprocessor.
THREADS = 256
#: Fewest threads of a block (a warp on NVIDIA GPUs).
MIN_THREADS = 32
#: Elements per thread of a vectorized element-wise nest (one ``float4``).
VECTOR = 4
#: Shortest reduction given a block of threads (shorter ones: one thread per output).
ROW_MIN = 32


def _pow2_at_least(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def threads_for(target: Any, extent: int | None, most: int = THREADS) -> int:
    """Threads of a block for a loop of ``extent`` iterations (None: unknown, large)."""
    limit = min(most, target.gpu.max_threads_per_block)
    if extent is None:
        return limit
    return max(min(limit, _pow2_at_least(extent)), min(MIN_THREADS, limit))


def stages(sch: Any) -> list[Any]:
    """The blocks directly under the root block, in program order."""
    return list(sch.get_child_blocks(sch.get_block("root")))


def _output_buffers(sch: Any) -> set[int]:
    return {id(b) for b in sch.func.buffer_map.values()}


def _is_reduction(block: Any) -> bool:
    return any(iv.iter_type == IterType.COMM_REDUCE for iv in block.iter_vars)


def inline_stages(sch: Any) -> None:
    """Inline element-wise stages into their consumers and fold element-wise consumers into
    their producer, where the schedule allows it (see the module docstring)."""
    inline_injective_stages(sch)
    for b in stages(sch):
        producers = sch.get_producers(b)
        if len(producers) != 1 or _is_reduction(sch.get(producers[0])):
            continue
        try:
            sch.reverse_compute_inline(b)
        except ScheduleError:
            pass


def perfect_loops(sch: Any, block: Any) -> list[Any] | None:
    """The loops of a stage that is one perfect nest around ``block``, else None."""
    loops = sch.get_loops(block)
    nodes = [sch.get(lp) for lp in loops]
    for outer, inner in zip(nodes, nodes[1:] + [None]):
        body = outer.body
        if inner is None:
            if not (isinstance(body, BlockRealize) and body.block is sch.get(block)):
                return None
        elif body is not inner:
            return None
    return loops


def loop_roles(sch: Any, block: Any, loops: list[Any]) -> list[str]:
    """Per loop: ``"spatial"``, ``"reduce"``, ``"mixed"`` or ``"unused"``."""
    realize_vars: dict[Any, set[IterType]] = {}
    node = sch.get(loops[-1]).body if loops else None
    if not isinstance(node, BlockRealize):
        return ["mixed"] * len(loops)
    for iv, value in zip(node.block.iter_vars, node.iter_values):
        for v in collect_vars(value):
            realize_vars.setdefault(v, set()).add(iv.iter_type)
    roles = []
    for lp in loops:
        types = realize_vars.get(sch.get(lp).loop_var, set())
        if not types:
            roles.append("unused")
        elif types == {IterType.DATA_PAR}:
            roles.append("spatial")
        elif types == {IterType.COMM_REDUCE}:
            roles.append("reduce")
        else:
            roles.append("mixed")
    return roles


def bind_flat(sch: Any, target: Any, loop: Any, vector: int = 1, most: int = THREADS) -> None:
    """Split one loop over ``blockIdx.x`` x ``threadIdx.x`` (x ``vector`` lanes; at most
    ``most`` threads a block), with a grid-stride loop when the blocks would exceed the grid
    limit."""
    extent = as_int(sch.get(loop).extent)
    if vector > 1:
        loop, lanes = sch.split(loop, [None, vector])
        sch.vectorize(lanes)
        extent = None if extent is None else extent // vector
    t = threads_for(target, extent, most)
    bx, tx = sch.split(loop, [None, t])
    max_grid = target.gpu.max_grid_dims[0]
    blocks = None if extent is None else -(-extent // t)
    if blocks is not None and blocks > max_grid:
        outer, bx = sch.split(bx, [None, max_grid])
        sch.reorder(bx, outer)
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")


#: Largest expression (nodes) of a vectorized element-wise block: vectors are written lane by
#: lane, so a big expression is emitted four times for no gain (gathers, select trees).
VECTOR_MAX_NODES = 128


def _streams_contiguously(block: Any) -> bool:
    """Every load of the block reads its innermost axis at the innermost iteration variable
    (plus a constant) or does not depend on it: what vectors load whole."""
    inner = block.iter_vars[-1].var if block.iter_vars else None
    if inner is None:
        return False
    ok = [True]
    count = [0]

    def visit(n: Any) -> None:
        count[0] += 1
        if isinstance(n, BufferLoad) and n.indices:
            *outer, last = n.indices
            if any(inner in collect_vars(i) for i in outer):
                ok[0] = False
            elif inner in collect_vars(last) and not (
                    last is inner or (type(last).__name__ == "Add" and (
                        last.a is inner and isinstance(last.b, IntImm)))):
                ok[0] = False

    post_order_visit(block.body, visit)
    return ok[0] and count[0] <= VECTOR_MAX_NODES


def _vector_lanes(sch: Any, block: Any, loops: list[Any]) -> int:
    """4 when a vectorized nest would load and store whole ``float4``-like vectors."""
    inner = as_int(sch.get(loops[-1]).extent)
    blk = sch.get(block)
    el = blk.writes[0].buffer.dtype.element
    if inner is None or inner % VECTOR or el.is_bool or el.bits not in (16, 32):
        return 1
    if not _streams_contiguously(blk):
        return 1
    total = 1
    for lp in loops:
        total *= as_int(sch.get(lp).extent) or 0
    return VECTOR if total >= VECTOR * MIN_THREADS else 1


def schedule_injective_block(sch: Any, target: Any, block: Any) -> bool:
    """Bind a spatial nest over blocks x threads (see the module docstring); False when the
    block is not one."""
    loops = perfect_loops(sch, block)
    if not loops or any(r != "spatial" for r in loop_roles(sch, block, loops)):
        return False
    vector = _vector_lanes(sch, block, loops)
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    bind_flat(sch, target, fused, vector)
    return True


def _contiguous_along_reduction(block: Any) -> bool:
    """Whether some input of the reduction is read contiguously along a reduced axis."""
    reduce_vars = {iv.var for iv in block.iter_vars if iv.iter_type == IterType.COMM_REDUCE}
    found = [False]
    acc = block.writes[0].buffer if block.writes else None

    def visit(n: Any) -> None:
        if isinstance(n, BufferLoad) and n.buffer is not acc and n.indices:
            if set(collect_vars(n.indices[-1])) & reduce_vars:
                found[0] = True

    post_order_visit(block.body, visit)
    return found[0]


def schedule_reduction_block(sch: Any, target: Any, block: Any) -> bool:
    """A row reduction over a block of threads, or one thread per output (see the module
    docstring); False when the block is not a te-style reduction nest."""
    blk = sch.get(block)
    if not _is_reduction(blk):
        return False
    loops = perfect_loops(sch, block)
    if not loops:
        return False
    roles = loop_roles(sch, block, loops)
    spatial = [lp for lp, r in zip(loops, roles) if r == "spatial"]
    reduce = [lp for lp, r in zip(loops, roles) if r == "reduce"]
    if len(spatial) + len(reduce) != len(loops) or loops[:len(spatial)] != spatial:
        return False
    extents = [as_int(sch.get(lp).extent) for lp in reduce]
    k = None if any(e is None for e in extents) else math.prod(extents)  # type: ignore
    try:
        split_reduction_update(blk, "gpu schedule")
        combinable = True
    except ScheduleError:
        combinable = False
    row = reduce and combinable and (k is None or k >= ROW_MIN) and (
        not spatial or _contiguous_along_reduction(blk))
    if row:
        r = sch.fuse(*reduce) if len(reduce) > 1 else reduce[0]
        t = threads_for(target, k)
        ro, ri = sch.split(r, [None, t])
        sch.reorder(ri, ro)
        if spatial:
            s = sch.fuse(*spatial) if len(spatial) > 1 else spatial[0]
            sch.bind(s, "blockIdx.x")
        sch.bind(ri, "threadIdx.x")
        return True
    if not spatial:
        return False
    write_back = _wide_accumulator(sch, block)
    s = sch.fuse(*spatial) if len(spatial) > 1 else spatial[0]
    bind_flat(sch, target, s)
    if write_back is not None:
        bound = [lp for lp in sch.get_loops(block)
                 if sch.get(lp).kind == ForKind.THREAD_BINDING]
        sch.reverse_compute_at(write_back, bound[-1])
    return True


def _wide_accumulator(sch: Any, block: Any) -> Any:
    """A float16/bfloat16 reduction given one thread per output sums into a float32 register
    (``cache_write`` to ``local`` in :func:`accumulator_dtype`), stored rounded once by the
    returned write-back block; None for other dtypes, or where the block cannot be staged."""
    blk = sch.get(block)
    if len(blk.writes) != 1:
        return None
    dtype = blk.writes[0].buffer.dtype
    wide = accumulator_dtype(dtype)
    if wide == dtype:
        return None
    try:
        return sch.cache_write(block, 0, "local", str(wide))
    except ScheduleError:
        return None


def _data_parallel(sch: Any, loop: Any) -> bool:
    """Every block under ``loop`` binds its variable through spatial iteration variables
    only, and no block body reads the variable directly."""
    node = sch.get(loop)
    var = node.loop_var
    ok = [True]
    seen = [False]

    def visit(n: Any) -> None:
        if isinstance(n, BlockRealize):
            for iv, value in zip(n.block.iter_vars, n.iter_values):
                if var in collect_vars(value):
                    seen[0] = True
                    if iv.iter_type != IterType.DATA_PAR:
                        ok[0] = False
            inner = collect_vars((n.block.body, n.block.init))
            if var in inner:
                ok[0] = False

    post_order_visit(node.body, visit)
    return ok[0] and seen[0]


def schedule_outer_parallel(sch: Any, target: Any, block: Any) -> bool:
    """Run one iteration of a stage's data-parallel outermost loop per thread."""
    loops = sch.get_loops(block)
    if not loops:
        return False
    outer = loops[0]
    if sch.get(outer).kind != ForKind.SERIAL or not _data_parallel(sch, outer):
        return False
    bind_flat(sch, target, outer)
    return True
