"""flatten_buffers: row-major offsets, strides and elem_offset, allocations, buffer_map kept."""

from __future__ import annotations

from kiln import tir
from kiln.ir import assert_structural_equal
from kiln.tir.transform import flat_index, flatten_buffers

F32 = "float32"


def v64(name):
    return tir.Var(name, "int64")


def c64(v):
    return tir.const("int64", v)


def func_of(body, *buffers):
    params = [tir.Var(b.name, "handle") for b in buffers]
    return tir.PrimFunc(params, dict(zip(params, buffers)), body)


def test_row_major_offsets_and_shared_data_var():
    A = tir.decl_buffer((c64(4), c64(8)), F32, "A")
    B = tir.decl_buffer((c64(4), c64(8)), F32, "B")
    i, j = v64("i"), v64("j")
    body = tir.BufferStore(B, A[i, j], (i, j))
    out = flatten_buffers(func_of(body, A, B))
    assert all(a is b for a, b in zip(out.buffer_map.values(), (A, B)))  # params keep N-D
    store = out.body
    assert store.buffer.data is B.data and store.buffer.shape[0].value == 32
    assert store.value.buffer.data is A.data
    assert_structural_equal(store.indices[0], i * c64(8) + j)
    assert_structural_equal(store.value.indices[0], i * c64(8) + j)


def test_symbolic_three_dimensional_shape():
    n, m = v64("n"), v64("m")
    A = tir.decl_buffer((n, m, c64(4)), F32, "A")
    i, j, k = v64("i"), v64("j"), v64("k")
    assert_structural_equal(flat_index(A, (i, j, k)), (i * m + j) * c64(4) + k)


def test_strides_and_elem_offset():
    A = tir.Buffer("A", (c64(4), c64(8)), F32, None, (c64(16), c64(1)), c64(3))
    i, j = v64("i"), v64("j")
    assert_structural_equal(flat_index(A, (i, j)), i * c64(16) + j + c64(3))
    out = flatten_buffers(func_of(tir.BufferStore(A, 1.0, (i, j)), A))
    # size spans the last reachable element: 3 + 3 * 16 + 7 * 1 + 1
    from kiln.arith import simplify

    assert simplify(out.body.buffer.shape[0]).value == 59


def test_zero_dim_and_allocate():
    S = tir.decl_buffer((), F32, "S")
    T = tir.decl_buffer((c64(2), c64(3)), F32, "T", scope="local")
    i = v64("i")
    body = tir.Allocate(T, tir.seq(tir.BufferStore(T, S[()], (c64(1), i)),
                                   tir.BufferStore(S, T[c64(0), i], ())))
    out = flatten_buffers(func_of(body, S))
    alloc = out.body
    assert alloc.buffer.data is T.data and alloc.buffer.scope == "local"
    assert alloc.buffer.shape[0].value == 6
    first, second = alloc.body.seq
    assert_structural_equal(first.indices[0], c64(1) * c64(3) + i)
    assert_structural_equal(first.value.indices[0], c64(0))
    assert_structural_equal(second.indices[0], c64(0))
    assert second.buffer.data is S.data


def test_one_dimensional_buffers_are_left_alone():
    A = tir.decl_buffer((c64(8),), F32, "A")
    i = v64("i")
    func = func_of(tir.BufferStore(A, A[i] + 1.0, (i,)), A)
    assert flatten_buffers(func) is func
