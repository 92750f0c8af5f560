"""Which ONNX backend node tests kiln runs, and why the others are excluded.

Every case of ``onnx.backend.test`` (node kind) is either run or excluded with a reason:

* ``training-only``: training operators (Adagrad, Adam, Momentum, Gradient, ...);
* ``string tensors``: the model reads or writes string tensors;
* ``dtype not supported by kiln``: float8/float4, 2-/4-bit integers, complex;
* ``sequence/optional types``: inputs/outputs of sequence, optional or map type, or sequence/
  optional values inside the graph (SequenceConstruct, SplitToSequence, OptionalHasElement...);
* ``not yet converted: <ops>``: an operator (of the model's opset) has no converter;
* ``KNOWN_FAILURES``: converted cases that fail, each with its concrete reason.
"""

from __future__ import annotations

from typing import Any

from .registry import lookup_converter

TRAINING_OPS = {"Adagrad", "Adam", "Momentum", "Gradient"}
# Operators whose inputs or outputs are sequences or optionals: a model using them has values of
# those types inside the graph even when its own inputs and outputs are tensors.
SEQUENCE_OP_PREFIXES = ("Sequence", "Optional")
SEQUENCE_OPS = {"SplitToSequence", "ConcatFromSequence"}

_BF16_ATTENTION = (
    "bfloat16 Attention: the reference rounds every intermediate (scaled Q/K, scores, exp, "
    "row sums) to bfloat16, kiln computes in float32 and rounds once; the results differ by "
    "1-2 bfloat16 ulps (0.8%), the case's rtol 1e-3 is below one ulp")
_EXPANDED_HALF = (
    "Attention function body in float16/bfloat16: run op by op in 16 bits, kiln's MatMul/"
    "Softmax round differently from numpy's by more than the case's rtol 1e-3 (1 fp16 ulp)")

_RUNTIME_RESIZE = (
    "run-time scales/sizes: Resize/Upsample scales, sizes or roi are graph inputs; the "
    "interpolation tables are built at import and need them constant")

_FLOAT_BITCAST = ("BitCast between float and integer bits: TIR has no bit-reinterpret node "
                  "(integer<->integer BitCast is a modular cast and runs)")

# Converted cases that fail, with the concrete reason (case name without the _cpu suffix).
KNOWN_FAILURES: dict[str, str] = {
    # -- run-time shapes (helper F): the backend no longer specializes a model to the first
    # run's values of its inputs, so converters that need an input at import time fail on
    # cases that feed it as a graph input
    # -- convolution and pooling (helper D2): Col2Im's image_shape/block_shape are graph inputs
    # in these cases; the output shape depends on their values, so the converter needs them at
    # import time (it passes with initializers: tests/frontend/test_frontend_onnx_conv_pool.py)
    **{f"test_col2im{c}": "Col2Im image_shape/block_shape fed as graph inputs (the output "
       "shape depends on their values; kiln needs them constant at import)"
       for c in ("", "_strides", "_pads", "_dilations", "_5d")},
    "test_maxunpool_export_with_output_shape": "MaxUnpool output_shape fed as a graph input "
        "(the output shape depends on its values; kiln needs it constant at import)",
    # -- image (helper D1): these cases feed scales/sizes/roi, AffineGrid's size and
    # CenterCropPad's shape as graph inputs; the converters need them at import time (they
    # pass with the values as initializers: tests/frontend/test_frontend_onnx_image.py)
    **{f"test_resize_{c}": _RUNTIME_RESIZE for c in (
        "upsample_scales_nearest", "downsample_scales_nearest", "upsample_sizes_nearest",
        "downsample_sizes_nearest", "upsample_scales_linear",
        "upsample_scales_linear_align_corners", "downsample_scales_linear",
        "downsample_scales_linear_align_corners", "upsample_scales_cubic",
        "upsample_scales_cubic_align_corners", "downsample_scales_cubic",
        "downsample_scales_cubic_align_corners", "upsample_sizes_cubic", "downsample_sizes_cubic",
        "upsample_scales_cubic_A_n0p5_exclude_outside",
        "downsample_scales_cubic_A_n0p5_exclude_outside", "upsample_scales_cubic_asymmetric",
        "tf_crop_and_resize", "tf_crop_and_resize_extrapolation_value",
        "downsample_sizes_linear_pytorch_half_pixel",
        "upsample_sizes_nearest_floor_align_corners",
        "upsample_sizes_nearest_round_prefer_ceil_asymmetric",
        "upsample_sizes_nearest_ceil_half_pixel", "downsample_scales_linear_antialias",
        "downsample_sizes_linear_antialias", "downsample_scales_cubic_antialias",
        "downsample_sizes_cubic_antialias", "upsample_scales_nearest_axes_2_3",
        "upsample_scales_nearest_axes_3_2", "upsample_sizes_nearest_axes_2_3",
        "upsample_sizes_nearest_axes_3_2", "tf_crop_and_resize_axes_2_3",
        "tf_crop_and_resize_axes_3_2", "upsample_sizes_nearest_not_larger",
        "upsample_sizes_nearest_not_smaller", "downsample_sizes_nearest_not_larger",
        "downsample_sizes_nearest_not_smaller", "downsample_scales_linear_half_pixel_symmetric",
        "upsample_scales_linear_half_pixel_symmetric",
    )},
    "test_upsample_nearest": _RUNTIME_RESIZE,
    **{f"test_affine_grid_{c}": "run-time size: AffineGrid's size is a graph input; the "
       "base grid is built at import and needs it constant"
       for c in ("2d", "2d_align_corners", "3d", "3d_align_corners")},
    **{f"test_center_crop_pad_{c}": "run-time shape: CenterCropPad's shape is a graph input; "
       "the crop/pad widths are computed at import and need it constant"
       for c in ("crop", "pad", "crop_and_pad", "crop_axes_hwc", "crop_negative_axes_hwc",
                 "crop_axes_chw")},
    # -- attention / normalization (helper B) --
    **{f"test_attention_{c}": _BF16_ATTENTION for c in (
        "4d_causal_bf16", "4d_padded_kv_bf16", "4d_causal_padded_kv_bf16",
        "4d_attn_mask_causal_bf16", "3d_causal_bf16")},
    **{f"test_attention_{c}_expanded": _EXPANDED_HALF for c in (
        "4d_fp16", "4d_gqa_with_past_and_present_fp16", "4d_causal_bf16", "4d_causal_fp16",
        "4d_padded_kv_bf16", "4d_causal_padded_kv_bf16", "4d_attn_mask_causal_bf16",
        "3d_causal_bf16")},
    # -- recurrent / subgraph / signal (helper H) --
    "test_loop11": "Loop trip count is a graph input: Loop is unrolled at import and needs "
                   "a trip count known at import time",
    "test_range_float_type_positive_delta_expanded":
        "Loop trip count computed from graph inputs: Loop is unrolled at import",
    "test_range_float16_type_positive_delta_expanded":
        "Loop trip count computed from graph inputs: Loop is unrolled at import",
    "test_range_bfloat16_type_positive_delta_expanded":
        "Loop trip count computed from graph inputs: Loop is unrolled at import",
    "test_range_int32_type_negative_delta_expanded":
        "Loop trip count computed from graph inputs: Loop is unrolled at import",
    "test_dft_inverse": "expected data carries float32 FFT round-off (1.9e-07 where the exact "
                        "value is 0) above the test's atol 1e-07; kiln's DFT is exact in float64",
    "test_dft_inverse_opset19":
        "expected data carries float32 FFT round-off (1.9e-07 where the exact value is 0) "
        "above the test's atol 1e-07; kiln's DFT is exact in float64",
    "test_dft_rfft": "DFT axis is a graph input and the one-sided output shape depends on it",
    "test_dft_irfft": "DFT axis is a graph input and the one-sided output shape depends on it",
    "test_affine_grid_2d_expanded":
        "size is a graph input: run-time shapes leave an Add of unknown shape (Unsqueeze "
        "needs a known rank)",
    "test_affine_grid_2d_align_corners_expanded":
        "size is a graph input: run-time shapes leave an Add of unknown shape (Unsqueeze "
        "needs a known rank)",
    "test_affine_grid_3d_expanded":
        "If with a run-time condition whose branches give shapes () and (1,): kiln runs both "
        "branches and selects, which needs equal shapes",
    "test_affine_grid_3d_align_corners_expanded":
        "If with a run-time condition whose branches give shapes () and (1,): kiln runs both "
        "branches and selects, which needs equal shapes",
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
    "test_wrap_pad": "Pad mode 'wrap' with pads fed as a graph input: the run-time pad "
        "(op.dynamic_pad) has no wrap mode; constant pads convert (a gather per axis)",
    # element-wise (helper A)
    "test_celu_bfloat16_expanded":
        "bfloat16 Celu spelled out in Div/Exp/Sub/Mul/Max/Min nodes: kiln rounds every node's "
        "result to bfloat16, the reference computes in float32 and rounds once (0.4453 vs "
        "0.4434, beyond rtol 1e-3); the Celu node itself computes in float32 and passes",
    "test_bitcast_float32_to_int32": _FLOAT_BITCAST,
    "test_bitcast_int32_to_float32": _FLOAT_BITCAST,
    "test_bitcast_float64_to_int64": _FLOAT_BITCAST,
    "test_bitcast_int64_to_float64": _FLOAT_BITCAST,
    "test_bitcast_2d_float32_to_int32": _FLOAT_BITCAST,
    "test_bitcast_scalar_float32_to_int32": _FLOAT_BITCAST,
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


# ONNX element types kiln has no dtype for (complex): the TensorProto enum values. (float8,
# float4 and 2/4-bit integers are kiln dtypes: kiln.ir.dtype.MINIFLOATS.)
UNSUPPORTED_ELEM_TYPES = {14: "complex64", 15: "complex128"}


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
    if kinds or any(n.op_type.startswith(SEQUENCE_OP_PREFIXES) or n.op_type in SEQUENCE_OPS
                    for n in nodes):
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
