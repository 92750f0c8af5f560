"""Builders for block-form PrimFuncs written by hand: the inputs and expected outputs of the
schedule tests (int64 indices, float32 data, te's conventions for regions and the root block)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kiln import tir
from kiln.tir import (
    Block,
    BlockRealize,
    BufferRegion,
    BufferStore,
    For,
    ForKind,
    IterType,
    IterVar,
    PrimExpr,
    PrimFunc,
    Range,
    Var,
)


def c(v: int) -> PrimExpr:
    return tir.const("int64", v)


def f32(v: float) -> PrimExpr:
    return tir.const("float32", v)


def var(name: str) -> Var:
    return Var(name, "int64")


def vars_(names: str) -> list[Var]:
    return [var(n) for n in names.split()]


def buf(name: str, shape: Sequence[int | PrimExpr], scope: str = "global") -> tir.Buffer:
    dims = tuple(c(s) if isinstance(s, int) else s for s in shape)
    return tir.decl_buffer(dims, "float32", name, scope)


def point(b: tir.Buffer, *idx: PrimExpr) -> BufferRegion:
    return BufferRegion(b, tuple(Range(i, c(1)) for i in idx))


def iv(v: Var, extent: int | PrimExpr, reduce: bool = False) -> IterVar:
    ext = c(extent) if isinstance(extent, int) else extent
    kind = IterType.COMM_REDUCE if reduce else IterType.DATA_PAR
    return IterVar(Range(c(0), ext), v, kind)


def block(name, ivs, reads, writes, body, init=None, allocs=(), annotations=None) -> Block:
    return Block(tuple(ivs), tuple(reads), tuple(writes), name, body, init, tuple(allocs),
                 dict(annotations or {}))


def realize(values: Sequence[PrimExpr], blk: Block, pred: PrimExpr | None = None
            ) -> BlockRealize:
    return BlockRealize(tuple(values), tir.true_predicate() if pred is None else pred, blk)


def loops(spec: Sequence[tuple], body: tir.Stmt) -> tir.Stmt:
    """Nest ``body`` in loops ``(var, extent[, kind[, annotations]])``, outermost first."""
    for item in reversed(spec):
        v, extent = item[0], item[1]
        kind = item[2] if len(item) > 2 else ForKind.SERIAL
        ann = item[3] if len(item) > 3 else {}
        ext = c(extent) if isinstance(extent, int) else extent
        body = For(v, c(0), ext, kind, body, dict(ann))
    return body


def prim_func(inputs, outputs, stages, allocs=()) -> PrimFunc:
    params, bmap = [], {}
    for b in (*inputs, *outputs):
        p = Var(b.name, "handle")
        params.append(p)
        bmap[p] = b
    root = Block((), (), (), "root", tir.seq(*stages), None, tuple(allocs))
    return PrimFunc(tuple(params), bmap, BlockRealize((), tir.true_predicate(), root))


# ---- the blocks of the test programs ------------------------------------------------------------
def mm_block(A, B, C, n: int, m: int, p: int, name: str = "C") -> Block:
    """``C[i, j] += A[i, k] * B[k, j]`` with init ``C[i, j] = 0``."""
    vi, vj, vk = vars_("vi vj vk")
    return block(
        name, [iv(vi, n), iv(vj, m), iv(vk, p, True)],
        [point(A, vi, vk), point(B, vk, vj)], [point(C, vi, vj)],
        BufferStore(C, C[vi, vj] + A[vi, vk] * B[vk, vj], (vi, vj)),
        init=BufferStore(C, f32(0.0), (vi, vj)),
    )


def ew_block(name: str, src, dst, shape: Sequence[int],
             fn: Callable[[PrimExpr], PrimExpr]) -> Block:
    """``dst[v...] = fn(src[v...])`` over ``shape``."""
    vs = [var(f"v{d}") for d in range(len(shape))]
    return block(
        name, [iv(v, e) for v, e in zip(vs, shape)], [point(src, *vs)], [point(dst, *vs)],
        BufferStore(dst, fn(src[tuple(vs)]), tuple(vs)),
    )


def copy_block(name: str, src, dst, shape: Sequence[int]) -> Block:
    return ew_block(name, src, dst, shape, lambda x: x)


def matmul(n: int = 16, m: int = 16, p: int = 16):
    """The matmul function and its buffers ``(A, B, C)``."""
    A, B, C = buf("A", (n, p)), buf("B", (p, m)), buf("C", (n, m))
    i, j, k = vars_("i j k")
    nest = loops([(i, n), (j, m), (k, p)], realize([i, j, k], mm_block(A, B, C, n, m, p)))
    return prim_func([A, B], [C], [nest]), (A, B, C)


def ew_nest(name: str, src, dst, shape: Sequence[int], fn) -> tir.Stmt:
    lv = [var(f"{name.lower()}{d}") for d in range(len(shape))]
    return loops(list(zip(lv, shape)), realize(lv, ew_block(name, src, dst, shape, fn)))


def chain(n: int = 16, m: int = 16):
    """``B = A + 1; C = B * 2`` (B intermediate) and its buffers ``(A, B, C)``."""
    A, B, C = buf("A", (n, m)), buf("B", (n, m)), buf("C", (n, m))
    f = prim_func(
        [A], [C],
        [ew_nest("B", A, B, (n, m), lambda x: x + f32(1.0)),
         ew_nest("C", B, C, (n, m), lambda x: x * f32(2.0))],
        allocs=[B],
    )
    return f, (A, B, C)


def matmul_relu(n: int = 16, m: int = 16, p: int = 16):
    """``C = A @ B`` (intermediate) then ``D = max(C, 0)``; buffers ``(A, B, C, D)``."""
    A, B, C, D = buf("A", (n, p)), buf("B", (p, m)), buf("C", (n, m)), buf("D", (n, m))
    i, j, k = vars_("i j k")
    mm = loops([(i, n), (j, m), (k, p)], realize([i, j, k], mm_block(A, B, C, n, m, p)))
    relu = ew_nest("D", C, D, (n, m), lambda x: tir.max(x, f32(0.0)))
    return prim_func([A, B], [D], [mm, relu], allocs=[C]), (A, B, C, D)
