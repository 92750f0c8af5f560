"""Import-time folding of nodes whose inputs are all constants (``frontend/onnx/fold.py``),
checked against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.frontend.onnx import from_onnx
from kiln.frontend.onnx.fold import FOLD_MAX_ELEMENTS
from kiln.graph import Call
from kiln.testing.onnx_graphs import (
    constant_node,
    onnx_model,
    pad_amounts_chain,
    squeeze_if_last_dim_is_one,
)
from kiln.testing.onnx_graphs import value_info as _vi

ort = pytest.importorskip("onnxruntime")

F, I64 = TensorProto.FLOAT, TensorProto.INT64
RNG = np.random.default_rng(0)


_const = constant_node


@pytest.mark.parametrize("n_frames", [1, 5])
def test_pad_amounts_chain_folds_and_nested_if_is_decided(n_frames):
    # conv STFT front end: reflect-pad by n_fft/2, a strided conv with fixed kernels; the
    # last dim is 1 for a one-frame input, so the If squeezes only then
    n_fft = hop = 16
    t = 12 if n_frames == 1 else hop * (n_frames - 1)  # reflect needs t > n_fft / 2
    kernel = RNG.standard_normal((2 * (n_fft // 2 + 1), 1, n_fft)).astype(np.float32)
    nodes = [*pad_amounts_chain(n_fft // 2, 3, "pads"),
             helper.make_node("Pad", ["x", "pads"], ["xp"], mode="reflect"),
             helper.make_node("Conv", ["xp", "k"], ["spec"], strides=[hop]),
             *squeeze_if_last_dim_is_one("spec", "y")]
    model = onnx_model(nodes, [_vi("x", [1, 1, t])], [_vi("y", None)],
                       [numpy_helper.from_array(kernel, "k")], opset=17)
    mod, params = from_onnx(model)
    # the pads are a constant: the Pad is a static-shaped op, no run-time shape function
    pads = [b.value for b in mod["main"].body.blocks[0].bindings
            if isinstance(b.value, Call) and b.value.op.name == "pad"]
    assert len(pads) == 1 and pads[0].struct_info.is_static
    x = RNG.standard_normal((1, 1, t)).astype(np.float32)
    got = kiln.build(mod, params=params)(x)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (ref,) = sess.run(None, {"x": x})
    assert got.shape == ref.shape == ((1, 18) if n_frames == 1 else (1, 18, n_frames))
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_constant_transpose_and_matmul_fold_to_constants():
    w = RNG.standard_normal((3, 4)).astype(np.float32)
    nodes = [_const("w", w), helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]),
             helper.make_node("MatMul", ["wt", "w"], ["ww"]),
             helper.make_node("MatMul", ["x", "ww"], ["y"])]
    model = onnx_model(nodes, [_vi("x", [2, 4])], [_vi("y", [2, 4])])
    mod, params = from_onnx(model)
    ops = [b.value.op.name for b in mod["main"].body.blocks[0].bindings
           if isinstance(b.value, Call)]
    assert ops == ["matmul"]  # the Transpose and the weight MatMul folded
    x = RNG.standard_normal((2, 4)).astype(np.float32)
    np.testing.assert_allclose(kiln.build(mod, params=params)(x), x @ (w.T @ w), rtol=1e-5)


def test_big_results_and_random_ops_are_not_folded():
    big = int(np.sqrt(FOLD_MAX_ELEMENTS)) * 2
    nodes = [_const("one", np.ones((big, 1), np.float32)),
             _const("reps", np.array([1, big], np.int64)),
             helper.make_node("Tile", ["one", "reps"], ["outer"]),  # big*big > the cap
             _const("shape", np.array([2, 2], np.int64)),
             helper.make_node("RandomNormalLike", ["shape"], ["r"], dtype=F),
             helper.make_node("ReduceSum", ["outer"], ["s"], keepdims=0)]
    model = onnx_model(nodes, [], [_vi("s", []), _vi("r", [2])], opset=17)
    mod, _ = from_onnx(model)
    ops = {b.value.op.name for b in mod["main"].body.blocks[0].bindings
           if isinstance(b.value, Call)}
    assert "broadcast_to" in ops and any("random" in o for o in ops)
