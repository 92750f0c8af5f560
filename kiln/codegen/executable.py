"""A legalized module -> Executable: what ``kiln.build`` and constant folding both run.

``build_executable(mod, target)`` takes a module whose graph functions call PrimFuncs only
(``call_tir`` after LegalizeOps, fused or not), applies each PrimFunc's schedule for the target
(:mod:`kiln.schedule`), makes an execution plan for every graph function that is not a
Primitive one, generates and compiles one library with the whole-model entries, and checks that
the kernels' symbols and symbolic dims are what the entries call them with. ``kiln.build`` runs
the graph passes first; ``FoldConstant`` legalizes a single call and runs it through here, so a
folded value is what kiln's own kernel computes, without the transform layer calling the build.
"""

from __future__ import annotations

from .. import progress
from ..graph import expr as g
from ..ir.errors import KilnError
from ..ir.module import IRModule
from ..runtime.executable import Executable
from ..schedule.apply import schedule_prim_func
from ..target import Target
from ..tir.function import PrimFunc
from . import c as codegen_c
from . import graph_entry
from .graph_plan import build_plan

__all__ = ["build_executable"]


def build_executable(mod: IRModule, tgt: Target) -> Executable:
    """Schedule, plan, generate and compile a legalized ``mod`` for target ``tgt``."""
    unscheduled = {name: f for name, f in mod.items() if isinstance(f, PrimFunc)}
    stage = progress.Stage("scheduling kernels", len(unscheduled))
    prim_funcs = {}
    for i, (name, f) in enumerate(unscheduled.items()):
        prim_funcs[name] = schedule_prim_func(f, tgt)
        stage.step(i + 1)
    stage.finish()
    plans = {
        name: build_plan(f, name) for name, f in mod.items()
        if isinstance(f, g.Function) and not f.attrs.get("Primitive")
    }
    if not plans:
        raise KilnError("kiln.build: the module has no graph function to run")
    extra = graph_entry.emit_entries(plans, prim_funcs)
    module = codegen_c.build(prim_funcs, tgt, extra_source=extra)
    predicted = graph_entry.predict_unchecked_symbols(prim_funcs)
    if any(module.functions[n].unchecked_symbol != sym for n, sym in predicted.items()):
        raise KilnError("kiln.build: internal error: kernel symbols differ from the whole-model "
                        "entry's prediction")
    for plan in plans.values():
        for call, dims in zip(plan.calls, plan.entry_sym_dims or ()):
            func = prim_funcs[call.func]
            names = [func.buffer_map[func.params[arg]].shape[axis].name for arg, axis in dims]
            if names != list(module.functions[call.func].sym_vars):
                raise KilnError(f"kiln.build: internal error: kernel {call.func!r} takes its "
                                f"symbolic dims as {module.functions[call.func].sym_vars}, the "
                                f"whole-model entry passes {names}")
    return Executable(module, plans, target=tgt.spec,
                      required_features=tgt.required_features)
