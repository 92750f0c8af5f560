"""Which ONNX backend node tests kiln runs, and why the others are excluded.

Every case of ``onnx.backend.test`` (node kind) is either run or excluded with a reason:

* ``training-only``: training operators (Adagrad, Adam, Momentum, Gradient, ...);
* ``string tensors``: the model reads or writes string tensors;
* ``dtype not supported by kiln``: float8/float4, 2-/4-bit integers, complex;
* ``sequence/optional types``: inputs/outputs of sequence, optional or map type;
* ``not yet converted: <ops>``: an operator (of the model's opset) has no converter;
* ``KNOWN_FAILURES``: converted cases that fail, each with its concrete reason.
"""

from __future__ import annotations

from typing import Any

from .registry import lookup_converter

TRAINING_OPS = {"Adagrad", "Adam", "Momentum", "Gradient"}

# Converted cases that fail, with the concrete reason (case name without the _cpu suffix).
KNOWN_FAILURES: dict[str, str] = {
    "test_averagepool_3d_default":
        "AveragePool on rank-5 input: only 1-D/2-D are converted",
    "test_averagepool_3d_dilations_small":
        "AveragePool on rank-5 input: only 1-D/2-D are converted",
    "test_averagepool_3d_dilations_large_count_include_pad_is_0_ceil_mode_is_True":
        "AveragePool on rank-5 input: only 1-D/2-D are converted",
    "test_averagepool_3d_dilations_large_count_include_pad_is_0_ceil_mode_is_False":
        "AveragePool on rank-5 input: only 1-D/2-D are converted",
    "test_averagepool_3d_dilations_large_count_include_pad_is_1_ceil_mode_is_True":
        "AveragePool on rank-5 input: only 1-D/2-D are converted",
    "test_averagepool_3d_dilations_large_count_include_pad_is_1_ceil_mode_is_False":
        "AveragePool on rank-5 input: only 1-D/2-D are converted",
    "test_batchnorm_example_training_mode":
        "BatchNormalization training_mode=1 (batch statistics outputs)",
    "test_batchnorm_epsilon_training_mode":
        "BatchNormalization training_mode=1 (batch statistics outputs)",
    "test_training_dropout_default": "Dropout training_mode=1 (random mask)",
    "test_training_dropout_default_mask": "Dropout training_mode=1 (random mask)",
    "test_training_dropout": "Dropout training_mode=1 (random mask)",
    "test_training_dropout_mask": "Dropout training_mode=1 (random mask)",
    "test_training_dropout_zero_ratio": "Dropout training_mode=1 (random mask)",
    "test_training_dropout_zero_ratio_mask": "Dropout training_mode=1 (random mask)",
    "test_maxpool_with_argmax_2d_precomputed_pads": "MaxPool Indices output not converted yet",
    "test_maxpool_with_argmax_2d_precomputed_strides": "MaxPool Indices output not converted yet",
    "test_maxpool_3d_default": "MaxPool on rank-5 input: only 1-D/2-D are converted",
    "test_maxpool_3d_dilations": "MaxPool on rank-5 input: only 1-D/2-D are converted",
    "test_maxpool_3d_dilations_use_ref_impl":
        "MaxPool on rank-5 input: only 1-D/2-D are converted",
    "test_maxpool_3d_dilations_use_ref_impl_large":
        "MaxPool on rank-5 input: only 1-D/2-D are converted",
    "test_wrap_pad": "Pad mode 'wrap' has no kiln pad mode",
}


def _opsets(model: Any) -> dict[str, int]:
    out = {("" if i.domain in ("", "ai.onnx") else i.domain): int(i.version)
           for i in model.opset_import}
    out.setdefault("", 1)
    return out


def _nodes(graph: Any) -> list[Any]:
    """Every node, including those in subgraphs (If/Loop/Scan bodies)."""
    out = []
    for node in graph.node:
        out.append(node)
        for a in node.attribute:
            if a.g.node:
                out.extend(_nodes(a.g))
            for sub in a.graphs:
                out.extend(_nodes(sub))
    return out


# ONNX element types kiln has no dtype for (float8/float4 variants, 2- and 4-bit integers,
# complex): the TensorProto enum values.
UNSUPPORTED_ELEM_TYPES = {
    14: "complex64", 15: "complex128", 17: "float8e4m3fn", 18: "float8e4m3fnuz",
    19: "float8e5m2", 20: "float8e5m2fnuz", 21: "uint4", 22: "int4", 23: "float4e2m1",
    24: "float8e8m0", 25: "uint2", 26: "int2",
}


def _elem_types(graph: Any, nodes: list[Any]) -> set[int]:
    types = {vi.type.tensor_type.elem_type for vi in [*graph.input, *graph.output]
             if vi.type.WhichOneof("value") == "tensor_type"}
    types |= {t.data_type for t in graph.initializer}
    for n in nodes:
        for a in n.attribute:
            if a.name in ("to", "saturate_to") and a.type == 2:  # INT
                types.add(int(a.i))
            if a.type == 4:  # TENSOR
                types.add(a.t.data_type)
    return types


def _value_kinds(graph: Any) -> set[str]:
    kinds = set()
    for vi in [*graph.input, *graph.output]:
        kind = vi.type.WhichOneof("value")
        if kind == "tensor_type" and vi.type.tensor_type.elem_type == 8:  # STRING
            kinds.add("string")
        elif kind != "tensor_type":
            kinds.add(kind or "unknown")
    return kinds


def exclusion_reason(model: Any, name: str = "") -> str | None:
    """Why ``model`` (a backend test case called ``name``) is not run, or None to run it."""
    nodes = _nodes(model.graph)
    ops = {n.op_type for n in nodes}
    if ops & TRAINING_OPS or any(n.domain == "ai.onnx.preview.training" for n in nodes):
        return "training-only"
    kinds = _value_kinds(model.graph)
    if "string" in kinds or any(a.type == 8 and a.name == "to" and a.i == 8
                                for n in nodes for a in n.attribute):
        return "string tensors"
    if kinds:
        return "sequence/optional types"
    bad = sorted(UNSUPPORTED_ELEM_TYPES[t] for t in _elem_types(model.graph, nodes)
                 if t in UNSUPPORTED_ELEM_TYPES)
    if bad:
        return "dtype not supported by kiln: " + ", ".join(bad)
    opsets = _opsets(model)
    missing = sorted({
        n.op_type for n in nodes
        if lookup_converter(n.op_type, opsets.get(
            "" if n.domain in ("", "ai.onnx") else n.domain, 0),
            "" if n.domain in ("", "ai.onnx") else n.domain) is None
    })
    if missing:
        return "not yet converted: " + ", ".join(missing)
    if name in KNOWN_FAILURES:
        return KNOWN_FAILURES[name]
    return None
