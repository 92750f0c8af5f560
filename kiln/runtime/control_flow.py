"""Control-flow steps: ``If``, ``Loop`` and ``Scan`` decided while the model runs.

A branch or loop body is a graph function of its own in the module (compiled to its own plan
like ``main``); the calling function holds one extern call::

    r = call(ExternFunc("kiln.control.if"), then_fn, else_fn, cond, *captures,
             sinfo_args=Tuple(Tensor(ndim=.., dtype), ...))
    r = call(ExternFunc("kiln.control.loop"), body_fn, trip, cond, *carried, *captures,
             attrs=LoopAttrs(...), sinfo_args=...)
    r = call(ExternFunc("kiln.control.scan"), body_fn, *states, *scan_inputs, *captures,
             attrs=LoopAttrs(...), sinfo_args=...)

(``then_fn``/``body_fn`` are GlobalVars, so dead-code elimination keeps the functions the
calls use). The plan turns such a call into a ``"control"`` step (``kiln.runtime.plan``); its
output slots have fresh dim names that the step binds from the arrays it gets, and the graph
``match_cast``\\ s the results to the shapes it knows (a shape that differs per branch or per
iteration is a fresh symbolic dim), as after a host function (``kiln.runtime.host_funcs``).

Running a step calls the functions' executors: ``If`` runs only the branch the condition
picks; ``Loop`` runs its body while the trip count and the condition allow, re-binding the
loop-carried values each iteration (their shapes may change: the body's plan binds its
symbolic dims from the arguments of each call); ``Scan`` slices its scan inputs per iteration.
Per-iteration scan outputs are stacked after the loop. Captured outer values are passed to
every call unchanged. The functions of this module compute on numpy arrays and take the
function runner as an argument (``call(name, args) -> list of arrays``), so they do not depend
on the executor.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..ir.errors import KilnError

#: Prefix of the ``ExternFunc`` symbol of a control-flow call in the graph IR.
PREFIX = "kiln.control."
#: The control-flow steps (the symbol's suffix).
KINDS = ("if", "loop", "scan")

#: Most iterations one Loop step runs before it is stopped with an error (ONNX allows a
#: trip count of 2**63-1 with a condition deciding; a model whose condition never turns false
#: would otherwise hang).
MAX_ITERATIONS = 1 << 20

Runner = Callable[[str, Sequence[np.ndarray]], list[np.ndarray]]


@dataclass(frozen=True)
class LoopAttrs:
    """What a Loop or Scan step needs besides its arguments.

    ``num_carried``: loop-carried values (Loop) or states (Scan). ``num_scan_inputs``: Scan's
    sliced inputs, with their ``scan_input_axes`` / ``scan_input_directions`` (1: last slice
    first). ``scan_output_axes`` / ``scan_output_directions``: where the per-iteration outputs
    are stacked. ``scan_output_shapes``: each scan output's element shape as far as known
    (-1: unknown), used when a Loop runs zero iterations. ``has_trip`` / ``has_cond``: whether
    the Loop's trip count and initial condition are given.
    """

    num_carried: int = 0
    num_scan_inputs: int = 0
    scan_input_axes: tuple[int, ...] = ()
    scan_input_directions: tuple[int, ...] = ()
    scan_output_axes: tuple[int, ...] = ()
    scan_output_directions: tuple[int, ...] = ()
    scan_output_shapes: tuple[tuple[int, ...], ...] = ()
    scan_output_dtypes: tuple[str, ...] = ()
    has_trip: bool = True
    has_cond: bool = True


def _flag(value: np.ndarray, what: str) -> bool:
    arr = np.asarray(value)
    if arr.size != 1:
        raise ValueError(f"{what} must have one element, got shape {arr.shape}")
    return bool(arr.reshape(-1)[0])


def run_if(call: Runner, funcs: Sequence[str], args: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Run the branch function (``funcs[0]`` when ``args[0]`` is true, else ``funcs[1]``) on
    the captured values ``args[1:]``."""
    return call(funcs[0] if _flag(args[0], "the If condition") else funcs[1], args[1:])


def _stack(steps: list[np.ndarray], axis: int, direction: int, shape: Sequence[int],
           dtype: str, what: str) -> np.ndarray:
    """Per-iteration ``steps`` stacked along ``axis`` (reversed for ``direction`` 1); an empty
    loop gives a zero-length axis in the element ``shape`` (unknown dims: 0)."""
    if not steps:
        elem = [max(int(d), 0) for d in shape]
        rank = len(elem) + 1
        elem.insert(axis % rank, 0)
        return np.zeros(elem, dtype)
    first = steps[0].shape
    for k, s in enumerate(steps):
        if s.shape != first:
            raise ValueError(f"{what}: scan output of iteration {k} has shape {s.shape}, "
                             f"iteration 0 had {first}; they are stacked and must agree")
    return np.stack(steps[::-1] if direction else steps, axis=axis % (len(first) + 1))


def _scan_outputs(attrs: LoopAttrs, steps: list[list[np.ndarray]], what: str
                  ) -> list[np.ndarray]:
    k = len(steps)
    axes = attrs.scan_output_axes or (0,) * k
    dirs = attrs.scan_output_directions or (0,) * k
    return [_stack(s, a, d, shape, dtype, what) for s, a, d, shape, dtype in
            zip(steps, axes, dirs, attrs.scan_output_shapes, attrs.scan_output_dtypes)]


def run_loop(call: Runner, body: str, args: Sequence[np.ndarray], attrs: LoopAttrs,
             what: str = "Loop") -> list[np.ndarray]:
    """ONNX Loop: ``args`` = (trip count if ``has_trip``, condition if ``has_cond``, carried
    values, captured values); the body takes (iteration, condition, carried, captured) and
    returns (condition, carried, scan outputs)."""
    pos = 0
    trip = None
    if attrs.has_trip:
        trip = int(np.asarray(args[0]).reshape(-1)[0])
        pos += 1
    cond = True
    if attrs.has_cond:
        cond = _flag(args[pos], f"{what}: the condition")
        pos += 1
    n = attrs.num_carried
    carried = list(args[pos:pos + n])
    captured = list(args[pos + n:])
    steps: list[list[np.ndarray]] = [[] for _ in attrs.scan_output_shapes]
    it = 0
    while cond and (trip is None or it < trip):
        if it >= MAX_ITERATIONS:
            raise KilnError(f"{what}: more than {MAX_ITERATIONS} iterations (a condition that "
                            "never turns false?)")
        outs = call(body, [np.array(it, np.int64), np.array(cond), *carried, *captured])
        cond = _flag(outs[0], f"{what}: the body's condition output")
        carried = list(outs[1:1 + n])
        for j, v in enumerate(outs[1 + n:]):
            steps[j].append(v)
        it += 1
    return [*carried, *_scan_outputs(attrs, steps, what)]


def run_scan(call: Runner, body: str, args: Sequence[np.ndarray], attrs: LoopAttrs,
             what: str = "Scan") -> list[np.ndarray]:
    """ONNX Scan (opset 9+): ``args`` = (states, scan inputs, captured values); the body takes
    (states, one slice of each scan input, captured) and returns (states, scan outputs)."""
    n, m = attrs.num_carried, attrs.num_scan_inputs
    states = list(args[:n])
    xs = list(args[n:n + m])
    captured = list(args[n + m:])
    axes = [a % max(x.ndim, 1) for a, x in zip(attrs.scan_input_axes or (0,) * m, xs)]
    dirs = attrs.scan_input_directions or (0,) * m
    lengths = {x.shape[a] for x, a in zip(xs, axes)}
    if len(lengths) > 1:
        raise ValueError(f"{what}: the scan inputs differ in length along their scan axes: "
                         f"{sorted(lengths)}")
    length = lengths.pop() if lengths else 0
    steps: list[list[np.ndarray]] = [[] for _ in attrs.scan_output_shapes]
    for t in range(length):
        sl = [np.ascontiguousarray(np.take(x, length - 1 - t if d else t, axis=a))
              for x, a, d in zip(xs, axes, dirs)]
        outs = call(body, [*states, *sl, *captured])
        states = list(outs[:n])
        for j, v in enumerate(outs[n:]):
            steps[j].append(v)
    return [*states, *_scan_outputs(attrs, steps, what)]


def run(kind: str, call: Runner, funcs: Sequence[str], args: Sequence[np.ndarray],
        attrs: dict[str, Any], what: str) -> list[np.ndarray]:
    """Run control-flow step ``kind`` (see :data:`KINDS`); ``attrs`` are the step's JSON
    attributes (a :class:`LoopAttrs` as a dict for loops)."""
    if kind == "if":
        return run_if(call, funcs, args)
    la = LoopAttrs(**{k: (tuple(tuple(x) if isinstance(x, list) else x for x in v)
                          if isinstance(v, list) else v) for k, v in attrs.items()})
    if kind == "loop":
        return run_loop(call, funcs[0], args, la, what)
    if kind == "scan":
        return run_scan(call, funcs[0], args, la, what)
    raise KilnError(f"unknown control-flow step {kind!r} (this kiln knows {', '.join(KINDS)})")
