"""LegalizeOps: replace every operator call by a ``call_tir`` of the PrimFunc made from its
tensor expression.

For each ``Call(Op)`` binding in every graph function, the op's declaration (``kiln.op``) gives
either a ``legalize(bb, call)`` hook or a ``compute``: te placeholders are made from the
arguments' StructInfo, the compute builds the output tensor(s), ``te.create_prim_func`` turns them
into block TIR, and the PrimFunc (tagged with ``op_name``/``op_pattern`` so the build can apply
the op's schedule) is added to the module, deduplicated structurally.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .. import te, tir
from ..arith import Analyzer
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
    """The dimensions of one op call's kernel: compound symbolic dimensions (``b*s``) kept
    where the kernel can bind their variables, fresh variables elsewhere.

    A kernel binds its symbolic dimensions from the shapes of its buffers, which works for a
    dimension that is a plain variable but not for an expression of one. A compound dimension
    whose variables all size some argument or result of the call plainly (``reshape`` of a
    ``(b*s, k)`` tensor into ``(b, s, k)``) stays as it is: the kernel binds the variables
    from those dimensions and checks the compound one, and the compute sees the relation. Any
    other compound dimension becomes a variable of its own (the kernel does not need the
    relation: graph-level inference guarantees it), one per provably equal dimension (``b*s``
    and ``s*b`` are one), in the arguments' shapes and in the op's attributes alike (a
    reshape of ``(b*s, k)`` into ``(s*b, k)``).
    """

    def __init__(self, plain: set[tir.Var] | frozenset[tir.Var] = frozenset()) -> None:
        self.known: list[tuple[Any, tir.Var]] = []
        self.plain = plain
        self.analyzer = Analyzer()

    def __call__(self, dim: Any) -> Any:
        if not isinstance(dim, tir.PrimExpr) or isinstance(dim, (tir.IntImm, tir.Var)):
            return dim
        used = tir.collect_vars(dim)
        if not used or all(v in self.plain for v in used):
            return dim
        for expr, var in self.known:
            if structural_equal(expr, dim, map_free_vars=False) or (
                    self.analyzer.can_prove_equal(expr, dim)):
                return var
        var = tir.Var(f"d{len(self.known)}", "int64")
        self.known.append((dim, var))
        return var

    def attrs(self, attrs: Any) -> Any:
        """``attrs`` with the compound dimensions of its fields (a PrimExpr, or a tuple/list
        of them: shapes, slice bounds) mapped like the arguments' dimensions."""
        if attrs is None or not dataclasses.is_dataclass(attrs):
            return attrs
        changes: dict[str, Any] = {}
        for f in dataclasses.fields(attrs):
            value = getattr(attrs, f.name)
            if isinstance(value, (tuple, list)):
                mapped = type(value)(self(v) for v in value)
                changed = any(a is not b for a, b in zip(mapped, value))
            else:
                mapped = self(value)
                changed = mapped is not value
            if changed:
                changes[f.name] = mapped
        return dataclasses.replace(attrs, **changes) if changes else attrs


def _plain_dims(exprs: list[gx.Expr]) -> set[tir.Var]:
    """The variables that are whole dimensions of the tensors (or tuple fields) ``exprs``
    hold."""
    out: set[tir.Var] = set()
    stack = [e.struct_info for e in exprs]
    while stack:
        sinfo = stack.pop()
        if isinstance(sinfo, TupleStructInfo):
            stack.extend(sinfo.fields)
        elif isinstance(sinfo, TensorStructInfo) and sinfo.shape is not None:
            out.update(d for d in sinfo.shape if isinstance(d, tir.Var))
    return out


def _placeholder(arg: gx.Expr, name: str, dims: _DimVars) -> te.Tensor:
    sinfo = arg.struct_info
    if not isinstance(sinfo, TensorStructInfo) or sinfo.shape is None:
        raise StructInfoError(
            f"LegalizeOps: argument {name} needs a tensor of known rank, got {sinfo}"
        )
    if sinfo.dtype.is_string:
        raise StructInfoError(f"LegalizeOps: argument {name} is a string tensor; only string "
                              "operators (kiln.op.strings, run on the host) take text")
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


def _te_inputs(call: gx.Call, dims: _DimVars) -> tuple[list[Any], list[te.Tensor]]:
    """te placeholders shaped like the call's arguments (a list for a Tuple argument)."""
    names = iter("ABCDEFGHIJKLMNOPQRSTUVWXYZ")
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


def _unbound_dims(func: tir.PrimFunc) -> bool:
    """Whether a buffer dimension of ``func`` uses a variable that no buffer has as a whole
    dimension (the kernel could not bind it)."""
    plain: set[tir.Var] = {p for p in func.params if p not in func.buffer_map}
    used: set[tir.Var] = set()
    for buf in func.buffer_map.values():
        for d in buf.shape:
            if isinstance(d, tir.Var):
                plain.add(d)
            elif not isinstance(d, tir.IntImm):
                used.update(tir.collect_vars(d))
    return not used <= plain


def _prim_func(call: gx.Call, opdef: Any, dims: _DimVars) -> tir.PrimFunc:
    grouped, flat_inputs = _te_inputs(call, dims)
    try:
        outs = opdef.compute(*grouped, attrs=dims.attrs(call.attrs))
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
    return te.create_prim_func([*flat_inputs, *out_list], num_outputs=len(out_list))


def legalize_call(bb: BlockBuilder, call: gx.Call) -> gx.Expr:
    """The call_tir (or custom expression) that implements one operator call.

    Compound dimensions are first kept wherever the call's arguments or results size their
    variables plainly; when the compute's results do not (the kernel could not bind a
    variable), the kernel is made again keeping only those the arguments bind.
    """
    opdef = get_op_def(call.op.name)
    if opdef.legalize is not None:
        return opdef.legalize(bb, call)
    args = _flatten_args(call)
    func = _prim_func(call, opdef, _DimVars(_plain_dims([*args, call])))
    if _unbound_dims(func):
        func = _prim_func(call, opdef, _DimVars(_plain_dims(args)))
    func = func.with_attr("op_name", opdef.name).with_attr("op_pattern", int(opdef.pattern))
    short = opdef.name.split(".")[-1]
    gvar = bb.add_func(func, short)
    return gx.call_tir(gvar, args, call.struct_info)


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
