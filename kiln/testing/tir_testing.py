"""Helpers shared by the loop-level tests (tests/tir, tests/codegen): an element-wise function
and a matrix product to schedule, the product's numeric check, and where a lowered function
allocates its buffers."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import te
from ..tir import stmt as S
from ..tir.function import PrimFunc
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
