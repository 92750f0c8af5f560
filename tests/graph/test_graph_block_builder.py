"""BlockBuilder: dataflow blocks, A-normal form, inference through registered ops, errors,
function calls with symbolic shapes, match_cast, add_func deduplication."""

from dataclasses import dataclass

import numpy as np
import pytest

from kiln import tir
from kiln.graph import (
    BindingBlock,
    BlockBuilder,
    Call,
    DataflowBlock,
    DataflowVar,
    Function,
    GlobalVar,
    If,
    MatchCast,
    Op,
    PrimStructInfo,
    SeqExpr,
    TensorStructInfo,
    Tuple,
    TupleGetItem,
    TupleStructInfo,
    Var,
    VarBinding,
    call_tir,
    const,
)
from kiln.graph.shape_utils import (
    broadcast_sinfo,
    dims_differ,
    normalize_axis,
    op_label,
    same_dtype,
    tensor_list_sinfo,
    tensor_sinfo,
)
from kiln.ir import (
    InternalError,
    IRModule,
    KilnError,
    StructInfoError,
    assert_structural_equal,
    structural_equal,
    structural_hash,
)
from kiln.op.registry import OpPattern, get_op_def, list_ops, register_op


# ---------------------------------------------------------------------------------------------
# test-only operators (unique names; never lowered)
# ---------------------------------------------------------------------------------------------
def _not_lowerable(bb, call):
    raise KilnError(f"{call.op.name} is a test-only operator")


def _op(name, infer, inputs, attrs=None):
    if name not in list_ops():
        register_op(name, inputs=inputs, infer=infer, pattern=OpPattern.OPAQUE, attrs=attrs,
                    legalize=_not_lowerable)
    return get_op_def(name)


def _infer_add(call):
    a, b = tensor_sinfo(call, 0), tensor_sinfo(call, 1)
    return broadcast_sinfo(a, b, same_dtype(call, a, b), op_label(call))


def _infer_matmul(call):
    a, b = tensor_sinfo(call, 0, ndim=2), tensor_sinfo(call, 1, ndim=2)
    dtype = same_dtype(call, a, b)
    if a.shape is None or b.shape is None:
        return TensorStructInfo(None, dtype, 2)
    if dims_differ(a.shape[1], b.shape[0]):
        raise StructInfoError(f"{op_label(call)}: inner dimensions differ")
    return TensorStructInfo((a.shape[0], b.shape[1]), dtype)


@dataclass(frozen=True)
class SplitAttrs:
    axis: int = 0


def _infer_split2(call):
    x = tensor_sinfo(call, 0)
    axis = normalize_axis(call.attrs.axis, x.ndim, op_label(call))
    half = list(x.shape)
    half[axis] = half[axis] // 2
    return TupleStructInfo([TensorStructInfo(half, x.dtype)] * 2)


@dataclass(frozen=True)
class ConcatAttrs:
    axis: int


def _infer_concat(call):
    parts = tensor_list_sinfo(call, 0)
    axis = normalize_axis(call.attrs.axis, parts[0].ndim, op_label(call))
    shape = list(parts[0].shape)
    for p in parts[1:]:
        shape[axis] = shape[axis] + p.shape[axis]
    return TensorStructInfo(shape, same_dtype(call, *parts))


def _crash(call):
    return call.args[7]


ADD = _op("test_graph_bb.add", _infer_add, ("lhs", "rhs"))
MATMUL = _op("test_graph_bb.matmul", _infer_matmul, ("a", "b"))
SPLIT2 = _op("test_graph_bb.split2", _infer_split2, ("data",), SplitAttrs)
CONCAT = _op("test_graph_bb.concat", _infer_concat, ("tensors*",), ConcatAttrs)
CRASH = _op("test_graph_bb.crash", _crash, ("x",))


def _t(*shape, dtype="float32"):
    return TensorStructInfo(shape, dtype)


def _bindings(func):
    return [b for blk in func.body.blocks for b in blk.bindings]


# ---------------------------------------------------------------------------------------------
def test_dataflow_and_binding_blocks():
    x = Var("x", _t(2, 3))
    bb = BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            lv = bb.emit(ADD(x, x))
            gv = bb.emit_output(ADD(lv, x))
        out = bb.emit(ADD(gv, gv))
        bb.emit_func_output(out)
    f = bb.get()["main"]
    assert isinstance(lv, DataflowVar) and type(gv) is Var and type(out) is Var
    blocks = f.body.blocks
    assert [type(b) for b in blocks] == [DataflowBlock, BindingBlock]
    assert [b.var for b in blocks[0].bindings] == [lv, gv]
    assert f.body.body is out
    assert (lv.name, gv.name, out.name) == ("lv", "gv", "gv1")
    assert structural_equal(f.ret_struct_info, _t(2, 3))


def test_emit_rules():
    x = Var("x", _t(2))
    bb = BlockBuilder()
    with pytest.raises(KilnError, match="needs an open function"):
        bb.emit(ADD(x, x))
    with bb.function("main", [x]):
        with pytest.raises(KilnError, match="only allowed inside a dataflow block"):
            bb.emit_output(x)
        with bb.dataflow():
            gv = bb.emit_output(ADD(x, x))
            with pytest.raises(KilnError, match="inside a dataflow block"):
                bb.emit_func_output(gv)
        bb.emit_func_output(gv)
    assert "main" in bb.get()
    with pytest.raises(KilnError, match=r"DataflowVar\(s\) \['lv'\] outside"):
        with bb.function("leak", [x]):
            with bb.dataflow():
                lv = bb.emit(ADD(x, x))
            bb.emit_func_output([x, lv])


def test_missing_func_output_is_an_error_and_adds_nothing():
    x = Var("x", _t(2))
    bb = BlockBuilder()
    with pytest.raises(KilnError, match="emit_func_output"):
        with bb.function("main", [x]):
            bb.emit(ADD(x, x))
    assert "main" not in bb.get()
    # the builder is usable again afterwards
    with bb.function("main", [x]):
        bb.emit_func_output(bb.emit(ADD(x, x)))
    assert "main" in bb.get()


def test_a_normal_form_emits_nested_calls_first():
    x, w = Var("x", _t(4, 8)), Var("w", _t(8, 2))
    bb = BlockBuilder()
    with bb.function("main", [x, w]):
        with bb.dataflow():
            out = bb.emit_output(ADD(MATMUL(x, w), ADD(MATMUL(x, w), const(1.0))))
        bb.emit_func_output(out)
    f = bb.get()["main"]
    bs = _bindings(f)
    ops = [b.value.op.name.split(".")[1] for b in bs]
    assert ops == ["matmul", "matmul", "add", "add"]
    assert [b.var.name for b in bs] == ["lv", "lv1", "lv2", "gv"]
    assert all(isinstance(b.var, DataflowVar) for b in bs[:3]) and bs[3].var is out
    assert bs[2].value.args == (bs[1].var, bs[2].value.args[1])
    assert bs[3].value.args == (bs[0].var, bs[2].var)
    assert structural_equal(out.struct_info, _t(4, 2))
    for b in bs:  # every argument is a leaf
        assert not any(isinstance(a, Call) for a in b.value.args)


def test_func_output_that_is_a_call_or_tuple():
    x = Var("x", _t(3))
    bb = BlockBuilder()
    with bb.function("main", [x]):
        bb.emit_func_output([x, ADD(x, x)])
    f = bb.get()["main"]
    assert isinstance(f.body.body, Tuple)
    assert f.body.body.fields[0] is x and isinstance(f.body.body.fields[1], Var)
    assert structural_equal(f.ret_struct_info, TupleStructInfo([_t(3), _t(3)]))


def test_params_given_at_output():
    x = Var("x", _t(3))
    bb = BlockBuilder()
    with bb.function("main"):
        bb.emit_func_output(x, params=[x])
    assert bb.get()["main"].params == (x,)
    with pytest.raises(KilnError, match="no parameters"):
        with bb.function("other"):
            bb.emit_func_output(x)


def test_symbolic_shapes_flow_through():
    n, m = tir.Var("n", "int64"), tir.Var("m", "int64")
    x, w, b = Var("x", _t(n, 16)), Var("w", _t(16, m)), Var("b", _t(1, m))
    bb = BlockBuilder()
    with bb.function("main", [x, w, b]):
        with bb.dataflow():
            y = bb.emit(MATMUL(x, w))
            z = bb.emit_output(ADD(y, b))
        bb.emit_func_output(z)
    assert z.struct_info.shape[0] is n and z.struct_info.shape[1] is m
    f = bb.get()["main"]
    assert structural_equal(f.ret_struct_info, _t(n, m), map_free_vars=False)


def test_struct_info_errors_name_the_op_and_argument():
    x = Var("x", _t(4, 8))
    t = Var("t", TupleStructInfo([_t(2)]))
    bb = BlockBuilder()
    with bb.function("main", [x, t]):
        with pytest.raises(StructInfoError, match=r"test_graph_bb.add: 'rhs' \(input 1\) must be a "
                                                  r"tensor, got Tuple"):
            bb.emit(ADD(x, t))
        with pytest.raises(StructInfoError, match="test_graph_bb.add: shapes"):
            bb.emit(ADD(x, Var("y", _t(3, 8))))
        with pytest.raises(StructInfoError, match="test_graph_bb.matmul: inner dimensions"):
            bb.emit(MATMUL(x, x))
        with pytest.raises(StructInfoError, match="'a' \\(input 0\\) must be 2-d"):
            bb.emit(MATMUL(Var("v", _t(8)), x))
        with pytest.raises(StructInfoError, match="same dtype"):
            bb.emit(ADD(x, Var("i", _t(4, 8, dtype="int32"))))
        with pytest.raises(StructInfoError, match=r"expected 2 input\(s\)"):
            bb.emit(Call(Op("test_graph_bb.add"), (x,)))
        with pytest.raises(StructInfoError, match="no operator named"):
            bb.emit(Call(Op("test_graph_bb.nope"), (x,)))
        with pytest.raises(InternalError, match="inference of test_graph_bb.crash crashed"):
            bb.emit(CRASH(x))
        bb.emit_func_output(x)


def test_tuple_results_and_variadic_inputs():
    x = Var("x", _t(4, 6))
    bb = BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            parts = bb.emit(SPLIT2(x, axis=1))
            first = bb.emit(TupleGetItem(parts, 0))
            cat = bb.emit_output(CONCAT([first, TupleGetItem(parts, 1), x], axis=1))
        bb.emit_func_output(cat)
    assert structural_equal(first.struct_info, _t(4, 3))
    assert cat.struct_info.static_shape() == (4, 12)
    # the TupleGetItem argument inside the concat list was emitted first
    bs = _bindings(bb.get()["main"])
    assert isinstance(bs[2].value, TupleGetItem)
    assert isinstance(bs[3].value.args[0], Tuple)
    with pytest.raises(KilnError):
        with bb.function("bad", [x]):
            bb.emit(TupleGetItem(parts, 5))


def test_default_attrs_are_filled():
    x = Var("x", _t(4, 6))
    bb = BlockBuilder()
    with bb.function("main", [x]):
        v = bb.emit(Call(Op("test_graph_bb.split2"), (x,)))
        bb.emit_func_output(v)
    call = _bindings(bb.get()["main"])[0].value
    assert call.attrs == SplitAttrs(0)
    assert v.struct_info.fields[0].static_shape() == (2, 6)


def test_normalize_fills_without_emitting():
    x = Var("x", _t(2, 2))
    bb = BlockBuilder()
    inner = ADD(x, x)
    outer = ADD(inner, x)
    got = bb.normalize(outer)
    assert got is outer and outer.struct_info is not None and inner.struct_info is not None
    assert bb.normalize(outer) is outer  # idempotent


def test_call_tir_binding():
    x = Var("x", _t(8))
    bb = BlockBuilder()
    gv = GlobalVar("add_one")
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(call_tir(gv, [x], _t(8)))
        bb.emit_func_output(y)
    assert structural_equal(y.struct_info, _t(8))
    with bb.function("bad", [x]):
        with pytest.raises(StructInfoError, match="call_tir expects"):
            bb.emit(Call(Op("call_tir"), (x, Tuple([x])), None, (_t(8),)))
        bb.emit_func_output(x)


def test_calling_a_graph_function_binds_its_symbolic_dims():
    n = tir.Var("n", "int64")
    p = Var("p", _t(n, 4))
    bb = BlockBuilder()
    with bb.function("double", [p]):
        bb.emit_func_output(bb.emit(ADD(p, p)))
    x = Var("x", _t(8, 4))
    with bb.function("main", [x]):
        y = bb.emit(Call(GlobalVar("double"), (x,)))
        with pytest.raises(StructInfoError, match="call of double: argument 0: dimension 1"):
            bb.emit(Call(GlobalVar("double"), (Var("z", _t(8, 5)),)))
        with pytest.raises(StructInfoError, match="give its result StructInfo in sinfo_args"):
            bb.emit(Call(GlobalVar("unknown"), (x,)))
        ext = bb.emit(Call(GlobalVar("unknown"), (x,), sinfo_args=(_t(1),)))
        bb.emit_func_output(y)
    assert y.struct_info.static_shape() == (8, 4)
    assert ext.struct_info.static_shape() == (1,)


def test_match_cast_defines_symbolic_vars():
    x = Var("x", TensorStructInfo(None, "float32", 2))
    n = tir.Var("n", "int64")
    bb = BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.match_cast(x, _t(n, 4))
            z = bb.emit_output(ADD(y, y))
        with pytest.raises(StructInfoError, match="match_cast: expected dtype int32"):
            bb.match_cast(x, _t(n, 4, dtype="int32"))
        with pytest.raises(StructInfoError, match="expected a 3-d tensor"):
            bb.match_cast(x, _t(n, 4, 1))
        bb.emit_func_output(z)
    f = bb.get()["main"]
    mc = f.body.blocks[0].bindings[0]
    assert isinstance(mc, MatchCast) and isinstance(y, DataflowVar)
    assert z.struct_info.shape[0] is n
    # n is defined inside the body only: the signature erases it
    assert f.ret_struct_info.shape is None and f.ret_struct_info.ndim == 2


def test_if_joins_branch_struct_info():
    c = Var("c", PrimStructInfo("bool"))
    x, y = Var("x", _t(2, 3)), Var("y", _t(5, 3))
    bb = BlockBuilder()
    with bb.function("main", [c, x, y]):
        r = bb.emit(If(c, ADD(x, x), y))
        bb.emit_func_output(r)
    assert r.struct_info.shape is None and r.struct_info.ndim == 2
    value = _bindings(bb.get()["main"])[0].value
    assert isinstance(value.true_branch, SeqExpr) and len(value.true_branch.blocks) == 1
    assert isinstance(value.false_branch, SeqExpr) and value.false_branch.body is y


def _prim_func(c=1.0, n=4):
    a, b = tir.Var("a", "handle"), tir.Var("b", "handle")
    A, B = tir.decl_buffer((n,), "float32", "A"), tir.decl_buffer((n,), "float32", "B")
    i = tir.Var("i", "int64")
    body = tir.For(i, 0, n, tir.ForKind.SERIAL, tir.BufferStore(B, A[i] + c, (i,)))
    return tir.PrimFunc((a, b), {a: A, b: B}, body)


def test_add_func_dedups_structurally_equal_functions():
    bb = BlockBuilder()
    g1 = bb.add_func(_prim_func(), "add_one")
    g2 = bb.add_func(_prim_func(), "add_one")  # equal up to renaming: same function
    g3 = bb.add_func(_prim_func(2.0), "add_one")
    assert g1.name == g2.name == "add_one" and g3.name == "add_one1"
    mod = bb.get()
    assert sorted(mod) == ["add_one", "add_one1"]
    assert bb.get_unique_name("add_one") == "add_one2"
    # a builder over an existing module deduplicates against it, without changing it
    bb2 = BlockBuilder(mod)
    assert bb2.add_func(_prim_func(2.0), "x").name == "add_one1"
    bb2.add_func(_prim_func(3.0), "add_one")
    assert len(mod) == 2 and len(bb2.get()) == 3
    bb2.update_func("add_one", _prim_func(5.0))
    assert structural_equal(bb2.get()["add_one"], _prim_func(5.0))
    assert isinstance(bb2.get(), IRModule)


def _model(names, scale=2.0, op=ADD):
    x = Var(names[0], _t(5, 4))
    w = Var(names[1], _t(4, 3))
    bb = BlockBuilder()
    with bb.function("main", [x, w]):
        with bb.dataflow():
            lv = bb.emit(MATMUL(x, w), names[2])
            lv2 = bb.emit(op(lv, const(np.full((5, 3), scale, np.float32))))
            gv = bb.emit_output(ADD(lv2, lv))
        bb.emit_func_output(gv)
    return bb.get()["main"]


def test_structural_equality_of_functions():
    a = _model(["x", "w", "lv"])
    b = _model(["inp", "weight", "hidden"])
    assert_structural_equal(a, b)
    assert structural_hash(a) == structural_hash(b)
    c = _model(["x", "w", "lv"], scale=3.0)
    assert not structural_equal(a, c)
    sub = _op("test_graph_bb.sub", _infer_add, ("lhs", "rhs"))
    d = _model(["x", "w", "lv"], op=sub)
    assert not structural_equal(a, d)


def test_unique_var_names_and_lookup_binding():
    x = Var("x", _t(2))
    bb = BlockBuilder()
    with bb.function("main", [x]):
        a = bb.emit(ADD(x, x), "x")
        b = bb.emit(ADD(a, x), "x")
        assert bb.lookup_binding(b).args[0] is a
        bb.emit_func_output(b)
    assert (a.name, b.name) == ("x1", "x2")


def test_function_with_attrs_and_duplicate_name():
    x = Var("x", _t(2))
    bb = BlockBuilder()
    with bb.function("main", [x], attrs={"global_symbol": "main"}):
        bb.emit_func_output(x)
    f = bb.get()["main"]
    assert isinstance(f, Function) and f.attrs == {"global_symbol": "main"}
    with pytest.raises(KilnError, match="already has a function"):
        with bb.function("main", [x]):
            pass


def test_emit_normalized_checks_dataflow_vars():
    x = Var("x", _t(2))
    bb = BlockBuilder()
    bb.begin_scope([x])
    bb.begin_binding_block()
    with pytest.raises(KilnError, match="outside a dataflow block"):
        bb.emit_normalized(VarBinding(DataflowVar("d", _t(2)), x))
    bb.emit_normalized(VarBinding(Var("v", _t(2)), x))
    block = bb.end_block()
    bb.end_scope()
    assert len(block.bindings) == 1 and type(block) is BindingBlock
