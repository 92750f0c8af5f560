"""StructInfo construction, equality, lattice join, and the shape helpers for op authors."""

import pytest

from kiln import tir
from kiln.graph import (
    FuncStructInfo,
    ObjectStructInfo,
    OptionalStructInfo,
    PrimStructInfo,
    SequenceStructInfo,
    ShapeStructInfo,
    TensorStructInfo,
    TupleStructInfo,
    struct_info_lca,
)
from kiln.graph.shape_utils import (
    broadcast_conditions,
    broadcast_shapes,
    broadcast_sinfo,
    normalize_axes,
    normalize_axis,
    prod,
)
from kiln.graph.struct_info import dims_equal, erase_sym_vars
from kiln.ir import StructInfoError, structural_equal, structural_hash


def _t(*shape):
    return TensorStructInfo(shape, "float32")


def _n(name="n"):
    return tir.Var(name, "int64")


def test_tensor_shape_ints_become_int64_immediates():
    s = TensorStructInfo((5, 64), "float32")
    assert all(isinstance(d, tir.IntImm) and d.dtype == "int64" for d in s.shape)
    assert s.ndim == 2 and s.dtype == "float32"
    assert s.is_static and s.static_shape() == (5, 64)
    assert TensorStructInfo((tir.IntImm("int32", 3),), "int8").shape[0].dtype == "int64"


def test_tensor_unknown_shape_keeps_rank():
    s = TensorStructInfo(None, "float16", ndim=3)
    assert s.shape is None and s.ndim == 3 and not s.is_static
    assert TensorStructInfo(None, "float16").ndim == -1
    with pytest.raises(StructInfoError, match="not static"):
        s.static_shape()


def test_tensor_symbolic_shape():
    n = _n()
    s = TensorStructInfo((n, 4), "float32")
    assert s.shape[0] is n and s.ndim == 2 and not s.is_static
    assert s.dim(-1).value == 4


@pytest.mark.parametrize(
    "shape, ndim, match",
    [
        ((2, 3), 3, "disagrees"),
        ((-1, 3), -1, "non-negative"),
        ((tir.Var("m", "int32"), 3), -1, "int64"),
        (("a",), -1, "int or an int64"),
        (5, -1, "sequence"),
    ],
)
def test_tensor_rejects_bad_shapes(shape, ndim, match):
    with pytest.raises(StructInfoError, match=match):
        TensorStructInfo(shape, "float32", ndim)


def test_structural_equality_maps_symbolic_dims():
    n, m = _n("n"), _n("m")
    assert structural_equal(_t(n, 4), _t(m, 4))
    assert structural_hash(TensorStructInfo((n, 4), "float32")) == structural_hash(
        TensorStructInfo((m, 4), "float32")
    )
    assert not structural_equal(
        TensorStructInfo((n, n), "float32"), TensorStructInfo((n, m), "float32")
    )
    assert not structural_equal(TensorStructInfo((2,), "float32"), TensorStructInfo((2,), "int32"))
    assert not structural_equal(_t(2), _t(3))


def test_other_struct_infos():
    t = TensorStructInfo((2,), "float32")
    tup = TupleStructInfo([t, PrimStructInfo("int64", 3)])
    assert isinstance(tup.fields, tuple) and tup.fields[1].value.value == 3
    assert ShapeStructInfo((1, 2)).ndim == 2 and ShapeStructInfo(ndim=4).values is None
    f = FuncStructInfo([t], t)
    assert f.params == (t,)
    with pytest.raises(StructInfoError):
        TupleStructInfo([t, 3])
    assert str(ObjectStructInfo()) == "Object"
    assert str(tup) == 'Tuple(Tensor((2,), "float32"), Prim("int64", value=3))'
    assert str(f) == 'Callable((Tensor((2,), "float32"),), Tensor((2,), "float32"))'
    assert str(ShapeStructInfo(ndim=2)) == "Shape(ndim=2)"
    assert str(TensorStructInfo(None, "int8", 2)) == 'Tensor(dtype="int8", ndim=2)'


def test_lca():
    n = _n()
    a = TensorStructInfo((n, 4), "float32")
    assert struct_info_lca(a, a) is a
    b = TensorStructInfo((3, 4), "float32")
    j = struct_info_lca(a, b)
    assert j.shape is None and j.ndim == 2 and j.dtype == "float32"
    assert struct_info_lca(a, TensorStructInfo((3,), "float32")).ndim == -1
    assert isinstance(struct_info_lca(a, TensorStructInfo((n, 4), "int32")), ObjectStructInfo)
    assert isinstance(struct_info_lca(a, TupleStructInfo([a])), ObjectStructInfo)
    tj = struct_info_lca(TupleStructInfo([a, a]), TupleStructInfo([a, b]))
    assert tj.fields[0] is a and tj.fields[1].shape is None


def test_erase_sym_vars_keeps_only_bound_vars():
    n, m = _n("n"), _n("m")
    s = TupleStructInfo([TensorStructInfo((n, 2), "float32"), TensorStructInfo((m,), "float32")])
    e = erase_sym_vars(s, {id(n)})
    assert e.fields[0] is s.fields[0]
    assert e.fields[1].shape is None and e.fields[1].ndim == 1


def test_dims_equal():
    n = _n()
    assert dims_equal(tir.IntImm("int64", 3), tir.IntImm("int64", 3))
    assert dims_equal(n, n)
    assert not dims_equal(n, _n("m"))
    assert not dims_equal(n, tir.IntImm("int64", 3))


# ---------------------------------------------------------------------------------------------
# shape_utils
# ---------------------------------------------------------------------------------------------
def _vals(shape):
    return tuple(d.value if isinstance(d, tir.IntImm) else d for d in shape)


def _s(*dims):
    return TensorStructInfo(dims, "float32").shape


def test_broadcast_static():
    assert _vals(broadcast_shapes(_s(2, 1, 4), _s(3, 1))) == (2, 3, 4)
    assert _vals(broadcast_shapes(_s(), _s(5))) == (5,)
    with pytest.raises(StructInfoError, match=r"myop: shapes \(2, 3\) and \(4,\) do not"):
        broadcast_shapes(_s(2, 3), _s(4), "myop")


def test_broadcast_symbolic():
    n, m = _n("n"), _n("m")
    out = broadcast_shapes(_s(n, 4), _s(1, 4))
    assert out[0] is n and out[1].value == 4
    assert broadcast_shapes(_s(n, 4), _s(n, 1))[0] is n
    assert broadcast_shapes(None, _s(3)) is None
    # undecidable pairs hold the dim the result has at run time (the kernel checks the rest)
    (d,) = broadcast_shapes(_s(n), _s(m))
    assert isinstance(d, tir.Max) and {d.a, d.b} == {n, m}
    assert _vals(broadcast_shapes(_s(n, 3), _s(5, 1))) == (5, 3)
    assert broadcast_conditions(_s(n, 3), _s(5, 3))[0][0] == 0
    assert broadcast_conditions(_s(1, 3), _s(5, 3)) == []
    s = broadcast_sinfo(TensorStructInfo((n,), "float32"), TensorStructInfo((m,), "float32"))
    assert s.ndim == 1
    s = broadcast_sinfo(TensorStructInfo(None, "float32", 3), TensorStructInfo((2,), "float32"))
    assert s.ndim == 3
    s = broadcast_sinfo(TensorStructInfo(None, "float32"), TensorStructInfo((2,), "float32"))
    assert s.ndim == -1


def test_axes():
    assert normalize_axis(-1, 3) == 2 and normalize_axis(0, 1) == 0
    with pytest.raises(StructInfoError, match="sum: axis=3 is out of range for a 3-d"):
        normalize_axis(3, 3, "sum")
    with pytest.raises(StructInfoError, match="must be an int"):
        normalize_axis(1.0, 3)
    assert normalize_axes([0, -1], 4) == (0, 3)
    with pytest.raises(StructInfoError, match="repeat"):
        normalize_axes([1, -3], 4, "sum")


def test_prod():
    n = _n()
    assert prod(_s(2, 3, 4)).value == 24
    assert prod(()).value == 1 and prod(()).dtype == "int64"
    p = prod(_s(n, 3, 2))
    assert structural_equal(p, n * 6)
    assert prod(_s(n, 1)) is n


def test_computed_dims_are_folded_and_simplified():
    n = _n()
    h = tir.IntImm("int64", 32)
    s = TensorStructInfo(((h + 2 * 1 - 3) // 2 + 1, n * 2 // 2), "float32")
    assert s.shape[0].value == 16
    assert s.shape[1] is n or structural_equal(s.shape[1], n, map_free_vars=False)
    with pytest.raises(StructInfoError, match="non-negative"):
        TensorStructInfo((h - 40,), "float32")


def test_sequence_and_optional_struct_info():
    n = tir.Var("n", "int64")
    a = SequenceStructInfo(_t(2, 3), 4)
    assert a.static_length == 4 and SequenceStructInfo(_t(2, 3), n).static_length is None
    assert structural_equal(a, SequenceStructInfo(_t(2, 3), 4))
    assert not structural_equal(a, SequenceStructInfo(_t(2, 3)))
    # join: elements' shapes generalize, lengths kept only when equal
    j = struct_info_lca(a, SequenceStructInfo(_t(5, 3), 4))
    assert j.static_length == 4 and j.elem.shape is None and j.elem.ndim == 2
    assert struct_info_lca(a, SequenceStructInfo(_t(2, 3), 1)).length is None
    o = struct_info_lca(OptionalStructInfo(_t(2)), OptionalStructInfo(_t(3)))
    assert isinstance(o, OptionalStructInfo) and o.elem.ndim == 1
    assert isinstance(struct_info_lca(a, OptionalStructInfo(_t(2))), ObjectStructInfo)
    # symbolic parts the caller cannot bind are erased
    e = erase_sym_vars(SequenceStructInfo(TensorStructInfo((n, 3), "float32"), n), set())
    assert e.length is None and e.elem.shape is None and e.elem.ndim == 2
    with pytest.raises(StructInfoError):
        SequenceStructInfo("not a struct info")
    with pytest.raises(StructInfoError):
        SequenceStructInfo(_t(1), -1)
