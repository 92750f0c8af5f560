"""Guarded specialization (``kiln.frontend.onnx.specialize``): an If on a run-time condition
whose branches differ in rank, compiled per condition value on first use, checked against
onnxruntime for every condition value, with the compile count of each specialization."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from kiln.frontend.onnx import GuardedExecutable, compile_onnx, from_onnx
from kiln.frontend.onnx.specialize import SPECIALIZE_KEY
from kiln.ir import KilnError
from kiln.testing.onnx_graphs import onnx_model
from kiln.testing.onnx_graphs import value_info as _vi
from kiln.transform import PassContext

ort = pytest.importorskip("onnxruntime")

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
RNG = np.random.default_rng(7)


def _init(name, arr):
    return numpy_helper.from_array(np.asarray(arr), name)


def _branch(nodes, out):
    return helper.make_graph(nodes, f"g_{out}", [], [_vi(out, None)])


def _rank_if(cond, src, out, name):
    """If ``cond``: Unsqueeze(src * 2, 0) (rank 3 for a matrix), else Relu(src) (rank 2)."""
    then_b = _branch([helper.make_node("Mul", [src, "two"], [f"{out}_m"]),
                      helper.make_node("Unsqueeze", [f"{out}_m", "ax0"], [f"{out}_t"])],
                     f"{out}_t")
    else_b = _branch([helper.make_node("Relu", [src], [f"{out}_e"])], f"{out}_e")
    return helper.make_node("If", [cond], [out], then_branch=then_b, else_branch=else_b,
                            name=name)


def _one_if_model():
    """c = sum(x) > 0 (a run-time condition); y = If(c) rank 3 or rank 2; then ops on y and
    on a value computed before the If (h): Add, Softmax, ReduceSum, and h as an output; a
    later If whose branches (same rank) are the only readers of another early value (g)."""
    late_if = helper.make_node(
        "If", ["c"], ["q"], name="late_if",
        then_branch=_branch([helper.make_node("Neg", ["g"], ["q_t"])], "q_t"),
        else_branch=_branch([helper.make_node("Identity", ["g"], ["q_e"])], "q_e"))
    nodes = [
        helper.make_node("Tanh", ["x"], ["h"]),
        helper.make_node("Sigmoid", ["x"], ["g"]),
        helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
        helper.make_node("Greater", ["s", "zero"], ["c"]),
        _rank_if("c", "h", "y", "rank_if"),
        helper.make_node("Add", ["y", "bias"], ["yb"]),
        helper.make_node("Softmax", ["yb"], ["p"], axis=-1),
        helper.make_node("Mul", ["p", "h"], ["ph"]),
        helper.make_node("ReduceSum", ["ph", "ax_last"], ["out"], keepdims=1),
        late_if,
    ]
    inits = [_init("zero", np.float32(0)), _init("two", np.float32(2)),
             _init("ax0", np.array([0], np.int64)), _init("ax_last", np.array([-1], np.int64)),
             _init("bias", RNG.standard_normal(3).astype(np.float32))]
    return onnx_model(nodes, [_vi("x", ["N", 3])],
                      [_vi("out", None), _vi("h", ["N", 3]), _vi("q", ["N", 3])], inits,
                      opset=18)


def _check(exe, model, feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = exe(**feeds)
    got = list(got) if isinstance(got, (list, tuple)) else [got]
    ref = sess.run(None, feeds)
    assert len(got) == len(ref)
    for a, b in zip(got, ref):
        assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, b.shape)
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def _x(n, sign):
    return (sign * np.abs(RNG.standard_normal((n, 3)))).astype(np.float32)


def test_if_branches_of_different_rank_compile_once_per_condition_value():
    model = _one_if_model()
    exe = compile_onnx(model)
    assert isinstance(exe, GuardedExecutable) and "rank_if" in exe.guard
    assert exe.compiles == 0  # nothing after the If is compiled before it runs
    _check(exe, model, {"x": _x(4, 1)})  # rank-3 branch
    assert exe.compiles == 1 and set(exe.specializations) == {True}
    _check(exe, model, {"x": _x(6, 1)})  # same guard, another N: a cache hit
    assert exe.compiles == 1
    _check(exe, model, {"x": _x(5, -1)})  # rank-2 branch: compiled on first use
    assert exe.compiles == 2 and set(exe.specializations) == {True, False}
    _check(exe, model, {"x": _x(2, 1)})
    _check(exe, model, {"x": _x(3, -1)})
    assert exe.compiles == 2
    assert exe.run({"x": _x(2, -1)}, output_names=["h"])[0].shape == (2, 3)


def test_two_guards_in_sequence_and_one_inside_a_constant_branch():
    """A second rank-changing If after the first (its continuation is guarded in turn), the
    second one inside the branch of an If whose condition the import knows."""
    inner = _rank_if("c2", "y", "z", "inner_if")
    known_b = _branch([inner, helper.make_node("Identity", ["z"], ["zk"])], "zk")
    other_b = _branch([helper.make_node("Identity", ["y"], ["zo"])], "zo")
    nodes = [
        helper.make_node("ReduceMax", ["x"], ["mx"], keepdims=0),
        helper.make_node("Greater", ["mx", "zero"], ["c1"]),
        helper.make_node("Less", ["k", "zero_i"], ["c2"]),
        _rank_if("c1", "x", "y", "outer_if"),
        helper.make_node("If", ["yes"], ["w"], then_branch=known_b, else_branch=other_b,
                         name="known_if"),
        helper.make_node("Neg", ["w"], ["out"]),
    ]
    inits = [_init("zero", np.float32(0)), _init("zero_i", np.int64(0)),
             _init("two", np.float32(2)), _init("ax0", np.array([0], np.int64)),
             _init("yes", np.array(True))]
    model = onnx_model(nodes, [_vi("x", [2, 3]), _vi("k", [], I64)], [_vi("out", None)], inits,
                       opset=18)
    exe = compile_onnx(model)
    for sign in (1, -1):
        for k in (-1, 1):
            _check(exe, model, {"x": _x(2, sign), "k": np.array(k, np.int64)})
    assert exe.compiles == 2
    assert all(isinstance(s, GuardedExecutable) and s.compiles == 2
               for s in exe.specializations.values())


def test_specialization_off_gives_the_error_naming_the_if():
    model = _one_if_model()
    with PassContext(config={SPECIALIZE_KEY: False}):
        with pytest.raises(KilnError, match="rank_if.*differs in rank"):
            compile_onnx(model)
    with pytest.raises(KilnError, match="rank_if.*differs in rank.*compile_onnx"):
        from_onnx(model)  # one IRModule cannot hold both


def test_model_without_guard_builds_one_executable():
    model = onnx_model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [2])],
                       [_vi("y", [2])])
    exe = compile_onnx(model)
    assert not isinstance(exe, GuardedExecutable)
    x = RNG.standard_normal(2).astype(np.float32)
    np.testing.assert_array_equal(exe(x), np.maximum(x, 0))


def test_rank_changing_if_inside_a_loop_body_is_refused():
    """The import cannot stop inside a loop body (run as a function of its own)."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         _rank_if("cond_in", "v", "v2", "body_if"),
         helper.make_node("ReduceSum", ["v2"], ["v_out"], keepdims=0)],
        "body", [_vi("i", [], I64), _vi("cond_in", [], B), _vi("v", None)],
        [_vi("cond_out", [], B), _vi("v_out", None)])
    loop = helper.make_node("Loop", ["n", "", "x"], ["y"], body=body)
    model = onnx_model([loop], [_vi("n", [], I64), _vi("x", [])], [_vi("y", None)],
                       [_init("two", np.float32(2)), _init("ax0", np.array([0], np.int64))])
    with pytest.raises(KilnError, match="body_if.*differs in rank"):
        compile_onnx(model)
