"""CPU schedules of ``matmul`` and ``dense`` (``kiln.op.linalg``) when their right operand is
not packed, and their layout preference: on CPUs both become ``matmul_packed`` where the
packed register-tiled GEMM applies (:mod:`.matmul_packed`).

:func:`schedule_gemm` walks the output in blocks of a few rows and, for each ``k``, adds
``A[i, k] * B[k, :]`` to those rows with SIMD vectors along the columns (each vector of ``B``
is loaded once for all rows of the block); the row blocks run in parallel. ``dense`` reads its
weight through the transposed stage ``dense_weight_t``: materialized (:func:`schedule_transpose`)
when there are enough rows to amortize the copy, inlined otherwise (:func:`schedule_gemv`).
"""

from __future__ import annotations

from typing import Any

from ... import tir
from ...op.linalg import const_int
from ..knobs import knob
from ..registry import register_alter_layout, register_schedule
from .generic import schedule_reduction, target_threads
from .loops import (
    block_work,
    loop_extent,
    other_blocks,
    parallel_outer,
    pick_factor,
    schedule_epilogue,
    split_off,
    vector_factor,
)
from .matmul_packed import alter_to_packed

#: Rows of A that share each vector load of B in the GEMM inner loop.
GEMM_ROWS = 4


#: Vectors of C per column chunk: ``GEMM_ROWS`` rows of a chunk (16 KiB of float32 with AVX2)
#: stay in L1 while the rows of B stream past (measured best for 1024^3 on a Zen 3 core).
GEMM_CHUNK_VECTORS = 128


#: Least share of the threads' time a matrix-vector product's column chunks must keep busy
#: (chunks / (threads x the chunks of the busiest thread)).
GEMV_CHUNK_BALANCE = 0.9


def _column_chunk(n: int, lanes: int, want: int, threads: int, outer: int = 1) -> int | None:
    """The widest chunk of whole vectors (at most :data:`GEMM_CHUNK_VECTORS`) that splits ``n``
    columns evenly into at least ``want`` chunks, which ``outer`` x chunks parallel iterations
    share among ``threads`` with at least :data:`GEMV_CHUNK_BALANCE` of them busy (else the
    best-balanced). ``n = 1000`` on 8 lanes and 2 threads: 25 chunks of 5 vectors; 5 chunks
    of 25 left one thread 3 of them, and a 1280 x 1000 classifier at batch 1 took 1.5x ORT's
    time."""
    if n % lanes:
        return None
    vectors = n // lanes
    best: tuple[float, int] | None = None
    for v in range(min(GEMM_CHUNK_VECTORS, vectors // want), 0, -1):
        if vectors % v:
            continue
        total = outer * (vectors // v)
        balance = total / (threads * -(-total // threads))
        if balance >= GEMV_CHUNK_BALANCE:
            return v * lanes
        if best is None or balance > best[0]:
            best = (balance, v)
    return None if best is None else best[1] * lanes


def schedule_gemm(sch: Any, target: Any, block: Any, *, has_i: bool, has_j: bool) -> Any:
    """CPU schedule of ``C[..., i, j] += A[..., i, k] * B[..., k, j]`` (B contiguous in j).

    ``block`` has loops ``batch..., [i], [j], k`` (``i``/``j`` absent for 1-d operands). The
    nest becomes::

        parallel for (batch, io)               # fused
          for jc                               # column chunk of C (128 vectors)
            C[rows, chunk] = 0                 # vectorized
            for k
              for jv                           # vectors of the chunk
                for ii in ROWS (unrolled)      # B[k, jv] loaded once for ROWS rows
                  for ji in LANES (vector)
                    C[i, j] += A[i, k] * B[k, j]

    C accumulates in place. This is the fallback for products AlterOpLayout did not pack
    (a column count 16 does not divide, a computed B with few rows, opt level < 2,
    non-float32): with B
    unpacked, each ``k`` strides a whole row of B, which defeats the register tile that
    ``matmul_packed`` uses. An extent that no vector length divides is not vectorized (a predicated
    vector loop falls back to scalar code anyway); symbolic extents are not split. Returns
    the parallel loop (or None).
    """
    if not has_j:
        return schedule_gemv(sch, target, block)
    blk = sch.get(block)
    work = block_work(sch, block)
    loops = sch.get_loops(block)
    n_sp = sum(iv.iter_type == tir.IterType.DATA_PAR for iv in blk.iter_vars)
    spatial, red = loops[:n_sp], loops[n_sp:]
    if not red:  # an empty inner dimension: the block only stores zeros
        return parallel_outer(sch, spatial, target, work=work)
    dtype = blk.writes[0].buffer.dtype
    n_batch = n_sp - int(has_i) - 1
    batch, j = spatial[:n_batch], spatial[-1]
    if loop_extent(sch, j) == 1 and dtype.is_float:
        # one column (a batch of matrix-vector products: an MoE layer's gathered experts, each
        # applied to one token): the vectors run along k, contiguous in both operands -- the
        # reduction schedule's vector partial sums (the loops below had no axis to vectorize:
        # 7 GFLOP/s on mixtral's 64 x (256x64 @ 64x1))
        schedule_reduction(sch, target, block)
        return None
    io, ii = (spatial[n_batch], None) if has_i else (None, None)
    if io is not None:
        m_ext = loop_extent(sch, io)
        if m_ext is not None and m_ext > 1:
            rows = knob("gemm_rows", (1, 2, 4, 6, 8), GEMM_ROWS)
            io, ii = sch.split(io, factors=[None, min(rows, m_ext)])
    n_ext = loop_extent(sch, j)
    lanes = vector_factor(target, dtype, n_ext)
    jc = jv = ji = None
    if lanes is not None:
        chunk = pick_factor(n_ext, [lanes * knob("gemm_chunk_vectors", (16, 32, 64, 128, 256),
                                                 GEMM_CHUNK_VECTORS)])
        outer_ext = 1
        for lp in [*batch] + ([io] if io is not None else []):
            # a symbolic extent (a dynamic batch) may be 1 at run time
            outer_ext *= loop_extent(sch, lp) or 1
        if getattr(target, "num_threads", 0) != 1:
            # few rows (a matrix-vector product): the column chunks are what the threads
            # share, so make enough of them (a classifier at a dynamic batch of 1 ran on one
            # thread: 1.6x the time of the static build's)
            threads = target_threads(target)
            want = -(-2 * threads // outer_ext)
            if want > 1 and (chunk is None or n_ext // chunk < want):
                chunk = _column_chunk(n_ext, lanes, want, threads, outer_ext) or chunk
        if chunk is not None and chunk < n_ext:
            jc, j = sch.split(j, factors=[None, chunk])
        jv, ji = sch.split(j, factors=[None, lanes])
    else:
        jv = j
    k_outer = red[0]
    order = [*batch, *(lp for lp in (io, jc) if lp is not None), *red, jv]
    order += [lp for lp in (ii, ji) if lp is not None]
    sch.reorder(*order)
    init = sch.decompose_reduction(block, k_outer)
    if ii is not None:
        sch.unroll(ii)
    if ji is not None:
        sch.vectorize(ji)
        sch.vectorize(sch.get_loops(init)[-1])
    # batch, row blocks, then column chunks (adjacent in the nest): as many as the threads need
    outer = [*batch] + [lp for lp in (io, jc) if lp is not None]
    return parallel_outer(sch, outer, target, work=work)


#: Side of the square tiles a transposition copies (both sides touch TILE cache lines).
TRANSPOSE_TILE = 16


def schedule_transpose(sch: Any, target: Any, block: Any) -> None:
    """CPU schedule of a 2-d transposition ``out[k, j] = in[j, k]``: square tiles, so reads
    and writes both stay within a few cache lines, parallel over rows of tiles."""
    k, j = sch.get_loops(block)
    ko, ki = split_off(sch, k, pick_factor(loop_extent(sch, k), [TRANSPOSE_TILE]))
    jo, ji = split_off(sch, j, pick_factor(loop_extent(sch, j), [TRANSPOSE_TILE]))
    if ki is not None and ji is not None:
        sch.reorder(ko, jo, ki, ji)
    parallel_outer(sch, [ko], target, work=block_work(sch, block))


def schedule_gemv(sch: Any, target: Any, block: Any) -> Any:
    """CPU schedule of a reduction whose output axes are not contiguous in both operands.

    The spatial loops are fused and run in parallel; the reduction runs innermost, serially,
    with its init hoisted out of the reduction loop. Returns the parallel loop (or None).
    """
    blk = sch.get(block)
    work = block_work(sch, block)
    loops = sch.get_loops(block)
    n_sp = sum(iv.iter_type == tir.IterType.DATA_PAR for iv in blk.iter_vars)
    spatial, red = loops[:n_sp], loops[n_sp:]
    if red and spatial:
        sch.decompose_reduction(block, red[0])
    if not spatial:
        return None
    return parallel_outer(sch, spatial, target, min_chunks=1 << 30, work=work)


@register_schedule("matmul", "c")
def _schedule_matmul(sch: Any, target: Any) -> None:
    a, b = (sch.func.buffer_map[p] for p in sch.func.params[:2])
    rest = other_blocks(sch, {"matmul"})
    at = schedule_gemm(sch, target, sch.get_block("matmul"), has_i=a.ndim > 1, has_j=b.ndim > 1)
    schedule_epilogue(sch, target, rest, at)


@register_alter_layout("matmul", "c")
def _alter_matmul_c(call: Any, target: Any) -> Any:
    return alter_to_packed(call, target, "matmul")


#: Rows of ``data`` from which materializing the transposed weight pays for itself.
DENSE_TRANSPOSE_MIN_ROWS = 8


@register_schedule("dense", "c")
def _schedule_dense(sch: Any, target: Any) -> None:
    x = sch.func.buffer_map[sch.func.params[0]]
    rows: int | None = 1
    for d in x.shape[:-1]:
        rows = rows * const_int(d) if rows is not None and const_int(d) is not None else None
    rest = other_blocks(sch, {"dense", "dense_weight_t"})
    wt = sch.get_block("dense_weight_t")
    block = sch.get_block("dense")
    if rows is not None and rows < DENSE_TRANSPOSE_MIN_ROWS:
        sch.compute_inline(wt)
        at = schedule_gemv(sch, target, block)
    else:
        schedule_transpose(sch, target, wt)
        at = schedule_gemm(sch, target, block, has_i=x.ndim > 1, has_j=True)
    schedule_epilogue(sch, target, rest, at)


@register_alter_layout("dense", "c")
def _alter_dense_c(call: Any, target: Any) -> Any:
    return alter_to_packed(call, target, "dense")
