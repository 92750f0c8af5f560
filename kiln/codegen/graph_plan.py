"""Turn a legalized graph function (only ``call_tir`` calls left) into an execution Plan.

Run-time shapes (``kiln.runtime.shape_funcs``): a call of ``ExternFunc("kiln.shape_func.F")``
becomes a host ``"shape_func"`` step binding fresh names, and a ``match_cast`` of its shape
value a ``"match"`` step binding the graph's symbolic dims; shape values live in the builder
as ``_Shape`` (encoded dims), never in slots. A call of ``ExternFunc("kiln.host_func.F")``
(``kiln.runtime.host_funcs``) becomes a ``"host_func"`` step whose output slot has fresh dim
names the step binds; a ``match_cast`` of that tensor binds the graph's dims from them.
Sequence and optional values (``SequenceStructInfo``, ``OptionalStructInfo``) get a slot of
that form (``SlotSpec.form``), with no shape: host functions make and read them, and a
parameter or result of ``main`` of that kind is a Python list / None-or-value at the call.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from .. import tir
from ..graph import expr as gx
from ..graph.struct_info import (
    OptionalStructInfo,
    SequenceStructInfo,
    ShapeStructInfo,
    TensorStructInfo,
    TupleStructInfo,
)
from ..ir.errors import KilnError
from ..runtime import control_flow, host_funcs, memory_plan, shape_expr, shape_funcs
from ..runtime.plan import MUTATIONS_ATTR, KernelCall, Plan, SlotSpec


class _Shape(tuple):
    """A shape value during plan building: its encoded dims."""


class _PlanBuilder:
    def __init__(self, name: str):
        self.name = name
        self.slots: list[SlotSpec] = []
        self.constants: dict[int, np.ndarray] = {}
        # id(constant array) -> (the array, its aligned copy); the array is kept so its id
        # cannot be reused while the plan is built
        self._aligned: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.calls: list[KernelCall] = []
        self.values: dict[int, Any] = {}  # id(graph var) -> slot or nested list of slots
        self.var_names: dict[int, str] = {}  # id(tir var) -> unique name
        self.reserved: set[str] = set()  # names of dims bound by shape functions
        self.binding = ""  # name of the variable being bound (for run-time error messages)

    # ---- shapes -------------------------------------------------------------------------
    def _name_sym_vars(self, shape: Any) -> None:
        for dim in shape:
            for v in tir.collect_vars(dim):
                if id(v) not in self.var_names:
                    used = set(self.var_names.values()) | self.reserved
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
        if isinstance(sinfo, (SequenceStructInfo, OptionalStructInfo)):
            form, elem, dtype = host_form(sinfo, f"{self.name}: {what}")
            self.slots.append(SlotSpec([], dtype, kind, form, elem))
            return len(self.slots) - 1
        if not isinstance(sinfo, TensorStructInfo) or sinfo.shape is None:
            raise KilnError(f"{self.name}: {what} must be a tensor of known rank, got {sinfo}")
        self._name_sym_vars(sinfo.shape)
        self.slots.append(SlotSpec([self._encode_dim(d) for d in sinfo.shape], sinfo.dtype, kind))
        return len(self.slots) - 1

    def new_value(self, sinfo: Any, kind: str, what: str) -> Any:
        if isinstance(sinfo, TupleStructInfo):
            return [self.new_value(f, kind, what) for f in sinfo.fields]
        return self.new_slot(sinfo, kind, what)

    def _aligned_constant(self, data: np.ndarray) -> np.ndarray:
        """The constant's bytes at a 64-byte address (``memory_plan.aligned_copy``: vector loads
        of a weight never straddle cache lines), copied once per array however often it is
        used."""
        key = id(data)
        if key not in self._aligned:
            self._aligned[key] = (data, memory_plan.aligned_copy(data))
        return self._aligned[key][1]

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
            slot = self.new_slot(e.struct_info, "const", "a constant")
            self.constants[slot] = self._aligned_constant(e.data)
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
        if isinstance(e, gx.ShapeExpr):
            self._name_sym_vars(e.values)
            return _Shape(self._encode_dim(d) for d in e.values)
        if isinstance(e, gx.PrimValue):
            self._name_sym_vars([e.value])
            return _Shape([self._encode_dim(e.value)])
        if (isinstance(e, gx.Call) and isinstance(e.op, gx.ExternFunc)
                and e.op.symbol.startswith(shape_funcs.PREFIX)):
            return self.shape_func(e)
        if (isinstance(e, gx.Call) and isinstance(e.op, gx.ExternFunc)
                and e.op.symbol.startswith(host_funcs.PREFIX)):
            return self.host_func(e)
        if (isinstance(e, gx.Call) and isinstance(e.op, gx.ExternFunc)
                and e.op.symbol.startswith(control_flow.PREFIX)):
            return self.control(e)
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
        self.calls.append(KernelCall(gvar.name_hint, in_slots + flat_outs, len(flat_outs),
                                     span=call.span))
        return outs

    def shape_func(self, call: gx.Call) -> _Shape:
        """A host step running a shape function; its result dims get fresh names."""
        name = call.op.symbol[len(shape_funcs.PREFIX):]
        if name not in shape_funcs.SHAPE_FUNCS:
            raise KilnError(f"{self.name}: unknown shape function {call.op.symbol!r}")
        sinfo = call.struct_info
        if not isinstance(sinfo, ShapeStructInfo) or sinfo.ndim < 0:
            raise KilnError(f"{self.name}: {call.op.symbol} must return a shape of known rank")
        slots: list[int] = []
        inputs: list[Any] = []
        for a in call.args:
            v = self.resolve(a)
            if isinstance(v, _Shape):
                prim = isinstance(a, gx.PrimValue)
                inputs.append(["prim", v[0]] if prim else ["shape", list(v)])
            elif isinstance(v, int):
                inputs.append(["tensor", len(slots)])
                slots.append(v)
            else:
                raise KilnError(f"{self.name}: {call.op.symbol}: tuple arguments are not supported")
        step = len(self.calls)
        binds = [self._fresh_name(f"_s{step}_{i}") for i in range(sinfo.ndim)]
        self.calls.append(KernelCall(name, slots, 0, "shape_func",
                                     {"inputs": inputs, "binds": binds, "what": self.binding},
                                     span=call.span))
        return _Shape(["var", b] for b in binds)

    def host_func(self, call: gx.Call) -> int:
        """A host step computing a tensor; its output slot's dims get fresh names that the step
        binds from the result (a ``match_cast`` of the value then binds the graph's dims)."""
        name = call.op.symbol[len(host_funcs.PREFIX):]
        if name not in host_funcs.HOST_FUNCS:
            raise KilnError(f"{self.name}: unknown host function {call.op.symbol!r}")
        sinfo = call.struct_info
        host_value = isinstance(sinfo, (SequenceStructInfo, OptionalStructInfo))
        if not host_value and (not isinstance(sinfo, TensorStructInfo) or sinfo.ndim < 0):
            raise KilnError(f"{self.name}: {call.op.symbol} must return a tensor of known "
                            "rank, a sequence or an optional")
        in_slots = []
        for a in call.args:
            v = self.resolve(a)
            if not isinstance(v, int):
                raise KilnError(f"{self.name}: {call.op.symbol}: arguments must be tensors, "
                                "sequences or optionals")
            in_slots.append(v)
        step = len(self.calls)
        if host_value:
            binds = []
            out = self.new_slot(sinfo, "temp", f"the result of {call.op.symbol}")
        else:
            binds = [self._fresh_name(f"_h{step}_{i}") for i in range(sinfo.ndim)]
            self.slots.append(SlotSpec([["var", b] for b in binds], sinfo.dtype, "temp"))
            out = len(self.slots) - 1
        attrs = dataclasses.asdict(call.attrs) if call.attrs is not None else {}
        self.calls.append(KernelCall(name, in_slots + [out], 1, "host_func",
                                     {"attrs": attrs, "binds": binds, "what": self.binding},
                                     span=call.span))
        return out

    def control(self, call: gx.Call) -> list[int]:
        """A control-flow step (If / Loop / Scan) running the graph functions its GlobalVar
        arguments name; each output slot's dims get fresh names the step binds."""
        kind = call.op.symbol[len(control_flow.PREFIX):]
        if kind not in control_flow.KINDS:
            raise KilnError(f"{self.name}: unknown control-flow call {call.op.symbol!r}")
        funcs = [a.name for a in call.args if isinstance(a, gx.GlobalVar)]
        in_slots = []
        for a in call.args:
            if isinstance(a, gx.GlobalVar):
                continue
            v = self.resolve(a)
            if not isinstance(v, int):
                raise KilnError(f"{self.name}: {call.op.symbol}: arguments must be tensors")
            in_slots.append(v)
        sinfo = call.struct_info
        fields = sinfo.fields if isinstance(sinfo, TupleStructInfo) else ()
        carried = (SequenceStructInfo, OptionalStructInfo)
        if not fields or not all(isinstance(f, carried) or (
                isinstance(f, TensorStructInfo) and f.ndim >= 0) for f in fields):
            raise KilnError(f"{self.name}: {call.op.symbol} must return a tuple of tensors of "
                            f"known rank, sequences or optionals, got {sinfo}")
        step = len(self.calls)
        outs, binds = [], []
        for k, f in enumerate(fields):
            if isinstance(f, carried):  # a host value: a slot of its form, no dims to bind
                outs.append(self.new_slot(f, "temp", f"{call.op.symbol} result {k}"))
                binds.append([])
                continue
            names = [self._fresh_name(f"_c{step}_{k}_{i}") for i in range(f.ndim)]
            self.slots.append(SlotSpec([["var", b] for b in names], f.dtype, "temp"))
            outs.append(len(self.slots) - 1)
            binds.append(names)
        attrs = dataclasses.asdict(call.attrs) if call.attrs is not None else {}
        self.calls.append(KernelCall(kind, in_slots + outs, len(outs), "control",
                                     {"funcs": funcs, "attrs": attrs, "binds": binds,
                                      "what": self.binding}, span=call.span))
        return outs

    def _fresh_name(self, base: str) -> str:
        used = set(self.var_names.values()) | self.reserved
        name, k = base, 1
        while name in used:
            name, k = f"{base}_{k}", k + 1
        self.reserved.add(name)
        return name

    def match_cast(self, b: gx.MatchCast) -> Any:
        """``match_cast`` of a shape value, or of a tensor (a host function's result: its
        slot's dims): bind new symbolic dims, check the others."""
        value = self.resolve(b.value)
        target = b.struct_info
        if isinstance(value, int) and isinstance(target, TensorStructInfo):
            spec = self.slots[value]
            if target.dtype != spec.dtype:
                raise KilnError(f"{self.name}: match_cast of {b.var.name_hint}: dtype "
                                f"{target.dtype} but the value has {spec.dtype}")
            if target.shape is None:
                return value
            target_dims, src_dims = target.shape, spec.shape
        elif isinstance(value, _Shape) and isinstance(target, ShapeStructInfo):
            if target.values is None:
                return value
            target_dims, src_dims = target.values, list(value)
        else:
            raise KilnError(f"{self.name}: match_cast of {b.var.name_hint} is only supported "
                            "for shape values and tensors")
        if len(target_dims) != len(src_dims):
            raise KilnError(f"{self.name}: match_cast of {b.var.name_hint}: rank mismatch")
        pairs = []
        for dim, src in zip(target_dims, src_dims):
            if isinstance(dim, tir.Var) and id(dim) not in self.var_names:
                self._name_sym_vars([dim])
                pairs.append([["bind", self.var_names[id(dim)]], src])
            else:
                self._name_sym_vars([dim])
                pairs.append([self._encode_dim(dim), src])
        self.calls.append(KernelCall("match_cast", [], 0, "match",
                                     {"pairs": pairs, "what": b.var.name_hint}))
        if isinstance(value, int):
            return value
        return _Shape(self._encode_dim(d) for d in target_dims)

    def mark_outputs(self, value: Any) -> None:
        if isinstance(value, list):
            for v in value:
                self.mark_outputs(v)
        elif self.slots[value].kind == "temp":
            self.slots[value].kind = "output"


def host_form(sinfo: Any, what: str) -> tuple[str, str, Any]:
    """``(form, elem, dtype)`` of the slot of a sequence or optional value: what it holds and
    the dtype of its tensors (KilnError when they are not tensors of one dtype)."""
    form = "sequence" if isinstance(sinfo, SequenceStructInfo) else "optional"
    inner = sinfo.elem
    elem = "tensor"
    if form == "optional" and isinstance(inner, SequenceStructInfo):
        elem, inner = "sequence", inner.elem
    if not isinstance(inner, TensorStructInfo):
        raise KilnError(f"{what}: a {form} must hold tensors (or, for an optional, a sequence "
                        f"of tensors), got {sinfo}")
    return form, elem, inner.dtype


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
            if isinstance(binding, gx.MatchCast):
                pb.values[id(binding.var)] = pb.match_cast(binding)
                continue
            if not isinstance(binding, gx.VarBinding):
                raise KilnError(f"{name}: {type(binding).__name__} bindings are not supported yet")
            pb.binding = binding.var.name_hint
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
        input_tree=func.attrs.get("kiln.input_tree"),
        output_tree=func.attrs.get("kiln.output_tree"),
        dim_ranges=dict(func.attrs.get("kiln.dim_ranges") or {}),
        output_names=[str(n) for n in func.attrs.get("output_names") or ()],
        mutations=_mutations(func),
    )
    plan.workspace_offsets, plan.workspace_bytes = memory_plan.plan_memory(plan)
    return plan


def _mutations(func: Any) -> list[dict[str, int]]:
    """The function's in-place updates (:data:`MUTATIONS_ATTR`) by input position."""
    position = {p.name_hint: i for i, p in enumerate(func.params)}
    out = []
    for m in func.attrs.get(MUTATIONS_ATTR) or ():
        if m["param"] not in position:
            raise KilnError(f"{func.attrs.get('global_symbol', 'main')}: an in-place update "
                            f"of {m['param']!r}, which is not a parameter (bound as a "
                            "constant? updated buffers must stay parameters)")
        out.append({"input": position[m["param"]], "output": int(m["output"])})
    return out
