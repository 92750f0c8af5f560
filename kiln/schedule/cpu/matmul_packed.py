"""CPU schedules of ``matmul_packed`` and ``matmul_vnni`` (``kiln.op.matmul_packed``), and
the layout hook that makes them out of ``matmul``/``dense``.

``matmul_packed``'s schedule is the classic register-blocked GEMM (GotoBLAS' micro-kernel,
written with kiln's schedule primitives): for each block of rows of the left operand that fits
L2 (:data:`GEMM_ROW_BLOCK_BYTES`), each panel of ``nb`` columns (blocks and panels in parallel)
and each tile of :func:`gemm_tile` rows, a ``rows x nb`` tile of the result accumulates in a
local buffer over the whole reduction -- buffer compaction
(``kiln.tir.transform.compact_buffers``) makes it a small stack array, and with the tile loops
unrolled the C compiler keeps it in vector registers -- then is written back, and fused
element-wise consumers (bias, activation, residual) run on the tile while it is in L1.
``matmul_vnni``'s tensorizes the product onto 16x16 AMX tiles
(``kiln.tir.tensor_intrin.x86.tensorize_gemm_amx``); :func:`alter_to_packed` chooses it when
the target has AMX for the dtype and the static shapes fit whole tiles.
"""

from __future__ import annotations

from typing import Any

from ...graph import expr as gx
from ...ir.dtype import as_dtype
from ...ir.errors import ScheduleError
from ...op.layout import LayoutRewrite
from ...op.linalg import const_int
from ...op.matmul_packed import matmul_packed, matmul_vnni
from ...op.shape import reshape
from ...tir.stmt import JAM_TAILS, UNROLL_BY
from ...tir.tensor_intrin.x86 import tensorize_gemm_amx
from ..knobs import knob
from ..registry import register_schedule
from .generic import schedule_reduction
from .loops import (
    block_work,
    loop_extent,
    other_blocks,
    parallel_outer,
    schedule_epilogue,
    tiles_to_fill,
    write_out_tile,
)

#: float32 register tile (rows, columns) per vector length in float32 lanes; the columns are
#: also the width of a packed panel. AVX2 (8 lanes, 16 registers): 6 rows x 2 vectors = 12
#: accumulators (measured best on Zen 3 against 4x16, 8x8 and 4x24). AVX-512 (16 lanes, 32
#: registers): 8 rows x 2 vectors = 16 accumulators, enough independent FMA chains to cover
#: two FMA pipes of 4-cycle latency; against 6 x 1 vector (the AVX2 tile's 16 columns), one
#: dense 1024 -> 1024 layer at batch 64 took 0.80 of the time and 1024^3 0.54 (Zen 5, 2
#: threads, 454 GFLOP/s, 94% of an FMA loop's peak); 6 x 2 vectors 0.83 and 0.55, 12 x 2 and
#: 14 x 2 1.12-1.15 at batch 64 (``benchmarks/ops.py dense``).
GEMM_TILES = {16: (8, 32), 8: (6, 16)}


def gemm_tile(target: Any) -> tuple[int, int]:
    """``(rows, columns)`` of the float32 register tile of ``matmul_packed`` on ``target``
    (:data:`GEMM_TILES`; narrower vectors take the AVX2 tile, which they split into more
    vectors)."""
    lanes = target.vector_lanes("float32")
    return GEMM_TILES.get(lanes, GEMM_TILES[8])


#: Steps of the reduction loop the C compiler unrolls into one iteration (the loop's
#: ``UNROLL_BY`` annotation): 4 steps of the tile's FMAs per iteration took 0.92-0.96 of the time
#: of 1 (1024^3, 2 threads, Zen 3, paired; 8 steps alike). Splitting the loop and unrolling the
#: inner 4 steps in kiln instead took 1.05: GCC then rotated the accumulators through register
#: moves again.
GEMM_K_UNROLL = 4


def _panels_at_once(m: int | None, rows: int, vectors: int, panels: int | None) -> int | None:
    """How many panels a tile of all ``m`` rows x ``vectors`` vectors runs at once, jammed
    (``JAM_TAILS``): enough for :data:`~kiln.op.linalg.TILE_MIN_ACCUMULATORS` (one row of a
    16-column panel has 2), a divisor of the panel count; None for one. Paired calls, a
    one-row 1024 x 1024 layer (+ bias, 2 threads, Zen 3): 0.73 of the time with 4 panels at
    once (2 panels 0.75, 8 panels 0.80); MLP 784-1024-1024-10 at batch 1: 0.84-0.97."""
    if m is None or panels is None or rows < m:
        return None
    need = tiles_to_fill(rows * vectors) or 1
    for p in range(min(need, panels), 1, -1):
        if panels % p == 0:
            return p
    return None


#: Bytes of the left operand's rows that one block of rows keeps in L2 while every panel of
#: the packed operand passes under it (see :func:`row_block_tiles`).
GEMM_ROW_BLOCK_BYTES = 1024 * 1024


def row_block_tiles(m: int | None, rows: int, k: int | None, itemsize: int) -> int | None:
    """Register tiles of rows per block of rows (None: one block of all rows). Without
    blocks, each panel of the packed operand streams the whole left operand through the
    caches again (16 MB per panel at 2048^3); with the rows cut into blocks of
    :data:`GEMM_ROW_BLOCK_BYTES` that stay in L2, every panel passes under a block instead. A
    divisor of the tile count, so no block has a tail."""
    if m is None or k is None or rows < 1:
        return None
    count = -(-m // rows)
    want = max(1, GEMM_ROW_BLOCK_BYTES // (rows * k * itemsize))
    if want >= count:
        return None
    best = next(t for t in range(want, 0, -1) if count % t == 0)
    return best if 2 * best >= want else None


#: Largest panel result (rows x the tile's columns) that fused consumers read back from a
#: buffer once the panel is done, rather than per register tile (see schedule_packed_gemm).
GEMM_PANEL_EPILOGUE_BYTES = 64 * 1024


def schedule_packed_gemm(sch: Any, target: Any, block: Any) -> tuple[Any, Any]:
    """Register-blocked schedule of a block with loops ``batch..., i, j, k`` reading a packed
    operand ``[..., j // nb, k, j % nb]`` (see the module docstring).

    Returns ``(loop for fused consumers, parallel loop or None)``: the consumers of a panel
    run once its rows are done, from a panel-sized buffer (:data:`GEMM_PANEL_EPILOGUE_BYTES`
    at most; larger panels get them per register tile). Run per tile, GCC hoists the
    consumers' loop-invariant operands (a bias vector, the zero of a ReLU) above the
    reduction loop and, short of registers, re-reads the packed operand from memory in every
    FMA: 0.84 of the time for MLP layer 784 -> 1024 at batch 64 and 0.95 for 1024 -> 1024
    with the consumers per panel (paired calls, 2 threads, Zen 3).
    """
    blk = sch.get(block)
    work = block_work(sch, block)
    dtype = blk.writes[0].buffer.dtype
    packed = blk.reads[1].buffer
    nb = const_int(packed.shape[-1])
    *batch, i, j, k = sch.get_loops(block)
    if batch and packed.ndim == 3 and loop_extent(sch, i) is not None:
        # one packed operand for every batch entry: the batch is more rows of one GEMM (with
        # a static row count, so a row's batch index and row stay affine in the fused loop)
        i = sch.fuse(*batch, i)
        batch = []
    m = loop_extent(sch, i)
    rows = knob("gemm_tile_rows", (1, 2, 4, 6, 8, 12), gemm_tile(target)[0])
    mr = rows if m is None else min(rows, m)
    io, ii = sch.split(i, factors=[None, mr]) if mr > 1 else (i, None)
    ib = None
    tiles = row_block_tiles(m, mr, const_int(packed.shape[-2]), as_dtype(dtype).bits // 8)
    if tiles is not None:
        ib, io = sch.split(io, factors=[None, tiles])
    jo, ji = sch.split(j, factors=[None, nb])
    lanes = target.vector_lanes(dtype)
    vec = next((v for v in (lanes, lanes // 2) if v > 1 and nb % v == 0), None)
    jv, jl = (sch.split(ji, factors=[None, vec]) if vec is not None and vec < nb
              else (None, ji))
    # a tile of all of few rows (a batch of 1): several panels at once, jammed
    at_once = _panels_at_once(m, mr, nb // (vec or nb), loop_extent(sch, jo))
    jj = None
    if at_once is not None:
        jo, jj = sch.split(jo, factors=[None, at_once])
    sch.reorder(*batch, *(lp for lp in (ib, jo, jj, io, k, ii, jv) if lp is not None), jl)
    local = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(local, io)
    init = sch.decompose_reduction(block, k)
    sch.annotate(k, UNROLL_BY, knob("gemm_k_unroll", (1, 2, 4, 8), GEMM_K_UNROLL))
    for lp in (ii, jv):
        if lp is not None:
            sch.unroll(lp)
    if vec is not None:
        sch.vectorize(jl)
    for b in (init, local):
        write_out_tile(sch, target, b, io, dtype)
    if jj is not None:
        sch.annotate(jj, JAM_TAILS, at_once)
    par = parallel_outer(sch, [*batch, *(lp for lp in (ib, jo) if lp is not None)], target,
                         work=work)
    panel_bytes = None if m is None else m * nb * as_dtype(dtype).bits // 8
    if panel_bytes is None or panel_bytes > GEMM_PANEL_EPILOGUE_BYTES:
        return io, par
    if jj is not None:
        return jj, par
    try:
        sch.get(jo)
    except ScheduleError:  # fused into the parallel loop
        return (par if par is not None else io), par
    return jo, par


@register_schedule("matmul_packed", "c")
def _schedule(sch: Any, target: Any) -> None:
    rest = other_blocks(sch, {"matmul_packed"})
    at, _ = schedule_packed_gemm(sch, target, sch.get_block("matmul_packed"))
    schedule_epilogue(sch, target, rest, at)


@register_schedule("matmul_vnni", "c")
def _schedule_vnni(sch: Any, target: Any) -> None:
    """AMX tiles when the target has them (16x16 output tiles in parallel), else the generic
    reduction schedule (the same function built for a CPU without AMX)."""
    rest = other_blocks(sch, {"matmul_vnni"})
    block = sch.get_block("matmul_vnni")
    work = block_work(sch, block)
    try:
        outer = tensorize_gemm_amx(sch, block, target)
    except ScheduleError:
        schedule_reduction(sch, target, block)
        schedule_epilogue(sch, target, rest, None)
        return
    par = parallel_outer(sch, sch.get_loops(outer), target, work=work)
    schedule_epilogue(sch, target, rest, par)


_BATCH_LETTERS = "ABCDEFGHIJLMOPQRSTUVWXYZ"  # no K, N


#: Side of an AMX result tile (16 rows x 16 float32/int32 columns).
AMX_TILE = 16


#: input dtype -> (accumulation dtype, VNNI pack factor P, Target property that enables it)
_AMX_KINDS = {"bfloat16": ("float32", 2, "has_amx_bf16"), "int8": ("int32", 4, "has_amx_int8")}


def _alter_to_vnni(call: Any, target: Any, op: str) -> LayoutRewrite | None:
    """bfloat16/int8 products on a target with AMX for that dtype: ``matmul_vnni`` with ``b``
    in the VNNI layout (a constant weight packed at compile time); ``a``'s leading dims are
    folded into the rows. Needs static shapes that fill whole 16x16 tiles."""
    a, b = call.args[0].struct_info, call.args[1].struct_info
    spec = _AMX_KINDS.get(str(a.dtype))
    if spec is None or str(b.dtype) != str(a.dtype) or b.ndim != 2:
        return None
    acc, pack, feature = spec
    if not getattr(target, feature, False) or call.attrs.out_dtype != acc:
        return None
    dims = [const_int(d) for d in a.shape]
    n = const_int(b.shape[0] if op == "dense" else b.shape[1])
    if any(d is None for d in dims) or n is None:
        return None
    k, rows = dims[-1], 1
    for d in dims[:-1]:
        rows *= d
    if rows % AMX_TILE or n % AMX_TILE or k % pack:
        return None
    out_shape = tuple(call.struct_info.shape)
    src = "NK" if op == "dense" else "KN"
    out = _BATCH_LETTERS[: len(out_shape) - 2] + "MN"

    def build(x: Any, bp: Any) -> Any:
        if len(dims) == 2:
            return matmul_vnni(x, bp, out_dtype=acc)
        y = matmul_vnni(reshape(x, (rows, k)), bp, out_dtype=acc)
        return reshape(y, out_shape)

    return LayoutRewrite(inputs=(None, (src, f"KN{pack}k")), output=(out, out), build=build)


def narrow_panel(n: int, target: Any) -> int | None:
    """The widest panel narrower than :func:`gemm_tile`'s columns that is a whole number of
    float32 vectors, else half a vector (at least 4 lanes), and divides ``n`` columns; None
    if none does. For a matrix-vector product with a constant matrix, where the register tile is
    one row anyway: each panel is a contiguous stream, against the unpacked schedule's
    column chunks that read a short piece of every row of the matrix. Classifiers at batch 1
    (AVX-512, 8-column panels, 2 threads, paired per-layer rounds on a busy machine): 0.48
    (0.39-0.57) of the unpacked schedule's time for MobileNetV2's 1280 -> 1000, 0.56
    (0.39-0.81) for ResNet-18's 512 -> 1000."""
    lanes = target.vector_lanes("float32")
    nr = gemm_tile(target)[1]
    widths = [*range(nr - lanes, 0, -lanes), *([lanes // 2] if lanes >= 8 else [])]
    return next((w for w in widths if w > 0 and n % w == 0), None)


def alter_to_packed(call: Any, target: Any, op: str) -> LayoutRewrite | None:
    """On CPUs with AMX, bfloat16/int8 products become ``matmul_vnni`` (see
    :func:`_alter_to_vnni`). A float32 ``matmul(a, b)`` / ``dense(a, w)`` whose column count
    :func:`gemm_tile`'s column count divides becomes ``matmul_packed`` with ``b`` packed
    ``NK{nb}n``. A constant
    ``b`` is packed at compile time, so any row count gains -- a matrix-vector product too: each
    panel is then one contiguous stream (measured: MLP 784-1024-1024-10 at batch 1, 0.135 ms
    against 0.17-0.19 ms unpacked). A computed ``b`` is packed at run time and needs a static
    row count of at least two tiles (or a symbolic one) to pay for it. A constant ``b`` whose
    column count the tile's does not divide, under fewer rows than a tile (a classifier at
    batch 1: 1280 -> 1000), is packed in narrower panels (:func:`narrow_panel`)."""
    a, b = call.args[0].struct_info, call.args[1].struct_info
    if a.shape is None or b.shape is None or a.ndim < 2 or b.ndim < 2:
        return None
    vnni = _alter_to_vnni(call, target, op)
    if vnni is not None:
        return vnni
    if a.dtype != "float32" or b.dtype != "float32" or call.attrs.out_dtype not in (None,
                                                                                     "float32"):
        return None
    if op == "dense":
        if b.ndim != 2:
            return None
        n, src = const_int(b.shape[0]), "NK"
    else:
        n = const_int(b.shape[-1])
        src = _BATCH_LETTERS[: b.ndim - 2] + "KN"
    mr, nr = gemm_tile(target)
    m = const_int(a.shape[-2])
    constant = isinstance(call.args[1], gx.Constant)
    if n is None:
        return None
    if n % nr == 0:
        nb = nr
    elif constant and m is not None and m < mr:
        nb = narrow_panel(n, target)
        if nb is None:
            return None
    else:
        return None
    if not constant and m is not None and m < 2 * mr:
        return None
    dst = src[:-2] + f"NK{nb}n"
    out = _BATCH_LETTERS[: len(call.struct_info.shape) - 2] + "MN"
    out_dtype = call.attrs.out_dtype

    def build(x: Any, bp: Any) -> Any:
        return matmul_packed(x, bp, out_dtype=out_dtype)

    return LayoutRewrite(inputs=(None, (src, dst)), output=(out, out), build=build)
