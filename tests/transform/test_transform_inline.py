"""Inline: private graph functions called once (or marked "inline") are inlined."""

import numpy as np

import kiln
from kiln import graph as g
from kiln import op, tir
from kiln.ir import assert_structural_equal
from kiln.transform import Inline

RNG = np.random.default_rng(9)


def _t(*shape):
    return g.TensorStructInfo(shape, "float32")


def _helper(bb, name, attrs=None, shape=(4,)):
    a = g.Var("a", _t(*shape))
    with bb.function(name, [a], attrs=attrs):
        with bb.dataflow():
            e = bb.emit(op.exp(a))
            r = bb.emit_output(op.add(e, a))
        bb.emit_func_output(r)
    return g.GlobalVar(name)


def test_single_call_is_inlined_and_callee_removed():
    bb = g.BlockBuilder()
    helper = _helper(bb, "helper")
    x = g.Var("x", _t(4))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(g.Call(helper, [x]))
            out = bb.emit_output(op.relu(h))
        bb.emit_func_output(out)
    mod = bb.get()
    after = Inline()(mod)
    assert set(after) == {"main"}

    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            e = bb.emit(op.exp(x))
            r = bb.emit(op.add(e, x))
            out = bb.emit_output(op.relu(r))
        bb.emit_func_output(out)
    assert_structural_equal(after["main"], bb.get()["main"])
    # (the executor runs no graph-function calls: compare with numpy)
    data = RNG.standard_normal(4).astype("float32")
    np.testing.assert_allclose(kiln.build(after)(data), np.maximum(np.exp(data) + data, 0),
                               rtol=1e-6)


def _helper_ref(a):
    return np.exp(a) + a


def _two_calls(attrs=None):
    bb = g.BlockBuilder()
    helper = _helper(bb, "helper", attrs)
    x = g.Var("x", _t(4))
    with bb.function("main", [x]):
        a = bb.emit(g.Call(helper, [x]))
        b = bb.emit(g.Call(helper, [a]))
        bb.emit_func_output(b)
    return bb.get()


def test_multiple_calls_need_the_inline_attribute():
    mod = _two_calls()
    assert Inline()(mod)["main"] is mod["main"]
    marked = _two_calls({"inline": True})
    after = Inline()(marked)
    assert set(after) == {"main"}
    names = [b.value.op.name for b in after["main"].body.blocks[0].bindings]
    assert names == ["exp", "add", "exp", "add"]
    # every inlined copy has its own variables (well formed: checked by the conftest instrument)
    data = RNG.standard_normal(4).astype("float32")
    np.testing.assert_allclose(kiln.build(after)(data), _helper_ref(_helper_ref(data)),
                               rtol=1e-6)
    # explicitly named functions are inlined too
    assert set(Inline(functions=["helper"])(mod)) == {"main"}


def test_entries_noinline_and_recursion_are_kept():
    bb = g.BlockBuilder()
    exported = _helper(bb, "exported", {"global_symbol": "exported"})
    never = _helper(bb, "never", {"inline": False})
    n = g.Var("n", _t(4))
    with bb.function("loop", [n]):
        bb.emit_func_output(bb.emit(g.Call(g.GlobalVar("loop"), [n], sinfo_args=(_t(4),))))
    x = g.Var("x", _t(4))
    with bb.function("main", [x]):
        a = bb.emit(g.Call(exported, [x]))
        b = bb.emit(g.Call(never, [a]))
        c = bb.emit(g.Call(g.GlobalVar("loop"), [b]))
        bb.emit_func_output(c)
    mod = bb.get()
    after = Inline()(mod)
    assert set(after) == set(mod)
    assert after["main"] is mod["main"]


def test_nested_functions_inline_all_the_way():
    bb = g.BlockBuilder()
    inner = _helper(bb, "inner")
    m = g.Var("m", _t(4))
    with bb.function("middle", [m]):
        h = bb.emit(g.Call(inner, [m]))
        bb.emit_func_output(bb.emit(op.negative(h)))
    x = g.Var("x", _t(4))
    with bb.function("main", [x]):
        with bb.dataflow():
            v = bb.emit(g.Call(g.GlobalVar("middle"), [x]))
            out = bb.emit_output(op.tanh(v))
        bb.emit_func_output(out)
    mod = bb.get()
    after = Inline()(mod)
    assert set(after) == {"main"}
    blk = after["main"].body.blocks[0]
    assert isinstance(blk, g.DataflowBlock)
    assert [b.value.op.name for b in blk.bindings] == ["exp", "add", "negative", "tanh"]
    assert all(isinstance(b.var, g.DataflowVar) for b in blk.bindings[:-1])
    data = RNG.standard_normal(4).astype("float32")
    np.testing.assert_allclose(kiln.build(after)(data), np.tanh(-_helper_ref(data)), rtol=1e-6)


def test_symbolic_callee_takes_the_callers_sizes():
    n = tir.Var("n", "int64")
    a = g.Var("a", _t(n, 2))
    bb = g.BlockBuilder()
    with bb.function("flatten", [a]):
        bb.emit_func_output(bb.emit(op.reshape(a, (n * 2,))))
    x = g.Var("x", _t(3, 2))
    with bb.function("main", [x]):
        bb.emit_func_output(bb.emit(g.Call(g.GlobalVar("flatten"), [x])))
    after = Inline()(bb.get())

    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        bb.emit_func_output(bb.emit(op.reshape(x, (6,))))
    assert_structural_equal(after["main"], bb.get()["main"])


def test_impure_callee_stays_out_of_dataflow_blocks():
    bb = g.BlockBuilder()
    a = g.Var("a", _t(4))
    with bb.function("logger", [a]):
        bb.emit(g.Call(g.ExternFunc("log_tensor"), [a], sinfo_args=(g.ObjectStructInfo(),)))
        bb.emit_func_output(a)
    x = g.Var("x", _t(4))
    with bb.function("main", [x]):
        with bb.dataflow():
            v = bb.emit(g.Call(g.GlobalVar("logger"), [x]))
            out = bb.emit_output(op.exp(v))
        bb.emit_func_output(out)
    mod = bb.get()
    after = Inline()(mod)
    assert set(after) == {"main", "logger"}
    assert after["main"] is mod["main"]
