"""Normalize (A-normal form + missing StructInfo) and InferStructInfo (re-inference)."""

import numpy as np
import pytest

from kiln import graph as g
from kiln import op
from kiln.graph.well_formed import well_formed
from kiln.ir import IRModule, StructInfoError, assert_structural_equal
from kiln.transform import InferStructInfo, Normalize, PassContext


def _repair(pass_, mod):
    """Run a repairing pass on ill-formed input (which the conftest instrument would reject
    before the pass runs) and check that its output is well formed."""
    with PassContext(instruments=()):
        out = pass_(mod)
    well_formed(out)
    return out


def _t(*shape, dtype="float32"):
    return g.TensorStructInfo(shape, dtype)


def test_nested_calls_get_their_own_bindings():
    x, y = g.Var("x", _t(4, 8)), g.Var("y", _t(4, 8))
    lv, gv = g.DataflowVar("lv"), g.Var("gv")  # no struct_info: Normalize fills it
    body = g.SeqExpr(
        [g.DataflowBlock([g.VarBinding(lv, op.relu(op.add(x, y))),
                          g.VarBinding(gv, op.exp(lv))])],
        op.negative(gv),
    )
    mod = IRModule({"main": g.Function([x, y], body)})
    after = _repair(Normalize(), mod)

    bb = g.BlockBuilder()
    with bb.function("main", [x, y]):
        with bb.dataflow():
            a = bb.emit(op.add(x, y))
            b = bb.emit(op.relu(a))
            c = bb.emit_output(op.exp(b))
        d = bb.emit(op.negative(c))
        bb.emit_func_output(d)
    assert_structural_equal(after["main"], bb.get()["main"])


def test_bare_body_and_tuple_fields():
    x = g.Var("x", _t(2, 3))
    func = g.Function([x], op.concat([op.exp(x), op.relu(x)], axis=0))
    after = _repair(Normalize(), IRModule({"f": func}))

    bb = g.BlockBuilder()
    with bb.function("f", [x]):
        a = bb.emit(op.exp(x))
        b = bb.emit(op.relu(x))
        c = bb.emit(op.concat([a, b], axis=0))
        bb.emit_func_output(c)
    assert_structural_equal(after["f"], bb.get()["f"])
    assert after["f"].ret_struct_info.shape[0].value == 4


def test_normalized_module_is_unchanged():
    x = g.Var("x", _t(4))
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            gv = bb.emit_output(op.exp(x))
        bb.emit_func_output(gv)
    mod = bb.get()
    after = Normalize()(mod)
    assert after is not mod
    assert after["main"] is mod["main"]


def test_infer_struct_info_replaces_stale_annotations():
    # a hand edit: x now has 2 rows, but the binding still claims 4 (and so does the result)
    x = g.Var("x", _t(2, 8))
    lv = g.Var("lv", _t(4, 8))
    stale = g.Function([x], g.SeqExpr([g.BindingBlock([g.VarBinding(lv, op.add(x, x))])], lv),
                       _t(4, 8))
    mod = IRModule({"main": stale})
    # Normalize refuses annotations that contradict the value; InferStructInfo re-derives them
    with pytest.raises(StructInfoError, match="lv.*InferStructInfo"):
        _repair(Normalize(), mod)
    after = _repair(InferStructInfo(), mod)

    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        v = bb.emit(op.add(x, x))
        bb.emit_func_output(v)
    assert_structural_equal(after["main"], bb.get()["main"])
    assert after["main"].ret_struct_info.static_shape() == (2, 8)


def test_infer_struct_info_handles_callees_first():
    # main calls helper; helper's result annotation is stale and main's binding depends on it
    a = g.Var("a", _t(3, dtype="float32"))
    t = g.Var("t", _t(5))
    helper = g.Function([a], g.SeqExpr([g.BindingBlock([g.VarBinding(t, op.exp(a))])], t), _t(5))
    x = g.Var("x", _t(3))
    r = g.Var("r", _t(5))
    call = g.Call(g.GlobalVar("helper"), [x], sinfo_args=())
    call_binding = g.VarBinding(r, call)
    main = g.Function([x], g.SeqExpr([g.BindingBlock([call_binding])], r), _t(5))
    # the call's StructInfo is memoized from the stale signature
    call._fill_struct_info(_t(5))
    after = _repair(InferStructInfo(), IRModule({"main": main, "helper": helper}))
    assert after["helper"].ret_struct_info.static_shape() == (3,)
    new_r = after["main"].body.blocks[0].bindings[0].var
    assert new_r.struct_info.static_shape() == (3,)
    assert after["main"].ret_struct_info.static_shape() == (3,)


def test_normalize_fills_if_branches():
    c = g.Var("c", g.TensorStructInfo((), "bool"))
    x = g.Var("x", _t(4))
    v = g.Var("v")
    branch = g.If(c, op.exp(op.relu(x)), op.negative(x))
    func = g.Function([c, x], g.SeqExpr([g.BindingBlock([g.VarBinding(v, branch)])], v))
    after = _repair(Normalize(), IRModule({"main": func}))
    new_if = after["main"].body.blocks[0].bindings[0].value
    assert isinstance(new_if.true_branch, g.SeqExpr)
    assert len(new_if.true_branch.blocks[0].bindings) == 2  # relu, then exp
    assert after["main"].ret_struct_info.static_shape() == (4,)
    np.testing.assert_equal(len(new_if.false_branch.blocks[0].bindings), 1)


def test_less_specific_annotation_is_kept():
    x = g.Var("x", _t(4, 8))
    lv = g.Var("lv", g.TensorStructInfo(None, "float32", ndim=2))
    func = g.Function([x], g.SeqExpr([g.BindingBlock([g.VarBinding(lv, op.exp(op.relu(x)))])],
                                     lv))
    after = _repair(Normalize(), IRModule({"main": func}))
    bindings = after["main"].body.blocks[0].bindings
    assert bindings[1].var is lv  # annotation kept (unknown shape covers (4, 8))
    assert bindings[0].var.struct_info.static_shape() == (4, 8)
