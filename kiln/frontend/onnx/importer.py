"""ONNX ModelProto -> kiln IRModule.

Import runs in three steps: load and validate the protobuf (``ModelFormatError`` for malformed
files), check that every node has a converter for the model's opset (one
``UnsupportedOperatorError`` listing all missing ops, before any work), then walk the nodes in
topological order (ONNX requires it) calling one converter per node inside a dataflow block.

Values known at import time (initializers, ``Constant`` nodes, ``Shape`` of static tensors and
the small integer arithmetic models do on them) are kept in a table of numpy arrays so that
shape-determining inputs (Reshape's shape, Slice's starts, reduction axes, ...) can be folded.
Shapes that depend on values only known at run time become host shape functions that bind
fresh symbolic dims while the model runs (``converters/dynamic.py``); an input that would set a
value's *rank* (reduction or squeeze axes, ...) must still be known here, else
``NonConstantInputError``.

Initializers that feed tensor inputs become trailing parameters of ``main`` and are returned in
``params`` (bind them with ``kiln.build(mod, params=params)``), as TVM does: the weights stay
replaceable without re-importing. ``bind_params=True`` embeds them as constants instead.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx

from ... import graph as g
from ... import tir
from ...ir import KilnError, ModelFormatError, UnsupportedOperatorError
from ...ir.errors import error_context
from ...ir.module import IRModule
from ...ir.span import Span
from .external_data import is_external, read_external
from .fold import FOLDERS, evaluate_node
from .registry import lookup_converter
from .spec import check_node


class NonConstantInputError(KilnError):
    """A shape-determining input of a node is not known at import time.

    ``value_name`` is the ONNX value that would have to be constant.
    """

    def __init__(self, message: str, value_name: str = ""):
        super().__init__(message)
        self.value_name = value_name


def load_model(model: Any) -> Any:
    """A ModelProto from a ModelProto, a file path or serialized bytes (ModelFormatError if
    the data is not a valid ONNX model)."""
    if isinstance(model, onnx.ModelProto):
        proto = model
    elif isinstance(model, (bytes, bytearray)):
        proto = _parse(bytes(model), "<bytes>")
    elif isinstance(model, str):
        try:
            with open(model, "rb") as f:
                data = f.read()
        except OSError as err:
            raise ModelFormatError(f"cannot read ONNX model {model!r}: {err}") from err
        proto = _parse(data, model)
    else:
        raise KilnError(f"from_onnx expects a ModelProto, a path or bytes, got "
                        f"{type(model).__name__}")
    if not proto.HasField("graph"):
        raise ModelFormatError("the ONNX model has no graph (is the file an ONNX model?)")
    return proto


def _parse(data: bytes, where: str) -> Any:
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except Exception as err:  # noqa: BLE001 - protobuf raises DecodeError or RuntimeWarning
        raise ModelFormatError(f"{where}: not a valid ONNX model (truncated or corrupt "
                               f"protobuf: {err})") from err
    if not data or proto.ir_version == 0 or not proto.HasField("graph"):
        raise ModelFormatError(f"{where}: not a valid ONNX model (no IR version or graph)")
    return proto


def onnx_dtype(elem_type: int, what: str) -> str:
    """The kiln dtype name of ONNX tensor element type ``elem_type`` (``"string"`` for text,
    held on the host: ``kiln.op.strings``)."""
    if elem_type == onnx.TensorProto.STRING:
        return "string"
    try:
        np_dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type))
    except Exception as err:  # noqa: BLE001 - KeyError / ValueError for unknown types
        raise KilnError(f"{what}: unsupported ONNX element type {elem_type}") from err
    return np_dtype.name


def _safe_name(name: str) -> str:
    s = re.sub(r"[^0-9A-Za-z_]", "_", name)
    return s if s and not s[0].isdigit() else f"v_{s}"


class NodeView:
    """What a converter sees of one node: its inputs as Exprs, attributes, constant inputs."""

    def __init__(self, ctx: GraphContext, proto: Any, opset: int):
        self.ctx = ctx
        self.proto = proto
        self.opset = opset
        self.op_type: str = proto.op_type
        self.name: str = node_name(proto)
        self.attrs: dict[str, Any] = {}
        for a in proto.attribute:
            self.attrs[a.name] = onnx.helper.get_attribute_value(a)

    def __str__(self) -> str:
        return f"{self.op_type} node {self.name!r}"

    def error(self, message: str) -> KilnError:
        return KilnError(f"{self}: {message}")

    @property
    def num_inputs(self) -> int:
        return len(self.proto.input)

    @property
    def num_outputs(self) -> int:
        return len(self.proto.output)

    def has_input(self, i: int) -> bool:
        return i < len(self.proto.input) and self.proto.input[i] != ""

    def input(self, i: int) -> Any:
        """Input ``i`` as a graph Expr (None when absent)."""
        if not self.has_input(i):
            return None
        return self.ctx.value(self.proto.input[i])

    def inputs(self) -> list[Any]:
        return [self.input(i) for i in range(self.num_inputs)]

    def const_input(self, i: int, what: str) -> np.ndarray | None:
        """Input ``i``'s value, which must be known at import time (None when absent)."""
        if not self.has_input(i):
            return None
        name = self.proto.input[i]
        value = self.ctx.consts.get(name)
        if value is None:
            raise NonConstantInputError(
                f"{self}: input {i} ({what}, {name!r}) must be a constant (an initializer or "
                "computed from constants): it is not computed at run time for this operator",
                name,
            )
        return value

    def is_const(self, i: int) -> bool:
        return self.has_input(i) and self.proto.input[i] in self.ctx.consts

    def const_value(self, i: int) -> np.ndarray | None:
        """Input ``i``'s value when known at import time, else None (no error)."""
        if not self.has_input(i):
            return None
        return self.ctx.consts.get(self.proto.input[i])

    def attr(self, name: str, default: Any = None) -> Any:
        v = self.attrs.get(name, default)
        if isinstance(v, bytes):
            return v.decode()
        return v


class WalkLevel:
    """One graph being walked: its nodes and outputs, the index of the node being converted,
    and whether it is walked once inline (the model's graph, a constant-condition If's
    branch), so that an import can stop inside it and resume there."""

    def __init__(self, nodes: Sequence[Any], outputs: Sequence[str], resumable: bool):
        self.nodes = nodes
        self.outputs = outputs
        self.index = -1
        self.resumable = resumable


class BranchGuard(KilnError):
    """An If on a run-time condition whose branches differ in rank or dtype (no StructInfo
    covers both) stopped an import that may specialize (``GraphContext.specialize``).

    ``node``: the If as messages name it; ``path``: its node path; ``cond``: the condition
    as a 0-d bool Expr of the function being built; ``live``: (ONNX name, Expr) of every
    run-time value the rest of the model uses; ``consts`` and ``shape_dims``: what the import
    knew of the values computed so far.
    Raised only where the import can resume at the If (``GraphContext.resumable``); the
    message is the error an import without specialization gives.
    """

    def __init__(self, message: str, node: str = "", path: tuple[int, ...] = (),
                 cond: Any = None, live: Sequence[tuple[str, Any]] = (),
                 consts: Mapping[str, Any] | None = None,
                 shape_dims: Mapping[str, Any] | None = None):
        super().__init__(message)
        self.node = node
        self.path = path
        self.cond = cond
        self.live = list(live)
        self.consts = dict(consts or {})
        self.shape_dims = dict(shape_dims or {})


class GraphContext:
    """Import state: the builder, Exprs and known constant values by ONNX value name."""

    def __init__(self, bb: g.BlockBuilder, bind_params: bool, base_dir: str | None = None):
        self.bb = bb
        self.bind_params = bind_params
        #: The folder external data files are relative to (None: unknown).
        self.base_dir = base_dir
        self.values: dict[str, Any] = {}
        self.consts: dict[str, np.ndarray] = {}
        self.initializers: dict[str, np.ndarray] = {}
        self.param_vars: dict[str, g.Var] = {}
        self.opsets: dict[str, int] = {}  # the model's opsets (for subgraph import)
        #: The dims (ints or symbolic) of values made by Shape nodes whose shape is partly
        #: symbolic, so a Gather of its static entries folds to a constant.
        self.shape_dims: dict[str, list[Any]] = {}
        #: Where the walk is: one :class:`WalkLevel` per graph being converted (the model's
        #: graph, then the branches of constant-condition Ifs imported inline).
        self.walk: list[WalkLevel] = []
        #: Whether an If on a run-time condition whose branches differ in rank may stop the
        #: import with a :class:`BranchGuard` (``kiln.frontend.onnx.specialize``).
        self.specialize = False
        #: A continuation's import: the node path to resume at (earlier nodes are skipped,
        #: their results given) and the pinned If conditions by node path.
        self.resume_at: tuple[int, ...] | None = None
        self.pinned: dict[tuple[int, ...], bool] = {}

    def value(self, name: str) -> Any:
        if name in self.values:
            return self.values[name]
        if name in self.initializers:
            arr = self.initializers[name]
            if self.bind_params:
                expr: Any = g.const(arr)
            else:
                expr = g.Var(_safe_name(name), g.TensorStructInfo(arr.shape, arr.dtype))
                self.param_vars[name] = expr
            self.values[name] = expr
            return expr
        raise KilnError(f"ONNX value {name!r} is used before it is defined")

    def dtype_of(self, name: str) -> str | None:
        """The kiln dtype name of value ``name`` when known at import, else None."""
        if name in self.consts:
            return np.asarray(self.consts[name]).dtype.name
        expr = self.values.get(name)
        sinfo = getattr(expr, "struct_info", None)
        return str(sinfo.dtype) if isinstance(sinfo, g.TensorStructInfo) else None

    def rank(self, name: str) -> int:
        """The rank of value ``name`` when known at import, else -1 (also for '' and values
        not defined yet, which the converter reports)."""
        if name in self.consts:
            return np.ndim(self.consts[name])
        expr = self.values.get(name)
        sinfo = getattr(expr, "struct_info", None)
        if isinstance(sinfo, g.TensorStructInfo):
            return len(sinfo.shape) if sinfo.shape is not None else sinfo.ndim
        return -1

    def node_path(self) -> tuple[int, ...]:
        """The position of the node being converted: its index in each enclosing graph."""
        return tuple(level.index for level in self.walk)

    def resumable(self) -> bool:
        """Whether the import could stop at the current node and go on from there in another
        function: every enclosing graph is walked once, inline into ``main`` (not a subgraph
        function, not an unrolled loop body)."""
        return self.specialize and bool(self.walk) and all(lv.resumable for lv in self.walk)

    def pinned_condition(self) -> bool | None:
        """The condition a continuation's import pins for the If being converted (None:
        none)."""
        return self.pinned.get(self.node_path())

    # ---- helpers for converters -----------------------------------------------------------
    @staticmethod
    def shape(expr: Any) -> tuple[Any, ...]:
        sinfo = expr.struct_info
        if not isinstance(sinfo, g.TensorStructInfo) or sinfo.shape is None:
            raise KilnError(f"expected a tensor of known shape, got {sinfo}")
        return tuple(sinfo.shape)

    @staticmethod
    def static_shape(expr: Any) -> tuple[int, ...] | None:
        """The shape as ints when every dimension is a constant, else None."""
        dims = []
        for d in GraphContext.shape(expr):
            if not isinstance(d, tir.IntImm):
                return None
            dims.append(int(d.value))
        return tuple(dims)

    @staticmethod
    def dtype(expr: Any) -> str:
        return str(expr.struct_info.dtype)

    def emit(self, expr: Any, name: str = "") -> Any:
        return self.bb.emit(expr, _safe_name(name) if name else "")


def value_type_sinfo(tp: Any, what: str) -> g.StructInfo:
    """The StructInfo of an ONNX sequence or optional type (``kiln.op.sequence``): their
    tensors keep their dtype and rank, and their shape when every dim is a number (the
    elements of a sequence may differ in the dims a model leaves symbolic)."""
    kind = tp.WhichOneof("value")
    if kind == "sequence_type":
        return g.SequenceStructInfo(value_type_sinfo(tp.sequence_type.elem_type, what))
    if kind == "optional_type":
        return g.OptionalStructInfo(value_type_sinfo(tp.optional_type.elem_type, what))
    if kind != "tensor_type":
        raise KilnError(f"{what}: {kind} types are not supported (only tensors, sequences and "
                        "optionals)")
    tt = tp.tensor_type
    dtype = onnx_dtype(tt.elem_type, what)
    if not tt.HasField("shape"):
        return g.TensorStructInfo(None, dtype)
    dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
    if any(d is None for d in dims):
        return g.TensorStructInfo(None, dtype, len(dims))
    return g.TensorStructInfo(tuple(dims), dtype)


def _input_sinfo(vi: Any, shape_dict: Mapping[str, Sequence[Any]], dtype_dict: Mapping[str, Any],
                 sym: dict[str, tir.Var]) -> g.StructInfo:
    name = vi.name
    tt = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
    if tt is None:
        return value_type_sinfo(vi.type, f"graph input {name!r}")
    dtype = str(dtype_dict[name]) if name in dtype_dict else onnx_dtype(
        tt.elem_type, f"graph input {name!r}")
    if name in shape_dict:
        dims: list[Any] = []
        for d in shape_dict[name]:
            if isinstance(d, str):
                dims.append(sym.setdefault(d, tir.Var(d, "int64")))
            else:
                dims.append(d)
        return g.TensorStructInfo(tuple(dims), dtype)
    if not tt.HasField("shape"):
        raise KilnError(f"graph input {name!r} has unknown rank; give its shape in shape_dict")
    dims = []
    for i, d in enumerate(tt.shape.dim):
        if d.HasField("dim_value") and d.dim_value >= 0:
            dims.append(int(d.dim_value))
        else:
            key = d.dim_param if d.HasField("dim_param") and d.dim_param else f"{name}_dim{i}"
            key = _safe_name(key)
            dims.append(sym.setdefault(key, tir.Var(key, "int64")))
    return g.TensorStructInfo(tuple(dims), dtype)


def check_text(proto: Any) -> None:
    """Every name of the model (nodes, values, opset domains, attributes) must be UTF-8 text:
    protobuf hands a string field that is not as bytes, which no converter expects."""

    def bad(value: Any, where: str) -> None:
        if isinstance(value, bytes):
            raise ModelFormatError(f"{where} is not UTF-8 text: {value[:40]!r}")

    for imp in proto.opset_import:
        bad(imp.domain, "an opset domain")

    def walk(graph: Any) -> None:
        for vi in (*graph.input, *graph.output, *graph.value_info):
            bad(vi.name, "a graph input, output or value name")
        for init in graph.initializer:
            bad(init.name, "an initializer name")
        for k, node in enumerate(graph.node):
            where = f"node #{k}"
            for field in (node.name, node.op_type, node.domain):
                bad(field, f"the name, op type or domain of {where}")
            for name in (*node.input, *node.output):
                bad(name, f"a value name of {where} ({node.op_type})")
            for attr in node.attribute:
                bad(attr.name, f"an attribute name of {where} ({node.op_type})")
                if attr.HasField("g"):
                    walk(attr.g)
                for sub in attr.graphs:
                    walk(sub)

    walk(proto.graph)


def _check_default(vi: Any, value: np.ndarray) -> None:
    """A graph input that an initializer of the same name gives a value (its default, which
    kiln binds): the declared type and shape must describe that value."""
    tt = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
    if tt is None:
        raise KilnError(f"graph input {vi.name!r} has an initializer but is not a tensor")
    dtype = onnx_dtype(tt.elem_type, f"graph input {vi.name!r}") if tt.elem_type else None
    if dtype is not None and dtype != str(g.TensorStructInfo((), value.dtype).dtype):
        raise KilnError(f"graph input {vi.name!r} is declared {dtype} but its initializer "
                        f"holds {value.dtype.name}")
    if not tt.HasField("shape"):
        return
    dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
    if len(dims) != value.ndim or any(d is not None and d != n for d, n in
                                      zip(dims, value.shape)):
        shown = tuple(d if d is not None else "?" for d in dims)
        raise KilnError(f"graph input {vi.name!r} is declared with shape {shown} but its "
                        f"initializer has shape {value.shape}")


def _opsets(proto: Any, opset: int | None) -> dict[str, int]:
    out: dict[str, int] = {}
    for imp in proto.opset_import:
        dom = "" if imp.domain in ("", "ai.onnx") else imp.domain
        out[dom] = int(imp.version)
    if opset is not None:
        out[""] = int(opset)
    out.setdefault("", 1)
    return out


def check_supported(graph: Any, opsets: Mapping[str, int]) -> None:
    """Raise one UnsupportedOperatorError naming every op type without a converter."""
    missing: dict[str, list[str]] = {}
    for i, node in enumerate(graph.node):
        dom = "" if node.domain in ("", "ai.onnx") else node.domain
        if lookup_converter(node.op_type, opsets.get(dom, 0), dom) is None:
            key = f"{dom}::{node.op_type}" if dom else node.op_type
            missing.setdefault(key, []).append(node.name or f"#{i}")
    if missing:
        lines = [f"  {op} (opset {opsets.get(op.split('::')[0] if '::' in op else '', 0)}): "
                 f"nodes {', '.join(names)}" for op, names in sorted(missing.items())]
        raise UnsupportedOperatorError(
            f"the ONNX model uses {len(missing)} operator type(s) kiln cannot convert:\n"
            + "\n".join(lines)
        )


def initializer_array(init: Any, base_dir: str | None) -> np.ndarray:
    """The value of initializer ``init``; external data is read from ``base_dir``
    (``external_data``)."""
    try:
        if is_external(init):
            return read_external(init, base_dir)
        arr = onnx.numpy_helper.to_array(init)
        if arr.dtype.kind in "OUS":  # text: an object array of str (kiln.op.strings)
            return np.vectorize(as_text, otypes=[object])(arr) if arr.size else arr.astype(object)
        return arr
    except KilnError:
        raise
    except Exception as err:  # noqa: BLE001
        raise ModelFormatError(f"initializer {init.name!r} cannot be read: {err}") from err


def as_text(v: Any) -> str:
    """An ONNX string (protobuf gives bytes for tensor data and string attributes) as str."""
    return v.decode("utf-8") if isinstance(v, bytes) else str(v)


def _import_errors(fn: Any) -> Any:
    """An exception escaping the import outside any node (reading the graph's inputs,
    initializers and outputs) becomes an InternalError; KilnErrors pass as they are."""

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        with error_context("ONNX import", prefix=False):
            return fn(*args, **kwargs)

    return wrapped


@_import_errors
def from_onnx(model: Any, shape_dict: Mapping[str, Sequence[Any]] | None = None,
              dtype_dict: Mapping[str, Any] | None = None, opset: int | None = None,
              bind_params: bool = False,
              freeze_inputs: Mapping[str, np.ndarray] | None = None,
              base_dir: str | None = None,
              ) -> tuple[IRModule, dict[str, np.ndarray]]:
    """Import an ONNX model as an IRModule with function ``main``.

    ``model``: a ModelProto, a file path or serialized bytes. ``base_dir``: the folder that
    external data files (weights kept outside the .onnx file) are relative to; by default the
    folder of a model given by path, whatever the current directory (a ModelProto loaded with
    ``onnx.load(path, load_external_data=False)`` needs it). ``shape_dict``/``dtype_dict``
    override graph input shapes (str entries become symbolic dims) and dtypes. ``opset``
    overrides the default-domain opset. ``main``'s parameters are the graph inputs (minus
    initializers) in model order, then -- unless ``bind_params`` -- the initializers used as
    tensors, whose values are returned in ``params``. ``freeze_inputs`` replaces graph inputs by
    the given constant values (specializes the model to them; never needed for shapes).
    Several graph outputs are returned as a Tuple in model order.

    An ``If`` on a run-time condition whose branches return values of different rank or
    dtype cannot be one function: a KilnError names it (``kiln.frontend.onnx.compile_onnx``
    compiles such a model by specializing on the condition).
    """
    if base_dir is None and isinstance(model, str):
        base_dir = os.path.dirname(os.path.abspath(model))
    mod, weights, _ = import_model(load_model(model), shape_dict, dtype_dict, opset,
                                   bind_params, freeze_inputs, base_dir)
    return mod, weights


class Resume:
    """Where a continuation's import starts (``kiln.frontend.onnx.specialize``): at node path
    ``at``, the run-time values ``live`` ((ONNX name, StructInfo): ``main``'s parameters, in
    order) and what the stopped import knew (``consts``, ``shape_dims``); ``pinned`` gives the
    condition of each specialized If by node path."""

    def __init__(self, at: tuple[int, ...], live: Sequence[tuple[str, Any]],
                 consts: Mapping[str, Any], shape_dims: Mapping[str, Any],
                 pinned: Mapping[tuple[int, ...], bool]):
        self.at = at
        self.live = list(live)
        self.consts = dict(consts)
        self.shape_dims = dict(shape_dims)
        self.pinned = dict(pinned)


@_import_errors
def import_model(proto: Any, shape_dict: Mapping[str, Sequence[Any]] | None = None,
                 dtype_dict: Mapping[str, Any] | None = None, opset: int | None = None,
                 bind_params: bool = False,
                 freeze_inputs: Mapping[str, np.ndarray] | None = None,
                 base_dir: str | None = None, specialize: bool = False,
                 resume: Resume | None = None,
                 ) -> tuple[IRModule, dict[str, np.ndarray], BranchGuard | None]:
    """:func:`from_onnx` on a loaded ModelProto, plus what specialization needs.

    With ``specialize``, an If that needs it (see :class:`BranchGuard`) stops the import
    where the model can resume: ``main`` then returns the condition and the live values
    (``guard.live``'s order) and the guard comes back as the third result (else None).
    ``resume`` imports the continuation instead: ``main`` takes ``resume.live`` and computes
    the model's outputs from the resume point on, the pinned Ifs importing only their branch.
    """
    check_text(proto)
    if opset is None and not any(imp.domain in ("", "ai.onnx") for imp in proto.opset_import) \
            and any(node.domain in ("", "ai.onnx") for node in proto.graph.node):
        raise ModelFormatError("the model uses ONNX operators but imports no opset of the "
                               "default domain (opset_import; or pass opset=)")
    graph = proto.graph
    opsets = _opsets(proto, opset)
    check_supported(graph, opsets)
    shape_dict = dict(shape_dict or {})
    dtype_dict = dict(dtype_dict or {})
    freeze = dict(freeze_inputs or {})

    bb = g.BlockBuilder()
    ctx = GraphContext(bb, bind_params, base_dir)
    ctx.opsets = dict(opsets)
    ctx.specialize = specialize
    for init in graph.initializer:
        arr = initializer_array(init, base_dir)
        ctx.initializers[init.name] = arr
        ctx.consts[init.name] = arr
    sym: dict[str, tir.Var] = {}
    inputs: list[g.Var] = []
    if resume is not None:
        ctx.resume_at, ctx.pinned = resume.at, dict(resume.pinned)
        for name, arr in resume.consts.items():
            if name not in ctx.initializers:
                ctx.consts[name] = arr
                ctx.values[name] = g.const(arr)
        ctx.shape_dims.update(resume.shape_dims)
        for name, sinfo in resume.live:
            var = g.Var(_safe_name(name), sinfo)
            ctx.values[name] = var
            inputs.append(var)
    for vi in graph.input if resume is None else ():
        if vi.name in ctx.initializers:
            _check_default(vi, ctx.initializers[vi.name])
            continue
        if vi.name in freeze:
            arr = np.asarray(freeze[vi.name])
            ctx.consts[vi.name] = arr
            ctx.values[vi.name] = g.const(arr)
            continue
        var = g.Var(vi.name, _input_sinfo(vi, shape_dict, dtype_dict, sym))
        ctx.values[vi.name] = var
        inputs.append(var)

    # the graph's output names, kept for the executable's outputs (``exe.outputs``)
    output_names = tuple(vo.name for vo in graph.output)
    guard = None
    with bb.function("main", attrs={"output_names": output_names}):
        with bb.dataflow():
            try:
                convert_nodes(ctx, graph.node, output_names, inline=True)
                outs = []
                for vo in graph.output:
                    if vo.name not in ctx.values and vo.name not in ctx.initializers:
                        raise ModelFormatError(f"graph output {vo.name!r} is never produced")
                    outs.append(bb.emit_output(ctx.value(vo.name), _safe_name(vo.name)))
                result = outs[0] if len(outs) == 1 else outs
            except BranchGuard as stop:
                guard = stop
                result = [bb.emit_output(stop.cond, "guard_cond"),
                          *(bb.emit_output(e, _safe_name(n)) for n, e in stop.live)]
        params = [*inputs, *ctx.param_vars.values()]
        bb.emit_func_output(result, params=params)
    mod = bb.get()
    if guard is not None:  # main returns the guard's condition and live values
        mod["main"] = mod["main"].with_attr(
            "output_names", ("guard_cond", *(n for n, _ in guard.live)))
    weights = {v.name: ctx.initializers[n] for n, v in ctx.param_vars.items()}
    return mod, weights, guard


def convert_nodes(ctx: GraphContext, nodes: Sequence[Any], outputs: Sequence[str],
                  inline: bool) -> None:
    """Convert ``nodes`` (a graph with outputs named ``outputs``) in order, keeping the walk
    position (``ctx.walk``; ``inline``: walked once into the current function, see
    :class:`WalkLevel`). A continuation's import skips the nodes before its resume point."""
    level = WalkLevel(nodes, outputs, inline)
    depth = len(ctx.walk)
    at = ctx.resume_at
    on_path = at is not None and depth < len(at) and ctx.node_path() == at[:depth]
    ctx.walk.append(level)
    try:
        for i, node in enumerate(nodes):
            level.index = i
            if on_path and i < at[depth]:  # type: ignore[index]
                continue  # computed before the resume point: its results are main's inputs
            _convert_node(ctx, node, ctx.opsets)
    finally:
        ctx.walk.pop()


def branch_guard(ctx: GraphContext, node: str, message: str, cond: Any) -> BranchGuard:
    """The :class:`BranchGuard` stopping the import at If ``node`` being converted (condition
    ``cond``, a 0-d bool Expr): the live values are the run-time values (not constants, not
    initializers, which the continuation has as well) that the rest of the walk reads -- the
    If's branches (its condition is pinned there) and the nodes after it in every enclosing
    graph, with their subgraphs, and those graphs' outputs."""
    used: dict[str, None] = {}
    for level in ctx.walk:
        for later in level.nodes[level.index + 1:]:
            for name in node_reads(later):
                used.setdefault(name)
        for name in level.outputs:
            used.setdefault(name)
    here = ctx.walk[-1].nodes[ctx.walk[-1].index]  # the If: its branches read, not its condition
    for name in node_reads(here)[len([n for n in here.input if n]):]:
        used.setdefault(name)
    live = [(n, ctx.values[n]) for n in used
            if n in ctx.values and n not in ctx.consts and n not in ctx.initializers
            and not isinstance(ctx.values[n], g.Constant)]
    return BranchGuard(message, node, ctx.node_path(), cond, live, dict(ctx.consts),
                       dict(ctx.shape_dims))


def node_reads(node: Any) -> list[str]:
    """Every value name ``node`` reads: its inputs and what its subgraphs read (their own
    names included: an over-estimate, which is harmless where it is used)."""
    names = [n for n in node.input if n]
    for attr in node.attribute:
        for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
            for inner in sub.node:
                names += node_reads(inner)
            names += [o.name for o in sub.output]
    return names


def node_name(node: Any) -> str:
    """How a node is named in messages: its name, else its first output, else its op type."""
    return node.name or (node.output[0] if node.output else node.op_type)


def _convert_node(ctx: GraphContext, node: Any, opsets: Mapping[str, int]) -> None:
    """Convert one node under its span: every error escaping it names the node (a KilnError
    gets the name as a prefix, anything else becomes an InternalError naming it)."""
    dom = "" if node.domain in ("", "ai.onnx") else node.domain
    with ctx.bb.span(Span.of(node_name(node), node.op_type)):
        check_node(node, opsets.get(dom, 0), dom, [ctx.rank(n) for n in node.input],
                   [ctx.dtype_of(n) for n in node.input])
        view = NodeView(ctx, node, opsets.get(dom, 0))
        fn = lookup_converter(node.op_type, view.opset, dom)
        assert fn is not None  # check_supported ran first
        present = [n for n in node.input if n]
        folder = FOLDERS.get(node.op_type) if not dom else None
        if present and all(n in ctx.consts for n in present):
            if folder is not None:
                fn = _folding(folder, fn, present)
            else:
                fn = _evaluating(fn, dict(opsets))
        _run_converter(ctx, view, fn)


def _folding(folder: Any, converter: Any, present: list[str]) -> Any:
    """A converter that evaluates the node on its constant inputs with numpy, and converts it
    as usual when numpy cannot (the converter then reports what is wrong)."""

    def convert(ctx: GraphContext, view: NodeView) -> Any:
        try:
            with np.errstate(all="ignore"):
                return folder(view, *(ctx.consts[n] for n in present))
        except (ValueError, TypeError, IndexError, ArithmeticError):
            return converter(ctx, view)

    return convert


def _evaluating(converter: Any, opsets: dict[str, int]) -> Any:
    """A converter that folds a node whose inputs are all constants with onnx's reference
    evaluator (``fold.evaluate_node``), and converts it as usual where that declines."""

    def convert(ctx: GraphContext, view: NodeView) -> Any:
        node = view.proto
        arrays = [ctx.consts[n] if n else None for n in node.input]
        results = evaluate_node(node, opsets, arrays)
        if results is None or len(results) != len([o for o in node.output if o]):
            return converter(ctx, view)
        it = iter(results)
        return [next(it) if o else None for o in node.output]

    return convert


def _run_converter(ctx: GraphContext, view: NodeView, fn: Any) -> None:
    node = view.proto
    result = fn(ctx, view)
    results = list(result) if isinstance(result, (list, tuple)) else [result]
    outputs = list(node.output)
    if len(results) < len([o for o in outputs if o]):
        tup = ctx.emit(results[0], f"{node.op_type}_out") if len(results) == 1 else None
        if tup is not None and isinstance(tup.struct_info, g.TupleStructInfo):
            results = [g.TupleGetItem(tup, i) for i in range(len(tup.struct_info.fields))]
        else:
            raise view.error(f"produced {len(results)} outputs, the model uses {len(outputs)}")
    for name, res in zip(outputs, results):
        if not name:
            continue
        if isinstance(res, (np.ndarray, np.generic)):
            res = np.asarray(res)
            ctx.consts[name] = res
            ctx.values[name] = g.const(res)
        elif isinstance(res, g.Constant):
            ctx.consts[name] = res.data
            ctx.values[name] = res
        elif isinstance(res, g.Var):
            ctx.values[name] = res
        else:
            ctx.values[name] = ctx.emit(res, name)


def convert_subgraph(ctx: GraphContext, graph: Any, bindings: Mapping[str, Any],
                     inline: bool = False) -> list[Any]:
    """Import the nodes of subgraph ``graph`` (an If branch, a Loop/Scan body) into the current
    function and return its outputs (Exprs; numpy arrays when known at import time).

    ``bindings`` maps the subgraph's formal input names to Exprs or numpy arrays. Outer-scope
    values stay visible, as ONNX requires. The subgraph's own names are dropped afterwards, so a
    body can be imported once per iteration (unrolling) with fresh values each time.
    ``inline``: the subgraph is walked once into the current function (a constant-condition
    If's branch), so an import may stop and resume inside it (:class:`WalkLevel`).
    """
    check_supported(graph, ctx.opsets)
    saved_values, saved_consts = dict(ctx.values), dict(ctx.consts)
    try:
        for init in graph.initializer:
            arr = initializer_array(init, ctx.base_dir)
            ctx.consts[init.name] = arr
            ctx.values[init.name] = g.const(arr)
        for name, value in bindings.items():
            if isinstance(value, (np.ndarray, np.generic)):
                ctx.consts[name] = np.asarray(value)
                ctx.values[name] = g.const(np.asarray(value))
            else:
                ctx.consts.pop(name, None)
                ctx.values[name] = value
        convert_nodes(ctx, graph.node, [vo.name for vo in graph.output], inline)
        outs: list[Any] = []
        for vo in graph.output:
            if vo.name in ctx.consts:
                outs.append(ctx.consts[vo.name])
            else:
                outs.append(ctx.value(vo.name))
        return outs
    finally:
        # keep outer initializers first used inside the subgraph (they became parameters)
        kept = {n: v for n, v in ctx.values.items() if n in ctx.param_vars}
        ctx.values, ctx.consts = saved_values, saved_consts
        ctx.values.update(kept)
