"""vectorize_loops: Ramp/Broadcast lowering, and the scalar fallback with its simd safety."""

from __future__ import annotations

import pytest

from kiln import tir
from kiln.ir import assert_structural_equal
from kiln.tir import Broadcast, BufferLoad, ForKind, Ramp
from kiln.tir.transform import vectorize_loops

F32 = "float32"


def v64(name):
    return tir.Var(name, "int64")


def c64(v):
    return tir.const("int64", v)


def func_of(body, *buffers):
    params = [tir.Var(b.name, "handle") for b in buffers]
    return tir.PrimFunc(params, dict(zip(params, buffers)), body)


def vec_loop(var, extent, body, start=0):
    return tir.For(var, c64(start), c64(extent), ForKind.VECTORIZED, body)


A = tir.decl_buffer((c64(64),), F32, "A")
B = tir.decl_buffer((c64(64),), F32, "B")


def test_contiguous_elementwise_becomes_vector_ops():
    i, j = v64("i"), v64("j")
    idx = i * c64(8) + j
    body = tir.For(i, c64(0), c64(8), ForKind.SERIAL,
                   vec_loop(j, 8, tir.BufferStore(B, A[idx] * 2.0 + A[c64(0)], (idx,))))
    out = vectorize_loops(func_of(body, A, B))
    ramp = Ramp(i * c64(8) + c64(0), c64(1), 8)
    value = BufferLoad(A, (ramp,)) * Broadcast(tir.const(F32, 2.0), 8) + Broadcast(A[c64(0)], 8)
    expected = tir.For(i, c64(0), c64(8), ForKind.SERIAL, tir.BufferStore(B, value, (ramp,)))
    assert_structural_equal(out.body, expected)


def test_select_compare_cast_and_uniform_if():
    j, n = v64("j"), v64("n")
    value = tir.select(A[j] > 0.0, tir.cast(F32, j), A[j])
    body = vec_loop(j, 8, tir.IfThenElse(tir.gt(n, c64(0)), tir.BufferStore(B, value, (j,))),
                    start=0)
    out = vectorize_loops(func_of(body, A, B))
    ramp = Ramp(c64(0), c64(1), 8)
    load = BufferLoad(A, (ramp,))
    vec_value = tir.Select(load > Broadcast(tir.const(F32, 0.0), 8),
                           tir.Cast("float32x8", ramp), load)
    expected = tir.IfThenElse(tir.gt(n, c64(0)), tir.BufferStore(B, vec_value, (ramp,)))
    assert_structural_equal(out.body, expected)


def _fallback(body_fn, extent=8):
    j = v64("j")
    out = vectorize_loops(func_of(vec_loop(j, extent, body_fn(j)), A, B))
    loop = out.body
    assert isinstance(loop, tir.For) and loop.kind == ForKind.SERIAL
    return loop.annotations


@pytest.mark.parametrize("make, reason, simd", [
    (lambda j: tir.BufferStore(B, tir.tanh(A[j]), (j,)), "intrinsic tanh", True),
    (lambda j: tir.BufferStore(B, A[j * c64(2)], (j,)), "gather", True),
    (lambda j: tir.BufferStore(B, B[c64(0)] + A[j], (c64(0),)), "does not depend", False),
    (lambda j: tir.BufferStore(B, A[j], (j * c64(2),)), "scatter", True),
    (lambda j: tir.IfThenElse(tir.gt(A[j], 0.0), tir.BufferStore(B, 1.0, (j,))),
     "differs between lanes", True),
    (lambda j: tir.BufferStore(B, B[j + c64(1)], (j,)), None, False),
])
def test_scalar_fallback_and_simd_safety(make, reason, simd):
    if reason is None:  # vectorizable, but check simd safety on the same body directly
        from kiln.tir.transform import simd_safe

        j = v64("j")
        assert simd_safe(vec_loop(j, 8, make(j))) is simd
        return
    ann = _fallback(make)
    assert reason in ann["kiln.not_vectorized"]
    assert bool(ann.get("kiln.simd", False)) is simd


def test_exp_and_sigmoid_expand_into_vector_formulas():
    # float32 (and float16/bfloat16) exp/sigmoid become branch-free vector arithmetic: no call
    # of the intrinsic is left, the 2^n scaling is a vector reinterpret
    for fn in (tir.exp, tir.sigmoid):
        j = v64("j")
        out = vectorize_loops(func_of(vec_loop(j, 8, tir.BufferStore(B, fn(A[j]), (j,))), A, B))
        assert isinstance(out.body, tir.BufferStore) and out.body.value.dtype.lanes == 8
        nodes = []
        tir.post_order_visit(out.body, nodes.append)
        calls = [n for n in nodes if isinstance(n, tir.Call)]
        assert {c.op for c in calls} <= {"reinterpret", "fabs"}  # fabs: sigmoid's |x|
        assert all(c.dtype.lanes == 8 for c in calls)


def test_float64_exp_keeps_the_scalar_loop():
    D = tir.decl_buffer((c64(64),), "float64", "D")
    j = v64("j")
    out = vectorize_loops(func_of(vec_loop(j, 4, tir.BufferStore(D, tir.exp(D[j]), (j,))), D))
    ann = out.body.annotations
    assert "intrinsic exp has no vector form for float64" in ann["kiln.not_vectorized"]
    assert ann["kiln.simd"] is True


def test_non_power_of_two_and_nested_loops_fall_back():
    ann = _fallback(lambda j: tir.BufferStore(B, A[j], (j,)), extent=6)
    assert "power of two" in ann["kiln.not_vectorized"] and ann["kiln.simd"] is True
    k = v64("k")
    ann = _fallback(lambda j: tir.For(k, c64(0), c64(2), ForKind.SERIAL,
                                      tir.BufferStore(B, A[j + k], (j,))))
    assert "loop" in ann["kiln.not_vectorized"] and "kiln.simd" not in ann


def test_float16_vectorizes_like_other_types():
    # the C backend holds float16/bfloat16 vectors as float32 vectors (widening loads)
    H = tir.decl_buffer((c64(16),), "float16", "H")
    j = v64("j")
    out = vectorize_loops(func_of(vec_loop(j, 8, tir.BufferStore(H, H[j] + H[j], (j,))), H))
    ramp = Ramp(c64(0), c64(1), 8)
    load = BufferLoad(H, (ramp,))
    assert_structural_equal(out.body, tir.BufferStore(H, load + load, (ramp,)))


def test_unit_extent_is_substituted():
    j = v64("j")
    out = vectorize_loops(func_of(vec_loop(j, 1, tir.BufferStore(B, A[j], (j,)), start=3), A, B))
    assert_structural_equal(out.body, tir.BufferStore(B, A[c64(3)], (c64(3),)))
