"""simplify: index arithmetic folds, loop ranges are used, trivial loops and branches vanish."""

from __future__ import annotations

from kiln import tir
from kiln.ir import assert_structural_equal
from kiln.tir.transform import simplify

F32 = "float32"


def v64(name):
    return tir.Var(name, "int64")


def c64(v):
    return tir.const("int64", v)


def func_of(body, *buffers):
    params = [tir.Var(b.name, "handle") for b in buffers]
    return tir.PrimFunc(params, dict(zip(params, buffers)), body)


def serial(var, extent, body):
    return tir.For(var, c64(0), c64(extent), tir.ForKind.SERIAL, body)


def test_index_arithmetic_folds():
    A = tir.decl_buffer((c64(32),), F32, "A")
    i, j = v64("i"), v64("j")
    idx = (i * c64(8) + j) * c64(1) + c64(0)
    body = serial(i, 4, serial(j, 8, tir.BufferStore(A, A[idx] * 2.0, (idx,))))
    out = simplify(func_of(body, A))
    expected = serial(i, 4, serial(j, 8, tir.BufferStore(A, A[i * c64(8) + j] * 2.0,
                                                         (i * c64(8) + j,))))
    assert_structural_equal(out.body, expected)


def test_loop_ranges_decide_conditions():
    A = tir.decl_buffer((c64(8),), F32, "A")
    i = v64("i")
    keep = tir.IfThenElse(tir.lt(i, c64(5)), tir.BufferStore(A, 1.0, (i,)))
    always = tir.IfThenElse(tir.lt(i, c64(8)), tir.BufferStore(A, 2.0, (i,)))
    never = tir.IfThenElse(tir.ge(i, c64(8)), tir.BufferStore(A, 3.0, (i,)))
    out = simplify(func_of(serial(i, 8, tir.seq(keep, always, never)), A))
    expected = serial(i, 8, tir.seq(keep, tir.BufferStore(A, 2.0, (i,))))
    assert_structural_equal(out.body, expected)


def test_unit_loops_are_inlined_and_empty_loops_dropped():
    A = tir.decl_buffer((c64(8),), F32, "A")
    i, j, k = v64("i"), v64("j"), v64("k")
    body = tir.seq(
        serial(i, 8, serial(j, 1, tir.BufferStore(A, 1.0, (i + j,)))),
        serial(k, 0, tir.BufferStore(A, 2.0, (k,))),
    )
    out = simplify(func_of(body, A))
    assert_structural_equal(out.body, serial(i, 8, tir.BufferStore(A, 1.0, (i,))))


def test_symbolic_shapes_are_non_negative():
    n = v64("n")
    A = tir.decl_buffer((n,), F32, "A")
    i = v64("i")
    body = tir.For(i, c64(0), n, tir.ForKind.SERIAL,
                   tir.IfThenElse(tir.ge(i, c64(0)), tir.BufferStore(A, 0.0, (i,))))
    out = simplify(func_of(body, A))
    assert isinstance(out.body.body, tir.BufferStore)


def _local_index(stmt):
    found = []
    tir.functor.post_order_visit(stmt, lambda n: found.append(n.indices[0]) if isinstance(
        n, tir.BufferStore) and n.buffer.scope == "local" else None)
    return found


def test_let_bound_indices_of_local_buffers_are_expanded():
    """A register array indexed through a let (GPU lowering binds a fused thread index's
    divisions once) gets constant indices: the compiler can keep it in registers."""
    acc = tir.decl_buffer((c64(8),), F32, "acc", scope="local")
    tx, j = v64("tx"), v64("j")
    v = v64("v")
    base = tx // c64(4) * c64(8)
    store = tir.BufferStore(acc, tir.const(F32, 0.0), (v + j - base,))
    body = serial(tx, 32, tir.LetStmt(v, base, serial(j, 8, store)))
    (index,) = _local_index(simplify(func_of(body, acc)).body)
    assert_structural_equal(index, j)


def test_lets_that_read_memory_are_not_expanded():
    acc = tir.decl_buffer((c64(8),), F32, "acc", scope="local")
    idx = tir.decl_buffer((c64(8),), "int64", "idx")
    j, v = v64("j"), v64("v")
    store = tir.BufferStore(acc, tir.const(F32, 0.0), (v,))
    body = serial(j, 8, tir.LetStmt(v, idx[j], store))
    (index,) = _local_index(simplify(func_of(body, acc, idx)).body)
    assert_structural_equal(index, v)
