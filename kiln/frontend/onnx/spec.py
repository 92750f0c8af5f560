"""What a node must look like before its converter runs, checked in one place.

Converters read attributes and inputs trusting that ONNX's rules hold: an int where the schema
says int, the inputs a node must have, an axis inside the rank it indexes, a kernel of at least
one element. A model that breaks them -- by mistake or on purpose -- would reach a converter's
arithmetic and fail there with Python's own error, loop for hours on a count of 2^31, or compute
nonsense. :func:`check_node` rejects it first, with a KilnError the importer prefixes with the
node (``kiln.frontend.onnx.importer``). The rules come from two places:

* the operator's schema in ``onnx.defs`` for the model's opset: the attribute names and types
  it declares (an unknown attribute, or a list where an int belongs, is an error, as in
  onnxruntime), the required attributes, the number of inputs and outputs, which inputs
  may be omitted (``''``), the input types (one type per type parameter, among the allowed
  ones); text attributes must be UTF-8. Operators without
  a schema (kiln's own domains) skip this part;
* kiln's rules by attribute name, which mean the same thing in every operator
  (:data:`RULES`): an ``axis``/``axes`` indexes the rank of the operator's first input, sizes
  and counts (``kernel_shape``, ``strides``, ``group``, ``num_outputs``, head counts...) lie in
  a sane range (:data:`MAX_SIZE`), so no converter loops over a count the data cannot have,
  flags are 0 or 1, and text choices (``auto_pad``, a ``mode``, a ``reduction``) are one of
  the spelled ones (:data:`CHOICES`, :data:`OP_CHOICES`): a converter would take an unknown
  one for its last branch. :data:`OP_RULES` overrides the rules where an operator means
  something else (Flatten's axis may equal the rank, Unsqueeze's axes index the output).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import onnx
from onnx import helper

from ...ir import KilnError
from ...ir.dtype import DataType

#: The largest size-like attribute value (a kernel extent, a stride, a count) kiln accepts:
#: far beyond any real model, far below what would make a converter loop for hours.
MAX_SIZE = 1 << 24
#: The largest number of outputs a node may declare (Split's ``num_outputs``...).
MAX_OUTPUTS = 1 << 16


@dataclass(frozen=True)
class Axis:
    """An int (or each int of a list) indexing the rank of input ``of``, plus ``extra``
    positions (Flatten's axis may equal the rank: ``extra=1``; Unsqueeze's axes index the
    output, ``extra=-1`` meaning "plus the number of axes")."""

    of: int = 0
    extra: int = 0


@dataclass(frozen=True)
class Sizes:
    """Ints (or each int of a list) in ``[lo, hi]``."""

    lo: int
    hi: int = MAX_SIZE


#: Rules by attribute name, for every operator (unless :data:`OP_RULES` says otherwise).
RULES: dict[str, Axis | Sizes] = {
    "axis": Axis(),
    "axes": Axis(),
    "kernel_shape": Sizes(1),
    "strides": Sizes(1),
    "dilations": Sizes(1),
    "pads": Sizes(-MAX_SIZE),
    "output_padding": Sizes(0),
    "output_shape": Sizes(0),
    "group": Sizes(1),
    "num_outputs": Sizes(1, MAX_OUTPUTS),
    "blocksize": Sizes(1),
    "block_size": Sizes(0),
    "size": Sizes(1),
    "batch_dims": Sizes(0),
    "hidden_size": Sizes(1),
    "num_heads": Sizes(1),
    "q_num_heads": Sizes(1),
    "kv_num_heads": Sizes(1),
    "max_gram_length": Sizes(1),
    "min_gram_length": Sizes(1),
    "max_skip_count": Sizes(0),
    "output_height": Sizes(1),
    "output_width": Sizes(1),
    "sampling_ratio": Sizes(0),
    "pooled_shape": Sizes(1),
    "k": Sizes(0),
    "rotary_embedding_dim": Sizes(0),
    "num_scan_inputs": Sizes(1, MAX_OUTPUTS),
    # flags: 0 or 1 (another value means nothing, and references read it differently)
    **{flag: Sizes(0, 1) for flag in (
        "keepdims", "noop_with_empty_axes", "select_last_index", "transA", "transB",
        "count_include_pad", "ceil_mode", "largest", "sorted", "exclusive", "reverse", "fmod",
        "saturate", "center_point_box", "storage_order", "allowzero", "detect_negative",
        "detect_positive", "upper", "is_causal", "interleaved", "input_forget",
        "linear_before_reset", "align_corners")},
}

#: Per-operator overrides of :data:`RULES` (None: the attribute is the converter's business).
OP_RULES: dict[str, dict[str, Axis | Sizes | None]] = {
    "Flatten": {"axis": Axis(extra=1)},
    "OneHot": {"axis": Axis(extra=1)},
    "Unsqueeze": {"axes": Axis(extra=-1)},
    "ConcatFromSequence": {"axis": None},
    "DFT": {"axis": None},
    "STFT": {"axis": None},
    "LRN": {"size": Sizes(1)},
    "CumSum": {"axis": None},
    "Pad": {"pads": Sizes(-MAX_SIZE)},
    "RotaryEmbedding": {"num_heads": Sizes(0)},
    "EyeLike": {"k": None},
}


#: Text attributes that name one of a few choices, by attribute name...
_SCATTER = ("none", "add", "mul", "max", "min")
_LOSS = ("none", "sum", "mean")
_DIRECTIONS = ("forward", "reverse", "bidirectional")
CHOICES: dict[str, tuple[str, ...]] = {
    "auto_pad": ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"),
    "approximate": ("none", "tanh"),
    "coordinate_transformation_mode": (
        "half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
        "asymmetric", "tf_half_pixel_for_nn", "tf_crop_and_resize"),
    "keep_aspect_ratio_policy": ("stretch", "not_larger", "not_smaller"),
    "nearest_mode": ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil"),
    "padding_mode": ("zeros", "border", "reflection"),
    "round_mode": ("up", "down", "nearest"),
}
#: ... and by operator where one name means different things (a converter would otherwise take
#: an unknown choice for its last branch).
OP_CHOICES: dict[tuple[str, str], tuple[str, ...]] = {
    ("DepthToSpace", "mode"): ("DCR", "CRD"),
    ("SpaceToDepth", "mode"): ("DCR", "CRD"),
    ("Pad", "mode"): ("constant", "reflect", "edge", "wrap"),
    ("Resize", "mode"): ("nearest", "linear", "cubic"),
    ("Upsample", "mode"): ("nearest", "linear", "bilinear"),
    ("GridSample", "mode"): ("bilinear", "nearest", "bicubic", "linear", "cubic"),
    ("RoiAlign", "mode"): ("avg", "max"),
    ("RoiAlign", "coordinate_transformation_mode"): ("half_pixel", "output_half_pixel"),
    ("TfIdfVectorizer", "mode"): ("TF", "IDF", "TFIDF"),
    ("TensorScatter", "mode"): ("linear", "circular"),
    ("BitShift", "direction"): ("LEFT", "RIGHT"),
    ("RNN", "direction"): _DIRECTIONS,
    ("GRU", "direction"): _DIRECTIONS,
    ("LSTM", "direction"): _DIRECTIONS,
    ("ScatterElements", "reduction"): _SCATTER,
    ("ScatterND", "reduction"): _SCATTER,
    ("NegativeLogLikelihoodLoss", "reduction"): _LOSS,
    ("SoftmaxCrossEntropyLoss", "reduction"): _LOSS,
}


def _schema(op_type: str, opset: int, domain: str) -> Any:
    try:
        return onnx.defs.get_schema(op_type, opset, domain)
    except Exception:  # noqa: BLE001 - no schema (kiln's own domains, functions)
        return None


def _value(attr: Any) -> Any:
    """An attribute's value as Python data, or a KilnError for one that has none."""
    try:
        return helper.get_attribute_value(attr)
    except Exception as err:  # noqa: BLE001 - an attribute of an unknown type
        raise KilnError(f"attribute {attr.name!r} has no value of a known type "
                        f"(type code {attr.type})") from err


_TYPE_WORDS = {1: "a float", 2: "an int", 3: "a string", 4: "a tensor", 5: "a graph",
               6: "a list of floats", 7: "a list of ints", 8: "a list of strings",
               9: "a list of tensors", 10: "a list of graphs", 11: "a sparse tensor",
               12: "a list of sparse tensors", 13: "a type proto", 14: "a list of type protos"}


def _check_schema(node: Any, schema: Any) -> None:
    declared = dict(schema.attributes)
    given = {a.name for a in node.attribute}
    for attr in node.attribute:
        spec = declared.get(attr.name)
        if spec is None:
            raise KilnError(f"unknown attribute {attr.name!r} (the {node.op_type} schema has "
                            f"{sorted(declared) or 'none'})")
        want = int(spec.type.value)
        if int(attr.type) != want:
            raise KilnError(f"attribute {attr.name!r} must be {_TYPE_WORDS.get(want, want)}, "
                            f"got {_TYPE_WORDS.get(int(attr.type), f'type {attr.type}')}")
    missing = sorted(n for n, a in declared.items() if a.required and n not in given)
    if missing:
        raise KilnError(f"required attribute(s) {missing} missing")
    n_in = len(node.input)
    if not schema.min_input <= n_in <= schema.max_input:
        raise KilnError(f"takes {_count(schema.min_input, schema.max_input)} input(s), got "
                        f"{n_in}")
    if not schema.min_output <= len(node.output) <= min(schema.max_output, MAX_OUTPUTS):
        raise KilnError(f"has {_count(schema.min_output, schema.max_output)} output(s), the "
                        f"node declares {len(node.output)}")
    formal = list(schema.inputs)
    for i, name in enumerate(node.input):
        param = formal[min(i, len(formal) - 1)] if formal else None
        if name == "" and param is not None and _option(param) != "Optional":
            raise KilnError(f"input {i} ({param.name}) is required but given as ''")


def _onnx_type(dtype: str | None) -> str | None:
    """``tensor(float)`` for kiln's ``float32`` (None when ONNX has no name for it)."""
    if dtype is None:
        return None
    try:
        code = onnx.helper.np_dtype_to_tensor_dtype(DataType(dtype).to_numpy())
        return f"tensor({onnx.TensorProto.DataType.Name(code).lower()})"
    except Exception:  # noqa: BLE001 - a dtype ONNX does not name
        return None


#: Narrow float types kiln computes in wherever an operator's schema allows float (an
#: extension over the schema, which lists them for few operators: an Add of float8 values).
NARROW_FLOATS = frozenset({"tensor(float16)", "tensor(bfloat16)", "tensor(float8e4m3fn)",
                           "tensor(float8e4m3fnuz)", "tensor(float8e5m2)",
                           "tensor(float8e5m2fnuz)"})


def _check_types(node: Any, schema: Any, dtypes: list[str | None]) -> None:
    """Inputs that share a type parameter (``T``) have one type, and each is one the
    constraint allows (as onnxruntime requires: an Equal of a float and an int64 is an
    error, not an implicit cast), or a narrow float where it allows float
    (:data:`NARROW_FLOATS`)."""
    allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
    for types in allowed.values():
        if "tensor(float)" in types:
            types |= NARROW_FLOATS
    formal = list(schema.inputs)
    bound: dict[str, tuple[int, str]] = {}
    for i, name in enumerate(node.input):
        if not name or i >= len(dtypes) or not formal:
            continue
        param = formal[min(i, len(formal) - 1)]
        have = _onnx_type(dtypes[i])
        if have is None:
            continue
        ts = param.type_str
        if ts in allowed:
            if have not in allowed[ts]:
                raise KilnError(f"input {i} ({param.name}) is {have}, which the {node.op_type} "
                                f"schema does not allow for {ts}")
            variadic = i >= len(formal) - 1 and _option(param) == "Variadic"
            if variadic and not param.is_homogeneous:
                continue
            first = bound.setdefault(ts, (i, have))
            if first[1] != have:
                raise KilnError(f"inputs {first[0]} and {i} must have one type ({ts}), got "
                                f"{first[1]} and {have}")
        elif ts.startswith("tensor(") and have != ts:
            raise KilnError(f"input {i} ({param.name}) must be {ts}, got {have}")


def _option(param: Any) -> str:
    return str(param.option).rsplit(".", 1)[-1]


def _count(lo: int, hi: int) -> str:
    if lo == hi:
        return str(lo)
    return f"at least {lo}" if hi >= 2**31 - 1 else f"{lo} to {hi}"


def _ints(value: Any) -> list[int] | None:
    if isinstance(value, int):
        return [value]
    if isinstance(value, (list, tuple)) and all(isinstance(v, int) for v in value):
        return list(value)
    return None


def _check_rule(name: str, rule: Axis | Sizes, value: Any, ranks: list[int]) -> None:
    ints = _ints(value)
    if ints is None:
        return
    if isinstance(rule, Sizes):
        if any(not rule.lo <= v <= rule.hi for v in ints):
            limit = " (kiln's limit)" if rule.hi >= MAX_SIZE else ""
            raise KilnError(f"attribute {name!r} = {value!r}: each value must be in "
                            f"[{rule.lo}, {rule.hi}]{limit}")
        return
    if rule.of >= len(ranks) or ranks[rule.of] < 0:
        return  # the rank is not known at import
    rank = ranks[rule.of] + (len(ints) if rule.extra < 0 else rule.extra)
    bad = [v for v in ints if not -rank <= v < rank]
    if bad:
        what = "input" if rule.of == 0 else f"input {rule.of}"
        raise KilnError(f"attribute {name!r} = {value!r} is out of range for the rank "
                        f"{ranks[rule.of]} {what}" + (f" (valid: [{-rank}, {rank}))"
                                                       if rank > 0 else ""))


def _check_tensor(name: str, tensor: Any) -> None:
    """A tensor attribute must be readable: dims that agree with its data and type."""
    if any(d < 0 for d in tensor.dims):
        raise KilnError(f"attribute {name!r}: the tensor has negative dims {list(tensor.dims)}")
    try:
        onnx.numpy_helper.to_array(tensor)
    except Exception as err:  # noqa: BLE001 - numpy/onnx say why in their own words
        raise KilnError(f"attribute {name!r}: its tensor (dims {list(tensor.dims)}, data type "
                        f"{tensor.data_type}) cannot be read: its data does not match") from err


def check_node(node: Any, opset: int, domain: str, ranks: list[int],
               dtypes: list[str | None] | None = None) -> None:
    """Check ``node`` (a NodeProto of a model whose ``domain`` opset is ``opset``) against its
    schema and kiln's rules (see the module docstring); ``ranks`` and ``dtypes`` are its
    inputs' ranks (-1 where unknown) and kiln dtype names (None where unknown). Raises
    KilnError; the importer names the node."""
    for attr in node.attribute:
        value = _value(attr)
        for item in (value if isinstance(value, list) else [value]):
            if isinstance(item, bytes):
                try:
                    item.decode("utf-8")
                except UnicodeDecodeError:
                    raise KilnError(f"attribute {attr.name!r} is not UTF-8 text: "
                                    f"{item[:40]!r}") from None
            elif isinstance(item, onnx.TensorProto):
                _check_tensor(attr.name, item)
    schema = _schema(node.op_type, opset, domain)
    if schema is not None:
        _check_schema(node, schema)
        if dtypes is not None:
            _check_types(node, schema, dtypes)
    overrides: Mapping[str, Axis | Sizes | None] = OP_RULES.get(node.op_type, {})
    for attr in node.attribute:
        rule = overrides.get(attr.name, RULES.get(attr.name))
        if rule is not None:
            _check_rule(attr.name, rule, _value(attr), ranks)
        choices = OP_CHOICES.get((node.op_type, attr.name), CHOICES.get(attr.name))
        value = _value(attr)
        if choices is not None and isinstance(value, bytes) and value.decode() not in choices:
            raise KilnError(f"attribute {attr.name!r} = {value.decode()!r} is not one of "
                            f"{', '.join(choices)}")
