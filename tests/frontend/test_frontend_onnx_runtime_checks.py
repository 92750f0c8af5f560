"""Values only known while a model runs are checked inside its kernels, as onnxruntime checks them.

An index out of range (Gather, GatherElements, GatherND, ScatterElements, ScatterND) and
symbolic dims that turn out not to fit (a batch that does not broadcast, contracted or channel
dims that differ) make the run fail with a RuntimeCheckError naming the ONNX node and the value,
through every way a plan runs: the static native entry, the native entry over symbolic shapes,
and kernel by kernel (plans with host steps). Symbolic dims that do broadcast give onnxruntime's
answer.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper

import kiln
from kiln.frontend.onnx import from_onnx
from kiln.ir import ArgumentError, RuntimeCheckError
from kiln.testing.onnx_graphs import onnx_model, value_info

RNG = np.random.default_rng(22)
I64 = TP.INT64


def _build(model):
    mod, params = from_onnx(model)
    return kiln.build(mod, params=params)


def _ort(model, feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)[0]


def _x(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


# ---- indices ------------------------------------------------------------------------------
def _index_cases():
    """(model, good feeds, bad feeds, the failing index): one node each, ORT raises on bad."""
    x = _x(6, 40)
    cases = []
    m = onnx_model([helper.make_node("Gather", ["x", "i"], ["y"], axis=0, name="emb")],
                   [value_info("x", [6, 40]), value_info("i", [3, 2], I64)],
                   [value_info("y", None)])
    cases.append((m, {"x": x, "i": np.array([[0, -6], [5, 2], [-1, 3]])},
                  {"x": x, "i": np.array([[0, 1], [6, 2], [1, 1]])}, 6))
    m = onnx_model([helper.make_node("GatherElements", ["x", "i"], ["y"], axis=1, name="ge")],
                   [value_info("x", [6, 40]), value_info("i", [6, 40], I64)],
                   [value_info("y", None)])
    good = RNG.integers(-40, 40, (6, 40))
    bad = good.copy()
    bad[4, 17] = -41
    cases.append((m, {"x": x, "i": good}, {"x": x, "i": bad}, -41))
    m = onnx_model([helper.make_node("GatherND", ["x", "i"], ["y"], name="gnd")],
                   [value_info("x", [6, 40]), value_info("i", [4, 2], I64)],
                   [value_info("y", None)])
    good = np.stack([RNG.integers(0, 6, 4), RNG.integers(0, 40, 4)], 1)
    bad = good.copy()
    bad[2, 1] = 40
    cases.append((m, {"x": x, "i": good}, {"x": x, "i": bad}, 40))
    m = onnx_model([helper.make_node("ScatterElements", ["x", "i", "u"], ["y"], axis=0,
                                     name="se")],
                   [value_info("x", [6, 40]), value_info("i", [2, 40], I64),
                    value_info("u", [2, 40])], [value_info("y", None)])
    good = np.stack([RNG.permutation(6)[:2] for _ in range(40)], 1)
    bad = good.copy()
    bad[1, 39] = 7
    u = _x(2, 40)
    cases.append((m, {"x": x, "i": good, "u": u}, {"x": x, "i": bad, "u": u}, 7))
    m = onnx_model([helper.make_node("ScatterND", ["x", "i", "u"], ["y"], name="snd")],
                   [value_info("x", [6, 40]), value_info("i", [2, 1], I64),
                    value_info("u", [2, 40])], [value_info("y", None)])
    u = _x(2, 40)
    cases.append((m, {"x": x, "i": np.array([[4], [-1]]), "u": u},
                  {"x": x, "i": np.array([[4], [-7]]), "u": u}, -7))
    return cases


@pytest.mark.parametrize("case", range(5))
def test_an_index_out_of_range_raises_naming_the_node_and_the_index(case):
    model, good, bad, index = _index_cases()[case]
    exe = _build(model)
    np.testing.assert_array_equal(exe(**good), _ort(model, good))
    node = model.graph.node[0]
    with pytest.raises(RuntimeCheckError,
                       match=rf"{node.op_type} node '{node.name}': .*index {index} is out of "
                             rf"range \[-\d+, \d+\)"):
        exe(**bad)
    with pytest.raises(Exception, match="(?i)out of|bounds|invalid"):
        _ort(model, bad)  # onnxruntime refuses the same input
    np.testing.assert_array_equal(exe(**good), _ort(model, good))  # and kiln still runs


def test_index_checks_through_every_way_a_plan_runs():
    """A static plan (native entry), symbolic dims (entry over symbolic shapes) and a run-time
    reshape (host steps: kernel by kernel) all stop at the failing kernel."""
    gather = helper.make_node("Gather", ["x", "i"], ["y"], axis=0, name="g")
    static = onnx_model([gather], [value_info("x", [6, 4]), value_info("i", [3], I64)],
                        [value_info("y", None)])
    dynamic = onnx_model([gather], [value_info("x", ["n", 4]), value_info("i", ["k"], I64)],
                         [value_info("y", None)])
    reshaped = onnx_model(
        [helper.make_node("Reshape", ["x0", "s"], ["x"], name="r"), gather],
        [value_info("x0", [24]), value_info("s", [2], I64), value_info("i", [3], I64)],
        [value_info("y", None)])
    x = _x(6, 4)
    for model, feeds in ((static, {"x": x}), (dynamic, {"x": x}),
                         (reshaped, {"x0": x.reshape(-1), "s": np.array([6, 4])})):
        exe = _build(model)
        plan = exe.plans["main"]
        assert (plan.entry is None) == (model is reshaped)
        np.testing.assert_array_equal(exe(**feeds, i=np.array([5, 0, -6])), x[[5, 0, 0]])
        with pytest.raises(RuntimeCheckError, match=r"Gather node 'g': take along axis 0: "
                                                    r"index 6 is out of range \[-6, 6\)"):
            exe(**feeds, i=np.array([1, 6, 2]))


# ---- symbolic dims ------------------------------------------------------------------------
def test_matmul_broadcasts_a_symbolic_batch_at_run_time():
    """``[2, N, 3, 4] @ [5, 4, 2]``: N = 1 broadcasts to 5, N = 5 is plain, N = 7 fails."""
    model = onnx_model([helper.make_node("MatMul", ["a", "b"], ["y"], name="mm")],
                       [value_info("a", [2, "N", 3, 4]), value_info("b", [5, 4, 2])],
                       [value_info("y", None)])
    exe = _build(model)
    b = _x(5, 4, 2)
    for n in (1, 5):
        feeds = {"a": _x(2, n, 3, 4), "b": b}
        got, want = exe(**feeds), _ort(model, feeds)
        assert got.shape == want.shape == (2, 5, 3, 2)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    with pytest.raises(RuntimeCheckError, match=r"MatMul node 'mm': .*must be 1 or 5.*N = 7"):
        exe(a=_x(2, 7, 3, 4), b=b)


def test_two_symbolic_dims_broadcast_either_way_in_a_fused_kernel():
    model = onnx_model([helper.make_node("Add", ["a", "b"], ["s"], name="add"),
                        helper.make_node("Relu", ["s"], ["y"], name="relu")],
                       [value_info("a", ["N", 3]), value_info("b", ["M", 3])],
                       [value_info("y", None)])
    exe = _build(model)
    for n, m in ((1, 4), (4, 1), (4, 4), (1, 1)):
        feeds = {"a": _x(n, 3), "b": _x(m, 3)}
        np.testing.assert_array_equal(exe(**feeds), _ort(model, feeds))
    with pytest.raises(RuntimeCheckError, match=r"Add node 'add'.*N = 3, M = 4"):
        exe(a=_x(3, 3), b=_x(4, 3))


def test_contracted_and_channel_dims_are_checked():
    mm = onnx_model([helper.make_node("MatMul", ["a", "b"], ["y"], name="mm")],
                    [value_info("a", [2, "K"]), value_info("b", [3, 4])], [value_info("y", None)])
    exe = _build(mm)
    feeds = {"a": _x(2, 3), "b": _x(3, 4)}
    np.testing.assert_allclose(exe(**feeds), _ort(mm, feeds), rtol=1e-5, atol=1e-6)
    with pytest.raises(RuntimeCheckError, match=r"MatMul node 'mm': .*columns.*K = 5"):
        exe(a=_x(2, 5), b=_x(3, 4))
    conv = onnx_model([helper.make_node("Conv", ["x", "w"], ["y"], name="conv")],
                      [value_info("x", [1, "C", 5, 5]), value_info("w", [2, 3, 3, 3])],
                      [value_info("y", None)])
    exe = _build(conv)
    feeds = {"x": _x(1, 3, 5, 5), "w": _x(2, 3, 3, 3)}
    np.testing.assert_allclose(exe(**feeds), _ort(conv, feeds), rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeCheckError, match=r"Conv node 'conv': .*channels.*C = 1"):
        exe(x=_x(1, 1, 5, 5), w=_x(2, 3, 3, 3))


def test_expand_of_a_symbolic_dim_that_is_one_broadcasts():
    """Expand's target is known at run time: a symbolic input dim of 1 broadcasts to it (it
    was taken for the output dim and the run refused)."""
    model = onnx_model([helper.make_node("Expand", ["x", "s"], ["y"], name="e")],
                       [value_info("x", ["N", 3]), value_info("s", [2], I64)],
                       [value_info("y", None)])
    exe = _build(model)
    for n, shape in ((1, [4, 3]), (4, [4, 3]), (4, [1, 3])):
        feeds = {"x": _x(n, 3), "s": np.array(shape)}
        np.testing.assert_array_equal(exe(**feeds), _ort(model, feeds))
    with pytest.raises(ArgumentError, match="cannot expand"):
        exe(x=_x(2, 3), s=np.array([4, 3]))


# ---- found by benchmarks/fuzz.py ------------------------------------------------------------
def test_indices_longer_than_the_data_at_run_time():
    """GatherElements/ScatterElements walk data's other dims with the indices': longer indices
    read (or, scattering, wrote) past the data -- heap corruption, found as "double free"."""
    model = onnx_model([helper.make_node("ScatterElements", ["x", "i", "u"], ["y"], axis=1,
                                         name="se")],
                       [value_info("x", ["R", 4]), value_info("i", ["S", 2], I64),
                        value_info("u", ["S", 2])], [value_info("y", None)])
    exe = _build(model)
    feeds = {"x": _x(3, 4), "i": np.array([[0, 3], [1, 2]]), "u": _x(2, 2)}
    np.testing.assert_array_equal(exe(**feeds), _ort(model, feeds))
    with pytest.raises(RuntimeCheckError, match=r"ScatterElements node 'se'.*must not be longer"):
        exe(x=_x(1, 4), i=np.array([[0, 3], [1, 2]]), u=_x(2, 2))


def test_a_window_larger_than_a_symbolic_input_fails_naming_the_node():
    model = onnx_model([helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[5, 5],
                                         name="pool")],
                       [value_info("x", [1, 1, "H", "W"])], [value_info("y", None)])
    exe = _build(model)
    feeds = {"x": _x(1, 1, 6, 7)}
    np.testing.assert_array_equal(exe(**feeds), _ort(model, feeds))
    with pytest.raises(ArgumentError, match=r"MaxPool node 'pool': the result would have the "
                                            r"negative shape"):
        exe(x=_x(1, 1, 3, 7))


def test_attention_row_with_no_key_is_zero_even_with_inf_scores():
    """A fully masked row gives zeros; it was softmax * 0, NaN where a key held inf."""
    model = onnx_model([helper.make_node("Attention", ["q", "k", "v", "m"], ["y"], name="att")],
                       [value_info("q", [1, 2, 2, 8]), value_info("k", [1, 2, 2, 8]),
                        value_info("v", [1, 2, 2, 8]),
                        value_info("m", [2, 2], TP.BOOL)], [value_info("y", None)], opset=23)
    k = _x(1, 2, 2, 8)
    k[0, 0, 1, 6] = np.inf
    feeds = {"q": _x(1, 2, 2, 8), "k": k, "v": _x(1, 2, 2, 8),
             "m": np.array([[False, False], [True, True]])}
    got, want = _build(model)(**feeds), _ort(model, feeds)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(np.nan_to_num(got), np.nan_to_num(want), rtol=1e-5, atol=1e-6)


def test_concat_of_symbolic_dims_that_differ_outside_the_axis():
    """The output takes dims outside the axis from the first input: a second input with another
    length there read past its end."""
    model = onnx_model([helper.make_node("Concat", ["a", "b"], ["y"], axis=1, name="cat")],
                       [value_info("a", ["N", 3]), value_info("b", ["M", 2])],
                       [value_info("y", None)])
    exe = _build(model)
    feeds = {"a": _x(4, 3), "b": _x(4, 2)}
    np.testing.assert_array_equal(exe(**feeds), _ort(model, feeds))
    with pytest.raises(RuntimeCheckError, match=r"Concat node 'cat': .*differs from tensors\[0\]"):
        exe(a=_x(4, 3), b=_x(5, 2))
