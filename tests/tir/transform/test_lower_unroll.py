"""unroll_loops: small constant unrolled loops are written out; large ones and bodies that
declare something keep the loop (and get GCC's unroll pragma at codegen)."""

from __future__ import annotations

from kiln import tir
from kiln.tir.transform import simplify
from kiln.tir.transform.unroll_loops import MAX_COPIES, unroll_loops

F32 = "float32"


def c64(v):
    return tir.const("int64", v)


def _func(body, *buffers):
    params = [tir.Var(b.name, "handle") for b in buffers]
    return tir.PrimFunc(params, dict(zip(params, buffers)), body)


def _stores(func):
    out = []
    tir.post_order_visit(func.body, lambda n: out.append(n)
                         if isinstance(n, tir.BufferStore) else None)
    return out


def _loops(func):
    out = []
    tir.post_order_visit(func.body, lambda n: out.append(n) if isinstance(n, tir.For) else None)
    return out


def test_nested_unrolled_tile_is_written_out_with_constant_offsets():
    A = tir.decl_buffer((c64(64),), F32, "A")
    k, ii, jj = (tir.Var(n, "int64") for n in ("k", "ii", "jj"))
    store = tir.BufferStore(A, tir.BufferLoad(A, (ii * 4 + jj,)) + 1.0, (ii * 4 + jj,))
    inner = tir.For(jj, c64(0), c64(4), tir.ForKind.UNROLLED, store)
    mid = tir.For(ii, c64(0), c64(3), tir.ForKind.UNROLLED, inner)
    func = _func(tir.For(k, c64(0), c64(8), tir.ForKind.SERIAL, mid), A)
    out = simplify(unroll_loops(func))
    assert [lp.loop_var.name for lp in _loops(out)] == ["k"]
    assert sorted(int(s.indices[0].value) for s in _stores(out)) == list(range(12))


def test_large_or_declaring_loops_are_kept():
    A = tir.decl_buffer((c64(1024),), F32, "A")
    i = tir.Var("i", "int64")
    big = _func(tir.For(i, c64(0), c64(MAX_COPIES + 1), tir.ForKind.UNROLLED,
                        tir.BufferStore(A, 0.0, (i,))), A)
    assert unroll_loops(big) is big
    x = tir.Var("x", F32)
    let = tir.LetStmt(x, tir.BufferLoad(A, (i,)), tir.BufferStore(A, x + 1.0, (i,)))
    declaring = _func(tir.For(i, c64(0), c64(4), tir.ForKind.UNROLLED, let), A)
    assert unroll_loops(declaring) is declaring
    serial = _func(tir.For(i, c64(0), c64(4), tir.ForKind.SERIAL,
                           tir.BufferStore(A, 0.0, (i,))), A)
    assert unroll_loops(serial) is serial
