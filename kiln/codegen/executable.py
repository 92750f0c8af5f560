"""A legalized module -> Executable: what ``kiln.build`` and constant folding both run.

``build_executable(mod, target)`` takes a module whose graph functions call PrimFuncs only
(``call_tir`` after LegalizeOps, fused or not), applies each PrimFunc's schedule for the target
(:mod:`kiln.schedule`), makes an execution plan for every graph function that is not a
Primitive one, generates and compiles one library with the whole-model entries, and checks that
the kernels' symbols and symbolic dims are what the entries call them with. For a GPU target
(``cuda``, ``opencl``) each PrimFunc gets its GPU schedule, lowered (:mod:`kiln.schedule.gpu`),
one CUDA/OpenCL program is generated (:mod:`kiln.codegen.gpu`) and the same plans are run by
the GPU executor (no whole-model C entry). ``kiln.build`` runs
the graph passes first; ``FoldConstant`` legalizes a single call and runs it through here, so a
folded value is what kiln's own kernel computes, without the transform layer calling the build.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .. import progress
from ..graph import expr as g
from ..graph.functor import post_order_visit
from ..ir.errors import KilnError, error_context
from ..ir.module import IRModule
from ..ir.span import Span, describe
from ..runtime import memory_plan
from ..runtime.executable import Executable
from ..schedule.apply import schedule_prim_func
from ..schedule.gpu import schedule_prim_func as gpu_schedule_prim_func
from ..target import Target
from ..tir.function import PrimFunc
from ..tir.transform.lower import lower
from . import c as codegen_c
from . import graph_entry
from .gpu.build import build as gpu_build
from .graph_plan import build_plan

__all__ = ["build_executable", "kernel_spans"]


def kernel_spans(mod: IRModule) -> dict[str, Span]:
    """The model nodes behind each PrimFunc of ``mod``: the merged spans of the ``call_tir``
    calls of it in the graph functions."""
    found: dict[str, list[Span | None]] = {}

    def visit(e: Any) -> None:
        if isinstance(e, g.Call) and isinstance(e.op, g.Op) and e.op.name == "call_tir":
            found.setdefault(e.args[0].name_hint, []).append(e.span)

    for _, f in mod.items():
        if isinstance(f, g.Function):
            post_order_visit(f, visit)
    return {name: span for name, ss in found.items() if (span := Span.merge(ss)) is not None}


def build_executable(mod: IRModule, tgt: Target,
                     knobs: Callable[[PrimFunc, Target], Mapping[str, Any] | None] | None = None
                     ) -> Executable:
    """Schedule, plan, generate and compile a legalized ``mod`` for target ``tgt``.

    ``knobs(func, target)`` gives the schedule knobs of a kernel (a tuning database's best
    record, or a benchmark's choice for a GPU kernel; None: the default schedule)."""
    unscheduled = {name: f for name, f in mod.items() if isinstance(f, PrimFunc)}
    stage = progress.Stage("scheduling kernels", len(unscheduled))
    schedule = gpu_schedule_prim_func if tgt.is_gpu else schedule_prim_func
    spans = kernel_spans(mod)
    prim_funcs = {}
    for i, (name, f) in enumerate(unscheduled.items()):
        # an error scheduling or lowering a kernel names the model nodes it computes
        with error_context(describe(spans.get(name), f"kernel {name}")):
            chosen = knobs(f, tgt) if knobs is not None else None
            prim_funcs[name] = lower(schedule(f, tgt, chosen) if chosen else schedule(f, tgt),
                                     tgt)
        stage.step(i + 1)
    stage.finish()
    plans = {}
    for name, f in mod.items():
        if isinstance(f, g.Function) and not f.attrs.get("Primitive"):
            with error_context(f"graph function {name}", prefix=False):
                plans[name] = build_plan(f, name)
            memory_plan.check_run_memory(plans[name])
    if not plans:
        raise KilnError("kiln.build: the module has no graph function to run")
    if tgt.is_gpu:
        return Executable(gpu_build(prim_funcs, tgt), plans, target=tgt.spec)
    extra = graph_entry.emit_entries(plans, prim_funcs)
    module = codegen_c.build(prim_funcs, tgt, extra_source=extra)
    predicted = graph_entry.predict_unchecked_symbols(prim_funcs)
    if any(module.functions[n].unchecked_symbol != sym for n, sym in predicted.items()):
        raise KilnError("kiln.build: internal error: kernel symbols differ from the whole-model "
                        "entry's prediction")
    for plan in plans.values():
        pairs = list(zip(plan.calls, plan.entry_sym_dims or ()))
        pairs += [(call, dims) for seg in plan.segments
                  for call, dims in zip(plan.calls[seg["start"]:seg["stop"]], seg["sym_dims"])]
        for call, dims in pairs:
            func = prim_funcs[call.func]
            names = [func.buffer_map[func.params[arg]].shape[axis].name for arg, axis in dims]
            if names != list(module.functions[call.func].sym_vars):
                raise KilnError(f"kiln.build: internal error: kernel {call.func!r} takes its "
                                f"symbolic dims as {module.functions[call.func].sym_vars}, the "
                                f"whole-model entry passes {names}")
    return Executable(module, plans, target=tgt.spec,
                      required_features=tgt.required_features)
