"""``kiln.build``: graph IRModule -> Executable.

The pipeline: bind parameters, legalize operators to ``call_tir`` of PrimFuncs, apply each
PrimFunc's schedule (the declaring op's default schedule for the target), lower and generate
native code for all PrimFuncs in one library, and make an execution plan for every graph
function.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from . import graph as g
from .codegen.graph_plan import build_plan
from .ir.errors import KilnError
from .ir.module import IRModule
from .op.registry import get_op_def
from .runtime.executable import Executable
from .target import Target
from .tir.function import PrimFunc
from .transform.legalize_ops import LegalizeOps


def bind_params(mod: IRModule, params: Mapping[str, Any], func_name: str = "main") -> IRModule:
    """Replace parameters of ``func_name`` named in ``params`` by constants."""
    func = mod[func_name]
    names = {p.name_hint: p for p in func.params}
    unknown = set(params) - set(names)
    if unknown:
        raise KilnError(f"bind_params: {func_name} has no parameter(s) {sorted(unknown)}")
    mapping = {}
    for name, value in params.items():
        var = names[name]
        const = g.const(np.asarray(value))
        sinfo = var.struct_info
        want_shape = tuple(int(d) for d in sinfo.shape) if sinfo.is_static else None
        if tuple(const.data.shape) != want_shape or const.struct_info.dtype != sinfo.dtype:
            raise KilnError(
                f"bind_params: parameter {name} expects {sinfo} but the value has shape "
                f"{const.data.shape} and dtype {const.data.dtype}"
            )
        mapping[var] = const
    new_params = tuple(p for p in func.params if p.name_hint not in params)

    class _Bind(g.ExprMutator):
        def visit_Var(self, v):
            return mapping.get(v, v)

    new_func = _Bind(mod).visit(g.Function(new_params, func.body, func.ret_struct_info,
                                           func.attrs))
    return mod.with_function(func_name, new_func)


def schedule_prim_func(func: PrimFunc, target: Target) -> PrimFunc:
    """Apply the default schedule of the op that produced ``func`` (if it declares one)."""
    from .tir.schedule import Schedule

    op_name = func.attrs.get("op_name")
    if op_name is None or func.attrs.get("scheduled"):
        return func
    sched = get_op_def(op_name).schedules.get(target.kind)
    if sched is None:
        return func
    sch = Schedule(func)
    sched(sch, target)
    return sch.func.with_attr("scheduled", True)


def build(mod: IRModule, target: Target | str | None = "c",
          params: Mapping[str, Any] | None = None) -> Executable:
    """Compile every function of ``mod``; the result runs graph function ``main`` when called."""
    from .codegen import c as codegen_c

    if not isinstance(mod, IRModule):
        raise KilnError(f"kiln.build expects an IRModule, got {type(mod).__name__}")
    tgt = Target.create(target)
    if params:
        mod = bind_params(mod, params)
    mod = LegalizeOps()(mod)
    prim_funcs = {
        name: schedule_prim_func(f, tgt) for name, f in mod.items() if isinstance(f, PrimFunc)
    }
    module = codegen_c.build(prim_funcs, tgt)
    plans = {
        name: build_plan(f, name) for name, f in mod.items() if isinstance(f, g.Function)
    }
    if not plans:
        raise KilnError("kiln.build: the module has no graph function to run")
    return Executable(module, plans)
