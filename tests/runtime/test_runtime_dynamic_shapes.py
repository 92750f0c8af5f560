"""Plans with run-time shapes: host shape-function steps, save/load, no native entry, errors."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import kiln
from kiln import graph as g
from kiln import op, tir
from kiln.codegen.graph_entry import supports_entry
from kiln.frontend.onnx import from_onnx
from kiln.ir.errors import ArgumentError
from kiln.runtime import shape_funcs

RNG = np.random.default_rng(5)


def _reshape_exe():
    """main(x: (2, 6), s: (2,) int64) = dynamic_reshape(x, s) + 1 (s's values bind the dims)."""
    x = g.Var("x", g.TensorStructInfo((2, 6), "float32"))
    s = g.Var("s", g.TensorStructInfo((2,), "int64"))
    bb = g.BlockBuilder()
    with bb.function("main", [x, s]):
        with bb.dataflow():
            call = g.Call(g.ExternFunc(shape_funcs.PREFIX + "reshape"),
                          [g.ShapeExpr((2, 6)), s, g.PrimValue(0)],
                          sinfo_args=[g.ShapeStructInfo(ndim=2)])
            d0, d1 = tir.Var("d0", "int64"), tir.Var("d1", "int64")
            bb.match_cast(bb.emit(call), g.ShapeStructInfo((d0, d1)))
            y = bb.emit(op.dynamic_reshape(x, (d0, d1)))
            out = bb.emit_output(op.add(y, g.const(np.float32(1))))
        bb.emit_func_output(out)
    return kiln.build(bb.get())


@pytest.fixture(scope="module")
def exe():
    return _reshape_exe()


def test_plan_has_host_steps_and_no_native_entry(exe):
    plan = exe.plans["main"]
    kinds = [c.kind for c in plan.calls]
    assert kinds[:2] == ["shape_func", "match"] and plan.has_host_steps
    assert plan.entry is None and not supports_entry(plan, {})
    assert exe.num_kernels == sum(k == "kernel" for k in kinds)


def test_static_models_keep_the_native_entry():
    x = g.Var("x", g.TensorStructInfo((4,), "float32"))
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        bb.emit_func_output(bb.emit(op.add(x, x)))
    plan = kiln.build(bb.get()).plans["main"]
    assert plan.entry is not None and not plan.has_host_steps


def test_save_load_round_trip(exe, tmp_path):
    path = str(tmp_path / "dyn.kiln")
    exe.save(path)
    loaded = kiln.load(path)
    x = RNG.standard_normal((2, 6)).astype("float32")
    for s, shape in (([3, 4], (3, 4)), ([-1, 2], (6, 2)), ([12, 1], (12, 1))):
        got = loaded(x, np.array(s))
        np.testing.assert_array_equal(got, x.reshape(shape) + 1)
        np.testing.assert_array_equal(got, exe(x, np.array(s)))


def test_shape_function_errors_name_the_step(exe):
    x = np.zeros((2, 6), np.float32)
    with pytest.raises(ArgumentError, match="cannot reshape"):
        exe(x, np.array([5, 3]))


def test_match_cast_checks_known_dims_at_run_time():
    """Expand of a symbolic dim ``n``: the output keeps ``n`` and the run checks it."""
    graph = helper.make_graph(
        [helper.make_node("Expand", ["x", "s"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 1]),
         helper.make_tensor_value_info("s", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    mod, params = from_onnx(model)
    exe = kiln.build(mod, params=params)
    x = RNG.standard_normal((3, 1)).astype("float32")
    np.testing.assert_array_equal(exe(x, np.array([1, 4])), np.broadcast_to(x, (3, 4)))
    np.testing.assert_array_equal(exe(x, np.array([3, 2])), np.broadcast_to(x, (3, 2)))
    # n = 1 broadcasts to 3, as ONNX's Expand does (decided at run time)
    np.testing.assert_array_equal(exe(x[:1], np.array([3, 2])), np.broadcast_to(x[:1], (3, 2)))
    with pytest.raises(ArgumentError, match="cannot expand"):
        exe(x[:2], np.array([3, 2]))  # n = 2 does not broadcast to 3


def test_shape_funcs_follow_onnx_rules():
    assert shape_funcs.run("reshape", [(2, 3, 4), np.array([0, -1]), 0]) == (2, 12)
    assert shape_funcs.run("reshape", [(0, 3), np.array([0, 3]), 1]) == (0, 3)
    assert shape_funcs.run("expand", [(3, 1), np.array([2, 1, 4])]) == (2, 3, 4)
    assert shape_funcs.run("range", [np.float32(1), np.float32(2), np.float32(0.3)]) == (4,)
    assert shape_funcs.run("slice", [(10,), np.array([-3]), np.array([2**63 - 1]), (0,),
                                     np.array([1])]) == (3,)
    assert shape_funcs.run("pad", [(4, 5), np.array([1, -1]), (1,)]) == (4, 5)
    with pytest.raises(ValueError):
        shape_funcs.run("range", [np.int64(0), np.int64(3), np.int64(0)])
