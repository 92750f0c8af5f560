"""Helpers shared by the loop-level tests (tests/tir, tests/codegen): an element-wise function
and a matrix product to schedule, the product's numeric check, and where a lowered function
allocates its buffers."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import te, tir
from ..codegen import c as codegen_c
from ..ir.dtype import DataType
from ..tir import stmt as S
from ..tir.expr import Var
from ..tir.function import PrimFunc
from ..tir.gpu import atomic_add
from ..tir.schedule import Schedule


def elementwise_func(shape: Any, dtype: str, fcompute: Any, nin: int = 1, name: str = "out",
                     vectorize: int | None = None, parallel: bool = False,
                     in_dtypes: Any = None) -> PrimFunc:
    """``name = fcompute(*inputs)`` over ``shape`` (inputs ``x0``, ``x1``... of ``dtype`` or
    ``in_dtypes``), its innermost loop split by ``vectorize`` and vectorized, its outermost loop
    parallel when asked."""
    ins = [te.placeholder(shape, (in_dtypes or [dtype] * nin)[k], name=f"x{k}")
           for k in range(nin)]
    out = te.compute(shape, lambda *idx: fcompute(*[x[idx] for x in ins]), name=name)
    func = te.create_prim_func([*ins, out])
    if vectorize is None and not parallel:
        return func
    sch = Schedule(func)
    loops = list(sch.get_loops(sch.get_block(name)))
    if vectorize:
        outer, inner = sch.split(loops[-1], factors=[None, vectorize])
        sch.vectorize(inner)
        loops[-1] = outer
    if parallel:
        sch.parallel(loops[0])
    return sch.func


def matmul_func(m: int, n: int, k: int) -> PrimFunc:
    """``C[m, n] = A[m, k] @ B[k, n]`` in float32, block ``"C"`` with reduction axis ``r``."""
    a = te.placeholder((m, k), "float32", name="A")
    b = te.placeholder((k, n), "float32", name="B")
    r = te.reduce_axis((0, k), name="r")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")
    return te.create_prim_func([a, b, c])


def check_matmul(mod: Any, name: str, m: int, n: int, k: int, rng: np.random.Generator) -> None:
    """Run ``mod[name](A, B, C)`` on random operands and compare C (NaN-filled first, so an
    element left unwritten fails) with numpy's product."""
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    c = np.full((m, n), np.nan, np.float32)
    mod[name](a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5)


def allocations(stmt: Any) -> list[tuple[str, tuple[int, ...], tuple[str, ...]]]:
    """``(buffer name, shape, enclosing loop variable names)`` of every Allocate under
    ``stmt``, outermost first."""
    out: list[tuple[str, tuple[int, ...], tuple[str, ...]]] = []

    def walk(s: Any, loops: tuple[str, ...]) -> None:
        if isinstance(s, S.Allocate):
            out.append((s.buffer.name, tuple(int(d.value) for d in s.buffer.shape), loops))
            walk(s.body, loops)
        elif isinstance(s, S.For):
            walk(s.body, (*loops, s.loop_var.name))
        elif isinstance(s, S.SeqStmt):
            for part in s.seq:
                walk(part, loops)
        elif isinstance(s, S.BlockRealize):
            walk(s.block.body, loops)
        elif isinstance(s, S.IfThenElse):
            walk(s.then_case, loops)
            if s.else_case is not None:
                walk(s.else_case, loops)
        elif hasattr(s, "body"):
            walk(s.body, loops)

    walk(stmt, ())
    return out


# ---- GPU schedules written by hand (tests/tir/transform, tests/codegen, tests/runtime) ---------
def gpu_row_reduce_func(rows: Any, cols: Any, dtype: str = "float32", threads: int = 128,
                        reducer: str = "sum", rows_per_block: int = 1) -> PrimFunc:
    """``out[i] = reduce(x[i, :])`` with ``threads`` threads of ``threadIdx.x`` per row (a
    cross-thread reduction) and ``rows_per_block`` rows per block on ``threadIdx.y``."""
    x = te.placeholder((rows, cols), dtype, name="x")
    k = te.reduce_axis((0, cols), name="k")
    fn = {"sum": te.sum, "max": te.max, "min": te.min}[reducer]
    out = te.compute((rows,), lambda i: fn(x[i, k], axis=k), name="out")
    sch = Schedule(te.create_prim_func([x, out]))
    i, r = sch.get_loops(sch.get_block("out"))
    ro, ri = sch.split(r, [None, threads])
    sch.reorder(ri, ro)
    if rows_per_block > 1:
        bo, bi = sch.split(i, [None, rows_per_block])
        sch.bind(bo, "blockIdx.x")
        sch.bind(bi, "threadIdx.y")
    else:
        sch.bind(i, "blockIdx.x")
    sch.bind(ri, "threadIdx.x")
    return sch.func


def gpu_tiled_matmul_func(m: int, n: int, k: int, tile: int = 16) -> PrimFunc:
    """``C = A @ B`` (float32) tiled for a GPU: a ``tile x tile`` block of threads per output
    tile, the tiles of A and B staged in shared memory by all threads of the block once per
    step of the reduction (loads and barriers, the shape of every shared-memory GEMM)."""
    sch = Schedule(matmul_func(m, n, k))
    c = sch.get_block("C")
    i, j, r = sch.get_loops(c)
    io, ii = sch.split(i, [None, tile])
    jo, ji = sch.split(j, [None, tile])
    ko, ki = sch.split(r, [None, tile])
    sch.reorder(io, jo, ko, ii, ji, ki)
    sch.bind(io, "blockIdx.y")
    sch.bind(jo, "blockIdx.x")
    sch.bind(ii, "threadIdx.y")
    sch.bind(ji, "threadIdx.x")
    for index in (0, 1):
        cache = sch.cache_read(c, index, "shared")
        sch.compute_at(cache, ko)
        a0, a1 = sch.get_loops(cache)[-2:]
        sch.bind(a0, "threadIdx.y")
        sch.bind(a1, "threadIdx.x")
    return sch.func


def gpu_scatter_add_func(dtype: str, n: int = 1000, m: int = 16) -> PrimFunc:
    """``out[idx[i]] += val[i]`` with one thread per i: atomics (an opaque block written by
    hand), split over blocks of 128 threads (the last one partly guarded)."""
    idx = tir.decl_buffer((n,), "int32", "idx")
    val = tir.decl_buffer((n,), dtype, "val")
    out = tir.decl_buffer((m,), dtype, "out")
    i = tir.Var("i", "int64")
    scatter = tir.Block((), (), (), "scatter",
                        atomic_add(out, [tir.cast("int64", idx[i])], val[i]))
    body = tir.For(i, 0, n, tir.ForKind.SERIAL,
                   tir.BlockRealize((), tir.const("bool", True), scatter))
    root = tir.BlockRealize((), tir.const("bool", True), tir.Block((), (), (), "root", body))
    handles = [tir.Var(b.name, "handle") for b in (idx, val, out)]
    sch = Schedule(tir.PrimFunc(tuple(handles), dict(zip(handles, (idx, val, out))), root))
    (loop,) = sch.get_loops(sch.get_block("scatter"))
    bo, bi = sch.split(loop, [None, 128])
    sch.bind(bo, "blockIdx.x")
    sch.bind(bi, "threadIdx.x")
    return sch.func


def loop_func(buffers: list[Any], body: Any, name: str = "f") -> PrimFunc:
    """A hand-written loop-form PrimFunc over ``buffers`` (inputs then outputs, each a handle
    parameter), for the tests of loop passes that state their IR before and after."""
    params = [Var(b.name, DataType("handle")) for b in buffers]
    return PrimFunc(tuple(params), dict(zip(params, buffers)), body,
                    {"global_symbol": name})


def run_c(func: PrimFunc, arrays: list[np.ndarray]) -> list[np.ndarray]:
    """Build ``func`` for the C target and run it on copies of ``arrays`` (one per buffer
    parameter); the arrays after the run."""
    out = [np.array(a, copy=True) for a in arrays]
    mod = codegen_c.build({"f": func})
    mod["f"](*out)
    return out
