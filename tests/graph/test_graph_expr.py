"""Graph expressions: constants, conversions, call_tir, derived struct_info, structural equality."""

import numpy as np
import pytest

from kiln import tir
from kiln.graph import (
    Call,
    Constant,
    DataflowVar,
    Function,
    GlobalVar,
    Op,
    PrimStructInfo,
    PrimValue,
    SeqExpr,
    ShapeExpr,
    StringImm,
    TensorStructInfo,
    Tuple,
    TupleGetItem,
    TupleStructInfo,
    Var,
    as_expr,
    call_tir,
    const,
    is_call_tir,
    is_leaf,
)
from kiln.graph.op_registry import get_op_def
from kiln.ir import KilnError, StructInfoError, structural_equal, structural_hash


def _t(*shape, dtype="float32"):
    return TensorStructInfo(shape, dtype)


def test_constant_struct_info_and_read_only_data():
    arr = np.arange(6, dtype=np.float16).reshape(2, 3)
    c = Constant(arr)
    assert structural_equal(c.struct_info, _t(2, 3, dtype="float16"))
    assert c.dtype == "float16"
    assert not c.data.flags.writeable
    with pytest.raises(ValueError):
        c.data[0, 0] = 1
    assert arr.flags.writeable  # the caller's array is untouched


def test_const_default_dtypes():
    assert const(1.5).dtype == "float32"
    assert const(3).dtype == "int64"
    assert const(True).dtype == "bool"
    assert const([[1.0, 2.0]]).struct_info.static_shape() == (1, 2)
    assert const([[1.0, 2.0]]).dtype == "float32"
    assert const(np.float64(2.0)).dtype == "float64"
    assert const(np.zeros(3, np.int8)).dtype == "int8"
    assert const(2, "float16").dtype == "float16"
    c = const(np.ones(2, np.float32))
    assert const(c) is c and const(c, "int32").dtype == "int32"
    with pytest.raises(KilnError):
        const("text")


def test_as_expr():
    x = Var("x", _t(2))
    assert as_expr(x) is x
    assert isinstance(as_expr(np.ones(2)), Constant)
    assert isinstance(as_expr(2.0), Constant) and as_expr(2.0).dtype == "float32"
    assert isinstance(as_expr([1, 2]), Constant)
    tup = as_expr([x, 1.0])
    assert isinstance(tup, Tuple) and tup.fields[0] is x and isinstance(tup.fields[1], Constant)
    assert isinstance(as_expr(()), Tuple)
    n = tir.Var("n", "int64")
    pv = as_expr(n)
    assert isinstance(pv, PrimValue)
    assert structural_equal(pv.struct_info, PrimStructInfo("int64", n))
    assert isinstance(as_expr("nearest"), StringImm)
    with pytest.raises(KilnError, match="cannot convert"):
        as_expr(object())


def test_leaves_compute_struct_info_at_construction():
    x = Var("x", _t(2))
    tup = Tuple([x, const(1.0)])
    assert isinstance(tup.struct_info, TupleStructInfo)
    assert TupleGetItem(tup, 0).struct_info is x.struct_info
    assert ShapeExpr((2, 3)).struct_info.ndim == 2
    assert PrimValue(4).value.dtype == "int64"
    assert is_leaf(tup) and is_leaf(x)
    assert not is_leaf(TupleGetItem(tup, 0))


def test_call_tir_struct_info_is_out_sinfo():
    x = Var("x", _t(4))
    out = _t(4)
    c = call_tir(GlobalVar("add_one"), [x], out)
    assert is_call_tir(c) and c.struct_info is out
    assert isinstance(c.args[1], Tuple) and c.args[1].fields[0] is x
    two = call_tir(GlobalVar("split"), (x,), [_t(2), _t(2)])
    assert isinstance(two.struct_info, TupleStructInfo) and len(two.struct_info.fields) == 2
    with pytest.raises(StructInfoError, match="output 0 must be a TensorStructInfo"):
        call_tir(GlobalVar("f"), [x], PrimStructInfo("int64"))


def test_replace_drops_derived_struct_info_but_var_keeps_its_own():
    x = Var("x", _t(4))
    c = call_tir(GlobalVar("f"), [x], _t(4))
    plain = Call(Op("some.op"), (x,), struct_info=_t(4))
    assert plain.replace(args=(x, x)).struct_info is None
    # call_tir recomputes it from sinfo_args
    assert c.replace(sinfo_args=(_t(8),)).struct_info.static_shape() == (8,)
    y = x.replace(name="y")
    assert y is not x and y.struct_info is x.struct_info


def test_structural_equality_ignores_derived_struct_info():
    x = Var("x", _t(4))
    a = Call(Op("some.op"), (x,))
    b = Call(Op("some.op"), (x,), struct_info=_t(4))
    assert structural_equal(a, b)
    assert structural_hash(a) == structural_hash(b)
    assert not structural_equal(a, Call(Op("other.op"), (x,)))


def test_vars_compare_by_struct_info_and_kind():
    assert structural_equal(Var("a", _t(2)), Var("b", _t(2)))
    assert not structural_equal(Var("a", _t(2)), Var("a", _t(3)))
    assert not structural_equal(Var("a", _t(2)), DataflowVar("a", _t(2)))


def test_function_derives_ret_and_erases_inner_symbols():
    n, m = tir.Var("n", "int64"), tir.Var("m", "int64")
    x = Var("x", _t(n, 4))
    f = Function([x], SeqExpr([], x))
    assert f.ret_struct_info is x.struct_info
    assert f.struct_info.params == (x.struct_info,)
    y = Var("y", _t(m, 4))  # m is not bound by the parameters
    g = Function([x], SeqExpr([], y))
    assert g.ret_struct_info.shape is None and g.ret_struct_info.ndim == 2
    with pytest.raises(StructInfoError, match="parameter z has no struct_info"):
        Function([Var("z")], SeqExpr([], x))


def test_constant_equality_compares_data():
    a = const(np.array([1.0, 2.0], np.float32))
    b = const(np.array([1.0, 2.0], np.float32))
    c = const(np.array([1.0, 3.0], np.float32))
    assert structural_equal(a, b) and structural_hash(a) == structural_hash(b)
    assert not structural_equal(a, c)


def test_op_def_lookup():
    with pytest.raises(KilnError, match="no operator named"):
        get_op_def(Op("definitely.not.an.op").name)
