"""torch.export ExportedProgram -> kiln IRModule.

Import runs the program's default decompositions (PyTorch's core ATen operator set), checks
that every operator has a converter (one ``UnsupportedOperatorError`` listing every missing
overload with the nodes that use it, before any work), then walks the FX graph in order
calling one converter per node, each under a :class:`~kiln.ir.span.Span` of the node's name
and ATen overload, inside one dataflow block of ``main``.

Inputs, parameters, buffers: the program's user inputs are ``main``'s first parameters (in
the order the program flattens them); its parameters, buffers and lifted constants follow and
are returned in ``params`` (bind them with ``kiln.build(mod, params=params)``), or become
constants with ``bind_params=True``.

Symbolic sizes: each ``torch.export.Dim`` of an input becomes a ``tir.Var`` (named after the
first input and axis it sizes, ``x_dim0``); derived dims (``2 * batch``) become expressions of
it. Every SymInt a node computes (``aten.sym_size``, Python arithmetic on sizes) is converted
from its sympy expression, so shapes built from sizes (``x.view(b * 2, -1)``) stay symbolic.
The exported ranges go into ``main``'s ``kiln.dim_ranges`` attribute, which the executable
checks when a run binds the dim.

Call structure: the program's input and output trees (tuples, lists, dicts) become ``main``'s
``kiln.input_tree`` and ``kiln.output_tree`` attributes (``kiln.runtime.pytree``), so the
executable is called like the exported module and returns the same nesting.

In-place updates: a program that updates a buffer (``self.steps += 1``, a running statistic,
a KV cache) or one of its inputs (``x.add_(1)``) has one extra output per update after its user
outputs; ``main``'s ``kiln.mutations`` attribute maps each to the parameter it updates
(``kiln.runtime.plan.MUTATIONS_ATTR``). An updated buffer stays a parameter of ``main`` even
with ``bind_params=True`` (its value is returned in ``params``): ``kiln.build`` keeps it as the
executable's *state*, which every call reads and then replaces with the update, as the module
would; an updated input is written back into the caller's array or tensor after the call.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from ... import graph as g
from ... import op, tir
from ...ir import KilnError, ModelFormatError, UnsupportedOperatorError
from ...ir.module import IRModule
from ...ir.span import Span
from ...runtime.plan import MUTATIONS_ATTR
from .registry import lookup_converter
from .tensors import kiln_dtype, require_torch, to_numpy

#: Python callables of SymInt arithmetic that FX graphs hold as node targets; their results
#: come from the nodes' sympy expressions, so they need no converter.
SYM_TARGETS = {operator.add, operator.sub, operator.mul, operator.floordiv, operator.mod,
               operator.truediv, operator.neg, operator.pow, operator.eq, operator.ne,
               operator.lt, operator.le, operator.gt, operator.ge}

#: ATen overloads that only assert facts torch.export already checked or recorded (ranges,
#: metadata); they compute nothing.
NO_OP_TARGETS = {"aten._assert_scalar.default", "aten.sym_constrain_range_for_size.default",
                 "aten.sym_constrain_range.default", "aten._assert_tensor_metadata.default",
                 "aten._assert_async.msg", "aten._assert_async.default"}


#: The value of an effect token (a TOKEN input of an exported program, threaded through
#: ``with_effects`` nodes to order side effects): it has no run-time value in kiln, whose
#: effects are tied to the values they guard (see ``converters/linalg.py``).
EFFECT_TOKEN = "kiln.effect_token"


def safe_name(name: str) -> str:
    """``name`` made a valid identifier (kiln variable names reach generated C)."""
    s = re.sub(r"[^0-9A-Za-z_]", "_", name)
    return s if s and not s[0].isdigit() else f"v_{s}"


def is_tensor_val(val: Any) -> bool:
    torch = require_torch()
    return isinstance(val, torch.Tensor)


def overload_name(target: Any) -> str:
    """``"aten.add.Tensor"`` for an OpOverload; the qualified name for other callables."""
    if hasattr(target, "_schema") and hasattr(target, "_overloadname"):
        return str(target)
    return f"{getattr(target, '__module__', '')}.{getattr(target, '__name__', repr(target))}"


def tree_json(spec: Any, leaf: Any) -> dict[str, Any]:
    """A ``torch.utils._pytree.TreeSpec`` as a ``kiln.runtime.pytree`` tree; ``leaf(i)`` gives
    the node of leaf ``i`` (in flattening order)."""
    counter = iter(range(1 << 30))

    def walk(s: Any) -> dict[str, Any]:
        if s.is_leaf():
            return leaf(next(counter))
        items = [walk(c) for c in s.children()]
        if s.type is type(None):
            return {"kind": "none"}
        if s.type is list:
            return {"kind": "list", "items": items}
        ctx = s.context
        if isinstance(ctx, (list, tuple)) and len(ctx) == len(items) and all(
                isinstance(k, str) for k in ctx):
            # dicts and dict-like outputs (transformers' ModelOutput) keep their keys
            return {"kind": "dict", "keys": list(ctx), "items": items}
        return {"kind": "tuple", "items": items}

    return walk(spec)


class NodeView:
    """What a converter sees of one FX node: its arguments by position or schema name, with
    graph values replaced by kiln Exprs (tensors), PrimExprs (sizes) or lists of them."""

    def __init__(self, ctx: ProgramContext, node: Any):
        self.ctx = ctx
        self.node = node
        self.name: str = node.name
        self.target = node.target
        self.op_name = overload_name(node.target)
        self.val = node.meta.get("val")
        schema = getattr(node.target, "_schema", None)
        self._names = [a.name for a in schema.arguments] if schema is not None else []
        self._defaults = ({a.name: a.default_value for a in schema.arguments
                           if a.has_default_value()} if schema is not None else {})
        self._args = list(node.args)
        self._kwargs = dict(node.kwargs)

    def __str__(self) -> str:
        return f"{self.op_name} node {self.name!r}"

    def error(self, message: str) -> KilnError:
        return KilnError(f"{self}: {message}")

    def arg(self, key: int | str, default: Any = None) -> Any:
        """Argument ``key`` (a position or schema name) converted to kiln values; the schema's
        default (else ``default``) when the node does not give it."""
        raw = self.raw(key, default)
        return self.ctx.convert_arg(raw)

    def raw(self, key: int | str, default: Any = None) -> Any:
        """Argument ``key`` as the FX node holds it (Nodes not converted)."""
        if isinstance(key, int):
            if key < len(self._args):
                return self._args[key]
            name = self._names[key] if key < len(self._names) else None
        else:
            name = key
            if name in self._names and self._names.index(name) < len(self._args):
                return self._args[self._names.index(name)]
        if name is not None and name in self._kwargs:
            return self._kwargs[name]
        if name is not None and name in self._defaults:
            return self._defaults[name]
        return default

    def has(self, key: int | str) -> bool:
        """Whether argument ``key`` is given and not None."""
        return self.raw(key) is not None

    def meta(self, key: int | str) -> Any:
        """The example value (FakeTensor, SymInt, ...) of argument ``key`` when it is a node."""
        raw = self.raw(key)
        return raw.meta.get("val") if hasattr(raw, "meta") else raw

    def output_used(self, i: int) -> bool:
        """Whether result ``i`` of a multi-result node is read (``getitem(node, i)``), so that
        converters skip work for results nobody uses (max_pool's indices, norms' statistics)."""
        for user in self.node.users:
            if user.target is not operator.getitem or user.args[1] == i:
                return True
        return False

    @property
    def out_dtype(self) -> str:
        """The kiln dtype of the node's (first) tensor result."""
        val = self.val[0] if isinstance(self.val, (tuple, list)) else self.val
        return kiln_dtype(val.dtype)

    @property
    def out_shape(self) -> tuple[Any, ...]:
        """The node's result shape with sizes as ints or PrimExprs."""
        val = self.val[0] if isinstance(self.val, (tuple, list)) else self.val
        return tuple(self.ctx.size(d) for d in val.shape)


class ProgramContext:
    """Import state: the builder, kiln values by FX node, and the symbolic dims."""

    def __init__(self, bb: g.BlockBuilder):
        self.bb = bb
        self.values: dict[Any, Any] = {}
        #: sympy symbol name -> tir.Var (or the IntImm of a frozen tensor's size), and each
        #: var's first (input Var, axis)
        self.symbols: dict[str, Any] = {}
        self.sym_origin: dict[tir.Var, tuple[g.Var, int]] = {}

    # ---- arguments ----------------------------------------------------------------------
    def convert_arg(self, raw: Any) -> Any:
        if hasattr(raw, "op") and hasattr(raw, "meta"):  # an fx.Node
            if raw not in self.values:
                raise KilnError(f"node {raw.name!r} is used before it is defined")
            return self.values[raw]
        if isinstance(raw, (list, tuple)):
            return type(raw)(self.convert_arg(r) for r in raw)
        torch = require_torch()
        if isinstance(raw, torch.SymInt):
            return self.size(raw)
        return raw

    # ---- sizes --------------------------------------------------------------------------
    def size(self, d: Any) -> Any:
        """A size (int or SymInt) as an int or a PrimExpr over the input dims."""
        torch = require_torch()
        if isinstance(d, torch.SymInt):
            expr = d.node.expr
            if expr.is_number:
                return int(expr)
            return self.sym_expr(expr)
        return int(d)

    def sym_expr(self, expr: Any) -> Any:
        """A sympy expression of the program's size symbols as a kiln PrimExpr."""
        if expr.is_Integer:
            return tir.IntImm("int64", int(expr))
        if expr.is_Symbol:
            var = self.symbols.get(str(expr))
            if var is None:
                raise KilnError(f"size {expr} is not derived from an input's size (a "
                                "data-dependent size); kiln cannot convert it")
            return var
        args = [self.sym_expr(a) for a in expr.args]
        kind = type(expr).__name__
        if kind == "Add":
            out = args[0]
            for a in args[1:]:
                out = out + a
            return out
        if kind == "Mul":
            out = args[0]
            for a in args[1:]:
                out = out * a
            return out
        if kind == "FloorDiv":
            return args[0] // args[1]
        if kind in ("Mod", "PythonMod"):
            return args[0] % args[1]
        if kind == "Max":
            return _fold(tir.max, args)
        if kind == "Min":
            return _fold(tir.min, args)
        if kind == "Pow" and expr.args[1].is_Integer and int(expr.args[1]) > 0:
            out = args[0]
            for _ in range(int(expr.args[1]) - 1):
                out = out * args[0]
            return out
        raise KilnError(f"size expression {expr} ({kind}) is not supported")

    def size_tensor(self, expr: Any) -> Any:
        """A 0-d int64 tensor holding size ``expr`` (a PrimExpr over the input dims), read at
        run time from the inputs' shapes (``dynamic_shape_of``)."""
        if isinstance(expr, int):
            return g.const(np.array(expr, dtype=np.int64))
        if isinstance(expr, tir.IntImm):
            return g.const(np.array(int(expr.value), dtype=np.int64))
        if isinstance(expr, tir.Var):
            if expr not in self.sym_origin:
                raise KilnError(f"size {expr} is not the size of an input")
            src, axis = self.sym_origin[expr]
            shape = op.dynamic_shape_of(src)
            return self.emit(op.reshape(op.strided_slice(shape, (axis,), (axis + 1,)), ()))
        ops = {"Add": op.add, "Sub": op.subtract, "Mul": op.multiply,
               "FloorDiv": op.floor_divide, "FloorMod": op.mod, "Min": op.minimum,
               "Max": op.maximum}
        kind = type(expr).__name__
        if kind not in ops:
            raise KilnError(f"size expression {expr} cannot be computed as a tensor")
        return self.emit(ops[kind](self.size_tensor(expr.a), self.size_tensor(expr.b)))

    # ---- emitting -----------------------------------------------------------------------
    def emit(self, expr: Any, name: str = "") -> Any:
        """Bind ``expr`` (left as is when it is already a Var or Constant)."""
        if isinstance(expr, (g.Var, g.Constant)):
            return expr
        return self.bb.emit(expr, safe_name(name) if name else "")


def _fold(fn: Any, args: Sequence[Any]) -> Any:
    out = args[0]
    for a in args[1:]:
        out = fn(out, a)
    return out


def _is_sym_node(node: Any) -> bool:
    """A node computing a size (a SymInt/SymFloat/SymBool, or a plain number)."""
    torch = require_torch()
    return isinstance(node.meta.get("val"), (torch.SymInt, torch.SymBool, torch.SymFloat))


def check_supported(graph: Any) -> None:
    """Raise one UnsupportedOperatorError naming every operator without a converter, each
    with the nodes that use it."""
    missing: dict[str, list[str]] = {}
    for node in graph.nodes:
        if node.op == "get_attr":
            missing.setdefault("get_attr (submodules: control flow)", []).append(node.name)
        if node.op != "call_function":
            continue
        name = overload_name(node.target)
        if (node.target is operator.getitem or name in NO_OP_TARGETS
                or (node.target in SYM_TARGETS or _is_sym_node(node))
                or lookup_converter(name) is not None):
            continue
        missing.setdefault(name, []).append(node.name)
    if missing:
        lines = [f"  {op}: nodes {', '.join(names)}" for op, names in sorted(missing.items())]
        raise UnsupportedOperatorError(
            f"the exported program uses {len(missing)} operator(s) kiln cannot convert:\n"
            + "\n".join(lines)
        )


def from_exported_program(ep: Any, bind_params: bool = False, run_decompositions: bool = True
                          ) -> tuple[IRModule, dict[str, np.ndarray]]:
    """Import a ``torch.export.ExportedProgram`` as an IRModule with function ``main``.

    ``main``'s parameters are the program's tensor user inputs (flattened in the order of the
    exported call), then -- unless ``bind_params`` -- its parameters, buffers and lifted
    constants, whose values are returned in ``params`` by parameter name. The executable keeps
    the program's call structure (see the module docstring). ``run_decompositions=False``
    imports the graph as it is (already decomposed programs).
    """
    torch = require_torch()
    if not isinstance(ep, torch.export.ExportedProgram):
        raise KilnError(f"from_exported_program expects a torch.export.ExportedProgram, got "
                        f"{type(ep).__name__}")
    if run_decompositions:
        ep = ep.run_decompositions()
    graph = ep.graph
    check_supported(graph)
    sig = ep.graph_signature
    kinds = {spec.arg.name: spec for spec in sig.input_specs}
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]

    # buffers the program updates stay parameters (the executable's state), even when bound
    mutated_buffers = {o.target for o in sig.output_specs if o.kind.name == "BUFFER_MUTATION"}
    bb = g.BlockBuilder()
    ctx = ProgramContext(bb)
    user_vars: list[g.Var] = []
    param_vars: list[g.Var] = []
    params: dict[str, np.ndarray] = {}
    leaf_nodes: list[dict[str, Any]] = []
    for node in placeholders:
        spec = kinds[node.name]
        kind = spec.kind.name
        val = node.meta.get("val")
        if kind == "USER_INPUT":
            if not is_tensor_val(val):
                if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
                    raise KilnError(f"input {node.name!r}: dynamic scalar inputs are not "
                                    "supported (export it as a constant or a tensor)")
                leaf_nodes.append({"kind": "const", "value": val} if val is not None
                                  else {"kind": "none"})
                continue
            user_vars.append(_user_input(ctx, node, val))
            leaf_nodes.append({"kind": "leaf"})
        elif kind in ("PARAMETER", "BUFFER", "CONSTANT_TENSOR"):
            store = ep.state_dict if spec.target in ep.state_dict else ep.constants
            arr = to_numpy(store[spec.target])
            if bind_params and spec.target not in mutated_buffers:
                ctx.values[node] = g.const(arr)
            else:
                var = g.Var(safe_name(node.name), g.TensorStructInfo(arr.shape, arr.dtype.name))
                ctx.values[node] = var
                param_vars.append(var)
                params[var.name_hint] = arr
        elif kind == "TOKEN":  # orders side effects (with_effects); no value at run time
            ctx.values[node] = EFFECT_TOKEN
        else:
            raise KilnError(f"input {node.name!r} of kind {kind} is not supported")

    input_tree = tree_json(ep.call_spec.in_spec, lambda i: leaf_nodes[i])
    ranges = _dim_ranges(ctx, ep.range_constraints)

    out_node = next(n for n in graph.nodes if n.op == "output")
    flat_out = list(out_node.args[0])
    by_name = {getattr(o, "name", None): o for o in flat_out}

    results = []
    for spec_out in sig.output_specs:
        if spec_out.kind.name == "USER_OUTPUT":
            src = by_name.get(spec_out.arg.name)
            results.append((spec_out.arg.name, src if src is not None
                            else getattr(spec_out.arg, "value", None)))
    main_params = [*user_vars, *param_vars]
    updates = _updates(sig, by_name, placeholders, ctx, main_params)
    attrs: dict[str, Any] = {"kiln.input_tree": input_tree}
    if ranges:
        attrs["kiln.dim_ranges"] = ranges
    mod = _build_main(ctx, graph, results, main_params, attrs,
                      lambda leaves: tree_json(ep.call_spec.out_spec, lambda i: leaves[i]),
                      updates)
    return mod, params


def _updates(sig: Any, by_name: dict[str | None, Any], placeholders: list[Any],
             ctx: ProgramContext, main_params: list[g.Var]) -> list[tuple[str, Any]]:
    """``(name of the updated parameter of main, FX node of its new value)`` per in-place
    update of a buffer or a user input (BUFFER_MUTATION / USER_INPUT_MUTATION outputs)."""
    spec_of = {spec.arg.name: spec for spec in sig.input_specs}
    names = {id(v): v.name_hint for v in main_params}
    out = []
    for spec_out in sig.output_specs:
        kind = spec_out.kind.name
        if kind not in ("BUFFER_MUTATION", "USER_INPUT_MUTATION"):
            continue
        node = next((n for n in placeholders if spec_of[n.name].kind.name ==
                     ("BUFFER" if kind == "BUFFER_MUTATION" else "USER_INPUT")
                     and (spec_of[n.name].target if kind == "BUFFER_MUTATION" else n.name)
                     == spec_out.target), None)
        var = ctx.values.get(node) if node is not None else None
        if not isinstance(var, g.Var) or id(var) not in names:
            raise KilnError(f"the exported program updates {spec_out.target!r} in place, "
                            "which is not a tensor input or buffer of the program")
        src = by_name.get(spec_out.arg.name)
        if src is None:
            raise KilnError(f"the exported program's update of {spec_out.target!r} has no "
                            "value in its outputs")
        out.append((names[id(var)], src))
    return out


def _user_input(ctx: ProgramContext, node: Any, val: Any) -> g.Var:
    """The graph parameter of a tensor input (its size symbols recorded)."""
    var = g.Var(safe_name(node.name), _input_sinfo(ctx, node.name, val))
    for axis, d in enumerate(var.struct_info.shape):
        if isinstance(d, tir.Var):
            ctx.sym_origin.setdefault(d, (var, axis))
    ctx.values[node] = var
    return var


def _build_main(ctx: ProgramContext, graph: Any, results: list[tuple[str, Any]],
                params: list[g.Var], attrs: dict[str, Any], output_tree: Any,
                updates: Sequence[tuple[str, Any]] = ()) -> IRModule:
    """Convert every node of ``graph`` into ``main`` returning the tensors of ``results``
    (``(name, FX node or constant)``); ``output_tree(leaves)`` makes the output tree from the
    results' leaf records. The new values of ``updates`` (``(parameter name, FX node)``) are
    returned after them, recorded in ``kiln.mutations``."""
    bb = ctx.bb
    with bb.function("main"):
        with bb.dataflow():
            for node in graph.nodes:
                if node.op == "call_function":
                    _convert_node(ctx, node)
            outs: list[Any] = []
            leaves: list[dict[str, Any]] = []
            for name, src in results:
                value = ctx.values.get(src) if hasattr(src, "op") else None
                if isinstance(value, g.Expr) and not isinstance(value, g.Tuple):
                    outs.append(bb.emit_output(value, safe_name(name)))
                    leaves.append({"kind": "leaf"})
                else:
                    const = value if hasattr(src, "op") else src
                    leaves.append({"kind": "none"} if const is None
                                  else {"kind": "const", "value": _plain(const)})
            mutations = []
            for name, src in updates:
                value = ctx.values.get(src)
                if not isinstance(value, g.Expr) or isinstance(value, g.Tuple):
                    raise KilnError(f"the exported program's update of {name!r} is not a "
                                    "tensor")
                outs.append(bb.emit_output(value, safe_name(f"{name}_update")))
                mutations.append({"param": name, "output": len(outs) - 1})
        attrs = {**attrs, "kiln.output_tree": output_tree(leaves)}
        if mutations:
            attrs[MUTATIONS_ATTR] = mutations
        bb.emit_func_output(outs, params=params)
    mod = bb.get()
    func = mod["main"]
    for k, v in attrs.items():
        func = func.with_attr(k, v)
    mod["main"] = func
    return mod


def from_graph_module(gm: Any, constants: dict[int, Any]) -> IRModule:
    """Import an ATen-level ``torch.fx.GraphModule`` (what ``torch.compile`` hands a backend
    after AOT tracing): placeholder ``i`` is the constant ``constants[i]`` (a frozen parameter
    or buffer) or a run-time input; SymInt placeholders are sizes of the tensor inputs, read
    from their shapes (not inputs of ``main``; unused ones are ignored). ``main``
    returns the graph's outputs as a
    flat tuple (``None`` entries kept in its output tree)."""
    torch = require_torch()
    graph = gm.graph
    check_supported(graph)
    ctx = ProgramContext(g.BlockBuilder())
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    inputs: list[g.Var] = []
    for i, node in enumerate(placeholders):
        val = node.meta.get("val")
        if i in constants:
            ctx.values[node] = g.const(to_numpy(constants[i]))
            # a frozen tensor Dynamo traced with symbolic sizes (dynamic=True marks every
            # input): its sizes are its own
            for d, size in zip(getattr(val, "shape", ()), constants[i].shape):
                if isinstance(d, torch.SymInt) and d.node.expr.is_Symbol:
                    ctx.symbols.setdefault(str(d.node.expr), tir.IntImm("int64", int(size)))
        elif is_tensor_val(val):
            inputs.append(_user_input(ctx, node, val))
    for i, node in enumerate(placeholders):
        val = node.meta.get("val")
        if i not in constants and not is_tensor_val(val) and node.users:
            if not isinstance(val, torch.SymInt):
                raise KilnError(f"graph input {node.name!r} ({type(val).__name__}) is neither "
                                "a tensor nor a size")
            ctx.values[node] = ctx.size(val)
    out = next(n for n in graph.nodes if n.op == "output").args[0]
    out = list(out) if isinstance(out, (tuple, list)) else [out]
    results = [(getattr(o, "name", f"out{k}"), o) for k, o in enumerate(out)]
    return _build_main(ctx, graph, results, inputs, {},
                       lambda leaves: {"kind": "tuple", "items": leaves})


def from_pt2(path: str, bind_params: bool = False) -> tuple[IRModule, dict[str, np.ndarray]]:
    """``from_exported_program`` of a program saved with ``torch.export.save`` (a ``.pt2``
    file); ModelFormatError when the file cannot be read as one."""
    torch = require_torch()
    try:
        ep = torch.export.load(path)
    except Exception as err:  # noqa: BLE001 - zip, pickle and version errors alike
        raise ModelFormatError(f"cannot load exported program {path!r}: {err}") from err
    return from_exported_program(ep, bind_params=bind_params)


def _plain(value: Any) -> Any:
    """A JSON-able Python value of an output constant."""
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    raise KilnError(f"the program returns a non-tensor value {value!r} kiln cannot keep")


def _input_sinfo(ctx: ProgramContext, name: str, val: Any) -> g.TensorStructInfo:
    """The StructInfo of a user input from its example value; each new size symbol becomes a
    tir.Var named after this input and axis."""
    torch = require_torch()
    dims: list[Any] = []
    for axis, d in enumerate(val.shape):
        if isinstance(d, torch.SymInt) and d.node.expr.is_Symbol:
            key = str(d.node.expr)
            if key not in ctx.symbols:
                ctx.symbols[key] = tir.Var(safe_name(f"{name}_dim{axis}"), "int64")
            dims.append(ctx.symbols[key])
        else:
            dims.append(d)
    # derived dims (2 * batch) once all plain symbols are known
    dims = [ctx.size(d) if isinstance(d, torch.SymInt) else (d if isinstance(d, tir.Var)
                                                              else int(d)) for d in dims]
    return g.TensorStructInfo(tuple(dims), kiln_dtype(val.dtype))


def _dim_ranges(ctx: ProgramContext, constraints: Any) -> dict[str, list[int | None]]:
    from torch.utils._sympy.numbers import int_oo

    out: dict[str, list[int | None]] = {}
    for sym, vr in constraints.items():
        var = ctx.symbols.get(str(sym))
        if not isinstance(var, tir.Var):
            continue
        lo = int(vr.lower) if vr.lower.is_finite and vr.lower != -int_oo else 0
        hi = None if (vr.upper == int_oo or not vr.upper.is_finite) else int(vr.upper)
        out[var.name] = [lo, hi]
    return out


def _convert_node(ctx: ProgramContext, node: Any) -> None:
    if node.target is operator.getitem:
        seq = ctx.values.get(node.args[0])
        if isinstance(seq, (list, tuple)):
            ctx.values[node] = seq[node.args[1]]
            return
        if isinstance(seq, g.Expr):
            ctx.values[node] = ctx.emit(g.TupleGetItem(seq, node.args[1]), node.name)
            return
        raise KilnError(f"getitem node {node.name!r}: cannot index {type(seq).__name__}")
    name = overload_name(node.target)
    if name in NO_OP_TARGETS:
        return
    if node.target in SYM_TARGETS or _is_sym_node(node):
        val = node.meta.get("val")
        try:
            ctx.values[node] = ctx.size(val) if val is not None else None
            return
        except KilnError as err:
            if lookup_converter(name) is None:
                raise KilnError(f"{name} node {node.name!r}: {err}") from err
    fn = lookup_converter(name)
    view = NodeView(ctx, node)
    with ctx.bb.span(Span.of(node.name, name)):
        try:
            result = fn(ctx, view)
        except KilnError as err:
            if str(view) in str(err):
                raise
            raise KilnError(f"{view}: {err}") from err
        ctx.values[node] = _bind_result(ctx, node.name, result)


def _bind_result(ctx: ProgramContext, name: str, result: Any) -> Any:
    if isinstance(result, (list, tuple)):
        return [_bind_result(ctx, f"{name}_{i}", r) for i, r in enumerate(result)]
    if isinstance(result, g.Expr):
        return ctx.emit(result, name)
    return result
