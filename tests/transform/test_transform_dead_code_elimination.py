"""DeadCodeElimination: unused pure bindings and unreachable functions."""

import numpy as np

import kiln
from kiln import graph as g
from kiln import op
from kiln.ir import IRModule, assert_structural_equal
from kiln.transform import DeadCodeElimination, LegalizeOps
from kiln.transform.dead_code_elimination import is_pure


def _t(*shape):
    return g.TensorStructInfo(shape, "float32")


def test_unused_chain_removed_outputs_kept():
    x = g.Var("x", _t(4))
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(op.exp(x))
            bb.emit(op.relu(a))  # dead, and the only user of a
            b = bb.emit(op.negative(x))
            out = bb.emit_output(op.add(b, x))
            bb.emit_output(op.sqrt(x))  # a dead block output
        bb.emit(op.tanh(out))  # dead pure binding outside the dataflow block
        bb.emit_func_output(out)
    after = DeadCodeElimination()(bb.get())

    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            b = bb.emit(op.negative(x))
            out = bb.emit_output(op.add(b, x))
        bb.emit_func_output(out)
    assert_structural_equal(after["main"], bb.get()["main"])


def test_nothing_dead_returns_same_function():
    x = g.Var("x", _t(4))
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        gv = bb.emit(op.exp(x))
        bb.emit_func_output(gv)
    mod = bb.get()
    assert DeadCodeElimination()(mod)["main"] is mod["main"]


def test_impure_calls_and_match_cast_kept():
    x = g.Var("x", _t(4))
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        bb.emit(g.Call(g.ExternFunc("log_tensor"), [x], sinfo_args=(g.ObjectStructInfo(),)))
        bb.match_cast(x, g.TensorStructInfo((4,), "float32"))
        bb.emit(op.exp(x))  # dead and pure: removed
        bb.emit_func_output(x)
    after = DeadCodeElimination()(bb.get())
    kinds = [type(b).__name__ for b in after["main"].body.blocks[0].bindings]
    assert kinds == ["VarBinding", "MatchCast"]
    assert not is_pure(after["main"].body.blocks[0].bindings[0].value)


def test_dead_code_inside_if_branches():
    c = g.Var("c", g.TensorStructInfo((), "bool"))
    x = g.Var("x", _t(4))
    bb = g.BlockBuilder()
    with bb.function("main", [c, x]):
        bb.begin_scope()
        bb.begin_binding_block()
        bb.emit(op.exp(x))  # dead inside the branch
        t = bb.emit(op.relu(x))
        then = g.SeqExpr([bb.end_block()], t)
        bb.end_scope()
        v = bb.emit(g.If(c, then, g.SeqExpr([], x)))
        bb.emit_func_output(v)
    after = DeadCodeElimination()(bb.get())
    branch = after["main"].body.blocks[0].bindings[0].value.true_branch
    assert [b.value.op.name for b in branch.blocks[0].bindings] == ["relu"]


def test_unreachable_functions_removed():
    x = g.Var("x", _t(4))
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            gv = bb.emit_output(op.exp(x))
        bb.emit_func_output(gv)
    y = g.Var("y", _t(4))
    with bb.function("unused_private", [y]):
        bb.emit_func_output(bb.emit(op.relu(y)))
    z = g.Var("z", _t(4))
    with bb.function("exported", [z], attrs={"global_symbol": "exported"}):
        bb.emit_func_output(bb.emit(op.tanh(z)))
    mod = LegalizeOps()(bb.get())  # adds PrimFuncs exp, relu, tanh
    assert {"exp", "relu", "tanh"} <= set(mod)
    after = DeadCodeElimination()(mod)
    assert set(after) == {"main", "exported", "exp", "tanh"}
    # naming an extra entry keeps it (and what it calls)
    kept = DeadCodeElimination(entry_functions=["unused_private"])(mod)
    assert set(kept) == set(mod)


def test_module_without_entry_keeps_graph_functions():
    y = g.Var("y", _t(4))
    bb = g.BlockBuilder()
    with bb.function("lib_fn", [y]):
        bb.emit_func_output(bb.emit(op.relu(y)))
    mod = LegalizeOps()(bb.get())
    assert set(DeadCodeElimination()(mod)) == {"lib_fn", "relu"}
    # a module of PrimFuncs only is a kernel library: all kept
    prims = IRModule({"relu": mod["relu"]})
    assert set(DeadCodeElimination()(prims)) == {"relu"}


def test_dead_call_of_pure_graph_function_removed():
    y = g.Var("y", _t(4))
    x = g.Var("x", _t(4))
    bb = g.BlockBuilder()
    with bb.function("helper", [y]):
        bb.emit_func_output(bb.emit(op.relu(y)))
    with bb.function("main", [x]):
        bb.emit(g.Call(g.GlobalVar("helper"), [x]))
        bb.emit_func_output(bb.emit(op.exp(x)))
    after = DeadCodeElimination()(bb.get())
    assert set(after) == {"main"}
    assert len(after["main"].body.blocks[0].bindings) == 1


def test_numerics_unchanged():
    x = g.Var("x", _t(8))
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            bb.emit(op.exp(x))
            gv = bb.emit_output(op.relu(x))
        bb.emit_func_output(gv)
    mod = bb.get()
    data = np.random.default_rng(0).standard_normal(8).astype("float32")
    after = DeadCodeElimination()(mod)
    np.testing.assert_array_equal(kiln.build(after)(data), kiln.build(mod)(data))
