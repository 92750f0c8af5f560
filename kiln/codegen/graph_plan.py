"""Turn a legalized graph function (only ``call_tir`` calls left) into an execution Plan."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import tir
from ..graph import expr as gx
from ..graph.struct_info import TensorStructInfo, TupleStructInfo
from ..ir.errors import KilnError
from ..runtime import memory_plan, shape_expr
from ..runtime.plan import KernelCall, Plan, SlotSpec


class _PlanBuilder:
    def __init__(self, name: str):
        self.name = name
        self.slots: list[SlotSpec] = []
        self.constants: dict[int, np.ndarray] = {}
        self.calls: list[KernelCall] = []
        self.values: dict[int, Any] = {}  # id(graph var) -> slot or nested list of slots
        self.var_names: dict[int, str] = {}  # id(tir var) -> unique name

    # ---- shapes -------------------------------------------------------------------------
    def _name_sym_vars(self, shape: Any) -> None:
        for dim in shape:
            for v in tir.collect_vars(dim):
                if id(v) not in self.var_names:
                    used = set(self.var_names.values())
                    name, k = v.name, 1
                    while name in used:
                        name, k = f"{v.name}_{k}", k + 1
                    self.var_names[id(v)] = name

    def _encode_dim(self, dim: Any) -> Any:
        dim = tir.convert(dim) if isinstance(dim, int) else dim
        renamed = tir.substitute(
            dim, lambda v: tir.Var(self.var_names[id(v)], v.dtype) if id(v) in self.var_names
            else None
        )
        return shape_expr.encode(renamed)

    def new_slot(self, sinfo: Any, kind: str, what: str) -> int:
        if not isinstance(sinfo, TensorStructInfo) or sinfo.shape is None:
            raise KilnError(f"{self.name}: {what} must be a tensor of known rank, got {sinfo}")
        self._name_sym_vars(sinfo.shape)
        self.slots.append(SlotSpec([self._encode_dim(d) for d in sinfo.shape], sinfo.dtype, kind))
        return len(self.slots) - 1

    def new_value(self, sinfo: Any, kind: str, what: str) -> Any:
        if isinstance(sinfo, TupleStructInfo):
            return [self.new_value(f, kind, what) for f in sinfo.fields]
        return self.new_slot(sinfo, kind, what)

    # ---- expressions --------------------------------------------------------------------
    def resolve(self, e: gx.Expr) -> Any:
        if isinstance(e, gx.Var):
            try:
                return self.values[id(e)]
            except KeyError:
                raise KilnError(
                    f"{self.name}: variable {e.name_hint} used before it is bound"
                ) from None
        if isinstance(e, gx.Constant):
            # (ascontiguousarray alone turns a 0-d array into shape (1,))
            data = np.ascontiguousarray(e.data).reshape(e.data.shape)
            slot = self.new_slot(e.struct_info, "const", "a constant")
            self.constants[slot] = data
            return slot
        if isinstance(e, gx.Tuple):
            return [self.resolve(f) for f in e.fields]
        if isinstance(e, gx.TupleGetItem):
            value = self.resolve(e.tuple_value)
            if not isinstance(value, list):
                raise KilnError(f"{self.name}: TupleGetItem of a non-tuple value")
            return value[e.index]
        if isinstance(e, gx.Call) and isinstance(e.op, gx.Op) and e.op.name == "call_tir":
            return self.call_tir(e)
        if isinstance(e, gx.Call) and isinstance(e.op, gx.Op):
            raise KilnError(
                f"{self.name}: operator {e.op.name} was not legalized (run LegalizeOps first)"
            )
        raise KilnError(f"{self.name}: the executor cannot run {type(e).__name__} expressions yet")

    def call_tir(self, call: gx.Call) -> Any:
        gvar, args = call.args[0], call.args[1]
        fields = args.fields if isinstance(args, gx.Tuple) else [args]
        in_slots = []
        for a in fields:
            v = self.resolve(a)
            if isinstance(v, list):
                raise KilnError(f"{self.name}: call_tir arguments must be tensors")
            in_slots.append(v)
        out_sinfo = call.sinfo_args[0]
        outs = self.new_value(out_sinfo, "temp", f"the output of {gvar.name_hint}")
        flat_outs = outs if isinstance(outs, list) else [outs]
        self.calls.append(KernelCall(gvar.name_hint, in_slots + flat_outs, len(flat_outs)))
        return outs

    def mark_outputs(self, value: Any) -> None:
        if isinstance(value, list):
            for v in value:
                self.mark_outputs(v)
        elif self.slots[value].kind == "temp":
            self.slots[value].kind = "output"


def build_plan(func: gx.Function, name: str = "main") -> Plan:
    """The Plan of graph function ``func`` (all op calls already legalized to call_tir)."""
    pb = _PlanBuilder(name)
    input_slots = []
    for p in func.params:
        slot = pb.new_slot(p.struct_info, "input", f"parameter {p.name_hint}")
        pb.values[id(p)] = slot
        input_slots.append(slot)
    body = func.body
    blocks = body.blocks if isinstance(body, gx.SeqExpr) else []
    result_expr = body.body if isinstance(body, gx.SeqExpr) else body
    for block in blocks:
        for binding in block.bindings:
            if not isinstance(binding, gx.VarBinding):
                raise KilnError(f"{name}: {type(binding).__name__} bindings are not supported yet")
            pb.values[id(binding.var)] = pb.resolve(binding.value)
    result = pb.resolve(result_expr)
    pb.mark_outputs(result)
    plan = Plan(
        name=name,
        input_names=[p.name_hint for p in func.params],
        input_slots=input_slots,
        slots=pb.slots,
        calls=pb.calls,
        outputs=result,
        constants=pb.constants,
    )
    plan.workspace_offsets, plan.workspace_bytes = memory_plan.plan_memory(plan)
    return plan
