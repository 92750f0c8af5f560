"""te.create_prim_func: the block-based PrimFunc made from tensor expressions."""

import pytest

from kiln import te, tir
from kiln.ir import KilnError, assert_structural_equal, structural_equal
from kiln.tir import (
    Block,
    BlockRealize,
    BufferRegion,
    BufferStore,
    For,
    ForKind,
    IterType,
    IterVar,
    PrimFunc,
    Range,
    SeqStmt,
    Var,
)

I64 = "int64"


def c64(v):
    return tir.const(I64, v)


def point(buf, idx):
    return BufferRegion(buf, tuple(Range(i, c64(1)) for i in idx))


def nests(f):
    """The stage loop nests of a create_prim_func result."""
    body = f.body.block.body
    return list(body.seq) if isinstance(body, SeqStmt) else [body]


def innermost(stmt):
    loops = []
    while isinstance(stmt, For):
        loops.append(stmt)
        stmt = stmt.body
    assert isinstance(stmt, BlockRealize)
    return loops, stmt


def test_elementwise_matches_hand_written_tir():
    A = te.placeholder((4, 8), name="A")
    B = te.compute((4, 8), lambda i, j: A[i, j] + 1.0, name="B")
    f = te.create_prim_func([A, B])

    a_buf = tir.decl_buffer((c64(4), c64(8)), "float32", "A")
    b_buf = tir.decl_buffer((c64(4), c64(8)), "float32", "B")
    pa, pb = Var("A", "handle"), Var("B", "handle")
    i, j = Var("i", I64), Var("j", I64)
    vi, vj = Var("v_i", I64), Var("v_j", I64)
    block = Block(
        iter_vars=(IterVar(Range(c64(0), c64(4)), vi, IterType.DATA_PAR),
                   IterVar(Range(c64(0), c64(8)), vj, IterType.DATA_PAR)),
        reads=(point(a_buf, (vi, vj)),),
        writes=(point(b_buf, (vi, vj)),),
        name_hint="B",
        body=BufferStore(b_buf, a_buf[vi, vj] + 1.0, (vi, vj)),
    )
    nest = For(i, c64(0), c64(4), ForKind.SERIAL,
               For(j, c64(0), c64(8), ForKind.SERIAL,
                   BlockRealize((i, j), tir.const("bool", True), block)))
    root = Block((), (), (), "root", nest)
    expected = PrimFunc((pa, pb), {pa: a_buf, pb: b_buf},
                        BlockRealize((), tir.const("bool", True), root),
                        {"global_symbol": "B", "num_outputs": 1})
    assert_structural_equal(f, expected)
    # params map to the tensors' own buffers
    assert f.buffer_map[f.params[0]] is A.buffer and f.buffer_map[f.params[1]] is B.buffer
    assert all(p.dtype == "handle" for p in f.params)


def test_matmul_reduction_matches_hand_written_tir():
    A = te.placeholder((4, 6), name="A")
    B = te.placeholder((6, 5), name="B")
    k = te.reduce_axis((0, 6), name="k")
    C = te.compute((4, 5), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    f = te.create_prim_func([A, B, C])

    a = tir.decl_buffer((c64(4), c64(6)), "float32", "A")
    b = tir.decl_buffer((c64(6), c64(5)), "float32", "B")
    c = tir.decl_buffer((c64(4), c64(5)), "float32", "C")
    pa, pb, pc = (Var(n, "handle") for n in "ABC")
    i, j, kk = Var("i", I64), Var("j", I64), Var("k", I64)
    vi, vj, vk = Var("v_i", I64), Var("v_j", I64), Var("v_k", I64)
    block = Block(
        iter_vars=(IterVar(Range(c64(0), c64(4)), vi, IterType.DATA_PAR),
                   IterVar(Range(c64(0), c64(5)), vj, IterType.DATA_PAR),
                   IterVar(Range(c64(0), c64(6)), vk, IterType.COMM_REDUCE)),
        reads=(point(a, (vi, vk)), point(b, (vk, vj))),
        writes=(point(c, (vi, vj)),),
        name_hint="C",
        body=BufferStore(c, c[vi, vj] + a[vi, vk] * b[vk, vj], (vi, vj)),
        init=BufferStore(c, tir.const("float32", 0.0), (vi, vj)),
    )
    true = tir.const("bool", True)
    nest = For(i, c64(0), c64(4), ForKind.SERIAL,
               For(j, c64(0), c64(5), ForKind.SERIAL,
                   For(kk, c64(0), c64(6), ForKind.SERIAL,
                       BlockRealize((i, j, kk), true, block))))
    expected = PrimFunc((pa, pb, pc), {pa: a, pb: b, pc: c},
                        BlockRealize((), true, Block((), (), (), "root", nest)),
                        {"global_symbol": "C", "num_outputs": 1})
    assert_structural_equal(f, expected)


def test_broadcast_reads_and_dedup():
    A = te.placeholder((4, 8), name="A")
    bias = te.placeholder((8,), name="bias")
    C = te.compute((4, 8), lambda i, j: A[i, j] * A[i, j] + bias[j], name="C")
    f = te.create_prim_func([A, bias, C])
    _, realize = innermost(nests(f)[0])
    blk = realize.block
    vi, vj = (iv.var for iv in blk.iter_vars)
    assert [r.buffer.name for r in blk.reads] == ["A", "bias"]  # A[i, j] read once
    assert_structural_equal(blk.reads[1], point(bias.buffer, (vj,)))
    assert blk.reads[1].region[0].min is vj
    assert [v.name for v in (vi, vj)] == ["v_i", "v_j"]


def test_reads_keep_distinct_accesses_of_one_buffer():
    A = te.placeholder((8, 8), name="A")
    T = te.compute((8, 8), lambda i, j: A[i, j] + A[j, i], name="T")
    f = te.create_prim_func([A, T])
    _, realize = innermost(nests(f)[0])
    assert len(realize.block.reads) == 2


def test_multi_stage_intermediate_is_alloc_buffer():
    A = te.placeholder((16,), name="A")
    B = te.compute((16,), lambda i: A[i] * 2.0, name="B")
    C = te.compute((16,), lambda i: B[i] + 1.0, name="C")
    f = te.create_prim_func([A, C])
    root = f.body.block
    assert root.name_hint == "root" and root.iter_vars == () and root.reads == ()
    assert root.alloc_buffers == (B.buffer,)
    assert [b.name for b in f.buffers] == ["A", "C"]
    names = [innermost(n)[1].block.name_hint for n in nests(f)]
    assert names == ["B", "C"]


def test_topological_order_diamond():
    A = te.placeholder((8,), name="A")
    B = te.compute((8,), lambda i: A[i] + 1.0, name="B")
    C = te.compute((8,), lambda i: B[i] * 2.0, name="C")
    D = te.compute((8,), lambda i: B[i] - C[i], name="D")
    f = te.create_prim_func([A, D])
    names = [innermost(n)[1].block.name_hint for n in nests(f)]
    assert names == ["B", "C", "D"]
    assert {b.name for b in f.body.block.alloc_buffers} == {"B", "C"}


def test_multi_output_default_and_explicit():
    A = te.placeholder((8,), name="A")
    B = te.compute((8,), lambda i: A[i] + 1.0, name="B")
    C = te.compute((8,), lambda i: A[i] * 2.0, name="C")
    f = te.create_prim_func([A, B, C])
    assert f.attrs == {"global_symbol": "C", "num_outputs": 2}
    assert len(nests(f)) == 2 and f.body.block.alloc_buffers == ()
    # an output that another output reads: explicit num_outputs keeps both as outputs
    D = te.compute((8,), lambda i: B[i] * B[i], name="D")
    g = te.create_prim_func([A, B, D], num_outputs=2)
    assert g.attrs["num_outputs"] == 2
    assert [innermost(n)[1].block.name_hint for n in nests(g)] == ["B", "D"]
    # by default B is an input of D and is not recomputed
    h = te.create_prim_func([A, B, D])
    assert h.attrs["num_outputs"] == 1
    assert [innermost(n)[1].block.name_hint for n in nests(h)] == ["D"]


def test_unused_placeholder_is_still_a_param():
    A = te.placeholder((8,), name="A")
    unused = te.placeholder((3,), "int32", name="unused")
    B = te.compute((8,), lambda i: A[i] + 1.0, name="B")
    f = te.create_prim_func([A, unused, B])
    assert [b.name for b in f.buffers] == ["A", "unused", "B"]


def test_symbolic_shapes():
    n = te.var("n")
    m = te.size_var("m")
    A = te.placeholder((n, m), name="A")
    k = te.reduce_axis((0, m), name="k")
    S = te.compute((n,), lambda i: te.max(A[i, k], axis=k), name="S")
    f = te.create_prim_func([A, S])
    a_buf = f.buffer_map[f.params[0]]
    assert a_buf.shape[0] is n and a_buf.shape[1] is m
    loops, realize = innermost(nests(f)[0])
    assert loops[0].extent is n and loops[1].extent is m
    assert [lv.loop_var.name for lv in loops] == ["i", "k"]
    assert all(lv.loop_var.dtype == "int64" for lv in loops)
    assert realize.block.iter_vars[1].iter_type == IterType.COMM_REDUCE
    init = realize.block.init
    assert init.value.value == float("-inf")


def test_reduce_axis_with_offset_and_where():
    A = te.placeholder((4, 10), name="A")
    k = te.reduce_axis((2, 9), name="k")
    S = te.compute((4,), lambda i: te.sum(A[i, k], axis=k, where=k < 7), name="S")
    f = te.create_prim_func([A, S])
    loops, realize = innermost(nests(f)[0])
    assert loops[1].min.value == 2 and loops[1].extent.value == 7
    iv = realize.block.iter_vars[1]
    assert iv.dom.min.value == 2 and iv.dom.extent.value == 7
    body = realize.block.body
    assert isinstance(body.value, tir.Select)
    assert isinstance(body.value.true_value, tir.Add)
    assert body.value.false_value.buffer is S.buffer


def test_scalar_output_and_multiple_reduce_axes():
    A = te.placeholder((3, 4), name="A")
    k1 = te.reduce_axis((0, 3), name="k1")
    k2 = te.reduce_axis((0, 4), name="k2")
    T = te.compute((), lambda: te.sum(A[k1, k2], axis=[k1, k2]), name="T")
    f = te.create_prim_func([A, T])
    loops, realize = innermost(nests(f)[0])
    assert [lv.loop_var.name for lv in loops] == ["k1", "k2"]
    assert realize.block.body.indices == ()
    assert [iv.iter_type for iv in realize.block.iter_vars] == [IterType.COMM_REDUCE] * 2


def test_block_and_buffer_names_made_unique():
    A = te.placeholder((8,), name="A")
    B1 = te.compute((8,), lambda i: A[i] + 1.0, name="T_add")
    B2 = te.compute((8,), lambda i: B1[i] + 1.0, name="T_add")
    B3 = te.compute((8,), lambda i: B2[i] + 1.0, name="root")
    f = te.create_prim_func([A, B3])
    names = [innermost(n)[1].block.name_hint for n in nests(f)]
    assert names == ["T_add", "T_add_1", "root_1"]
    bufs = [b.name for b in f.buffers] + [b.name for b in f.body.block.alloc_buffers]
    assert len(set(bufs)) == len(bufs)


def test_identical_builds_are_structurally_equal():
    def build(reducer=te.sum):
        n = te.var("n")
        A = te.placeholder((n, 16), name="A")
        B = te.placeholder((16, 4), name="B")
        k = te.reduce_axis((0, 16), name="k")
        C = te.compute((n, 4), lambda i, j: reducer(A[i, k] * B[k, j], axis=k), name="C")
        D = te.compute((n, 4), lambda i, j: tir.max(C[i, j], 0.0), name="D")
        return te.create_prim_func([A, B, D])

    assert structural_equal(build(), build())
    assert not structural_equal(build(), build(te.max))


def test_compute_attrs_become_block_annotations():
    A = te.placeholder((8,), name="A")
    B = te.compute((8,), lambda i: A[i], name="B", attrs={"schedule_rule": "x"})
    f = te.create_prim_func([A, B])
    assert innermost(nests(f)[0])[1].block.annotations == {"schedule_rule": "x"}


def test_scalar_var_param():
    s = te.var("s", "float32")
    A = te.placeholder((8,), name="A")
    B = te.compute((8,), lambda i: A[i] * s, name="B")
    f = te.create_prim_func([A, s, B])
    assert f.params[1] is s and s not in f.buffer_map


# ---- errors -----------------------------------------------------------------------------------
def test_missing_placeholder():
    A = te.placeholder((8,), name="A")
    W = te.placeholder((8,), name="W")
    B = te.compute((8,), lambda i: A[i] * W[i], name="B")
    with pytest.raises(KilnError, match="placeholder 'W'.*not in the argument list"):
        te.create_prim_func([A, B])


def test_outputs_must_come_last():
    A = te.placeholder((8,), name="A")
    B = te.compute((8,), lambda i: A[i] + 1.0, name="B")
    with pytest.raises(KilnError, match="inputs first"):
        te.create_prim_func([B, A])


def test_no_output():
    A = te.placeholder((8,), name="A")
    with pytest.raises(KilnError, match="no output"):
        te.create_prim_func([A])


def test_bad_num_outputs():
    A = te.placeholder((8,), name="A")
    B = te.compute((8,), lambda i: A[i] + 1.0, name="B")
    with pytest.raises(KilnError, match="num_outputs"):
        te.create_prim_func([A, B], num_outputs=3)
    with pytest.raises(KilnError, match="output 'A' is not a te.compute"):
        te.create_prim_func([A, B], num_outputs=2)


def test_duplicate_and_non_tensor_arguments():
    A = te.placeholder((8,), name="A")
    B = te.compute((8,), lambda i: A[i] + 1.0, name="B")
    with pytest.raises(KilnError, match="listed twice"):
        te.create_prim_func([A, A, B])
    with pytest.raises(KilnError, match="not a te.Tensor"):
        te.create_prim_func([A, 3, B])


def test_unbound_symbolic_var():
    n = te.var("n")
    A = te.placeholder((8,), name="A")
    B = te.compute((8,), lambda i: A[i] * n.astype("float32"), name="B")
    with pytest.raises(KilnError, match="'n' are used but not bound"):
        te.create_prim_func([A, B])


def test_empty_reduction_is_its_identity():
    """A reduction over a statically empty axis stores the reducer's identity (as a reduction
    block its init would sit inside the zero-trip loop and never run)."""
    import numpy as np

    import kiln
    from kiln import graph as g
    from kiln import op

    u = g.Var("u", g.TensorStructInfo((2, 0), "float64"))
    bb = g.BlockBuilder()
    with bb.function("main", [u]):
        with bb.dataflow():
            out = bb.emit_output(g.Tuple((op.sum(u), op.prod(u, axis=1), op.max(u, axis=1))))
        bb.emit_func_output(out)
    s, p, m = kiln.build(bb.get())(np.zeros((2, 0)))
    assert float(s) == 0.0
    np.testing.assert_array_equal(p, [1.0, 1.0])
    np.testing.assert_array_equal(m, [-np.inf, -np.inf])
