"""float16/bfloat16 convolutions on tensor cores: the implicit GEMM of :mod:`.conv` rewritten
as an explicit matrix product that :func:`kiln.schedule.gpu.linalg.schedule_mma_gemm` tiles.

The product: rows M are the output channels, columns N the output pixels of the whole batch
(``n * H * W + y * W + x``) and the reduction K the input channels x taps: taps outer, channels
inner (``(ry * KW + rx) * C + c``) when a reduction step holds whole runs of channels of one
tap (C a multiple of the step, :func:`channels_inner`: every ResNet layer but the stem), else
``c * KH * KW + ry * KW + rx`` (the order of an OIHW weight's memory). Taps outer, the gathers'
indices need no division per element: the shared copies are marked ``SUBSTITUTE_BINDINGS``
(:mod:`kiln.tir.transform.convert_blocks_to_loops`), so their indices simplify against the
reduction loop -- a step's tap is ``ko // (C / bk)``, one value per block, and an element's
channel the step's first plus its row in the tile -- leaving adds and the padding's bounds test
(with int32 indices the copies are substituted either way: the stem's divisions then simplify
and NVRTC shares them; knob ``gpu_conv_mma_taps_outer``, default on: the weight's gather then
reads a tile's rows KH * KW elements apart instead of contiguously; not yet timed on a GPU).
The GEMM's indices are int32 where every buffer has fewer than 2^31 elements
(:func:`index_dtype`): what divisions remain (a column's pixel, the stem's taps) are one
``mul.hi.s32`` each instead of a 64-bit multiply sequence.

M = output channels because they are the axis every real convolution gives in multiples of
16 (the mma's row tile), while the pixels of a batch-1 image at 7 x 7 or 14 x 14 are no
multiple of the column tile's 8 on any axis; columns = pixels also makes a warp's write-back
of the NCHW output run along a row of pixels.

:func:`conv_gemm_func` rewrites the fused convolution (padding, ``conv2d``, its element-wise
epilogues) into:

- ``conv2d_a[M, Kp]``: the weight seen as a matrix (zero where ``k >= K``);
- ``conv2d_b[Kp, N]``: the im2col matrix, a gather of the (padded) input (zero where
  ``k >= K``); the padding block stays and is computed inside it;
- ``conv2d[M, N] += conv2d_a[M, Kp] @ conv2d_b[Kp, N]``, a plain GEMM block;
- the epilogues over ``(M, N)`` instead of ``(n, o, y, x)``, their intermediates 2-D, the
  loads of residuals and the final store NCHW again (``n = col / HW``, ``y = col / W % H``,
  ``x = col % W``).

The mma GEMM schedule then computes ``conv2d_a`` and ``conv2d_b`` inside its cooperative
global -> shared copies (all threads of a block; the zero padding and ``k >= K`` computed
there, never stored) and folds the epilogues into the write-back: one kernel per fused
convolution, as on the SIMT path. K is padded with zeros to the reduction step (ResNet-18's
stem, K = 3 x 7 x 7 = 147, runs as 160). M and N that no block tile divides
(``linalg.mma_tile``) are padded to multiples of :data:`PAD_TO` (:func:`padded_gemm`; knob
``gpu_conv_mma_pad``): the gathers clamp the row and column, so the padded rows and columns
compute copies of the last real ones, and :func:`guard_padded_stores` predicates the stores
into the function's outputs. What this module refuses (another block structure, an off-tile
shape with ``gpu_conv_mma_pad`` off) takes the SIMT implicit GEMM with a warning naming the
shape and the reason (:func:`kiln.schedule.gpu.conv.schedule_conv2d`). Knob ``gpu_conv_mma``
(True) keeps the SIMT path reachable.

The rewritten function gets a new :class:`~kiln.tir.schedule.Schedule` that the caller's
adopts: the knob decisions stay in the caller's trace (what tuning re-applies, by name); the
instructions recorded after the rewrite name the GEMM form's blocks, so that trace is a record
of what was done, not one that replays on the original function.
"""

from __future__ import annotations

import math
from typing import Any

from ...arith.analyzer import simplify
from ...ir.errors import ScheduleError
from ...tir.buffer import Buffer
from ...tir.expr import (
    Add,
    BufferLoad,
    Cast,
    FloatImm,
    IterType,
    IterVar,
    Mul,
    PrimExpr,
    Range,
    Select,
    Var,
    cast,
    const,
    select,
)
from ...tir.expr import min as tmin
from ...tir.function import PrimFunc
from ...tir.functor import Mutator, post_order_visit, substitute
from ...tir.schedule import Schedule
from ...tir.schedule.analysis import as_int, infer_regions
from ...tir.stmt import Block, BlockRealize, BufferStore, For, ForKind, SeqStmt, Stmt
from ..knobs import knob
from .linalg import MMA_BK_CHOICES, MMA_WARPS, mma_tile, schedule_mma_gemm

__all__ = ["GATHERS", "INT32_ELEMENTS", "PAD_TO", "channels_inner", "conv_gemm_func",
           "guard_padded_stores", "index_dtype", "padded_gemm", "reduction_step",
           "schedule_conv_mma"]

#: What :func:`padded_gemm` rounds output channels and pixels up to: 32 x 32 block tiles
#: (2 x 2 warps of 1 x 2 or 2 x 1 mma tiles... :data:`linalg.MMA_TILES`).
PAD_TO = 32
#: The blocks of :func:`conv_gemm_func` computed inside the GEMM's shared copies.
GATHERS = ("conv2d_a", "conv2d_b")


def reduction_step(k: int) -> int:
    """The default reduction step of a K-deep convolution GEMM: the first of
    :data:`MMA_BK_CHOICES` that pads ``k`` least (one that divides it: none)."""
    return min(MMA_BK_CHOICES, key=lambda b: -(-k // b) * b)


def padded_gemm(m: int, n: int, multiprocessors: int) -> tuple[int, int]:
    """The GEMM extents a conv with ``m`` output channels and ``n`` pixels (the batch's)
    computes: ``(m, n)`` when a block tile of some warps divides them (:func:`mma_tile`), else
    each rounded up to a multiple of :data:`PAD_TO` (ResNet-18's 14 x 14 and 7 x 7 layers at
    batch 1: 196 -> 224 and 49 -> 64 columns)."""
    if any(mma_tile(m, n, 1, w, multiprocessors) for w in MMA_WARPS):
        return m, n
    return -(-m // PAD_TO) * PAD_TO, -(-n // PAD_TO) * PAD_TO


def guard_padded_stores(func: PrimFunc, extents: tuple[int, int]) -> PrimFunc:
    """``func`` with every block that stores into one of its parameters over the padded GEMM's
    ``(m, col)`` given the predicate ``m < extents[0] and col < extents[1]``: the padded rows
    and columns compute a copy of the last real ones and are not stored (nor race with the
    real ones when an output aliases an input)."""
    params = set(func.buffer_map.values())

    class Guard(Mutator):
        def visit_BlockRealize(self, realize: BlockRealize) -> Stmt:
            realize = self.generic_visit(realize)
            block = realize.block
            stores: list[BufferStore] = []
            post_order_visit(block.body, lambda n: stores.append(n)
                             if isinstance(n, BufferStore) else None)
            if len(block.iter_vars) != 2 or not any(st.buffer in params for st in stores):
                return realize
            row, col = realize.iter_values
            inside = (row < extents[0]) & (col < extents[1])
            return realize.replace(predicate=realize.predicate & inside)

    return func.replace(body=Guard().visit(func.body))


def schedule_conv_mma(sch: Schedule, target: Any) -> None:
    """Schedule the fused convolution of ``sch`` as the module docstring says (``sch`` takes
    over the rewritten function's schedule), else a ScheduleError saying why not."""
    conv = sch.get(sch.get_block("conv2d"))
    n, o, h, w, c, kh, kw = (as_int(iv.dom.extent) or 0 for iv in conv.iter_vars)
    bk = knob("gpu_mma_bk", MMA_BK_CHOICES, reduction_step(c * kh * kw))
    extents = (o, n * h * w)
    padded = padded_gemm(*extents, target.gpu.multiprocessors) if knob(
        "gpu_conv_mma_pad", (True, False), True) else extents
    taps_outer = channels_inner(c, bk) and knob("gpu_conv_mma_taps_outer", (True, False), True)
    trial = Schedule(conv_gemm_func(sch.func, bk, padded, taps_outer))
    trial.knob_values = dict(sch.knob_values)
    try:
        trial.compute_inline(trial.get_block("conv2d_pad"))
    except ScheduleError:
        pass  # no padding
    gemm = trial.get_block("conv2d")
    # substituted int32 gathers: the taps' divisions CSE'd by NVRTC, the stem's 120 mul.hi.s32
    # -> 74 (102 registers, was 106); in int64 the stem spilled (sm_80): there, only where the
    # taps run outer (no division left to repeat)
    narrow = str(trial.get(gemm).iter_vars[0].var.dtype) == "int32"
    schedule_mma_gemm(trial, target, gemm, rows_fused=False, gathers=GATHERS,
                      substitute_gathers=taps_outer or narrow)
    if padded != extents:
        trial = Schedule(guard_padded_stores(trial.func, extents))
    sch.adopt(trial)


def _nests(func: PrimFunc) -> list[tuple[list[For], BlockRealize]]:
    """The root's loop nests, each a perfect nest of serial loops over one block whose iter
    vars are bound to the loop variables in order (an unscheduled function), else an error."""
    root = func.body.block
    stmts = list(root.body.seq) if isinstance(root.body, SeqStmt) else [root.body]
    out = []
    for stmt in stmts:
        loops: list[For] = []
        while isinstance(stmt, For):
            loops.append(stmt)
            stmt = stmt.body
        if not isinstance(stmt, BlockRealize) or len(loops) != len(stmt.iter_values) or any(
                v is not lp.loop_var for v, lp in zip(stmt.iter_values, loops)):
            raise ScheduleError("conv2d mma: not an unscheduled function of loop nests")
        out.append((loops, stmt))
    return out


def _nest(block: Block) -> Stmt:
    """``block`` (with iter vars of its own) under one serial loop per iter var, bound in
    order."""
    ivs = tuple(IterVar(iv.dom, Var(iv.var.name, iv.var.dtype), iv.iter_type)
                for iv in block.iter_vars)
    vmap = {old.var: new.var for old, new in zip(block.iter_vars, ivs)}
    block = block.replace(iter_vars=ivs, body=substitute(block.body, vmap),
                          init=None if block.init is None else substitute(block.init, vmap))
    loop_vars = [Var(f"l_{iv.var.name}", iv.var.dtype) for iv in block.iter_vars]
    reads, writes = infer_regions(block)
    stmt: Stmt = BlockRealize(tuple(loop_vars), const("bool", 1),
                              block.replace(reads=reads, writes=writes))
    for lv, iv in reversed(list(zip(loop_vars, block.iter_vars))):
        stmt = For(lv, iv.dom.min, iv.dom.extent, ForKind.SERIAL, stmt)
    return stmt


def _iter(name: str, extent: int, dtype: Any, kind: IterType = IterType.DATA_PAR,
          var: Var | None = None) -> IterVar:
    dom = Range(const(dtype, 0), const(dtype, extent))
    return IterVar(dom, var if var is not None else Var(name, dtype), kind)


class _Reshape(Mutator):
    """Loads and stores of the conv-shaped intermediates (``buffers``: old -> 2-D) at the
    block's own ``(n, o, y, x)`` iter vars become ``[m, col]``; other accesses are refused."""

    def __init__(self, buffers: dict[Buffer, Buffer], own: tuple[Var, ...],
                 mn: tuple[Var, Var]):
        self.buffers, self.own, self.mn = buffers, own, mn

    def _indices(self, buffer: Buffer, indices: tuple[PrimExpr, ...]) -> tuple[PrimExpr, ...]:
        if len(indices) != 4 or any(i is not v for i, v in zip(indices, self.own)):
            raise ScheduleError(f"conv2d mma: an epilogue reads {buffer.name} at other "
                                "indices than its own iteration (not element-wise)")
        return self.mn

    def visit_BufferLoad(self, load: BufferLoad) -> PrimExpr:
        load = self.generic_visit(load)
        if load.buffer not in self.buffers:
            return load
        return BufferLoad(self.buffers[load.buffer], self._indices(load.buffer, load.indices))

    def visit_BufferStore(self, store: BufferStore) -> Stmt:
        store = self.generic_visit(store)
        if store.buffer not in self.buffers:
            return store
        return BufferStore(self.buffers[store.buffer], store.value,
                           self._indices(store.buffer, store.indices))


def _update_terms(conv: Block, out: Buffer, src: Buffer, wgt: Buffer
                  ) -> tuple[PrimExpr, PrimExpr]:
    """The input and weight terms of the convolution's update ``out += x * w`` (each a load,
    or a cast of one), else a ScheduleError."""
    store = conv.body
    value = store.value if isinstance(store, BufferStore) else None
    if not isinstance(value, Add) or not isinstance(value.b, Mul) or not (
            isinstance(value.a, BufferLoad) and value.a.buffer is out):
        raise ScheduleError("conv2d mma: the update is not out += input * weight")
    terms = {}
    for term in (value.b.a, value.b.b):
        load = term.value if isinstance(term, Cast) else term
        if not isinstance(load, BufferLoad) or load.buffer not in (src, wgt):
            raise ScheduleError("conv2d mma: the update is not out += input * weight")
        terms[load.buffer] = term
    if len(terms) != 2:
        raise ScheduleError("conv2d mma: the update is not out += input * weight")
    return terms[src], terms[wgt]


def _narrowed(pad: Block | None, low: Any) -> Block:
    """The padding block of a float32-accumulating convolution, ``select(inside,
    float32(x[...]), 0)`` with ``x`` of dtype ``low``, storing ``low`` values instead (exact:
    the cast only widened them), so the im2col matrix and the shared tiles stay ``low``."""
    store = pad.body if pad is not None else None
    value = store.value if isinstance(store, BufferStore) else None
    if isinstance(value, Select) and isinstance(value.true_value, Cast) and isinstance(
            value.false_value, FloatImm) and value.true_value.value.dtype == low:
        narrow = select(value.condition, value.true_value.value,
                        const(str(low), value.false_value.value))
    elif isinstance(value, Cast) and value.value.dtype == low:
        narrow = value.value
    else:
        raise ScheduleError("conv2d mma: the input is not a float16/bfloat16 tensor cast up")
    old = store.buffer
    buf = Buffer(old.name, old.shape, low, scope=old.scope)
    reads, writes = infer_regions(pad.replace(body=BufferStore(buf, narrow, store.indices)))
    return pad.replace(body=BufferStore(buf, narrow, store.indices), reads=reads, writes=writes)


class _Operands(Mutator):
    """Every load of a buffer of ``loads`` replaced by the load given for it."""

    def __init__(self, loads: dict[Buffer, BufferLoad]):
        self.loads = loads

    def visit_BufferLoad(self, load: BufferLoad) -> PrimExpr:
        return self.loads.get(load.buffer, load)


def _loads(node: Any, buffer: Buffer) -> list[BufferLoad]:
    found: list[BufferLoad] = []
    post_order_visit(node, lambda n: found.append(n) if isinstance(n, BufferLoad)
                     and n.buffer is buffer else None)
    return found


def conv_gemm_func(func: PrimFunc, bk: int, padded: tuple[int, int] | None = None,
                   taps_outer: bool = True) -> PrimFunc:
    """``func`` (a fused NCHW/OIHW ``conv2d``, groups 1, with its padding and element-wise
    epilogues) with the convolution written as the GEMM of the module docstring (K taps outer
    where ``taps_outer`` and :func:`channels_inner` allow), K padded to
    a multiple of ``bk``, M and N to ``padded`` (the rows and columns beyond the convolution's
    read its last row / column: every index stays inside its buffer, and
    :func:`guard_padded_stores` keeps them from being stored); a ScheduleError when it has
    another structure."""
    nests = _nests(func)
    by_name = {r.block.name_hint: r.block for _, r in nests}
    conv = by_name.get("conv2d")
    if conv is None or conv.init is None or len(conv.iter_vars) != 7:
        raise ScheduleError("conv2d mma: no 7-loop conv2d reduction block")
    vb, vo, vy, vx, vc, vry, vrx = (iv.var for iv in conv.iter_vars)
    n, o, h, w, c, kh, kw = (as_int(iv.dom.extent) for iv in conv.iter_vars)
    if None in (n, o, h, w, c, kh, kw):
        raise ScheduleError("conv2d mma: symbolic extents")
    out = conv.writes[0].buffer
    src, wgt = conv.reads[0].buffer, conv.reads[1].buffer
    x_term, w_term = _update_terms(conv, out, src, wgt)
    if as_int(wgt.shape[1]) != c:
        raise ScheduleError("conv2d mma: groups > 1")
    by_buffer = {r.block.writes[0].buffer: r.block for _, r in nests}
    narrow_pad = None
    if src.dtype != wgt.dtype:  # float32 accumulation: the padding casts the input up
        narrow_pad = _narrowed(by_buffer.get(src), wgt.dtype)
    (x_load,), (w_load,) = _loads(x_term, src), _loads(w_term, wgt)
    big_k, hw = c * kh * kw, h * w
    kp = -(-big_k // bk) * bk
    cols = n * hw
    mp, np_ = padded or (o, cols)
    if mp < o or np_ < cols:
        raise ScheduleError("conv2d mma: the padded GEMM is smaller than the convolution")
    dt = index_dtype(func, (mp * kp, kp * np_, mp * np_), vb.dtype)
    m_iv, n_iv = _iter("vm", mp, dt), _iter("vn", np_, dt)
    k_iv = _iter("vk", kp, dt, IterType.COMM_REDUCE)
    vm, vn, vk = m_iv.var, n_iv.var, k_iv.var
    row = vm if mp == o else tmin(vm, o - 1)
    col = vn if np_ == cols else tmin(vn, cols - 1)
    pixel = {vb: col // hw, vo: row, vy: col // w % h, vx: col % w}
    if taps_outer and channels_inner(c, bk):
        tap = {vc: vk % c, vry: vk // c // kw, vrx: vk // c % kw}
    else:
        tap = {vc: vk // (kh * kw), vry: vk // kw % kh, vrx: vk % kw}
    low = str(wgt.dtype)
    zero = const(low, 0)

    def padded_k(value: PrimExpr) -> PrimExpr:
        return value if kp == big_k else select(vk < big_k, value, zero)

    a_buf = Buffer("conv2d_a", (mp, kp), low)
    b_buf = Buffer("conv2d_b", (kp, np_), low)
    if narrow_pad is not None:
        x_load = BufferLoad(narrow_pad.writes[0].buffer, x_load.indices)
    params = set(func.buffer_map.values())
    c_buf = Buffer("conv2d_gemm" if out in params else out.name, (mp, np_), out.dtype,
                   scope="global" if out in params else out.scope)
    k_data = _iter("vk", kp, dt, var=vk)  # the same variable, spatial in the gathers
    a_blk = Block((m_iv, k_data), (), (), "conv2d_a",
                  BufferStore(a_buf, padded_k(substitute(w_load, {vo: row, **tap})), (vm, vk)))
    b_blk = Block((k_data, n_iv), (), (), "conv2d_b",
                  BufferStore(b_buf, padded_k(substitute(x_load, {**pixel, **tap})), (vk, vn)))
    # the update as the op wrote it (casts of a float32-accumulating conv included), its
    # operands the matrices, A first
    a_term = _Operands({wgt: a_buf[vm, vk]}).visit(w_term)
    b_term = _Operands({src: b_buf[vk, vn]}).visit(x_term) if narrow_pad is None else cast(
        str(src.dtype), b_buf[vk, vn])
    update = c_buf[vm, vn] + a_term * b_term
    gemm = Block((m_iv, n_iv, k_iv), (), (), "conv2d", BufferStore(c_buf, update, (vm, vn)),
                 init=BufferStore(c_buf, const(str(out.dtype), 0), (vm, vn)))
    flat = {out: c_buf}
    stmts: list[Stmt] = []
    for _, realize in nests:
        blk = realize.block
        if blk is conv:
            stmts += [_nest(a_blk), _nest(b_blk), _nest(gemm)]
            if out in params:
                stmts.append(_epilogue_copy(out, c_buf, (m_iv, n_iv), pixel))
            continue
        if not any(r.buffer in flat for r in blk.reads):
            # a producer (the padding)
            stmts.append(_nest(narrow_pad if narrow_pad is not None and
                               blk.writes[0].buffer is src else blk))
            continue
        stmts.append(_nest(_epilogue(blk, flat, params, (m_iv, n_iv), (n, o, h, w), pixel)))
    root = func.body.block
    gone = set(flat) | ({src} if narrow_pad is not None else set())
    narrow = (narrow_pad.writes[0].buffer,) if narrow_pad is not None else ()
    allocs = tuple(b for b in root.alloc_buffers if b not in gone) + narrow + (
        a_buf, b_buf) + tuple(flat.values())
    new_root = root.replace(body=SeqStmt(tuple(stmts)), alloc_buffers=allocs)
    return func.replace(body=func.body.replace(block=new_root))


def _epilogue(blk: Block, flat: dict[Buffer, Buffer], params: set[Buffer],
              mn_ivs: tuple[IterVar, IterVar], shape: tuple[int, int, int, int],
              pixel: dict[Var, PrimExpr]) -> Block:
    """An element-wise consumer of the convolution over ``(m, col)`` (``pixel``: the
    convolution's ``n, o, y, x`` in those); a conv-shaped intermediate it writes becomes 2-D
    (added to ``flat``)."""
    n, o, h, w = shape
    own = tuple(iv.var for iv in blk.iter_vars)
    if blk.init is not None or [as_int(iv.dom.extent) for iv in blk.iter_vars] != [n, o, h, w] \
            or any(iv.iter_type != IterType.DATA_PAR for iv in blk.iter_vars):
        raise ScheduleError(f"conv2d mma: {blk.name_hint} is not an element-wise epilogue")
    (written,) = {r.buffer for r in blk.writes}
    if written not in params:
        if tuple(as_int(s) for s in written.shape) != (n, o, h, w):
            raise ScheduleError(f"conv2d mma: {blk.name_hint} writes another shape")
        shape2 = tuple(as_int(iv.dom.extent) for iv in mn_ivs)
        flat[written] = Buffer(written.name, shape2, written.dtype, scope=written.scope)
    vm, vn = (iv.var for iv in mn_ivs)
    body = _Reshape(flat, own, (vm, vn)).visit(blk.body)
    body = substitute(body, dict(zip(own, pixel.values())))
    return Block(mn_ivs, (), (), blk.name_hint, body, annotations=dict(blk.annotations))


def _epilogue_copy(out: Buffer, c_buf: Buffer, mn_ivs: tuple[IterVar, IterVar],
                   pixel: dict[Var, PrimExpr]) -> Stmt:
    """The NCHW store of a convolution without epilogues (folded into the write-back)."""
    vm, vn = (iv.var for iv in mn_ivs)
    index = tuple(pixel.values())
    return _nest(Block(mn_ivs, (), (), "conv2d_nchw", BufferStore(out, c_buf[vm, vn], index)))


def channels_inner(channels: int, bk: int) -> bool:
    """Whether the GEMM's K runs taps outer, input channels inner (``k = (ry * KW + rx) * C +
    c``): when a reduction step of ``bk`` holds whole runs of channels of one tap (C a multiple
    of ``bk``), so that the step's tap is one value per block and a K index's channel is the
    step's first plus the row in the tile -- no division per gathered element."""
    return channels % bk == 0


#: The largest element count whose indices :func:`index_dtype` computes in int32.
INT32_ELEMENTS = 2 ** 31 - 1


def index_dtype(func: PrimFunc, gemm_sizes: tuple[int, ...], wide: Any) -> Any:
    """int32 for the GEMM's iteration variables when every buffer of ``func`` and every
    matrix of the GEMM (``gemm_sizes``: element counts) has fewer than 2^31 elements -- each
    index, and each quotient and remainder of one, then fits; else ``wide`` (the
    convolution's own, int64). The gathers divide and take remainders of these indices for
    every element: in int32 a division by a constant is one ``mul.hi.s32`` where an int64 one
    is a multi-instruction 64-bit multiply, and the indices take half the registers."""
    sizes = list(gemm_sizes)
    buffers = list(func.buffer_map.values()) + list(func.body.block.alloc_buffers)
    for buf in buffers:
        dims = [as_int(simplify(d)) for d in buf.shape]
        if any(d is None for d in dims):
            return wide
        sizes.append(math.prod(dims))  # type: ignore[arg-type]
    return "int32" if max(sizes) <= INT32_ELEMENTS else wide
