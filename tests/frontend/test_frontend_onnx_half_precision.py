"""16-bit float ONNX nodes produce their declared type once: MatMul and Gemm sum their products
in float32 and round the result (as numpy, onnxruntime and torch do), composite activations
(Elu, Selu, Celu, Softplus, Softsign, HardSwish, Mish) compute in float32 and round once.
Checked against numpy in float32 rounded to the 16-bit type, on random inputs."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from kiln.frontend.onnx.backend import KilnBackend

RNG = np.random.default_rng(26)
HALF = {"float16": (TensorProto.FLOAT16, np.float16),
        "bfloat16": (TensorProto.BFLOAT16, ml_dtypes.bfloat16)}


def _model(node: onnx.NodeProto, inputs: dict[str, tuple[int, tuple]], elem: int,
           opset: int = 21) -> onnx.ModelProto:
    graph = helper.make_graph(
        [node], "half", [helper.make_tensor_value_info(n, e, s) for n, (e, s) in inputs.items()],
        [helper.make_tensor_value_info(node.output[0], elem, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _run(model: onnx.ModelProto, *arrays: np.ndarray) -> np.ndarray:
    return KilnBackend.prepare(model).run(list(arrays))[0]


def _close_to_rounded(got: np.ndarray, exact: np.ndarray, dtype: type) -> None:
    """``got`` is ``exact`` (float32) rounded once to ``dtype``: equal but for rare last-bit
    ties (a float32 sum in another order), never more than one ulp off."""
    want = exact.astype(dtype)
    assert got.dtype == want.dtype and got.shape == want.shape
    g, w = got.astype(np.float32), want.astype(np.float32)
    ulp = np.abs(np.spacing(w.astype(dtype)).astype(np.float32))
    assert np.all(np.abs(g - w) <= ulp), np.max(np.abs(g - w) / ulp)
    assert np.mean(g != w) < 0.02, f"{np.mean(g != w):.1%} differ"


@pytest.mark.parametrize("name", sorted(HALF))
def test_matmul_accumulates_in_float32(name):
    elem, dtype = HALF[name]
    a = RNG.standard_normal((3, 8, 64)).astype(dtype)
    b = RNG.standard_normal((3, 64, 16)).astype(dtype)
    node = helper.make_node("MatMul", ["a", "b"], ["c"])
    got = _run(_model(node, {"a": (elem, a.shape), "b": (elem, b.shape)}, elem), a, b)
    _close_to_rounded(got, a.astype(np.float32) @ b.astype(np.float32), dtype)


@pytest.mark.parametrize("name", sorted(HALF))
def test_gemm_rounds_once(name):
    elem, dtype = HALF[name]
    a = RNG.standard_normal((64, 12)).astype(dtype)
    b = RNG.standard_normal((10, 64)).astype(dtype)
    c = RNG.standard_normal((10,)).astype(dtype)
    node = helper.make_node("Gemm", ["a", "b", "c"], ["y"], transA=1, transB=1, alpha=0.75,
                            beta=1.5)
    got = _run(_model(node, {"a": (elem, a.shape), "b": (elem, b.shape),
                             "c": (elem, c.shape)}, elem), a, b, c)
    f = np.float32
    exact = f(0.75) * (a.astype(f).T @ b.astype(f).T) + f(1.5) * c.astype(f)
    _close_to_rounded(got, exact, dtype)


def _softplus(x):
    return np.log1p(np.exp(x))


ACTIVATIONS = {
    "Elu": ({"alpha": 0.7}, lambda x: np.where(x > 0, x, 0.7 * np.expm1(x))),
    "Celu": ({"alpha": 2.0}, lambda x: np.maximum(x, 0) + np.minimum(0, 2 * np.expm1(x / 2))),
    "Selu": ({}, lambda x: 1.0507009873554805 * np.where(x > 0, x,
                                                         1.6732632423543772 * np.expm1(x))),
    "Softplus": ({}, _softplus),
    "Softsign": ({}, lambda x: x / (1 + np.abs(x))),
    "HardSwish": ({}, lambda x: x * np.clip(x / 6 + 0.5, 0, 1)),
    "Mish": ({}, lambda x: x * np.tanh(_softplus(x))),
}


@pytest.mark.parametrize("name", sorted(HALF))
@pytest.mark.parametrize("act", sorted(ACTIVATIONS))
def test_composite_activations_round_once(act, name):
    elem, dtype = HALF[name]
    attrs, fn = ACTIVATIONS[act]
    # small magnitudes, where a 16-bit exp(x) - 1 loses most digits, and a few large ones
    x = np.concatenate([RNG.uniform(-0.6, 0.6, 200), RNG.uniform(-6, 6, 56),
                        [-0.5, -0.25, 0.0, 0.5]]).astype(dtype)
    node = helper.make_node(act, ["x"], ["y"], **attrs)
    got = _run(_model(node, {"x": (elem, x.shape)}, elem), x)
    exact = fn(x.astype(np.float64)).astype(np.float32)
    _close_to_rounded(got, exact, dtype)


def test_elu_of_bfloat16_keeps_small_values():
    """The ONNX Celu function body (Div, Elu, Mul) in bfloat16: Elu(-0.25) is -0.2217 (one
    rounding of expm1), not -0.2227 (exp rounded to bfloat16 first)."""
    elem, dtype = HALF["bfloat16"]
    x = np.array([-0.25], dtype)
    node = helper.make_node("Elu", ["x"], ["y"], alpha=1.0)
    got = _run(_model(node, {"x": (elem, x.shape)}, elem), x)
    assert got[0] == np.float32(np.expm1(-0.25)).astype(dtype)
