"""Subgraph ONNX operators: If, Loop, Scan.

kiln's graph IR runs straight-line dataflow, so control flow is resolved at import time:

* ``Scan`` and ``Loop`` are unrolled: the body subgraph is imported once per iteration
  (``importer.convert_subgraph``) with that iteration's values. The trip count must be known at
  import time (Scan: the scan axis length; Loop: a constant ``M``, and a condition that folds
  to a constant after every iteration), else a clear error.
* ``If`` imports only the chosen branch when the condition is known at import time. When it is
  only known at run time, *both branches run* and ``where`` selects the result -- correct, but
  the cost of both is paid. Outputs whose dims differ between the branches get dims bound at
  run time (``dynamic.select_shaped``); outputs whose rank or dtype differ are refused, since
  a value's rank and dtype are static in kiln.

Subgraphs see outer-scope values. Body outputs known at import time stay numpy arrays, so
constant state (counters, shapes) keeps folding across iterations.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .... import graph as g
from .... import op
from ....op.common import dims_equal
from ..importer import convert_subgraph
from ..registry import converter
from .common import norm_axis, static_int
from .dynamic import select_shaped

# Unrolling more iterations than this is refused (the graph would grow without bound).
MAX_UNROLL = 4096


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


@converter("Scan", since=9)
def scan(ctx: Any, node: Any) -> Any:
    m = int(node.attr("num_scan_inputs"))
    n = node.num_inputs - m
    states = [_value(node, i) for i in range(n)]
    xs = [_value(node, i) for i in range(n, n + m)]
    axes = [norm_axis(int(a), len(_shape(ctx, x)))
            for a, x in zip(node.attr("scan_input_axes", None) or [0] * m, xs)]
    dirs = [int(d) for d in node.attr("scan_input_directions", None) or [0] * m]
    states, steps = _scan_loop(ctx, node, states, xs, axes, dirs)
    return [*states, *_scan_outputs(ctx, node, steps)]


@converter("Scan", since=8)
def scan_v8(ctx: Any, node: Any) -> Any:
    """Opset 8: every input has a leading batch axis; the body runs per batch entry."""
    m = int(node.attr("num_scan_inputs"))
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


def _same_type(ctx: Any, a: Any, b: Any) -> bool:
    ea, eb = _expr(a), _expr(b)
    sa, sb = ea.struct_info, eb.struct_info
    if str(sa.dtype) != str(sb.dtype) or sa.shape is None or sb.shape is None:
        return False
    if len(sa.shape) != len(sb.shape):
        return False

    return all(dims_equal(x, y) for x, y in zip(sa.shape, sb.shape))


@converter("If", since=1)
def if_(ctx: Any, node: Any) -> Any:
    then_b, else_b = node.attr("then_branch"), node.attr("else_branch")
    cond = node.const_value(0)
    if cond is not None:
        flat = np.asarray(cond).reshape(-1)
        if flat.size != 1:
            raise node.error(f"the condition must have one element, got shape {cond.shape}")
        return convert_subgraph(ctx, then_b if bool(flat[0]) else else_b, {})
    c = node.input(0)
    shape = ctx.static_shape(c)
    if shape is None or int(np.prod(shape)) != 1:
        raise node.error(f"the condition must have one element, got shape {ctx.shape(c)}")
    c = op.reshape(c, ())
    if ctx.dtype(node.input(0)) != "bool":
        c = op.cast(c, "bool")
    c = ctx.emit(c)
    then_out = convert_subgraph(ctx, then_b, {})
    else_out = convert_subgraph(ctx, else_b, {})
    outs = []
    for i, (a, b) in enumerate(zip(then_out, else_out)):
        if not isinstance(_expr(a).struct_info, g.TensorStructInfo):  # sequence / optional
            outs.append(op.select_value(c, _expr(a), _expr(b)))
            continue
        if _same_type(ctx, a, b):
            outs.append(op.where(c, _expr(a), _expr(b)))
            continue
        sa, sb = _expr(a).struct_info, _expr(b).struct_info
        if (str(sa.dtype) != str(sb.dtype) or sa.shape is None or sb.shape is None
                or len(sa.shape) != len(sb.shape)):
            raise node.error(
                f"the condition is only known at run time and output {i} differs in rank or "
                f"dtype between the branches ({sa} vs {sb}); a value's rank and dtype are "
                "static in kiln, so the branches cannot be merged")
        # same rank, different dims: the output dims are bound at run time
        outs.append(select_shaped(ctx, node, _expr(b), [(c, _expr(a))]))
    return outs


@converter("Loop", since=1)
def loop(ctx: Any, node: Any) -> Any:
    """Unrolled. A condition computed at run time is supported with a constant trip count and
    no scan outputs: every iteration then runs and ``where`` keeps the carried values of the
    iterations after the loop would have stopped (their results are discarded)."""
    body = node.attr("body")
    trip = node.const_input(0, "trip count M")
    cond = node.const_input(1, "cond")
    if trip is None and cond is None:
        raise node.error("a Loop without trip count and condition never ends")
    max_trip = None if trip is None else int(np.asarray(trip).reshape(()))
    alive: Any = True if cond is None else bool(np.asarray(cond).reshape(-1)[0])
    carried = [_value(node, i) for i in range(2, node.num_inputs)]
    n = len(carried)
    names = [vi.name for vi in body.input]
    steps: list[list[Any]] = [[] for _ in range(len(body.output) - 1 - n)]
    it = 0
    while alive is not False and (max_trip is None or it < max_trip):
        if it >= MAX_UNROLL:
            raise node.error(f"more than {MAX_UNROLL} iterations; Loop is unrolled")
        cond_in = np.array(True) if alive is True else alive
        res = convert_subgraph(ctx, body, dict(zip(names, [np.array(it, np.int64), cond_in,
                                                           *carried])))
        cond_out, new = res[0], res[1:1 + n]
        for j, v in enumerate(res[1 + n:]):
            steps[j].append(v)
        it += 1
        if alive is not True:  # run-time condition: keep the old values once it turned false
            carried = [_select(ctx, node, alive, a, b) for a, b in zip(new, carried)]
        else:
            carried = new
        if isinstance(cond_out, (np.ndarray, np.generic)):
            still = bool(np.asarray(cond_out).reshape(-1)[0])
            alive = still if alive is True else (alive if still else False)
            continue
        if max_trip is not None and it >= max_trip:
            break  # the last iteration's condition does not matter
        if max_trip is None or steps:
            raise node.error("the loop condition is computed at run time (data-dependent "
                             "termination); kiln unrolls Loop and needs it known at import "
                             "(or a constant trip count and no scan outputs)")
        flag = ctx.emit(op.reshape(op.cast(cond_out, "bool"), ()))
        alive = flag if alive is True else ctx.emit(op.logical_and(alive, flag))
    if steps and it == 0:
        raise node.error("a Loop that runs zero iterations with scan outputs is not supported")
    return [*carried, *[_stack(ctx, vals, 0) for vals in steps]]


def _select(ctx: Any, node: Any, flag: Any, a: Any, b: Any) -> Any:
    if not _same_type(ctx, a, b):
        raise node.error("a loop-carried value changes shape or dtype under a run-time "
                         "condition")
    return ctx.emit(op.where(flag, _expr(a), _expr(b)))
