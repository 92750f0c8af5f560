"""LegalizeOps: replace every operator call by a ``call_tir`` of the PrimFunc made from its
tensor expression.

For each ``Call(Op)`` binding in every graph function, the op's declaration (``kiln.op``) gives
either a ``legalize(bb, call)`` hook or a ``compute``: te placeholders are made from the
arguments' StructInfo, the compute builds the output tensor(s), ``te.create_prim_func`` turns them
into block TIR, and the PrimFunc (tagged with ``op_name``/``op_pattern`` so the build can apply
the op's schedule) is added to the module, deduplicated structurally.
"""

from __future__ import annotations

from typing import Any

from .. import te, tir
from ..graph import expr as gx
from ..graph.block_builder import BlockBuilder
from ..graph.functor import ExprMutator
from ..graph.struct_info import TensorStructInfo, TupleStructInfo
from ..ir.errors import KilnError, StructInfoError
from ..ir.module import IRModule
from ..ir.node import structural_equal
from ..op.registry import get_op_def
from .pass_infra import PassContext, module_pass


class _DimVars:
    """Fresh variables for compound symbolic dimensions (``2*n``) of one op call.

    A kernel binds its symbolic dimensions from the shapes of its arguments, which works for a
    dimension that is a plain variable but not for an expression of one. The kernel does not
    need the relation (graph-level inference already guarantees it), so each distinct compound
    dimension becomes a variable of its own.
    """

    def __init__(self) -> None:
        self.known: list[tuple[Any, tir.Var]] = []

    def __call__(self, dim: Any) -> Any:
        if isinstance(dim, (int, tir.IntImm, tir.Var)) or not tir.collect_vars(dim):
            return dim
        for expr, var in self.known:
            if structural_equal(expr, dim, map_free_vars=False):
                return var
        var = tir.Var(f"d{len(self.known)}", "int64")
        self.known.append((dim, var))
        return var


def _placeholder(arg: gx.Expr, name: str, dims: _DimVars) -> te.Tensor:
    sinfo = arg.struct_info
    if not isinstance(sinfo, TensorStructInfo) or sinfo.shape is None:
        raise StructInfoError(
            f"LegalizeOps: argument {name} needs a tensor of known rank, got {sinfo}"
        )
    return te.placeholder(tuple(dims(d) for d in sinfo.shape), sinfo.dtype, name=name)


def _flatten_args(call: gx.Call) -> list[gx.Expr]:
    """Tensor arguments in order; a Tuple argument (variadic inputs) contributes its fields."""
    flat: list[gx.Expr] = []
    for a in call.args:
        if isinstance(a, gx.Tuple):
            flat.extend(a.fields)
        else:
            flat.append(a)
    return flat


def _te_inputs(call: gx.Call, bb: BlockBuilder) -> tuple[list[Any], list[te.Tensor]]:
    """te placeholders shaped like the call's arguments (a list for a Tuple argument)."""
    names = iter("ABCDEFGHIJKLMNOPQRSTUVWXYZ")
    dims = _DimVars()
    grouped: list[Any] = []
    flat: list[te.Tensor] = []
    for a in call.args:
        if isinstance(a, gx.Tuple) or isinstance(a.struct_info, TupleStructInfo):
            fields = a.fields if isinstance(a, gx.Tuple) else None
            if fields is None:
                raise KilnError("LegalizeOps: tuple-valued arguments must be explicit tuples")
            group = [_placeholder(f, next(names, "X"), dims) for f in fields]
            grouped.append(group)
            flat.extend(group)
        else:
            t = _placeholder(a, next(names, "X"), dims)
            grouped.append(t)
            flat.append(t)
    return grouped, flat


def legalize_call(bb: BlockBuilder, call: gx.Call) -> gx.Expr:
    """The call_tir (or custom expression) that implements one operator call."""
    opdef = get_op_def(call.op.name)
    if opdef.legalize is not None:
        return opdef.legalize(bb, call)
    grouped, flat_inputs = _te_inputs(call, bb)
    try:
        outs = opdef.compute(*grouped, attrs=call.attrs)
    except KilnError:
        raise
    except Exception as err:  # a compute bug must name the op, not surface as a bare traceback
        raise KilnError(f"LegalizeOps: compute of {opdef.name} failed: {err}") from err
    out_list = list(outs) if isinstance(outs, (list, tuple)) else [outs]
    # An output that is one of the inputs (an identity, e.g. a cast to the same dtype) or that
    # appears twice still needs its own output buffer: copy it.
    seen: set[int] = {id(t) for t in flat_inputs}
    for i, t in enumerate(out_list):
        if id(t) in seen or not isinstance(t.op, te.ComputeOp):
            out_list[i] = te.compute(t.shape, lambda *idx, t=t: t(*idx), name=f"{t.name}_copy")
        seen.add(id(out_list[i]))
    func = te.create_prim_func([*flat_inputs, *out_list], num_outputs=len(out_list))
    func = func.with_attr("op_name", opdef.name).with_attr("op_pattern", int(opdef.pattern))
    short = opdef.name.split(".")[-1]
    gvar = bb.add_func(func, short)
    return gx.call_tir(gvar, _flatten_args(call), call.struct_info)


class _Legalizer(ExprMutator):
    def __init__(self, bb: BlockBuilder):
        super().__init__(bb)
        self.bb = bb

    def visit_Call(self, call: gx.Call) -> gx.Expr:
        call = super().visit_Call(call)
        if isinstance(call.op, gx.Op) and call.op.name != "call_tir":
            return legalize_call(self.bb, call)
        return call


@module_pass(opt_level=0)
class LegalizeOps:
    """Lower every op call in every graph function to ``call_tir``."""

    def transform_module(self, mod: IRModule, ctx: PassContext) -> IRModule:
        bb = BlockBuilder(mod)
        for name, func in mod.items():
            if isinstance(func, gx.Function):
                new_func = _Legalizer(bb).visit(func)
                bb.update_func(name, new_func)
        return bb.get()
