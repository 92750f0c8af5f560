"""convert_blocks_to_loops: iter var substitution, init guards, predicates, allocations."""

from __future__ import annotations

import pytest

from kiln import tir
from kiln.ir import LoweringError, assert_structural_equal
from kiln.tir import IterType, IterVar, Range
from kiln.tir.transform import convert_blocks_to_loops

F32 = "float32"


def c64(v):
    return tir.const("int64", v)


def ivar(var, lo, extent, kind=IterType.DATA_PAR):
    return IterVar(Range(c64(lo), c64(extent)), var, kind)


def v64(name):
    return tir.Var(name, "int64")


def make_func(body, *buffers, allocs=()):
    params = [tir.Var(b.name, "handle") for b in buffers]
    root = tir.BlockRealize((), True, tir.Block((), (), (), "root", body, None, tuple(allocs)))
    return tir.PrimFunc(params, dict(zip(params, buffers)), root)


def test_elementwise_block_becomes_plain_store():
    A = tir.decl_buffer((4, 8), F32, "A")
    B = tir.decl_buffer((4, 8), F32, "B")
    i, j, vi, vj = v64("i"), v64("j"), v64("vi"), v64("vj")
    block = tir.Block((ivar(vi, 0, 4), ivar(vj, 0, 8)), (A.full_region(),), (B.full_region(),),
                      "B", tir.BufferStore(B, A[vi, vj] + 1.0, (vi, vj)))
    nest = tir.For(i, 0, 4, tir.ForKind.SERIAL,
                   tir.For(j, 0, 8, tir.ForKind.SERIAL, tir.BlockRealize((i, j), True, block)))
    out = convert_blocks_to_loops(make_func(nest, A, B))
    expected = tir.For(i, 0, 4, tir.ForKind.SERIAL, tir.For(
        j, 0, 8, tir.ForKind.SERIAL, tir.BufferStore(B, A[i, j] + 1.0, (i, j))))
    assert_structural_equal(out.body, expected)


def _reduction(binding_k, loops, k_dom=(0, 16)):
    A = tir.decl_buffer((4, 16), F32, "A")
    C = tir.decl_buffer((4,), F32, "C")
    i, vi, vk = v64("i"), v64("vi"), v64("vk")
    block = tir.Block(
        (ivar(vi, 0, 4), ivar(vk, k_dom[0], k_dom[1], IterType.COMM_REDUCE)), (), (), "C",
        tir.BufferStore(C, C[vi] + A[vi, vk], (vi,)), tir.BufferStore(C, 0.0, (vi,)))
    inner = tir.BlockRealize((i, binding_k), True, block)
    for var, extent in reversed(loops):
        inner = tir.For(var, 0, extent, tir.ForKind.SERIAL, inner)
    nest = tir.For(i, 0, 4, tir.ForKind.SERIAL, inner)
    return make_func(nest, A, C), (A, C, i)


def _expected(A, C, i, k_value, guard, loops):
    body = tir.seq(tir.IfThenElse(guard, tir.BufferStore(C, 0.0, (i,))),
                   tir.BufferStore(C, C[i] + A[i, k_value], (i,)))
    for var, extent in reversed(loops):
        body = tir.For(var, 0, extent, tir.ForKind.SERIAL, body)
    return tir.For(i, 0, 4, tir.ForKind.SERIAL, body)


def test_reduction_init_guarded_by_reduce_binding():
    k = v64("k")
    func, (A, C, i) = _reduction(k, [(k, 16)])
    out = convert_blocks_to_loops(func)
    assert_structural_equal(out.body, _expected(A, C, i, k, tir.eq(k, c64(0)), [(k, 16)]))


def test_init_guard_after_split_uses_the_binding():
    ko, ki = v64("ko"), v64("ki")
    binding = ko * 4 + ki
    func, (A, C, i) = _reduction(binding, [(ko, 4), (ki, 4)])
    out = convert_blocks_to_loops(func)
    expected = _expected(A, C, i, binding, tir.eq(binding, c64(0)), [(ko, 4), (ki, 4)])
    assert_structural_equal(out.body, expected)


def test_init_guard_uses_domain_min():
    k = v64("k")
    func, (A, C, i) = _reduction(k + 2, [(k, 14)], k_dom=(2, 14))
    out = convert_blocks_to_loops(func)
    expected = _expected(A, C, i, k + 2, tir.eq(k + 2, c64(2)), [(k, 14)])
    assert_structural_equal(out.body, expected)


def test_predicate_becomes_if_and_allocs_become_allocate():
    A = tir.decl_buffer((30,), F32, "A")
    B = tir.decl_buffer((30,), F32, "B")
    T = tir.decl_buffer((30,), F32, "T")
    L = tir.decl_buffer((4,), F32, "L", scope="local")
    io, ii, v = v64("io"), v64("ii"), v64("v")
    bind = io * 8 + ii
    block = tir.Block((ivar(v, 0, 30),), (), (), "T", tir.BufferStore(T, A[v] * 2.0, (v,)))
    realize = tir.BlockRealize((bind,), tir.lt(bind, c64(30)), block)
    nest = tir.For(io, 0, 4, tir.ForKind.SERIAL, tir.For(ii, 0, 8, tir.ForKind.SERIAL, realize))
    out = convert_blocks_to_loops(make_func(nest, A, B, allocs=(T, L)))
    store = tir.IfThenElse(tir.lt(bind, c64(30)), tir.BufferStore(T, A[bind] * 2.0, (bind,)))
    expected = tir.Allocate(T, tir.Allocate(L, tir.For(
        io, 0, 4, tir.ForKind.SERIAL, tir.For(ii, 0, 8, tir.ForKind.SERIAL, store))))
    assert_structural_equal(out.body, expected)


def test_init_without_reduction_vars_runs_unconditionally():
    C = tir.decl_buffer((1,), F32, "C")
    block = tir.Block((), (), (), "c", tir.BufferStore(C, C[0] + 1.0, (0,)),
                      tir.BufferStore(C, 0.0, (0,)))
    out = convert_blocks_to_loops(make_func(tir.BlockRealize((), True, block), C))
    expected = tir.seq(tir.BufferStore(C, 0.0, (0,)), tir.BufferStore(C, C[0] + 1.0, (0,)))
    assert_structural_equal(out.body, expected)


def test_binding_count_mismatch_is_a_lowering_error():
    C = tir.decl_buffer((4,), F32, "C")
    v = v64("v")
    block = tir.Block((ivar(v, 0, 4),), (), (), "bad", tir.BufferStore(C, 1.0, (v,)))
    with pytest.raises(LoweringError, match="'bad'"):
        convert_blocks_to_loops(make_func(tir.BlockRealize((), True, block), C))


def test_te_function_has_no_blocks_left():
    from kiln import te

    A = te.placeholder((5, 6), F32, name="A")
    k = te.reduce_axis((0, 6), name="k")
    S = te.compute((5,), lambda i: te.sum(A[i, k], axis=k), name="S")
    out = convert_blocks_to_loops(te.create_prim_func([A, S]))
    kinds = set()
    tir.post_order_visit(out.body, lambda n: kinds.add(type(n).__name__))
    assert not kinds & {"Block", "BlockRealize"}
    assert "IfThenElse" in kinds
