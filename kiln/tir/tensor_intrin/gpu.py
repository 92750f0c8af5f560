"""GPU tensor intrinsics: the tensor cores' ``mma.sync.m16n8k16``, described per thread.

A warp's ``mma.sync.aligned.m16n8k16`` multiplies a 16 x 16 tile of A by a 16 x 8 tile of B
into a 16 x 8 float32 accumulator held across its 32 lanes: lane ``4 g + t`` (``g < 8``,
``t < 4``) holds accumulator rows ``g`` and ``g + 8``, columns ``2 t`` and ``2 t + 1`` (PTX ISA,
"Matrix Fragments for mma.m16n8k16"). Seen from one thread that is a 2 x 2 x 16 product of its
own:

- ``gpu.mma_m16n8k16.<dt>.lanecols<L>``: ``C[2, 2] (float32) += A[2, 16] (dt) @ B[16, 2] (dt)``,
  ``dt`` float16 or bfloat16, ``C`` in ``local`` (registers), ``A`` and ``B`` in ``shared``
  memory, every row stride free.

The schedule that tensorizes a GEMM onto it (:func:`kiln.schedule.gpu.linalg.schedule_mma_gemm`)
gives each thread such a product by splitting the output rows as ``(..., g, rows of the
thread)`` and the columns as ``(..., t, columns of the thread)``, with ``g`` and ``t`` fused
into ``threadIdx.x`` (32 lanes, ``g`` outer): the two rows of a thread's product are the
accumulator rows ``g`` and ``g + 8`` of one ``mma`` and its two columns are ``2 t`` and
``2 t + 1``. Which rows and columns of the GEMM these are is the schedule's choice (a thread's
rows and columns are adjacent, so its accumulators form one dense register tile); the
instruction only needs every lane's part of the operands, and B's column ``n`` of the
``mma`` is the column of lane ``t = n // 2``'s product: ``L`` elements after lane ``t - 1``'s
(the columns of a thread's whole register tile), a constant of the intrinsic.

The impl is one ``Call`` of :data:`MMA_SYNC` (args: dtype name, the addresses of ``C[0, 0]``,
``A[0, 0]``, ``B[0, 0]``, the row strides of C, A, B, then ``L``, and a 1 for the variant
whose fragments CUDA loads with ``ldmatrix``, :func:`register_mma_intrinsic`). The GPU code
generator
writes it as inline PTX on CUDA (a warp-collective instruction: every lane of the warp calls
it with the same ``L`` and B row) and as the thread's own 2 x 2 x 16 loop in OpenCL C, which
is what PoCL runs in CI: the same schedule, the same data movement, each lane computing the
values the instruction gives it.
"""

from __future__ import annotations

from ..buffer import Buffer
from ..expr import Call, IterType, IterVar, PrimExpr, Range, StringImm, Var, cast, const
from ..function import PrimFunc
from ..stmt import Block, BlockRealize, BufferStore, Evaluate, For, ForKind, Stmt
from .intrin import address_of, get, names, register
from .wgmma import SharedOperand

__all__ = ["MMA_DTYPES", "MMA_K", "MMA_SYNC", "MMA_TILE", "WGMMA", "mma_intrin_name",
           "mma_tile_intrin_name", "register_mma_intrinsic", "register_mma_tile_intrinsic",
           "register_wgmma_intrinsic", "wgmma_intrin_name"]

#: ``Call`` op of the per-thread view of ``mma.sync.m16n8k16`` (see the module docstring).
MMA_SYNC = "gpu.mma_sync"
#: ``Call`` op of a warp's whole register tile per 16-deep step (``MI x NI`` ``mma``, their
#: fragments loaded once by ``ldmatrix``: :func:`register_mma_tile_intrinsic`).
MMA_TILE = "gpu.mma_tile"
#: ``Call`` op of a thread's part of a warpgroup's ``wgmma.mma_async`` for a whole step of the
#: reduction (:func:`register_wgmma_intrinsic`).
WGMMA = "gpu.wgmma"
#: Operand dtypes the tensor cores multiply (into float32).
MMA_DTYPES = ("float16", "bfloat16")
#: The reduction extent of one ``mma`` (and of the intrinsic).
MMA_K = 16
I64 = "int64"


def mma_intrin_name(dtype: str, lane_cols: int, ldmatrix: bool = False) -> str:
    """The registered name of the intrinsic for operands of ``dtype`` whose threads hold
    ``lane_cols`` accumulator columns each (``ldmatrix``: the variant whose fragments are loaded
    by ``ldmatrix`` from permuted tiles, see :func:`register_mma_intrinsic`)."""
    return f"gpu.mma_m16n8k16.{dtype}.lanecols{lane_cols}" + (".ldmatrix" if ldmatrix else "")


def _func(buffers: list[Buffer], body: Stmt) -> PrimFunc:
    params = [Var(b.name, "handle") for b in buffers]
    root = Block((), (), (), "root", body)
    return PrimFunc(params, dict(zip(params, buffers)), BlockRealize((), const("bool", 1), root))


def _buffers(dtype: str, rows: int = 2, cols: int = 2, b_rows_n: bool = False,
             depth: int = MMA_K) -> list[Buffer]:
    """C, A and B of a per-thread description; ``b_rows_n``: B indexed ``[n, k]`` (a dense
    weight's rows), not ``[k, n]``."""
    ldc, lda, ldb = (Var(n, I64) for n in ("ldc", "lda", "ldb"))
    one = const(I64, 1)
    b_shape = (cols, depth) if b_rows_n else (depth, cols)
    return [Buffer("C", (rows, cols), "float32", strides=(ldc, one), scope="local"),
            Buffer("A", (rows, depth), dtype, strides=(lda, one), scope="shared"),
            Buffer("B", b_shape, dtype, strides=(ldb, one), scope="shared")]


def _desc(C: Buffer, A: Buffer, B: Buffer, rows: int = 2, cols: int = 2,
          b_rows_n: bool = False, depth: int = MMA_K) -> PrimFunc:
    loops = [Var(n, I64) for n in ("i", "j", "k")]
    kinds = (IterType.DATA_PAR, IterType.DATA_PAR, IterType.COMM_REDUCE)
    extents = (rows, cols, depth)
    ivs = [IterVar(Range(const(I64, 0), const(I64, e)), Var(f"v{lv.name}", I64), kind)
           for lv, e, kind in zip(loops, extents, kinds)]
    vi, vj, vk = (iv.var for iv in ivs)
    b = B[vj, vk] if b_rows_n else B[vk, vj]
    value: PrimExpr = C[vi, vj] + cast("float32", A[vi, vk]) * cast("float32", b)
    stmt: Stmt = BlockRealize(tuple(loops), const("bool", 1),
                              Block(tuple(ivs), (), (), "update", BufferStore(C, value, (vi, vj))))
    for lv, e in reversed(list(zip(loops, extents))):
        stmt = For(lv, const(I64, 0), const(I64, e), ForKind.SERIAL, stmt)
    return _func([C, A, B], stmt)


def _impl(C: Buffer, A: Buffer, B: Buffer, dtype: str, lane_cols: int, ldmatrix: bool
          ) -> PrimFunc:
    args = (StringImm(dtype), address_of(C, 0, 0), address_of(A, 0, 0), address_of(B, 0, 0),
            C.strides[0], A.strides[0], B.strides[0], const(I64, lane_cols))
    call = Call("int32", MMA_SYNC, args + ((const(I64, 1),) if ldmatrix else ()))
    return _func([C, A, B], Evaluate(call))


def register_mma_intrinsic(dtype: str, lane_cols: int, ldmatrix: bool = False) -> str:
    """Register (once) the intrinsic of ``dtype`` operands and ``lane_cols`` columns per
    thread; returns its name. ``ldmatrix``: the impl's call gets a ninth argument, 1, and CUDA
    loads A's fragments with ``ldmatrix.x4``, which needs A's tile laid out so that an
    ``mma``'s 16 rows are consecutive, the lane's second row 8 rows after its first (the
    intrinsic's row stride is then 8 of the tile's rows: ``lda / 8`` is the tile's), every row
    16-byte aligned: the layout ``kiln.schedule.gpu.linalg.schedule_mma_gemm`` asks
    ``permute_layout`` for."""
    if dtype not in MMA_DTYPES:
        raise ValueError(f"mma.sync multiplies {', '.join(MMA_DTYPES)}, not {dtype}")
    if lane_cols < 2 or lane_cols % 2:
        raise ValueError(f"mma: a thread holds an even number of columns, not {lane_cols}")
    name = mma_intrin_name(dtype, lane_cols, ldmatrix)
    if name not in names():
        # one set of buffers for both: the stride variables the impl passes are the desc's,
        # which tensorize binds to element-offset differences (right after compaction)
        C, A, B = _buffers(dtype)
        register(name, _desc(C, A, B), _impl(C, A, B, dtype, lane_cols, ldmatrix))
    return get(name).name


def mma_tile_intrin_name(dtype: str, mi: int, ni: int) -> str:
    """The registered name of the warp-tile intrinsic (:func:`register_mma_tile_intrinsic`)."""
    return f"gpu.mma_tile_m16n8k16.{dtype}.{mi}x{ni}"


def register_mma_tile_intrinsic(dtype: str, mi: int, ni: int) -> str:
    """Register (once) a thread's part of a warp's ``16 MI x 8 NI`` register tile for one
    16-deep step, ``C[2 MI, 2 NI] (float32) += A[2 MI, 16] @ B[16, 2 NI]``; returns its name.

    Per-``mma`` tensorization (:func:`register_mma_intrinsic`) loads each lane's fragments
    again for every ``mma`` that uses them, unless the compiler shares the plain loads (it does
    not share ``ldmatrix``, an ``asm volatile``); a warp then reads 4 shared-memory wavefronts
    of A and 4 of B per ``mma``. This intrinsic covers the whole step: CUDA loads each ``mma``
    row block of A once (``ldmatrix.x4``) and each pair of column blocks of B once
    (``ldmatrix.x4.trans``) into registers, then issues the ``MI x NI`` ``mma`` -- 4 wavefronts
    per row block and per pair of column blocks (a 64 x 64 warp tile: one per ``mma``).

    The layouts it needs (what ``kiln.schedule.gpu.linalg.schedule_mma_gemm`` asks
    ``permute_layout`` for): A's tile rows in the ``mma`` row order (a thread's logical row
    ``i`` is tile row ``8 i`` after its first, so the intrinsic's A row stride is 8 tile rows),
    B's columns ordered (warp, ``mma`` column block, lane ``t``, ``e``) so each block's 8
    columns are consecutive (a thread's logical column ``2 n + e`` is ``8 n + e`` after its
    first; the desc's unit column stride is this convention's, not a memory stride), rows of
    both 16-byte aligned and an odd number of 16-byte units apart (conflict-free ``ldmatrix``).
    OpenCL computes the thread's ``2 MI x 2 NI`` outputs in float32 through the same layouts."""
    if dtype not in MMA_DTYPES:
        raise ValueError(f"mma.sync multiplies {', '.join(MMA_DTYPES)}, not {dtype}")
    if mi < 1 or ni < 1:
        raise ValueError(f"mma tile: {mi} x {ni} mma per warp")
    name = mma_tile_intrin_name(dtype, mi, ni)
    if name not in names():
        C, A, B = _buffers(dtype, 2 * mi, 2 * ni)
        args = (StringImm(dtype), address_of(C, 0, 0), address_of(A, 0, 0),
                address_of(B, 0, 0), C.strides[0], A.strides[0], B.strides[0],
                const(I64, mi), const(I64, ni))
        register(name, _desc(C, A, B, 2 * mi, 2 * ni),
                 _func([C, A, B], Evaluate(Call("int32", MMA_TILE, args))))
    return get(name).name


def wgmma_intrin_name(dtype: str, mi: int, nj: int, a: SharedOperand, b: SharedOperand,
                      depth: int = MMA_K) -> str:
    """The registered name of the warpgroup intrinsic (:func:`register_wgmma_intrinsic`)."""
    return (f"gpu.wgmma_m64n{8 * nj}k16.{dtype}.x{mi}.k{depth}.a{a.major}{a.lbo}_{a.sbo}"
            f".b{b.major}{b.lbo}_{b.sbo}")


def register_wgmma_intrinsic(dtype: str, mi: int, nj: int, a: SharedOperand,
                             b: SharedOperand, depth: int = MMA_K) -> str:
    """Register (once) a thread's part of ``MI`` ``wgmma.mma_async.m64n<8 NJ>k16`` of its
    warpgroup for each 16 of a ``depth``-deep step, ``C[2 MI, 2 NJ] (float32) += A[2 MI,
    depth] @ B[depth, 2 NJ]``; returns its name. One call covers a whole shared stage: CUDA
    issues its ``depth / 16 x MI`` products back to back in one commit group and waits once.

    The accumulator fragment of ``m64nNk16`` is the ``mma.m16n8`` one per warp and column
    block: warp ``w`` of the warpgroup holds rows ``16 w`` to ``16 w + 15``, lane ``4 g + t``
    rows ``16 w + g`` and ``16 w + g + 8``, columns ``8 j + 2 t`` and ``8 j + 2 t + 1`` of
    every block ``j`` (PTX ISA, "Matrix Fragments for wgmma.m64nNk16"). A thread's logical
    rows ``(m, h)`` (``m`` < MI: which of the warpgroup's 64-row products) and columns
    ``(j, e)`` form one dense register tile; the shared layouts put logical row ``(m, h)`` of
    lane group ``g`` of warp ``w`` at row ``16 w + 8 h + g`` of product ``m`` and logical
    column ``(j, e)`` of lane ``t`` at column ``8 j + 2 t + e``, which is what the operands
    ``a`` and ``b`` (:mod:`kiln.tir.tensor_intrin.wgmma`, their LBO/SBO constants of the
    intrinsic) describe. The impl is one ``Call`` of :data:`WGMMA` (dtype, the addresses of
    ``C[0, 0]``, ``A[0, 0]``, ``B[0, 0]``, the row strides of C, A, B, ``MI``, ``NJ``, then
    A's major (0 K, 1 MN), LBO, SBO, B's, and ``depth``): CUDA finds its warpgroup's
    descriptors from the thread's own elements, OpenCL reads every element through the same
    address arithmetic.
    As with the warp tile, the desc's unit strides along K and the columns are a convention,
    not memory strides. A K-major ``b`` (a ``dense`` weight ``W[n, k]``, ``imm-trans-b`` 0)
    gets the description whose B is indexed ``[n, k]``: ``B[16, 2 NJ]`` becomes
    ``B[2 NJ, 16]`` (``ldb`` then steps between the thread's columns)."""
    if dtype not in MMA_DTYPES:
        raise ValueError(f"wgmma multiplies {', '.join(MMA_DTYPES)}, not {dtype}")
    if mi < 1 or not 1 <= nj <= 32 or depth < MMA_K or depth % MMA_K:
        raise ValueError(f"wgmma: {mi} products of 64 x {8 * nj} (N from 8 to 256), "
                         f"{depth} deep (a multiple of 16)")
    name = wgmma_intrin_name(dtype, mi, nj, a, b, depth)
    if name not in names():
        rows_n = b.major == "k"
        C, A, B = _buffers(dtype, 2 * mi, 2 * nj, rows_n, depth)
        args = (StringImm(dtype), address_of(C, 0, 0), address_of(A, 0, 0),
                address_of(B, 0, 0), C.strides[0], A.strides[0], B.strides[0],
                *(const(I64, v) for v in (mi, nj, a.transposed, a.lbo, a.sbo, b.transposed,
                                          b.lbo, b.sbo, depth)))
        register(name, _desc(C, A, B, 2 * mi, 2 * nj, rows_n, depth),
                 _func([C, A, B], Evaluate(Call("int32", WGMMA, args))))
    return get(name).name
