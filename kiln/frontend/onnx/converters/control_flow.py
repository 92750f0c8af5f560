"""Subgraph ONNX operators: If, Loop, Scan.

Control flow is resolved at import time where the import knows enough, and run by the
executor otherwise (``kiln.runtime.control_flow``):

* ``If`` with a condition known at import imports only the chosen branch. With a run-time
  condition, each branch becomes a graph function (``subgraph.import_function``) and the
  executor runs only the branch taken; outputs whose dims differ between the branches get
  fresh dims bound when it runs. Outputs differing in rank or dtype cannot be one function
  (a value's rank and dtype are static in kiln): a KilnError names the node, or, where the
  import may specialize, a ``BranchGuard`` stops it there (``kiln.frontend.onnx.specialize``
  compiles the rest per condition value). A pinned condition (a specialization's import)
  imports only its branch.
* ``Loop`` and ``Scan`` with a trip count known at import whose unrolled graph would have at
  most ``UNROLL_LIMIT`` body nodes (iterations x body nodes; and a condition that stays
  known) are unrolled: the body is imported once per
  iteration (``importer.convert_subgraph``), so constant state keeps folding and the
  iterations fuse with their neighbours. Any other loop (a run-time trip count or condition,
  a symbolic scan length, a long loop) runs its body function as often as needed at run time,
  re-binding the loop-carried values each iteration; a carried value whose shape the body
  changes gets a body parameter of symbolic shape (found by importing the body until its
  parameter shapes are stable).

Subgraphs see outer-scope values. Body outputs known at import time stay numpy arrays, so
constant state (counters, shapes) keeps folding across unrolled iterations.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .... import graph as g
from .... import op, tir
from ....ir import KilnError
from ....op.common import dims_equal
from ....runtime import control_flow as rt_cf
from ..importer import branch_guard, convert_subgraph
from ..registry import converter
from ..subgraph import (
    HOST_VALUE_SINFO,
    SubgraphFunction,
    as_carried,
    import_function,
    outer_names,
    outer_vars,
    result_dims,
    widen_host_value,
    widen_sinfo,
)
from .common import norm_axis, static_int
from .dynamic import safe_name

# Unrolling more iterations than this is refused (the graph would grow without bound).
MAX_UNROLL = 4096
#: Loops and scans whose trip count is known at import are unrolled while iterations x body
#: nodes stays within this; larger ones run their body function at run time. Unrolled loops
#: run faster (one planned, fused graph: ``benchmarks/control_flow.py`` measured 30x-600x for
#: a 4-node body on a loaded 2-core machine) but build time and graph size grow with them.
UNROLL_LIMIT = 256


def unrolls(trip: int, body: Any) -> bool:
    """Whether a loop of ``trip`` iterations over ONNX graph ``body`` is unrolled."""
    return trip * max(len(body.node), 1) <= UNROLL_LIMIT


class NotUnrolled(Exception):
    """Raised inside the unroller when the loop turns out to need run-time control flow."""


def _value(node: Any, i: int) -> Any:
    """Input ``i`` as a numpy array when known at import time, else as an Expr."""
    const = node.const_value(i)
    return node.input(i) if const is None else const


def _expr(v: Any) -> Any:
    return g.const(np.asarray(v)) if isinstance(v, (np.ndarray, np.generic)) else v


def _shape(ctx: Any, v: Any) -> tuple[Any, ...]:
    if isinstance(v, (np.ndarray, np.generic)):
        return tuple(np.shape(v))
    return ctx.shape(v)


def _step(v: Any, axis: int, t: int) -> Any:
    """Element ``t`` along ``axis`` (the axis removed)."""
    if isinstance(v, (np.ndarray, np.generic)):
        return np.take(np.asarray(v), t, axis=axis)
    return op.squeeze(op.strided_slice(v, (t,), (t + 1,), None, (axis,)), axis=(axis,))


def _stack(ctx: Any, values: list[Any], axis: int) -> Any:
    """``values`` stacked along a new ``axis`` (numpy when all are known)."""
    if all(isinstance(v, (np.ndarray, np.generic)) for v in values):
        return np.stack([np.asarray(v) for v in values], axis=axis)
    return op.concat([op.expand_dims(_expr(v), (axis,)) for v in values], axis=axis)


def _emit(ctx: Any, v: Any) -> Any:
    """Bind non-leaf Exprs so the next iteration reuses them instead of copying trees."""
    if isinstance(v, (np.ndarray, np.generic, g.Var, g.Constant)):
        return v
    return ctx.emit(v)


def _scan_loop(ctx: Any, node: Any, states: list[Any], xs: list[Any], in_axes: list[int],
               in_dirs: list[int]) -> tuple[list[Any], list[list[Any]]]:
    """Run the Scan body over ``xs`` (scan axis ``in_axes``); (final states, per-output
    per-step values in iteration order)."""
    body = node.attr("body")
    for x, a in zip(xs, in_axes):
        if a >= len(_shape(ctx, x)):
            raise node.error(f"a scan input of shape {tuple(_shape(ctx, x))} has no scan axis "
                             f"{a}")
    lengths = {static_int(_shape(ctx, x)[a]) for x, a in zip(xs, in_axes)}
    if None in lengths:
        raise node.error("the scan axis length is symbolic; Scan is unrolled and needs a "
                         "static length")
    if len(lengths) != 1:
        raise node.error(f"scan inputs differ in length along their scan axes: {lengths}")
    (length,) = lengths
    if length > MAX_UNROLL:
        raise node.error(f"{length} scan steps exceed the unrolling limit {MAX_UNROLL}")
    names = [vi.name for vi in body.input]
    n = len(states)
    steps: list[list[Any]] = [[] for _ in range(len(body.output) - n)]
    for t in range(length):
        sl = [_emit(ctx, _step(x, a, length - 1 - t if d else t))
              for x, a, d in zip(xs, in_axes, in_dirs)]
        res = convert_subgraph(ctx, body, dict(zip(names, [*states, *sl])))
        states = res[:n]
        for j, v in enumerate(res[n:]):
            steps[j].append(v)
    if length == 0 and steps:
        raise node.error("a zero-length scan with scan outputs is not supported")
    return states, steps


def _scan_outputs(ctx: Any, node: Any, steps: list[list[Any]]) -> list[Any]:
    k = len(steps)
    out_axes = list(node.attr("scan_output_axes", None) or [0] * k)
    out_dirs = list(node.attr("scan_output_directions", None) or [0] * k)
    outs = []
    for vals, axis, d in zip(steps, out_axes, out_dirs):
        rank = len(_shape(ctx, vals[0])) + 1
        outs.append(_stack(ctx, vals[::-1] if d else vals, norm_axis(int(axis), rank)))
    return outs


def _num_scan_inputs(node: Any, inputs: int) -> int:
    """Scan's ``num_scan_inputs``: at least one of its ``inputs`` (states and scanned
    tensors; opset 8's sequence_lens not counted)."""
    m = int(node.attr("num_scan_inputs"))
    if not 1 <= m <= inputs:
        raise node.error(f"attribute 'num_scan_inputs' = {m}: the node has {inputs} state and "
                         f"scan input(s), so it must be in [1, {inputs}]")
    body = len(node.attr("body").input)
    if body != inputs:
        raise node.error(f"the body takes {body} input(s); the node gives it {inputs} (states "
                         "and scan inputs)")
    return m


@converter("Scan", since=9)
def scan(ctx: Any, node: Any) -> Any:
    m = _num_scan_inputs(node, node.num_inputs)
    n = node.num_inputs - m
    states = [_value(node, i) for i in range(n)]
    xs = [_value(node, i) for i in range(n, n + m)]
    axes = [norm_axis(int(a), len(_shape(ctx, x)))
            for a, x in zip(node.attr("scan_input_axes", None) or [0] * m, xs)]
    dirs = [int(d) for d in node.attr("scan_input_directions", None) or [0] * m]
    lengths = {static_int(_shape(ctx, x)[a]) for x, a in zip(xs, axes)}
    if None not in lengths and len(lengths) == 1 and unrolls(max(lengths), node.attr("body")):
        states, steps = _scan_loop(ctx, node, states, xs, axes, dirs)
        return [*states, *_scan_outputs(ctx, node, steps)]
    return _runtime_scan(ctx, node, [_expr(v) for v in states], [_expr(x) for x in xs],
                         axes, dirs)


@converter("Scan", since=8)
def scan_v8(ctx: Any, node: Any) -> Any:
    """Opset 8: every input has a leading batch axis; the body runs per batch entry."""
    m = _num_scan_inputs(node, node.num_inputs - 1)
    n = node.num_inputs - 1 - m
    if node.has_input(0):
        lens = node.const_input(0, "sequence_lens")
        x_len = static_int(_shape(ctx, _value(node, 1 + n))[1])
        if x_len is None or np.any(np.asarray(lens) != x_len):
            raise node.error("sequence_lens shorter than the scan inputs are not supported")
    states = [_value(node, 1 + i) for i in range(n)]
    xs = [_value(node, 1 + n + i) for i in range(m)]
    batch = static_int(_shape(ctx, (states + xs)[0])[0])
    if batch is None:
        raise node.error("the batch size is symbolic; Scan (opset 8) is unrolled per batch "
                         "entry and needs a static batch size")
    dirs = [int(d) for d in node.attr("directions", None) or [0] * m]
    finals: list[list[Any]] = []
    scans: list[list[Any]] = []
    for b in range(batch):
        st = [_emit(ctx, _step(s, 0, b)) for s in states]
        xb = [_emit(ctx, _step(x, 0, b)) for x in xs]
        st, steps = _scan_loop(ctx, node, st, xb, [0] * m, dirs)
        finals.append(st)
        scans.append([_stack(ctx, vals, 0) for vals in steps])
    out_states = [_stack(ctx, [f[i] for f in finals], 0) for i in range(n)]
    out_scans = [_stack(ctx, [s[j] for s in scans], 0) for j in range(len(scans[0]))]
    return [*out_states, *out_scans]


def _scalar(ctx: Any, e: Any, dtype: str) -> Any:
    """A one-element tensor as a 0-d one of ``dtype`` (a condition, a trip count)."""
    e = ctx.emit(op.reshape(e, ()))
    return e if ctx.dtype(e) == dtype else ctx.emit(op.cast(e, dtype))


def _control_call(ctx: Any, kind: str, funcs: list[g.GlobalVar], args: list[Any],
                  outputs: list[Any], attrs: Any = None) -> list[Any]:
    """Emit the ``kiln.control.<kind>`` call and match_cast its tensor results to
    ``outputs`` ((dims, dtype, rank) each; dims None: all fresh); a sequence or optional
    result is given by its StructInfo and taken as it is."""
    fields = tuple(o if isinstance(o, HOST_VALUE_SINFO) else
                   g.TensorStructInfo(None, o[1], ndim=o[2]) for o in outputs)
    call = g.Call(g.ExternFunc(rt_cf.PREFIX + kind), [*funcs, *args], attrs=attrs,
                  sinfo_args=[g.TupleStructInfo(fields)])
    tup = ctx.emit(call)
    return [ctx.emit(g.TupleGetItem(tup, k)) if isinstance(o, HOST_VALUE_SINFO) else
            ctx.bb.match_cast(g.TupleGetItem(tup, k), g.TensorStructInfo(o[0], o[1]))
            for k, o in enumerate(outputs)]


def _host_dtype(sinfo: Any) -> str | None:
    """The dtype of the tensors a sequence or optional holds (None: unknown)."""
    while isinstance(sinfo, HOST_VALUE_SINFO):
        sinfo = sinfo.elem
    return str(sinfo.dtype) if isinstance(sinfo, g.TensorStructInfo) else None


def _check_types(node: Any, what: str, got: Any, want: Any) -> None:
    if isinstance(want, HOST_VALUE_SINFO) or isinstance(got, HOST_VALUE_SINFO):
        got = as_carried(want, got)
        if type(got) is not type(want) or _host_dtype(got) != _host_dtype(want):
            raise node.error(f"{what} is {got} after an iteration but {want} before; a "
                             "loop-carried sequence or optional keeps its kind and dtype")
        return
    if str(got.dtype) != str(want.dtype) or got.ndim != want.ndim:
        raise node.error(f"{what} is {got} after an iteration but {want} before; a loop-carried "
                         "value may change its dims, not its rank or dtype")


def _stable_body(ctx: Any, node: Any, body: Any, lead: list[Any], carried: list[Any],
                 rest: list[Any], out_offset: int) -> tuple[SubgraphFunction, list[Any]]:
    """Import loop ``body`` as a function whose carried parameters (initially ``carried``'s
    StructInfo, after the ``lead`` formals and before ``rest``) keep their shape where the body
    keeps it and become symbolic where it changes it (imported until stable; the probes'
    nested functions go to a throwaway module). Returns the function and the carried
    parameters' StructInfo."""
    base = safe_name(node.name)
    names = [vi.name for vi in body.input]
    captures = outer_names(body)
    sinfos = list(carried)
    fresh: set[int] = set()
    # each round widens at least one value; a tensor's dims turn fresh once, a sequence's
    # element goes from unknown (empty) to a shape, to a rank, to nothing known: 3 steps
    for _ in range(3 * len(carried) + 1):
        probe = import_function(ctx, node, body, f"{base}_body",
                                list(zip(names, [*lead, *sinfos, *rest])),
                                sink=g.BlockBuilder(), captures=captures)
        changed = False
        for j, want in enumerate(sinfos):
            got = probe.outputs[out_offset + j]
            _check_types(node, f"loop-carried value {j} ({names[len(lead) + j]!r})", got, want)
            wider = (widen_host_value(want, got) if isinstance(want, HOST_VALUE_SINFO) else
                     widen_sinfo(want, got, f"{base}_v{j}", fresh))
            if wider is not None:
                sinfos[j], changed = wider, True
        if not changed:
            break
    func = import_function(ctx, node, body, f"{base}_body",
                           list(zip(names, [*lead, *sinfos, *rest])), captures=captures)
    return func, sinfos


def _declared_dims(vi: Any, ndim: int) -> list[int]:
    """The static dims an ONNX value_info declares (-1 where a dim is symbolic or absent;
    all -1 when its rank is not ``ndim``)."""
    tt = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
    dims = list(tt.shape.dim) if tt is not None and tt.HasField("shape") else []
    if len(dims) != ndim:
        return [-1] * ndim
    return [int(d.dim_value) if d.HasField("dim_value") else -1 for d in dims]


def _scan_attrs(func: SubgraphFunction, first: int, body: Any, **kw: Any) -> rt_cf.LoopAttrs:
    """The executor's attributes of a loop or scan whose body's outputs from ``first`` on are
    stacked: the element shape of each (what a run of zero iterations gives, ``(0, *shape)``)
    is what kiln inferred, else what the body declares for that output (onnxruntime's
    choice: a Loop that never runs gives ``(0, 1)`` for a declared ``[1]`` element, fuzz seed
    3028890), else 0."""
    outs = func.outputs[first:]
    shapes = []
    for o, vi in zip(outs, body.output[first:]):
        dims = list(o.shape or ())
        declared = _declared_dims(vi, len(dims))
        shapes.append(tuple(int(d.value) if isinstance(d, tir.IntImm) else declared[i]
                            for i, d in enumerate(dims)))
    return rt_cf.LoopAttrs(scan_output_shapes=tuple(shapes),
                           scan_output_dtypes=tuple(str(o.dtype) for o in outs), **kw)


def _runtime_scan(ctx: Any, node: Any, states: list[Any], xs: list[Any], axes: list[int],
                  dirs: list[int]) -> list[Any]:
    """Scan run by the executor: the body function runs once per slice."""
    body = node.attr("body")
    n, m = len(states), len(xs)
    slices = []
    for x, a in zip(xs, axes):
        sh = list(_shape(ctx, x))
        del sh[a]
        slices.append(g.TensorStructInfo(tuple(sh), ctx.dtype(x)))
    func, sinfos = _stable_body(ctx, node, body, [], [s.struct_info for s in states], slices, 0)
    k = len(func.outputs) - n
    out_axes = [int(a) for a in node.attr("scan_output_axes", None) or [0] * k]
    out_dirs = [int(d) for d in node.attr("scan_output_directions", None) or [0] * k]
    captured = [e for _, e in func.captures]
    known = outer_vars([*states, *xs, *captured])
    base = safe_name(node.name)
    length = _shape(ctx, xs[0])[axes[0]] if xs else 0
    outputs = [(result_dims([s.shape], known, f"{base}_s{j}"), str(s.dtype), s.ndim)
               for j, s in enumerate(sinfos)]
    for j, o in enumerate(func.outputs[n:]):
        elem = list(result_dims([o.shape], known, f"{base}_o{j}") if o.shape is not None
                    else [None] * o.ndim)
        axis = norm_axis(out_axes[j], o.ndim + 1)
        elem.insert(axis, length)
        dims = None if any(d is None for d in elem) else tuple(elem)
        outputs.append((dims, str(o.dtype), o.ndim + 1))
    attrs = _scan_attrs(func, n, body, num_carried=n, num_scan_inputs=m,
                        scan_input_axes=tuple(axes), scan_input_directions=tuple(dirs),
                        scan_output_axes=tuple(out_axes), scan_output_directions=tuple(out_dirs))
    return _control_call(ctx, "scan", [func.gvar], [*states, *xs, *captured], outputs, attrs)


@converter("If", since=1)
def if_(ctx: Any, node: Any) -> Any:
    then_b, else_b = node.attr("then_branch"), node.attr("else_branch")
    cond = node.const_value(0)
    pinned = ctx.pinned_condition()
    if pinned is not None:  # a specialization of the model for this condition
        return convert_subgraph(ctx, then_b if pinned else else_b, {}, inline=True)
    if cond is not None:
        flat = np.asarray(cond).reshape(-1)
        if flat.size != 1:
            raise node.error(f"the condition must have one element, got shape {cond.shape}")
        return convert_subgraph(ctx, then_b if bool(flat[0]) else else_b, {}, inline=True)
    c = node.input(0)
    shape = ctx.static_shape(c)
    if shape is None or int(np.prod(shape)) != 1:
        raise node.error(f"the condition must have one element, got shape {ctx.shape(c)}")
    c = _scalar(ctx, c, "bool")
    if _carries_host_values(then_b) or _carries_host_values(else_b):
        return _selected_if(ctx, node, c, then_b, else_b)
    # both branch functions take the captures of either, in one order
    names = list(dict.fromkeys([*outer_names(then_b), *outer_names(else_b)]))
    base = safe_name(node.name)
    then_f = import_function(ctx, node, then_b, f"{base}_then", [], captures=names)
    else_f = import_function(ctx, node, else_b, f"{base}_else", [], captures=names)
    captured = [e for _, e in then_f.captures]
    known = outer_vars(captured)
    outputs = []
    for k, (a, b) in enumerate(zip(then_f.outputs, else_f.outputs)):
        if str(a.dtype) != str(b.dtype) or a.ndim != b.ndim:
            message = (f"{node}: the condition is only known at run time and output {k} "
                       f"differs in rank or dtype between the branches ({a} vs {b}); a value's "
                       "rank and dtype are static in kiln, so what follows cannot be compiled "
                       "for both")
            if ctx.resumable():  # compile_onnx specializes the rest of the model on c
                raise branch_guard(ctx, str(node), message, c)
            raise KilnError(message + (" (kiln.frontend.onnx.compile_onnx specializes the "
                                       "model on the condition where the If is not inside a "
                                       "loop body or a run-time branch)"))
        dims = (None if a.shape is None or b.shape is None
                else result_dims([a.shape, b.shape], known, f"{base}_out{k}"))
        outputs.append((dims, str(a.dtype), a.ndim))
    return _control_call(ctx, "if", [then_f.gvar, else_f.gvar], [c, *captured], outputs)


def _same_type(sa: Any, sb: Any) -> bool:
    """Whether two tensor StructInfos have one dtype and provably equal shapes."""
    return (str(sa.dtype) == str(sb.dtype) and sa.shape is not None and sb.shape is not None
            and len(sa.shape) == len(sb.shape)
            and all(dims_equal(x, y) for x, y in zip(sa.shape, sb.shape)))


def _carries_host_values(graph: Any) -> bool:
    """Whether an ONNX subgraph returns a sequence or an optional (declared output types)."""
    return any(o.type.HasField("sequence_type") or o.type.HasField("optional_type")
               for o in graph.output)


def _selected_if(ctx: Any, node: Any, c: Any, then_b: Any, else_b: Any) -> list[Any]:
    """An If on a run-time condition whose branches return sequences or optionals (which
    subgraph functions do not carry yet): both branches are imported inline and each output
    is selected by the condition (``select_value``; ``where`` for tensors of one type). Both
    branches run: correct, and these branches are small host-side list operations."""
    outs = []
    then_out = convert_subgraph(ctx, then_b, {})
    else_out = convert_subgraph(ctx, else_b, {})
    for k, (a, b) in enumerate(zip(then_out, else_out)):
        ea, eb = _expr(a), _expr(b)
        if not isinstance(ea.struct_info, g.TensorStructInfo):
            outs.append(op.select_value(c, ea, eb))
        elif _same_type(ea.struct_info, eb.struct_info):
            outs.append(op.where(c, ea, eb))
        else:
            raise node.error(f"output {k}: a tensor whose type differs between the branches, "
                             "beside sequence or optional outputs, is not supported")
    return outs


@converter("Loop", since=1)
def loop(ctx: Any, node: Any) -> Any:
    """Unrolled when the trip count is known at import and small (``unrolls``; and the
    condition stays known while unrolling), else run by the executor."""
    trip_known = not node.has_input(0) or node.is_const(0)
    cond_known = not node.has_input(1) or node.is_const(1)
    if not node.has_input(0) and not node.has_input(1):
        raise node.error("a Loop without trip count and condition never ends")
    if trip_known and cond_known:
        trip = node.const_value(0)
        if trip is None or unrolls(int(np.asarray(trip).reshape(-1)[0]), node.attr("body")):
            try:
                return _unrolled_loop(ctx, node)
            except NotUnrolled:
                pass  # what the unroller emitted is dead code, removed by the graph passes
    return _runtime_loop(ctx, node)


def _runtime_loop(ctx: Any, node: Any) -> list[Any]:
    body = node.attr("body")
    carried = [_expr(_value(node, i)) for i in range(2, node.num_inputs)]
    n = len(carried)
    lead = [g.TensorStructInfo((), "int64"), g.TensorStructInfo((), "bool")]
    func, sinfos = _stable_body(ctx, node, body, lead, [c.struct_info for c in carried], [],
                                1)
    k = len(func.outputs) - 1 - n
    head = []
    if node.has_input(0):
        head.append(_scalar(ctx, node.input(0), "int64"))
    if node.has_input(1):
        head.append(_scalar(ctx, node.input(1), "bool"))
    captured = [e for _, e in func.captures]
    known = outer_vars([*carried, *captured])
    base = safe_name(node.name)
    outputs: list[Any] = [
        s if isinstance(s, HOST_VALUE_SINFO) else
        (result_dims([s.shape], known, f"{base}_out{j}"), str(s.dtype), s.ndim)
        for j, s in enumerate(sinfos)]
    for j, o in enumerate(func.outputs[1 + n:]):
        if not isinstance(o, g.TensorStructInfo):
            raise node.error(f"scan output {j} of the body is {o}; a Loop stacks tensors only")
        dims = (None if o.shape is None else
                (tir.Var(f"{base}_n{j}", "int64"), *result_dims([o.shape], known, f"{base}_o{j}")))
        outputs.append((dims, str(o.dtype), o.ndim + 1))
    attrs = _scan_attrs(func, 1 + n, body, num_carried=n, has_trip=node.has_input(0),
                        has_cond=node.has_input(1), scan_output_axes=(0,) * k,
                        scan_output_directions=(0,) * k)
    return _control_call(ctx, "loop", [func.gvar], [*head, *carried, *captured], outputs, attrs)


def _unrolled_loop(ctx: Any, node: Any) -> Any:
    """The body imported once per iteration; NotUnrolled when the condition turns out to be
    computed at run time or the loop runs longer than ``unrolls`` allows."""
    body = node.attr("body")
    trip = node.const_input(0, "trip count M")
    cond = node.const_input(1, "cond")
    max_trip = None if trip is None else int(np.asarray(trip).reshape(()))
    alive = True if cond is None else bool(np.asarray(cond).reshape(-1)[0])
    carried = [_value(node, i) for i in range(2, node.num_inputs)]
    n = len(carried)
    names = [vi.name for vi in body.input]
    steps: list[list[Any]] = [[] for _ in range(len(body.output) - 1 - n)]
    it = 0
    while alive and (max_trip is None or it < max_trip):
        if not unrolls(it + 1, body):
            raise NotUnrolled
        res = convert_subgraph(ctx, body, dict(zip(names, [np.array(it, np.int64),
                                                           np.array(True), *carried])))
        cond_out, carried = res[0], res[1:1 + n]
        for j, v in enumerate(res[1 + n:]):
            steps[j].append(v)
        it += 1
        if isinstance(cond_out, (np.ndarray, np.generic)):
            alive = bool(np.asarray(cond_out).reshape(-1)[0])
        elif max_trip is None or it < max_trip:
            raise NotUnrolled  # the last iteration's condition does not matter
    if steps and it == 0:
        raise NotUnrolled  # zero iterations: the scan outputs' element shape is the body's
    return [*carried, *[_stack(ctx, vals, 0) for vals in steps]]
