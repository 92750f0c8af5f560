"""Shared CPU schedules for operator declarations.

Most operators need one of two loop shapes on a CPU:

- :func:`schedule_injective` — every output element is computed independently: fuse the spatial
  loops into one parallel loop and split a SIMD-wide vector loop off the innermost output
  dimension when its extent is a known multiple of the vector width.
- :func:`schedule_reduction` — reductions: parallelize the fused outer spatial loops, keep the
  reduce loops serial inside them, and hoist the init out of the reduce loops
  (``decompose_reduction``). When the block reads its input with the innermost *spatial*
  variable as the contiguous index (``sum(x, axis=0)``, or the interleaved partial sums that
  ``kiln.op.reduce`` uses for long innermost axes) the reduce loops move outside a vectorized
  chunk of that axis, so every reduce step is a few contiguous vector loads and adds.

Both take the ``tir.Schedule`` of a legalized PrimFunc (as produced by ``te.create_prim_func``:
one loop nest per stage, spatial loops then reduce loops) and the ``Target``. They are safe for
any shape: a loop whose extent is not a constant is never split or vectorized, blocks whose
loops no longer look like a fresh ``te`` nest (already scheduled) are left alone, and a block
whose transformation the schedule refuses keeps its plain loops (each block is tried on a copy
of the schedule first, so a refusal never leaves it half transformed).
"""

from __future__ import annotations

import math
import os
from typing import Any

from ...arith import simplify
from ...ir.errors import ScheduleError
from ...tir.expr import LT, Add, BufferLoad, Call, FloorDiv, FloorMod, IntImm, IterType, Select
from ...tir.functor import collect_vars, post_order_visit, substitute
from ..apply import inline_is_cheap
from ..knobs import knob

__all__ = [
    "PARALLEL_MIN_WORK",
    "inline_injective_stages",
    "schedule_default",
    "schedule_injective",
    "schedule_reduction",
]

# Below this many scalar operations a parallel region costs more than it saves.
PARALLEL_MIN_WORK = 16384
#: Chunks of a parallel element-wise loop per thread (static scheduling: a few per thread
#: even out uneven progress).
PARALLEL_CHUNKS_PER_THREAD = 8
# Narrowest vector worth emitting.
_MIN_LANES = 4
# Elements of the contiguous output axis updated per step of a column reduction.
_COLUMN_CHUNK = 256
# Shortest innermost reduce loop given vector partial results (rfactor) by the default
# reduction schedule: shorter rows do not pay for the extra combine loop (the threshold of
# kiln.op.reduce's interleaved partials, which cover the long multiples of 8 themselves).
_RFACTOR_MIN_EXTENT = 64


def _const(extent: Any) -> int | None:
    return extent.value if isinstance(extent, IntImm) else None


def _root_and_blocks(sch: Any) -> list[Any]:
    """BlockRVs of the compute blocks (children of the root block), in program order."""
    root = sch.get_block("root")
    return list(sch.get_child_blocks(root))


def _is_reduction(block: Any) -> bool:
    return any(iv.iter_type == IterType.COMM_REDUCE for iv in block.iter_vars)


def _output_buffers(sch: Any) -> set[Any]:
    return {id(b) for b in sch.func.buffer_map.values()}


def _loop_extents(sch: Any, loops: list[Any]) -> list[int | None]:
    return [_const(sch.get(lp).extent) for lp in loops]


def _product(extents: list[int | None]) -> int | None:
    total = 1
    for e in extents:
        if e is None:
            return None
        total *= e
    return total


def _worth_parallel(target: Any, work: int | None, outer: int | None) -> bool:
    """Parallelize when there is enough work (unknown sizes are assumed large)."""
    if getattr(target, "num_threads", 0) == 1:
        return False
    if outer is not None and outer <= 1:
        return False
    return work is None or work >= PARALLEL_MIN_WORK


def _vector_dtype(block: Any) -> Any | None:
    """The widest element type the block touches: it sets how many lanes fill one register."""
    dtypes = [r.buffer.dtype for r in (*block.reads, *block.writes)]
    if not dtypes:
        return None
    return max(dtypes, key=lambda d: max(d.bits, 8))


def _pick_lanes(target: Any, dtype: Any, extent: int | None) -> int:
    """Largest power-of-two vector width (<= the target's) that divides ``extent``; else 1."""
    if dtype is None or extent is None or extent <= 1:
        return 1
    lanes = target.vector_lanes(dtype)
    while lanes >= _MIN_LANES:
        if extent % lanes == 0:
            return lanes
        lanes //= 2
    return 1


def _lane_domain(target: Any, block: Any, extent: int | None) -> tuple[int, ...]:
    """The vector widths an element-wise block may take (a tuning knob's domain): 1 and
    the powers of two of at least :data:`_MIN_LANES` up to the target's that divide ``extent``."""
    dtype = _vector_dtype(block)
    if dtype is None or extent is None:
        return (1,)
    top, out = target.vector_lanes(dtype), [1]
    while top >= _MIN_LANES:
        if extent % top == 0:
            out.append(top)
        top //= 2
    return tuple(sorted(out))


def inline_injective_stages(sch: Any) -> None:
    """Inline every intermediate stage that is a plain element-wise/injective computation.

    Ops whose compute uses helper stages (e.g. a padded copy feeding a window) get one loop nest
    instead of several; stages that cannot be inlined (reductions, or ones the schedule refuses)
    stay as they are.
    """
    outputs = _output_buffers(sch)
    for b in _root_and_blocks(sch):
        blk = sch.get(b)
        if _is_reduction(blk) or any(id(w.buffer) in outputs for w in blk.writes):
            continue
        if not inline_is_cheap(sch, b):
            continue
        try:
            sch.compute_inline(b)
        except ScheduleError:
            pass


def _loads(block: Any) -> list[Any]:
    """The buffer loads in ``block``'s body."""
    loads: list[Any] = []
    post_order_visit(block.body, lambda n: loads.append(n) if isinstance(n, BufferLoad)
                     else None)
    return loads


def _walks_contiguously(load: Any, var: Any) -> bool:
    """``load`` steps through its buffer one element per step of ``var``: ``var`` has unit
    stride in the last index whose axis is longer than 1 and appears in no other (the
    vector operand of a matrix-vector product, ``B[b, k, 0]`` of a (b, k, 1) buffer, walks
    along ``k``)."""
    indices = list(load.indices)
    shape = list(load.buffer.shape)
    while len(indices) > 1 and _const_dim(shape[-1]) == 1:
        if var in collect_vars(indices.pop()):
            return False
        shape.pop()
    return (bool(indices) and _unit_stride(indices[-1], var)
            and not any(var in collect_vars(i) for i in indices[:-1]))


def _const_dim(d: Any) -> int | None:
    return d if isinstance(d, int) else _const(d)


def _input_stride(load: Any, var: Any) -> int | None:
    """Elements between the input elements ``load`` reads at ``var`` and ``var + 1`` (the
    other variables at 0); None for a symbolic shape or a non-linear index."""
    strides, step = [], 1
    for d in reversed(load.buffer.shape):
        strides.insert(0, step)
        step = step * d if isinstance(d, int) else (step * d.value if isinstance(d, IntImm)
                                                    else None)
        if step is None:
            return None
    total = 0
    for index, stride in zip(load.indices, strides):
        at = [simplify(substitute(index, lambda v, k=k: IntImm(v.dtype, k if v is var else 0)))
              for k in (0, 1, 2)]
        if not all(isinstance(a, IntImm) for a in at):
            return None
        if at[2].value - at[1].value != at[1].value - at[0].value:
            return None  # not linear in var (a floordiv or floormod of it)
        total += (at[1].value - at[0].value) * stride
    return total


#: L1 data cache geometry assumed for conflict misses: 64-byte lines in 64 sets (every
#: x86 core since Sandy Bridge and Zen 1, with 8 to 12 ways), and the lines a loop may keep
#: in one set before they evict each other, leaving ways for its other data.
_L1_LINE, _L1_SETS, _L1_SET_BUDGET = 64, 64, 4


def _conflicting_rows(rows: int, stride_bytes: int) -> bool:
    """Whether ``rows`` cache lines ``stride_bytes`` apart crowd one L1 set past the budget.
    The set of row ``k`` repeats with ``k * stride_bytes`` modulo the L1 way size (line x
    sets), so a few thousand rows show every set however many there are."""
    sets = {(k * stride_bytes // _L1_LINE) % _L1_SETS
            for k in range(min(rows, _L1_LINE * _L1_SETS))}
    return rows > _L1_SET_BUDGET * len(sets)


def _transposed_axis(block: Any, extents: list[int | None]) -> int | None:
    """The position of the spatial variable that walks the block's one input contiguously,
    when the innermost variable reads rows whose cache lines conflict in L1 (a transpose
    whose stride is a multiple of 4 KiB: ``layout_transform`` packing a 1024 x 1024 weight
    into 16-column panels); None otherwise.

    Run innermost-first, such a copy gathers every output vector from rows a large stride
    apart: 16 rows 4 KiB apart share one L1 set of 8 ways, so the rows evict each other
    and every element comes from L2 (the panel packing above took 1.13 ms against
    0.25-0.29 ms with the contiguous axis innermost, 2 threads, Zen 3). Without conflicts
    the vectorized gather is the faster one (NCHW -> NCHW8c at 56 x 56 x 64: 0.047 ms
    against 0.075 ms for the scalar transposed loop)."""
    loads = _loads(block)
    spatial = [iv.var for iv in block.iter_vars if iv.iter_type == IterType.DATA_PAR]
    if len(loads) != 1 or len(spatial) != len(block.iter_vars) or len(spatial) < 2:
        return None
    indices = loads[0].indices
    last = spatial[-1]
    if not indices or _unit_stride(indices[-1], last):
        return None
    if not any(last in collect_vars(i) for i in indices):
        return None  # a broadcast along the innermost axis, not a transpose
    stride = _input_stride(loads[0], last)
    itemsize = max(1, loads[0].buffer.dtype.bits // 8)
    if extents[-1] is None or stride is None or not _conflicting_rows(extents[-1],
                                                                      stride * itemsize):
        return None
    return next((pos for pos, var in enumerate(spatial[:-1])
                 if _walks_contiguously(loads[0], var)), None)


#: Bytes of the contiguous input axis a transposing copy reads per innermost loop (see
#: :func:`_transposed_axis`): half a cache line, so the lines the inner loops write stay
#: few (8 and 16 float32 elements measured alike).
_TRANSPOSE_TILE_BYTES = 32


def _transpose_block(sch: Any, target: Any, b: Any, loops: list[Any], extents: list[Any]
                     ) -> bool:
    """Schedule a transposing copy with a tile of its contiguous input axis innermost (scalar
    and unrolled: the writes it makes are strided); False when the block is not one."""
    blk = sch.get(b)
    pos = _transposed_axis(blk, extents)
    if pos is None or extents[pos] is None:
        return False
    tile = _TRANSPOSE_TILE_BYTES // max(1, blk.writes[0].buffer.dtype.bits // 8)
    if tile < 2 or extents[pos] % tile or extents[pos] == tile:
        return False
    outer, inner = sch.split(loops[pos], factors=[None, tile])
    loops = [*loops[:pos], outer, *loops[pos + 1:]]
    sch.reorder(*loops, inner)
    sch.unroll(inner)
    _parallel_outer_loops(sch, target, loops, extents, sch.get(b).name_hint)
    return True


#: Most copies of an element-wise body that :func:`_piecewise_block` unrolls: one per
#: concatenated piece a row of the innermost axis touches (and per value of the other axes
#: its choice depends on).
_MAX_PIECES = 16


def _affine_coefficients(expr: Any, variables: list[Any]) -> tuple[list[int], int] | None:
    """``expr`` as ``sum(coef[j] * variables[j]) + const`` with integer coefficients, or None
    when it is not affine in them (or uses other variables)."""
    if not {id(v) for v in collect_vars(expr)} <= {id(v) for v in variables}:
        return None

    def at(values: dict[int, int]) -> int | None:
        v = simplify(substitute(expr, lambda x: IntImm(x.dtype, values.get(id(x), 0))))
        return v.value if isinstance(v, IntImm) else None

    const = at({})
    if const is None:
        return None
    coefs = []
    for var in variables:
        one, two = at({id(var): 1}), at({id(var): 2})
        if one is None or two is None or two - one != one - const:
            return None
        coefs.append(one - const)
    return coefs, const


def _piece_conditions(block: Any) -> list[tuple[list[int], int]] | None:
    """The conditions of the block's selects as ``(coefficients, bound)`` for ``sum(coef *
    iter_var) < bound``: what a concat writes to pick its input (``select(c < 6, a[c],
    select(c < 12, b[c - 6], ...))``). None when a select has another kind of condition."""
    variables = [iv.var for iv in block.iter_vars]
    conds: list[tuple[list[int], int]] = []
    bad = []

    def visit(n: Any) -> None:
        if not isinstance(n, Select):
            return
        c = n.condition
        form = (_affine_coefficients(c.a, variables)
                if isinstance(c, LT) and isinstance(c.b, IntImm) else None)
        if form is None:
            bad.append(c)
        else:
            conds.append((form[0], c.b.value - form[1]))

    post_order_visit(block.body, visit)
    return None if bad else conds


def _piecewise_block(sch: Any, target: Any, b: Any, loops: list[Any], extents: list[Any]
                     ) -> bool:
    """Schedule an element-wise block whose selects pick a piece along the innermost axis (a
    concat along the channels of a blocked NCHWc layout: lanes 0-5 from one input, 6-11 from
    another) so that every select is decided per unrolled copy; False when the block is not
    one.

    Left as it is, every element evaluates the select chain and clamps its indices into each
    input (the resizes, concat and NCHW -> NCHW12c transform of the text detector's FPN: 2.5
    ms, scalar). Here the innermost axis splits into pieces of ``g`` lanes (``g`` divides the
    extent, every bound and the steps of the other axes in the conditions), its outer part and
    the other axes the conditions use are unrolled (those moved just inside the parallel
    loops), and after unrolling the simplifier proves each condition constant: one input per
    copy, no clamps (0.6 ms there)."""
    blk = sch.get(b)
    conds = _piece_conditions(blk)
    last = len(loops) - 1
    if not conds or any(e is None for e in extents) or len(loops) < 2:
        return False
    if any(coefs[last] not in (0, 1) for coefs, _ in conds) or all(
            coefs[last] == 0 for coefs, _ in conds):
        return False
    g = extents[last]
    for coefs, bound in conds:
        g = math.gcd(g, bound, *(c for j, c in enumerate(coefs) if j != last))
    chosen = [j for j in range(last) if any(coefs[j] for coefs, _ in conds)]
    copies = extents[last] // g * math.prod(extents[j] for j in chosen)
    if g <= 1 or copies > _MAX_PIECES or copies <= 1:
        return False
    if not knob(f"{blk.name_hint}.unroll_pieces", (False, True), True):
        return False
    rest = [j for j in range(last) if j not in chosen]
    if not rest:
        return False
    # the chosen axes go just outside the last of the other axes, so that a row of the
    # output's innermost axes stays one contiguous loop per copy
    outer, row = rest[:-1], rest[-1]
    order = [loops[j] for j in outer] + [loops[j] for j in chosen] + [loops[row]]
    if g < extents[last]:
        piece, lane = sch.split(loops[last], factors=[None, g])
        inner = [piece, lane]
    else:
        piece, lane = None, loops[last]
        inner = [lane]
    sch.reorder(*order, *inner)
    for j in chosen:
        sch.unroll(loops[j])
    if piece is not None:
        sch.unroll(piece)
    if outer:
        take = _chunk_loops(sch, [loops[j] for j in outer], target, blk.name_hint)
        fused = sch.fuse(*(loops[j] for j in outer[:take])) if take > 1 else loops[outer[0]]
        if _worth_parallel(target, _product(extents), _const(sch.get(fused).extent)):
            sch.parallel(fused)
    lanes = _pick_lanes(target, _vector_dtype(blk), g)
    if lanes == g:
        sch.vectorize(lane)
    return True


#: Calls a row loop may hold and still be vectorized by the C compiler on its own (see
#: :func:`_interleave_factors`); any other call needs kiln's vector formulas.
_PLAIN_CALLS = frozenset({"rounded"})


def _interleave_factors(block: Any, extent: int | None) -> list[int] | None:
    """Split factors of the innermost axis of an element-wise block that reads its input
    through a flattened interleave (the depth-to-space of a 2x2/s2 ConvTranspose:
    ``y[c, i] = g[c, (i // 320) % 2 * 2 + i % 320 % 2, i // 640 * 160 + i % 320 // 2]``): the
    chain of constant divisors of the axis in the load indices (320, then 2 dividing it), when
    the last one is shorter than a vector; None otherwise.

    Vectorized over ``i``, every lane is a gather (the phase alternates lane by lane). Split at
    the divisors into (row, column, phase) the divisions fold away, the phase loop is unrolled
    and the column loop reads each phase's row contiguously, which the C compiler vectorizes
    (interleaving the two rows in registers). Only for bodies of plain arithmetic: a call
    (``sigmoid``, ``exp``) would stay scalar in that loop."""
    if extent is None:
        return None
    var = block.iter_vars[-1].var
    divisors, calls = set(), []

    def visit(n: Any) -> None:
        if isinstance(n, (FloorDiv, FloorMod)) and isinstance(n.b, IntImm) and any(
                v is var for v in collect_vars(n.a)):
            divisors.add(n.b.value)
        elif isinstance(n, Call) and n.op not in _PLAIN_CALLS:
            calls.append(n)

    for load in _loads(block):
        for index in load.indices:
            post_order_visit(index, visit)
    post_order_visit(block.body, visit)
    if calls:
        return None
    chain, rest = [], extent
    for d in sorted(divisors, reverse=True):
        if 1 < d < rest and rest % d == 0:
            chain.append(d)
            rest = d
    if not chain or chain[-1] >= _MIN_LANES:
        return None
    return [extent // chain[0]] + [a // b for a, b in zip(chain, chain[1:])] + [chain[-1]]


def _interleave_block(sch: Any, target: Any, b: Any, loops: list[Any], extents: list[Any]
                      ) -> bool:
    """Schedule an element-wise block that reads through a flattened interleave (see
    :func:`_interleave_factors`): the innermost axis split at the divisors, the phase loop
    unrolled, the column loop left for the C compiler to vectorize, the rows parallel; False
    when the block is not one."""
    blk = sch.get(b)
    factors = _interleave_factors(blk, extents[-1])
    if factors is None or not knob(f"{blk.name_hint}.split_interleave", (False, True), True):
        return False
    parts = sch.split(loops[-1], factors=factors)
    sch.unroll(parts[-1])
    outer = [*loops[:-1], *parts[:-2]]
    if not outer:
        return True
    take = _chunk_loops(sch, outer, target, blk.name_hint)
    fused = sch.fuse(*outer[:take]) if take > 1 else outer[0]
    if _worth_parallel(target, _product(extents), _const(sch.get(fused).extent)):
        sch.parallel(fused)
    return True


def _injective_block(sch: Any, target: Any, b: Any) -> None:
    blk = sch.get(b)
    loops = list(sch.get_loops(b))
    if not loops or len(loops) != len(blk.iter_vars):
        return  # rank 0, or already transformed
    extents = _loop_extents(sch, loops)
    if _transpose_block(sch, target, b, loops, extents):
        return
    if _piecewise_block(sch, target, b, loops, extents):
        return
    if _interleave_block(sch, target, b, loops, extents):
        return
    lanes = knob(f"{blk.name_hint}.vector_lanes", _lane_domain(target, blk, extents[-1]),
                 _pick_lanes(target, _vector_dtype(blk), extents[-1]))
    inner = None
    if lanes > 1:
        outer, inner = sch.split(loops[-1], factors=[None, lanes])
        loops = [*loops[:-1], outer]
    _parallel_outer_loops(sch, target, loops, extents, blk.name_hint)
    if inner is not None:
        sch.vectorize(inner)


def _parallel_outer_loops(sch: Any, target: Any, loops: list[Any], extents: list[Any],
                          name: str = "") -> None:
    """Fuse only the outer ``loops`` that give every thread several chunks and run them in
    parallel when the nest is worth it; the inner ones stay nested, so their index arithmetic
    is an increment rather than a div/mod of one big fused counter per element (which cost
    more than the copy in transposes and splits)."""
    take = _chunk_loops(sch, loops, target, name)
    fused = sch.fuse(*loops[:take]) if take > 1 else loops[0]
    if _worth_parallel(target, _product(extents), _const(sch.get(fused).extent)):
        sch.parallel(fused)


def cpu_count() -> int:
    """CPUs this process may run on (its affinity mask), the default thread count."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def target_threads(target: Any) -> int:
    """The threads a target's kernels run on: its ``num_threads``, else :func:`cpu_count`."""
    return getattr(target, "num_threads", 0) or cpu_count()


def _chunk_loops(sch: Any, loops: list[Any], target: Any, name: str = "") -> int:
    """How many leading ``loops`` to fuse into the parallel loop: enough for
    :data:`PARALLEL_CHUNKS_PER_THREAD` chunks per thread (all of them when the nest is
    small). A symbolic extent (a dynamic batch, which may be 1) counts as 1: the constant
    loops after it are fused until they alone give the chunks, and the rest stay nested --
    fusing them all made a layout transform of MobileNetV2's input at batch 1 take 16x the
    time (a div/mod of the fused counter per element)."""
    threads = target_threads(target)
    chunks = knob(f"{name}.parallel_chunks", (1, 2, 4, 8, 16, 32), PARALLEL_CHUNKS_PER_THREAD)
    want = chunks * max(threads, 1)
    total = 1
    for k, lp in enumerate(loops):
        ext = _const(sch.get(lp).extent)
        total *= 1 if ext is None else ext
        if total >= want:
            return k + 1
    return len(loops)


def _strided_reduce_read(block: Any) -> bool:
    """True when the block reads an input whose innermost index is the innermost spatial
    variable while other indices use reduce variables (``sum(x, axis=0)``): a reduction over a
    non-contiguous axis, best done with the contiguous spatial axis vectorized inside."""
    spatial = [iv.var for iv in block.iter_vars if iv.iter_type == IterType.DATA_PAR]
    reduce = {iv.var for iv in block.iter_vars if iv.iter_type == IterType.COMM_REDUCE}
    if not spatial or not reduce:
        return False
    last = spatial[-1]
    found = []

    def visit(n: Any) -> None:
        if isinstance(n, BufferLoad) and n.indices and _unit_stride(n.indices[-1], last):
            if any(v in reduce for i in n.indices for v in collect_vars(i)):
                found.append(n)

    post_order_visit(block.body, visit)
    return bool(found)


def _reduction_block(sch: Any, target: Any, b: Any) -> None:
    blk = sch.get(b)
    loops = list(sch.get_loops(b))
    n_spatial = sum(iv.iter_type == IterType.DATA_PAR for iv in blk.iter_vars)
    if len(loops) != len(blk.iter_vars) or n_spatial == 0 or blk.init is None:
        return  # full reduction to a scalar (stays serial) or already transformed
    spatial, reduce = loops[:n_spatial], loops[n_spatial:]
    sp_ext = _loop_extents(sch, spatial)
    work = _product(sp_ext + _loop_extents(sch, reduce))
    lanes = 1
    if _strided_reduce_read(blk):
        lanes = _pick_lanes(target, _vector_dtype(blk), sp_ext[-1])
    inner = None
    if lanes > 1:
        # loops: fused(outer spatial) > reduce... > chunk > vectorized lanes. Each reduce step
        # streams a contiguous chunk of up to _COLUMN_CHUNK elements, so rows are read in order
        # and the chunk of partial results stays in L1.
        vectors = sp_ext[-1] // lanes
        per_chunk = max(d for d in range(1, min(vectors, _COLUMN_CHUNK // lanes) + 1)
                        if vectors % d == 0)
        outer, mid, inner = sch.split(spatial[-1], factors=[None, per_chunk, lanes])
        sch.reorder(outer, *reduce, mid, inner)
        spatial = [*spatial[:-1], outer]
    rf = None
    rf_lanes = _contiguous_reduce_lanes(sch, target, blk, reduce) if lanes == 1 else 1
    if rf_lanes > 1 and _rfactor_applies(sch, reduce[-1], rf_lanes):
        rf = _rfactor_innermost(sch, reduce[-1], rf_lanes)
        loops = list(sch.get_loops(b))  # now the write-back block: spatial loops + partials
        spatial, reduce = loops[:n_spatial], loops[n_spatial:]
    fused = sch.fuse(*spatial) if len(spatial) > 1 else spatial[0]
    if _worth_parallel(target, work, _const(sch.get(fused).extent)):
        sch.parallel(fused)
    # the init runs once per output element, before the reduce loops, not as a guarded store
    init = sch.decompose_reduction(b, reduce[0])
    if inner is not None:
        sch.vectorize(inner)
        sch.vectorize(sch.get_loops(init)[-1])
    if rf is not None:  # its loops: fused spatial, reduce..., chunks, vectorized partials
        sch.decompose_reduction(rf, sch.get_loops(rf)[1])


def _contiguous_reduce_lanes(sch: Any, target: Any, block: Any, reduce: list[Any]) -> int:
    """Vector width for partial results of a float reduction whose innermost reduce variable
    is the contiguous index of every load that uses it (``sum(x, axis=-1)``), when the
    innermost reduce loop is long enough (:data:`_RFACTOR_MIN_EXTENT`); else 1."""
    dtype = block.writes[0].buffer.dtype if len(block.writes) == 1 else None
    if dtype is None or not dtype.is_float or not reduce:
        return 1
    ext = _const(sch.get(reduce[-1]).extent)
    last = next((iv.var for iv in reversed(block.iter_vars)
                 if iv.iter_type == IterType.COMM_REDUCE), None)
    if ext is None or last is None:
        return 1
    uses = [ld for ld in _loads(block) if any(last in collect_vars(i) for i in ld.indices)]
    if not uses or not all(_walks_contiguously(ld, last) for ld in uses):
        return 1
    lanes = _pick_lanes(target, dtype, ext)
    return lanes if ext >= max(2 * lanes, _RFACTOR_MIN_EXTENT) else 1


def _unit_stride(index: Any, var: Any) -> bool:
    """``index`` is ``var`` or ``e + var`` with ``e`` free of ``var``."""
    if index is var:
        return True
    if isinstance(index, Add):
        for a, b in ((index.a, index.b), (index.b, index.a)):
            if a is var and var not in collect_vars(b):
                return True
    return False


def _rfactor_innermost(sch: Any, loop: Any, lanes: int) -> Any:
    """Split ``loop`` by ``lanes`` and keep that many partial results in a vector (rfactor);
    returns the block of partial results."""
    _, ki = sch.split(loop, factors=[None, lanes])
    block = sch.get(sch.get_child_blocks(ki)[0])
    rf = sch.rfactor(ki, len(block.writes[0].buffer.shape))
    sch.vectorize(ki)
    return rf


def _rfactor_applies(sch: Any, loop: Any, lanes: int) -> bool:
    """Whether :func:`_rfactor_innermost` succeeds (tried on a copy: an unsupported combiner
    keeps the scalar reduction instead of leaving the block unscheduled)."""
    try:
        _rfactor_innermost(sch.copy(), loop, lanes)
    except ScheduleError:
        return False
    return True


def _apply_safely(sch: Any, fn: Any, *args: Any) -> bool:
    """Run ``fn(sch, *args)`` only if it succeeds on a copy (no half-applied transformations)."""
    try:
        fn(sch.copy(), *args)
    except ScheduleError:
        return False
    fn(sch, *args)
    return True


def schedule_injective(sch: Any, target: Any, block: Any = None) -> None:
    """Default CPU schedule of injective (element-wise, broadcast, shape) computations.

    With ``block`` given, schedules that block; otherwise inlines injective intermediate
    stages and schedules every remaining non-reduction block. Reduction blocks are left alone.
    """
    if block is not None:
        _apply_safely(sch, _injective_block, target, block)
        return
    inline_injective_stages(sch)
    for b in _root_and_blocks(sch):
        if not _is_reduction(sch.get(b)):
            _apply_safely(sch, _injective_block, target, b)


def schedule_reduction(sch: Any, target: Any, block: Any = None) -> None:
    """Default CPU schedule of reductions.

    With ``block`` given, schedules that reduction block; otherwise inlines injective producer
    stages, schedules every reduction block, and gives the remaining injective blocks (e.g. the
    division of ``mean``) the injective schedule.
    """
    if block is not None:
        _apply_safely(sch, _reduction_block, target, block)
        return
    inline_injective_stages(sch)
    for b in _root_and_blocks(sch):
        fn = _reduction_block if _is_reduction(sch.get(b)) else _injective_block
        _apply_safely(sch, fn, target, b)


def schedule_default(sch: Any, target: Any) -> None:
    """Injective or reduction schedule per block; what an op without its own schedule gets."""
    schedule_reduction(sch, target)
