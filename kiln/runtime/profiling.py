"""Per-kernel profiles of a model run: where the time goes, which model nodes each kernel was
made from, on which shapes, and a Chrome trace of the runs.

``Executable.profile(*inputs)`` returns a :class:`Profile`: one :class:`KernelProfile` row per
kernel (its calls per run, median time per run, share of the total, the shapes of its calls'
tensors and the source nodes behind it -- the ONNX nodes fused into it, from the plan's spans,
as TVM's LabelOps keeps them), printed as a table slowest first, and
:meth:`Profile.write_chrome_trace` lays every timed run out as events for ``chrome://tracing``
or Perfetto (each kernel call one event, with its nodes and shapes as arguments).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..ir.span import Span
from . import shape_expr
from .plan import KernelCall, Plan


def call_shapes(plan: Plan, call: KernelCall, env: dict[str, int]) -> str:
    """``"1x64x56x56, 64x64x3x3 -> 1x64x56x56"``: the shapes of a call's inputs and outputs
    (symbolic dims evaluated in ``env``; a dim not bound there keeps its name)."""

    def one(slot: int) -> str:
        dims = []
        for d in plan.slots[slot].shape:
            try:
                dims.append(str(shape_expr.evaluate(d, env)))
            except Exception:  # noqa: BLE001 - a name not bound: show it
                dims.append(shape_expr.to_str(d))
        return "x".join(dims) if dims else "scalar"

    n_in = len(call.args) - call.num_outputs
    ins = ", ".join(one(s) for s in call.args[:n_in])
    outs = ", ".join(one(s) for s in call.args[n_in:])
    return f"{ins} -> {outs}" if ins else outs


@dataclass(frozen=True)
class CallRecord:
    """One kernel call of a run: its kernel, source nodes, shapes and seconds in each run."""

    kernel: str
    span: Span | None
    shapes: str
    seconds: tuple[float, ...]


@dataclass(frozen=True)
class KernelProfile:
    """The calls of one kernel in a run, summed."""

    kernel: str
    calls: int
    seconds: float  # median over the runs of the time its calls take per run
    share: float  # of the sum of every kernel's median
    shapes: tuple[str, ...]  # the distinct shapes of its calls, in run order
    span: Span | None  # the source nodes of all its calls

    @property
    def nodes(self) -> str:
        """The source nodes as text (``Conv node 'conv1', Relu node 'relu1'``)."""
        return "" if self.span is None else str(self.span)


@dataclass
class Profile:
    """A profile of ``runs`` timed runs of a graph function (see the module docstring)."""

    function: str
    runs: int
    calls: list[CallRecord]
    rows: list[KernelProfile] = field(init=False)

    def __post_init__(self) -> None:
        groups: dict[str, list[CallRecord]] = {}
        for c in self.calls:
            groups.setdefault(c.kernel, []).append(c)
        medians = {k: float(np.median(np.sum([c.seconds for c in cs], axis=0)))
                   for k, cs in groups.items()}
        total = sum(medians.values())
        rows = []
        for kernel, cs in groups.items():
            t = medians[kernel]
            rows.append(KernelProfile(kernel, len(cs), t, t / total if total else 0.0,
                                      tuple(dict.fromkeys(c.shapes for c in cs)),
                                      Span.merge(c.span for c in cs)))
        self.rows = sorted(rows, key=lambda r: -r.seconds)

    @property
    def total_seconds(self) -> float:
        """The sum of the kernels' median times per run (what the shares divide)."""
        return sum(r.seconds for r in self.rows)

    def table(self, max_shapes: int = 48) -> str:
        """The rows, slowest first: kernel, calls, ms, share, shapes, source nodes."""
        width = max([len(r.kernel) for r in self.rows] + [6])
        lines = [f"{'kernel':{width}s} {'calls':>5s} {'ms':>9s} {'share':>6s}  "
                 f"{'shapes':{max_shapes}s}  source nodes"]
        for r in self.rows:
            shapes = " | ".join(_shorten(sh, max_shapes) for sh in r.shapes)
            if len(shapes) > max_shapes:
                shapes = shapes[:max_shapes - 3] + "..."
            lines.append(f"{r.kernel:{width}s} {r.calls:5d} {r.seconds * 1e3:9.3f} "
                         f"{r.share:6.1%}  {shapes:{max_shapes}s}  {r.nodes or '-'}")
        lines.append(f"{'total':{width}s} {len(self.calls):5d} {self.total_seconds * 1e3:9.3f}")
        return "\n".join(lines)

    __str__ = table

    def chrome_trace(self) -> dict[str, Any]:
        """The runs as Chrome trace events (times in microseconds, calls back to back: they
        run one after another inside the native entry)."""
        events: list[dict[str, Any]] = [
            {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "kiln"}},
            {"name": "thread_name", "ph": "M", "pid": 1, "tid": 1,
             "args": {"name": f"{self.function} (kernels)"}},
        ]
        now = 0.0
        for run in range(self.runs):
            start = now
            for c in self.calls:
                dur = c.seconds[run] * 1e6
                args: dict[str, Any] = {"shapes": c.shapes}
                if c.span is not None:
                    args["nodes"] = [f"{n.op_type} {n.name}".strip() for n in c.span.nodes]
                events.append({"name": c.kernel, "cat": "kernel", "ph": "X", "pid": 1,
                               "tid": 1, "ts": round(now, 3), "dur": round(dur, 3),
                               "args": args})
                now += dur
            events.append({"name": f"run {run}", "cat": "run", "ph": "X", "pid": 1, "tid": 0,
                           "ts": round(start, 3), "dur": round(now - start, 3)})
        return {"traceEvents": events, "displayTimeUnit": "ms"}

    def write_chrome_trace(self, path: str) -> None:
        """Write :meth:`chrome_trace` as JSON to ``path`` (open it in chrome://tracing or
        https://ui.perfetto.dev)."""
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.chrome_trace(), f)


def _shorten(shapes: str, width: int) -> str:
    """``shapes`` in at most ``width`` characters where possible, keeping the first input and
    the outputs: ``"1x4x16x16x16, ... -> 1x4x16x16x16"``."""
    if len(shapes) <= width or " -> " not in shapes:
        return shapes
    ins, outs = shapes.split(" -> ", 1)
    return f"{ins.split(', ')[0]}, ... -> {outs}"


def make_profile(plan: Plan, calls: Sequence[KernelCall], samples: np.ndarray,
                 env: dict[str, int]) -> Profile:
    """A Profile from the kernel calls of ``plan`` and their ``(runs, calls)`` seconds."""
    records = [CallRecord(c.func, c.span, call_shapes(plan, c, env),
                          tuple(float(t) for t in samples[:, i]))
               for i, c in enumerate(calls)]
    return Profile(plan.name, int(samples.shape[0]), records)
