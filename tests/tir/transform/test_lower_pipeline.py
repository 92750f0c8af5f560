"""lower(): the whole pass sequence on scheduled te functions."""

from __future__ import annotations

from kiln import te, tir
from kiln.tir.schedule import Schedule
from kiln.tir.transform import LOWERED_ATTR, is_lowered, lower


def _nodes(stmt):
    found = []
    tir.post_order_visit(stmt, found.append)
    return found


def _scheduled_softmax_like():
    n = tir.Var("n", "int64")
    A = te.placeholder((n, 32), "float32", name="A")
    k = te.reduce_axis((0, 32), name="k")
    M = te.compute((n,), lambda i: te.max(A[i, k], axis=k), name="M")
    E = te.compute((n, 32), lambda i, j: tir.tanh(A[i, j] - M[i]), name="E")
    O = te.compute((n, 32), lambda i, j: E[i, j] * 0.5 + A[i, j], name="O")
    sch = Schedule(te.create_prim_func([A, O]))
    i, j = sch.get_loops(sch.get_block("O"))
    jo, ji = sch.split(j, factors=[None, 8])
    sch.parallel(i)
    sch.vectorize(ji)
    i2, j2 = sch.get_loops(sch.get_block("E"))
    sch.vectorize(j2)
    return sch.func


def test_lowered_function_is_codegen_ready():
    func = _scheduled_softmax_like()
    out = lower(func, "c")
    assert is_lowered(out) and out.attrs[LOWERED_ATTR] is True
    nodes = _nodes(out.body)
    names = {type(n).__name__ for n in nodes}
    assert not names & {"Block", "BlockRealize"}
    for n in nodes:
        if isinstance(n, (tir.BufferLoad, tir.BufferStore)):
            assert len(n.indices) == 1, "every access is flat"
    assert "Ramp" in names  # O's inner loop became vector ops
    loops = [n for n in nodes if isinstance(n, tir.For)]
    assert any(lp.kind == tir.ForKind.PARALLEL for lp in loops)
    assert not any(lp.kind == tir.ForKind.VECTORIZED for lp in loops)
    # E's loop (tanh, no vector form) stays scalar but is marked for `#pragma omp simd`
    assert any(lp.annotations.get("kiln.simd") for lp in loops)
    # parameters keep their N-D buffers
    assert [b.ndim for b in out.buffers] == [2, 2]


def test_lower_is_idempotent():
    out = lower(_scheduled_softmax_like())
    assert lower(out) is out
