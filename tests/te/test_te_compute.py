"""te: placeholders, computes, reductions and their error cases."""

import math

import pytest

from kiln import te, tir
from kiln.ir import DataType, KilnError, structural_equal
from kiln.ir.errors import DTypeError


def test_placeholder_properties_and_indexing():
    n = te.var("n")
    A = te.placeholder((n, 4), "float16", name="A")
    assert A.name == "A" and A.ndim == 2 and A.dtype == "float16"
    assert A.shape[0] is n
    assert isinstance(A.shape[1], tir.IntImm) and A.shape[1].dtype == "int64"
    assert A.shape[1].value == 4
    assert isinstance(A.op, te.PlaceholderOp)
    i = te.var("i")
    load = A[i, 2]
    assert isinstance(load, tir.BufferLoad) and load.buffer is A.buffer
    assert load.indices[0] is i and load.indices[1].dtype == "int64"
    assert structural_equal(A(i, 2), load)
    assert te.tensor_of_buffer(A.buffer) is A


def test_placeholder_int32_dims_are_widened():
    m = te.var("m", "int32")
    A = te.placeholder((m, 3), name="A")
    assert A.shape[0].dtype == "int64" and isinstance(A.shape[0], tir.Cast)
    assert A.shape[1].dtype == "int64"


def test_compute_elementwise_op_fields():
    A = te.placeholder((3, 4), name="A")
    B = te.compute((3, 4), lambda i, j: A[i, j] * 2.0, name="B", tag="elemwise",
                   attrs={"k": 1})
    op = B.op
    assert isinstance(op, te.ComputeOp)
    assert [iv.var.name for iv in op.axis] == ["i", "j"]
    assert all(iv.var.dtype == "int64" for iv in op.axis)
    assert op.reduce_axis == () and op.tag == "elemwise" and op.attrs == {"k": 1}
    assert op.input_tensors == (A,)
    assert B.dtype == "float32" and [d.value for d in B.shape] == [3, 4]


def test_compute_varargs_names_and_scalar_body():
    B = te.compute((2, 3, 4), lambda *idx: 1.5, name="B")
    assert [iv.var.name for iv in B.op.axis] == ["i0", "i1", "i2"]
    assert isinstance(B.op.body, tir.FloatImm) and B.dtype == "float32"


def test_compute_dtype_follows_body():
    A = te.placeholder((8,), "int8", name="A")
    B = te.compute((8,), lambda i: A[i].astype("int32") + 1, name="B")
    assert B.dtype == "int32"


def test_reduction_body():
    A = te.placeholder((4, 5), name="A")
    k = te.reduce_axis((0, 5), name="k")
    assert k.iter_type == tir.IterType.COMM_REDUCE and k.var.dtype == "int64"
    S = te.compute((4,), lambda i: te.sum(A[i, k], axis=k), name="S")
    assert isinstance(S.op.body, tir.Reduce)
    assert S.op.reduce_axis == (k,)
    red = S.op.body
    assert isinstance(red.combiner.identity, tir.FloatImm) and red.combiner.identity.value == 0


@pytest.mark.parametrize(
    "reducer, dtype, expected",
    [
        (te.max, "float32", -math.inf),
        (te.min, "float32", math.inf),
        (te.max, "int8", -128),
        (te.min, "int16", 32767),
        (te.sum, "int32", 0),
    ],
)
def test_reducer_identities(reducer, dtype, expected):
    A = te.placeholder((4,), dtype, name="A")
    k = te.reduce_axis((0, 4), name="k")
    T = te.compute((1,), lambda i: reducer(A[k], axis=k), name="T")
    ident = T.op.body.combiner.identity
    assert ident.dtype == dtype and ident.value == expected


def test_multiple_reduce_axes_and_where_and_init():
    A = te.placeholder((4, 5, 6), name="A")
    k1 = te.reduce_axis((0, 5), name="k1")
    k2 = te.reduce_axis((1, 6), name="k2")
    T = te.compute(
        (4,), lambda i: te.sum(A[i, k1, k2], axis=[k1, k2], where=k1 < k2, init=1.0), name="T"
    )
    assert T.op.reduce_axis == (k1, k2)
    assert T.op.body.condition is not None
    assert T.op.body.combiner.identity.value == 1.0
    assert k2.dom.min.value == 1 and k2.dom.extent.value == 5


def test_comm_reducer_custom():
    prod = te.comm_reducer(lambda x, y: x * y, lambda t: tir.const(t, 1), name="prod")
    A = te.placeholder((4, 3), name="A")
    k = te.reduce_axis((0, 3), name="k")
    P = te.compute((4,), lambda i: prod(A[i, k], axis=k), name="P")
    c = P.op.body.combiner
    assert isinstance(c.result, tir.Mul) and c.identity.value == 1.0


def test_reduce_axis_from_range_and_symbolic():
    n = te.var("n")
    k = te.reduce_axis(tir.Range(0, n), name="k")
    assert k.dom.extent is n
    k2 = te.reduce_axis((0, n), name="k2")
    assert k2.dom.extent is n


def test_if_then_else():
    A = te.placeholder((4,), name="A")
    B = te.compute((4,), lambda i: te.if_then_else(i < 2, A[i], 0.0), name="B")
    assert isinstance(B.op.body, tir.Select)
    with pytest.raises(DTypeError):
        te.if_then_else(A[0], 1.0, 0.0)
    i = te.var("i")
    with pytest.raises(KilnError, match="tir.eq"):
        te.if_then_else(i == 0, 1.0, 0.0)
    k = te.reduce_axis((0, 4), name="k")
    with pytest.raises(KilnError, match="where=.*Python bool"):
        te.sum(A[k], axis=k, where=k == 0)


def test_identical_computes_are_structurally_equal():
    def build():
        A = te.placeholder((8, 16), name="A")
        B = te.placeholder((16, 4), name="B")
        k = te.reduce_axis((0, 16), name="k")
        return te.compute((8, 4), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")

    assert structural_equal(build().op, build().op)
    A = te.placeholder((8, 16), name="A")
    B = te.placeholder((16, 4), name="B")
    k = te.reduce_axis((0, 16), name="k")
    other = te.compute((8, 4), lambda i, j: te.max(A[i, k] * B[k, j], axis=k), name="C")
    assert not structural_equal(build().op, other.op)


def test_var_and_size_var():
    assert te.var("n").dtype == "int64"
    s = te.size_var("s", "int32")
    assert isinstance(s, tir.SizeVar) and s.dtype == DataType("int32")


# ---- errors -----------------------------------------------------------------------------------
def test_wrong_index_count():
    A = te.placeholder((3, 4), name="A")
    with pytest.raises(KilnError, match="'A' has 2 dimension"):
        A[1]


def test_nested_reduction_rejected():
    A = te.placeholder((4, 5), name="A")
    k = te.reduce_axis((0, 5), name="k")
    with pytest.raises(KilnError, match="whole body"):
        te.compute((4,), lambda i: te.sum(A[i, k], axis=k) + 1.0, name="S")


def test_reduce_axis_outside_reduction_rejected():
    A = te.placeholder((4, 5), name="A")
    k = te.reduce_axis((0, 5), name="k")
    with pytest.raises(KilnError, match="reduce axis 'k'"):
        te.compute((4,), lambda i: A[i, k], name="S")
    k2 = te.reduce_axis((0, 5), name="k2")
    with pytest.raises(KilnError, match="reduce axis 'k'"):
        te.compute((4,), lambda i: te.sum(A[i, k], axis=k2), name="S")


def test_bad_reduce_axis_argument():
    A = te.placeholder((4,), name="A")
    with pytest.raises(KilnError, match="not a reduce axis"):
        te.sum(A[0], axis=te.var("q"))
    k = te.reduce_axis((0, 4), name="k")
    with pytest.raises(KilnError, match="given twice"):
        te.sum(A[k], axis=[k, k])
    with pytest.raises(KilnError, match="dom must be"):
        te.reduce_axis(5, name="bad")


def test_multi_value_compute_rejected():
    A = te.placeholder((4,), name="A")
    with pytest.raises(KilnError, match="one compute per output"):
        te.compute((4,), lambda i: (A[i], A[i]), name="T")


def test_arity_mismatch_rejected():
    with pytest.raises(KilnError, match="takes 1 argument"):
        te.compute((4, 4), lambda i: 1.0, name="T")


def test_bad_shape_rejected():
    with pytest.raises(KilnError, match="negative"):
        te.placeholder((-1, 3), name="A")
    with pytest.raises(KilnError, match="float32"):
        te.placeholder((tir.FloatImm("float32", 2.0),), name="A")


def test_foreign_buffer_rejected():
    buf = tir.decl_buffer((4,), "float32", "raw")
    with pytest.raises(KilnError, match="'raw'.*not a te tensor"):
        te.compute((4,), lambda i: buf[i] + 1.0, name="T")


def test_tensor_used_as_value_rejected():
    A = te.placeholder((4,), name="A")
    with pytest.raises(KilnError, match="index it"):
        te.compute((4,), lambda i: A, name="T")
