"""Import-time evaluation of small ops whose inputs are all known constants.

Models compute shapes with chains like Shape -> Gather -> Sub -> ConstantOfShape; evaluating
them with numpy keeps every shape-determining input constant. ``FOLDERS`` maps an op type to
``fn(node, *arrays) -> array``; the importer uses it before the op's converter whenever every
present input of the node is constant. A folder that numpy cannot evaluate (shapes that do not
broadcast, a squeeze of a dim that is not 1) falls back to the op's converter, which reports it.

Every other operator whose inputs are all constants is evaluated with onnx's reference
evaluator (``evaluate_node``): a Transpose, Pad or Gemm of constants then stays a constant too,
so shapes it determines stay static (a voice-activity model computes its Pad amounts through
ConstantOfShape -> Concat -> Reshape -> Slice -> Transpose -> Reshape -> Cast; leaving one link
unfolded made the pads a run-time value and a later ``If`` on the padded shape undecidable).
Random operators and operators with subgraphs are never evaluated; results larger than
``FOLD_MAX_ELEMENTS`` (and than the largest input) are left to the converter, so folding does
not blow the model up, nor do inputs over ``FOLD_MAX_INPUT_ELEMENTS`` (evaluation in Python
would be slow where the compiled kernel is not).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator

#: A folded result may have at most this many elements (or no more than its largest input).
FOLD_MAX_ELEMENTS = 1 << 18
#: Nodes whose constant inputs hold more elements than this (together) are not evaluated.
FOLD_MAX_INPUT_ELEMENTS = 1 << 22
#: Operators never evaluated at import: random ones (a fresh draw per run), those with
#: subgraphs (their converters fold constant conditions and trip counts themselves) and
#: sequence/optional producers (their values are not tensors).
NOT_FOLDED = frozenset({
    "RandomUniform", "RandomNormal", "RandomUniformLike", "RandomNormalLike", "Bernoulli",
    "Multinomial", "Dropout", "If", "Loop", "Scan", "SequenceMap", "Optional",
    "SequenceConstruct", "SequenceEmpty", "SequenceInsert", "SequenceErase", "SplitToSequence",
    "OptionalGetElement", "OptionalHasElement", "SequenceAt", "SequenceLength",
    "ConcatFromSequence",
})


def _int_div(node: Any, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """ONNX Div: integers truncate toward zero (the floor quotient plus one where inexact and
    the signs differ: exact at INT_MIN), a zero divisor gives 0, as the compiled kernel does."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if a.dtype.kind in "iu":
            q, r = np.floor_divide(a, b), np.mod(a, b)
            fix = (r != 0) & ((a < 0) != (b < 0))
            return np.asarray(q + fix.astype(q.dtype)).astype(a.dtype)
        return np.asarray(a / b).astype(a.dtype)


def _mod(node: Any, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """ONNX Mod: ``fmod=1`` is C fmod (sign of the dividend), else the floor modulo; an
    integer modulo by zero gives 0 (as the compiled kernel does)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.fmod(a, b) if node.attr("fmod", 0) else np.mod(a, b)
    return np.asarray(out).astype(a.dtype)


def _binary(fn: Callable[..., Any]) -> Callable[..., Any]:
    def fold(node: Any, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        out = np.asarray(fn(a, b))
        return out if out.dtype == bool else out.astype(a.dtype)

    return fold


def _unary(fn: Callable[..., Any]) -> Callable[..., Any]:
    return lambda node, a: np.asarray(fn(a)).astype(a.dtype)


def _variadic(fn: Callable[..., Any]) -> Callable[..., Any]:
    def fold(node: Any, *xs: np.ndarray) -> np.ndarray:
        out = xs[0]
        for x in xs[1:]:
            out = fn(out, x)
        return np.asarray(out).astype(xs[0].dtype)

    return fold


def _axes(node: Any, axes: np.ndarray | None) -> tuple[int, ...] | None:
    """Squeeze/Unsqueeze axes: the input (opset 13+) or the attribute (before)."""
    if axes is not None:
        return tuple(int(a) for a in np.asarray(axes).reshape(-1))
    attr = node.attr("axes", None)
    return None if attr is None else tuple(int(a) for a in attr)


def _squeeze(node: Any, x: np.ndarray, axes: np.ndarray | None = None) -> np.ndarray:
    ax = _axes(node, axes)
    return np.squeeze(x) if ax is None else np.squeeze(x, axis=ax)


def _unsqueeze(node: Any, x: np.ndarray, axes: np.ndarray | None = None) -> np.ndarray:
    ax = _axes(node, axes) or ()
    rank = x.ndim + len(ax)
    return np.expand_dims(x, tuple(sorted(a % rank for a in ax)))


FOLDERS: dict[str, Callable[..., np.ndarray]] = {
    "Add": _binary(np.add), "Sub": _binary(np.subtract), "Mul": _binary(np.multiply),
    "Div": _int_div, "Equal": _binary(np.equal), "Less": _binary(np.less),
    "Greater": _binary(np.greater), "LessOrEqual": _binary(np.less_equal),
    "GreaterOrEqual": _binary(np.greater_equal), "And": _binary(np.logical_and),
    "Or": _binary(np.logical_or), "Not": lambda node, a: np.logical_not(a),
    "Neg": _unary(np.negative), "Abs": _unary(np.abs), "Max": _variadic(np.maximum),
    "Min": _variadic(np.minimum), "Identity": lambda node, a: a,
    "Where": lambda node, c, a, b: np.where(c, a, b).astype(a.dtype),
    # element-wise family (helper A)
    "Mod": _mod, "CastLike": lambda node, a, b: a.astype(b.dtype), "Sign": _unary(np.sign),
    "Xor": _binary(np.logical_xor), "BitwiseAnd": _binary(np.bitwise_and),
    "BitwiseOr": _binary(np.bitwise_or), "BitwiseXor": _binary(np.bitwise_xor),
    "BitwiseNot": _unary(np.invert),
    # shape values (attention function bodies squeeze a gathered dim before Range)
    "Squeeze": _squeeze, "Unsqueeze": _unsqueeze,
}


def evaluate_node(proto: Any, opsets: dict[str, int], arrays: list[np.ndarray | None]
                  ) -> list[np.ndarray] | None:
    """Node ``proto``'s outputs computed by onnx's reference evaluator from the constant
    ``arrays`` (one per input, None for an absent optional input) under the model's
    ``opsets``, or None when the node is not to be folded (see the module doc) or the
    evaluator fails (the converter then converts, and reports bad input, as usual)."""
    dom = "" if proto.domain in ("", "ai.onnx") else proto.domain
    if (proto.op_type in NOT_FOLDED and not dom) or any(
            a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
            for a in proto.attribute):
        return None
    present = [a for a in arrays if a is not None]
    if not present or sum(int(a.size) for a in present) > FOLD_MAX_INPUT_ELEMENTS:
        return None
    if any(a.dtype.kind in "OUS" for a in present):
        return None
    inputs = [onnx.helper.make_tensor_value_info(
        name, onnx.helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
        for name, a in zip(proto.input, arrays) if name and a is not None]
    outputs = [onnx.helper.make_empty_tensor_value_info(n) for n in proto.output if n]
    graph = onnx.helper.make_graph([proto], "fold", inputs, outputs)
    feeds = {name: a for name, a in zip(proto.input, arrays) if name and a is not None}
    try:
        with np.errstate(all="ignore"):
            ref = ReferenceEvaluator(graph, opsets={**opsets, dom: opsets.get(dom, 1)})
            results = ref.run(None, feeds)
    except Exception:  # noqa: BLE001 - any failure: convert the node instead
        return None
    out = []
    biggest = max(int(a.size) for a in present)
    for r in results:
        if not isinstance(r, (np.ndarray, np.generic)):
            return None  # a sequence, optional or map value
        r = np.asarray(r)
        if r.dtype.kind in "OUSV" or (r.size > FOLD_MAX_ELEMENTS and r.size > biggest):
            return None
        out.append(r)
    return out
