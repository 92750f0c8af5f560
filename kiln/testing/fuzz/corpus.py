"""Where fuzz cases start: ONNX's node test models and small hand-built models.

A :class:`Sample` is a serialized model with inputs it runs on. The node test models are the
ones ONNX ships with its backend tests (``onnx.backend.test``, generated in process: about a
thousand models, each with a test input set) that kiln runs -- the others would only test the
"unsupported operator" error; loading them takes tens of seconds, so :func:`load_corpus` keeps
them in a pickle that worker processes read. Hand-built models (:func:`handbuilt`) are drawn
from a seed: the shapes of common layers (Conv, MatMul, Gather, run-time Reshape, Softmax, ...)
with random sizes and symbolic dims, which the node tests, all static, lack.
"""

from __future__ import annotations

import os
import pickle
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.backend.test.loader import load_model_tests

from ...frontend.onnx.exclusions import KNOWN_FAILURES, exclusion_reason

#: Input arrays larger than this (bytes) make a node test sample too slow to fuzz.
MAX_SAMPLE_BYTES = 1 << 22


@dataclass(frozen=True)
class Sample:
    """A model (serialized ModelProto) and inputs it runs on, by graph input name."""

    name: str
    model: bytes
    inputs: tuple[tuple[str, np.ndarray], ...]

    def feeds(self) -> dict[str, np.ndarray]:
        return {k: v.copy() for k, v in self.inputs}


def _tensor_inputs(model: Any, arrays: list[Any]) -> tuple[tuple[str, np.ndarray], ...] | None:
    """The test inputs as numpy arrays by name (None: a sequence, optional or string input)."""
    inits = {i.name for i in model.graph.initializer}
    names = [vi.name for vi in model.graph.input if vi.name not in inits]
    out = []
    for name, value in zip(names, arrays):
        if isinstance(value, onnx.TensorProto):
            value = onnx.numpy_helper.to_array(value)
        if not isinstance(value, np.ndarray) or value.dtype.kind in "OUS":
            return None
        out.append((name, value))
    return tuple(out) if len(out) == len(names) else None


def _tensor_outputs(model: Any) -> bool:
    """Whether every graph output is a numeric tensor (the fuzzer compares arrays, not the
    lists of a sequence, the None of an optional or text)."""
    return all(vi.type.HasField("tensor_type")
               and vi.type.tensor_type.elem_type != TensorProto.STRING
               for vi in model.graph.output)


def node_test_samples() -> list[Sample]:
    """The ONNX node test models kiln runs (see ``kiln.frontend.onnx.exclusions``), each with
    the inputs of its first test data set."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = load_model_tests(kind="node")
    samples = []
    for case in cases:
        model = case.model
        if (model is None or not case.data_sets or case.name in KNOWN_FAILURES
                or exclusion_reason(model, case.name) is not None):
            continue
        inputs = _tensor_inputs(model, list(case.data_sets[0][0]))
        if (inputs is None or not _tensor_outputs(model)
                or sum(a.nbytes for _, a in inputs) > MAX_SAMPLE_BYTES):
            continue
        samples.append(Sample(case.name, model.SerializeToString(), inputs))
    return samples


def load_corpus(cache: str | None = None) -> list[Sample]:
    """The node test samples, read from the pickle ``cache`` when it exists (else made and
    written there)."""
    if cache is not None and os.path.exists(cache):
        with open(cache, "rb") as f:
            return pickle.load(f)
    samples = node_test_samples()
    if cache is not None:
        tmp = f"{cache}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            pickle.dump(samples, f)
        os.replace(tmp, cache)
    return samples


# ---- hand-built models ----------------------------------------------------------------------
def _model(nodes: list[Any], inputs: list[Any], outputs: list[Any], inits: list[Any] = (),
           opset: int = 18) -> bytes:
    graph = helper.make_graph(nodes, "fuzz", inputs, outputs, initializer=list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model.SerializeToString()


def _vi(name: str, shape: list[Any] | None, elem: int | None = None) -> Any:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT if elem is None else elem,
                                         shape)


def _dims(rng: np.random.Generator, shape: list[int], names: str) -> list[Any]:
    """``shape`` with some dims declared symbolic (named from the letters of ``names``, so two
    inputs may share a name and with it a dim)."""
    return [names[k % len(names)] if rng.random() < 0.3 else d for k, d in enumerate(shape)]


def _rand(rng: np.random.Generator, shape: list[int]) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def _conv(rng: np.random.Generator) -> Sample:
    o, k = int(rng.integers(1, 6)), int(rng.integers(1, 4))
    pad = int(rng.integers(0, k))
    stride = int(rng.integers(1, 3))
    # big enough for the 2x2 pool after the convolution: (h + 2 pad - k) // stride + 1 >= 2
    n, c = int(rng.integers(1, 3)), int(rng.integers(1, 5))
    h, w = (int(v) + k + stride for v in rng.integers(0, 6, 2))
    weight = numpy_helper.from_array(_rand(rng, [o, c, k, k]), "w")
    bias = numpy_helper.from_array(_rand(rng, [o]), "b")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[pad] * 4,
                              strides=[stride] * 2, kernel_shape=[k, k]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("MaxPool", ["r"], ["y"], name="pool", kernel_shape=[2, 2],
                              ceil_mode=1)]
    shape = [n, c, int(h), int(w)]
    return Sample("handbuilt_conv", _model(nodes, [_vi("x", _dims(rng, shape, "NCHW"))],
                                            [_vi("y", None)], [weight, bias]),
                  (("x", _rand(rng, shape)),))


def _matmul(rng: np.random.Generator) -> Sample:
    m, k, n = (int(v) for v in rng.integers(1, 7, 3))
    batch_a = [int(v) for v in rng.integers(1, 4, int(rng.integers(0, 3)))]
    keep = int(rng.integers(0, len(batch_a) + 1))  # b's batch: a suffix of a's, some dims 1
    batch_b = [1 if rng.random() < 0.3 else d for d in batch_a[len(batch_a) - keep:]]
    a, b = batch_a + [m, k], batch_b + [k, n]
    nodes = [helper.make_node("MatMul", ["a", "b"], ["p"], name="mm"),
             helper.make_node("Add", ["p", "c"], ["y"], name="add")]
    return Sample("handbuilt_matmul", _model(
        nodes, [_vi("a", _dims(rng, a, "BCMK")), _vi("b", _dims(rng, b, "DEKN")),
                _vi("c", [n])], [_vi("y", None)]),
        (("a", _rand(rng, a)), ("b", _rand(rng, b)), ("c", _rand(rng, [n]))))


def _gather(rng: np.random.Generator) -> Sample:
    rows, cols, count = (int(v) for v in rng.integers(1, 9, 3))
    axis = int(rng.integers(0, 2))
    n = (rows, cols)[axis]
    idx = rng.integers(-n, n, [count])
    nodes = [helper.make_node("Gather", ["x", "i"], ["g"], axis=axis, name="gather"),
             helper.make_node("Mul", ["g", "g"], ["y"], name="square")]
    return Sample("handbuilt_gather", _model(
        nodes, [_vi("x", _dims(rng, [rows, cols], "RC")),
                _vi("i", _dims(rng, [count], "K"), TensorProto.INT64)], [_vi("y", None)]),
        (("x", _rand(rng, [rows, cols])), ("i", idx)))


def _reshape(rng: np.random.Generator) -> Sample:
    """A dynamic batch reshaped through Shape -> Gather -> Concat, as exporters write it."""
    b, s, h = int(rng.integers(1, 4)), int(rng.integers(1, 5)), int(rng.choice([2, 4, 6]))
    heads = int(rng.choice([1, 2]))
    consts = [numpy_helper.from_array(np.array([0], np.int64), "zero"),
              numpy_helper.from_array(np.array([s, heads, h // heads], np.int64), "rest")]
    nodes = [helper.make_node("Shape", ["x"], ["sh"], name="shape"),
             helper.make_node("Gather", ["sh", "zero"], ["batch"], axis=0, name="batch"),
             helper.make_node("Concat", ["batch", "rest"], ["target"], axis=0, name="target"),
             helper.make_node("Reshape", ["x", "target"], ["r"], name="reshape"),
             helper.make_node("Softmax", ["r"], ["y"], axis=-1, name="softmax")]
    return Sample("handbuilt_reshape", _model(
        nodes, [_vi("x", ["B", s, h])], [_vi("y", None)], consts),
        (("x", _rand(rng, [b, s, h])),))


def _split_concat(rng: np.random.Generator) -> Sample:
    d = int(rng.integers(2, 9))
    parts = int(rng.integers(1, min(d, 4) + 1))
    outs = [f"s{k}" for k in range(parts)]
    nodes = [helper.make_node("Split", ["x"], outs, axis=1, num_outputs=parts, name="split"),
             helper.make_node("Concat", list(reversed(outs)), ["c"], axis=1, name="concat"),
             helper.make_node("ReduceSum", ["c"], ["y"], keepdims=1, name="sum")]
    shape = [int(rng.integers(1, 4)), d]
    declared = [_dims(rng, shape[:1], "N")[0], d]  # the split axis stays static
    return Sample("handbuilt_split", _model(nodes, [_vi("x", declared)], [_vi("y", None)]),
                  (("x", _rand(rng, shape)),))


def _attention(rng: np.random.Generator) -> Sample:
    """Scaled dot-product attention spelled in plain ops, with an additive mask."""
    b, s, d = int(rng.integers(1, 3)), int(rng.integers(1, 6)), int(rng.choice([2, 4, 8]))
    scale = numpy_helper.from_array(np.array(1.0 / np.sqrt(d), np.float32), "scale")
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1], name="kt"),
             helper.make_node("MatMul", ["q", "kt"], ["qk"], name="qk"),
             helper.make_node("Mul", ["qk", "scale"], ["scaled"], name="scale"),
             helper.make_node("Add", ["scaled", "mask"], ["masked"], name="mask"),
             helper.make_node("Softmax", ["masked"], ["p"], axis=-1, name="softmax"),
             helper.make_node("MatMul", ["p", "v"], ["y"], name="pv")]
    mask = np.where(rng.random((s, s)) < 0.2, -1e9, 0.0).astype(np.float32)
    return Sample("handbuilt_attention", _model(
        nodes, [_vi(n, _dims(rng, [b, s, d], "BSD")) for n in ("q", "k", "v")]
        + [_vi("mask", [s, s])], [_vi("y", None)], [scale]),
        (("q", _rand(rng, [b, s, d])), ("k", _rand(rng, [b, s, d])),
         ("v", _rand(rng, [b, s, d])), ("mask", mask)))


def _slice_pad(rng: np.random.Generator) -> Sample:
    """Slice with run-time starts, then Pad with constant pads."""
    n = int(rng.integers(2, 9))
    pads = numpy_helper.from_array(rng.integers(0, 3, 4).astype(np.int64), "pads")
    nodes = [helper.make_node("Slice", ["x", "starts", "ends"], ["s"], name="slice"),
             helper.make_node("Pad", ["s", "pads"], ["y"], mode=str(rng.choice(
                 ["constant", "reflect", "edge"])), name="pad")]
    starts = rng.integers(-n, n, 2).astype(np.int64)
    ends = rng.integers(-n, n + 2, 2).astype(np.int64)
    return Sample("handbuilt_slice_pad", _model(
        nodes, [_vi("x", [n, n]), _vi("starts", [2], TensorProto.INT64),
                _vi("ends", [2], TensorProto.INT64)], [_vi("y", None)], [pads]),
        (("x", _rand(rng, [n, n])), ("starts", starts), ("ends", ends)))


def _reduce_axes(rng: np.random.Generator) -> Sample:
    """A reduction whose axes are a run-time input, then a normalization."""
    shape = [int(v) for v in rng.integers(1, 5, 3)]
    op_type = str(rng.choice(["ReduceSum", "ReduceMean", "ReduceMax", "ReduceL2"]))
    nodes = [helper.make_node(op_type, ["x", "axes"], ["r"], keepdims=1, name="reduce"),
             helper.make_node("Sub", ["x", "r"], ["y"], name="center")]
    axes = rng.choice(np.arange(-3, 3), int(rng.integers(1, 3)), replace=False) % 3
    return Sample("handbuilt_reduce", _model(
        nodes, [_vi("x", shape), _vi("axes", [len(axes)], TensorProto.INT64)],
        [_vi("y", None)]),
        (("x", _rand(rng, shape)), ("axes", axes.astype(np.int64))))


def _conv_transpose(rng: np.random.Generator) -> Sample:
    c, o, k = int(rng.integers(1, 4)), int(rng.integers(1, 4)), int(rng.integers(1, 4))
    stride = int(rng.integers(1, 3))
    weight = numpy_helper.from_array(_rand(rng, [c, o, k, k]), "w")
    nodes = [helper.make_node("ConvTranspose", ["x", "w"], ["t"], strides=[stride] * 2,
                              name="deconv"),
             helper.make_node("Sigmoid", ["t"], ["y"], name="sigmoid")]
    shape = [1, c, int(rng.integers(1, 6)), int(rng.integers(1, 6))]
    return Sample("handbuilt_conv_transpose", _model(
        nodes, [_vi("x", shape)], [_vi("y", None)], [weight]), (("x", _rand(rng, shape)),))


def _layer_norm(rng: np.random.Generator) -> Sample:
    shape = [int(rng.integers(1, 4)), int(rng.integers(1, 5)), int(rng.integers(1, 9))]
    gamma = numpy_helper.from_array(_rand(rng, shape[-1:]), "g")
    beta = numpy_helper.from_array(_rand(rng, shape[-1:]), "b")
    nodes = [helper.make_node("LayerNormalization", ["x", "g", "b"], ["n"], axis=-1,
                              name="ln"),
             helper.make_node("Gelu", ["n"], ["y"], name="gelu")]
    return Sample("handbuilt_layer_norm", _model(
        nodes, [_vi("x", _dims(rng, shape, "BTC"))], [_vi("y", None)], [gamma, beta], opset=20),
        (("x", _rand(rng, shape)),))


HANDBUILT: tuple[Callable[[np.random.Generator], Sample], ...] = (
    _conv, _matmul, _gather, _reshape, _split_concat, _attention, _slice_pad, _reduce_axes,
    _conv_transpose, _layer_norm,
)


def handbuilt(rng: np.random.Generator) -> Sample:
    """A random small hand-built model and its inputs."""
    return HANDBUILT[int(rng.integers(len(HANDBUILT)))](rng)
