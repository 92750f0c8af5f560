"""ToMixedPrecision: compute a float32 model in float16 or bfloat16 where each operator's
declared policy allows it, and keep every other tensor in exactly the dtype it had.

The policy of an op is the ``mixed_precision`` field of its declaration in ``kiln.op``
(:class:`~kiln.op.registry.MixedPrecision`), overridable per call of the pass:

- ``ALWAYS`` (conv2d, dense, matmul): the op computes in the low-precision type. Ops whose
  attrs have an ``out_dtype`` accumulate in ``accumulate_dtype`` (float32) and return that;
  consumers that want the low-precision value get one cast, consumers that want float32 (a
  layer_norm right after a conv) read the float32 result directly, so no ``f32 -> f16 -> f32``
  round trip is ever made.
- ``FOLLOW`` (element-wise, shape, pooling...): the op runs in the dtype its inputs already
  have. It runs in low precision when at least one float32 input currently is low precision
  and no other input is a float32 value computed by the graph (parameters and constants adapt
  for free); otherwise it runs in float32.
- ``NEVER`` (softmax, layer_norm, sum/mean/prod, comparisons, cast): the op gets exactly the
  dtypes it had before the pass. It is never forced to float32: an op that was already in
  float16 (or an integer op) stays as it was. ``cast`` is free to read any precision of its
  input; a cast to a dtype the value already has is dropped.

Only tensors that were float32 before the pass ever change dtype: integer, bool, float64 and
tensors that already were float16/bfloat16 keep their dtypes. Calls that are not op calls
(``call_tir``, calls of other graph functions, extern calls), ``match_cast`` and the results of
functions and ``If`` branches get their original dtypes, so function signatures never change.

Casts are made lazily, at the point a consumer needs a dtype the value does not have yet, and
are shared by all later consumers in the same block (a dataflow block's casts are not visible
after it). A cast of a value that was itself made by an exact widening (``float16 ->
float32``) back to the narrow type reuses the narrow value, so redundant cast pairs never
appear. Constants are converted at compile time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .. import op as _op
from ..graph import expr as gx
from ..graph.functor import ExprMutator
from ..graph.struct_info import TensorStructInfo, TupleStructInfo, sinfo_equal
from ..ir.dtype import DataType, as_dtype
from ..ir.errors import KilnError
from ..ir.module import IRModule
from ..op.registry import MixedPrecision, get_op_def, list_ops
from .pass_infra import PassContext, function_pass

__all__ = ["LOW_PRECISION_DTYPES", "ToMixedPrecision"]

#: The dtypes ToMixedPrecision can compute in.
LOW_PRECISION_DTYPES = ("float16", "bfloat16")

_F32 = DataType("float32")

#: Float conversions that keep every value exactly (a cast back restores the source).
_EXACT_WIDENING = {("float16", "float32"), ("bfloat16", "float32"), ("float16", "float64"),
                   ("bfloat16", "float64"), ("float32", "float64")}


def _tensor_dtype(sinfo: Any) -> DataType | None:
    return as_dtype(sinfo.dtype) if isinstance(sinfo, TensorStructInfo) else None


def _short(dt: DataType) -> str:
    return {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}.get(str(dt), str(dt))


@dataclass
class _Value:
    """What the pass knows about one value of the original function.

    ``orig``: its tensor dtype before the pass (None for non-tensors); ``cur``: the dtype it
    logically has now (what FOLLOW consumers see); ``reps``: the new expressions that hold it,
    by dtype (the first one is the binding that replaced the original); ``free``: a parameter
    or constant, cheap to provide in any precision.
    """

    primary: gx.Expr
    orig: DataType | None
    cur: DataType | None
    reps: dict[str, gx.Expr] = field(default_factory=dict)
    free: bool = False


class _Converter(ExprMutator):
    def __init__(self, mod: IRModule | None, lp: DataType, policies: dict[str, MixedPrecision],
                 accumulate: DataType | None):
        super().__init__(mod)
        self.lp = lp
        self.policies = policies
        self.accumulate = accumulate
        self.values: dict[gx.Expr, _Value] = {}
        self.const_cache: dict[tuple[int, str], gx.Constant] = {}
        # reps made inside a dataflow block or a branch are forgotten when it ends
        self.frames: list[list[tuple[_Value, str]]] = []

    # ---- bookkeeping ------------------------------------------------------------------------
    def _push(self) -> None:
        self.frames.append([])

    def _pop(self) -> None:
        for value, key in self.frames.pop():
            value.reps.pop(key, None)

    def _add_rep(self, value: _Value, dtype: DataType, expr: gx.Expr) -> None:
        key = str(dtype)
        if key in value.reps:
            return
        value.reps[key] = expr
        if self.frames:
            self.frames[-1].append((value, key))

    def _new_value(self, primary: gx.Expr, orig_sinfo: Any, cur: DataType | None = None,
                   free: bool = False) -> _Value:
        new_dt = _tensor_dtype(primary.struct_info)
        value = _Value(primary, _tensor_dtype(orig_sinfo), cur or new_dt, free=free)
        if new_dt is not None:
            value.reps[str(new_dt)] = primary
        return value

    def _value_of(self, e: gx.Expr) -> _Value:
        """The _Value of an argument expression of the original function."""
        known = self.values.get(e)
        if known is not None:
            return known
        if isinstance(e, gx.Var):  # defined outside what the pass has seen (free variable)
            value = self._new_value(self.var_remap.get(e, e), e.struct_info, free=True)
        elif isinstance(e, gx.Constant):
            value = self._new_value(e, e.struct_info, free=True)
        elif gx.is_leaf(e):
            value = self._new_value(self.visit_expr(e), e.struct_info, free=True)
        else:  # a nested (non A-normal) expression: convert and bind it first
            new, cur = self._convert(e)
            new = self.builder.normalize(new, anf=True)
            var = self.builder.emit(new) if not gx.is_leaf(new) else new
            value = self._new_value(var, e.struct_info, cur)
        self.values[e] = value
        return value

    # ---- providing values in a dtype --------------------------------------------------------
    def _in_dtype(self, e: gx.Expr, dtype: DataType) -> gx.Expr:
        """Argument ``e`` (original expression) as a new expression of tensor dtype ``dtype``."""
        if isinstance(e, gx.Constant):
            if e.dtype == dtype:
                return e
            key = (id(e), str(dtype))
            if key not in self.const_cache:
                self.const_cache[key] = gx.Constant(e.data.astype(dtype.to_numpy()))
            return self.const_cache[key]
        value = self._value_of(e)
        return self._rep(value, dtype)

    def _rep(self, value: _Value, dtype: DataType) -> gx.Expr:
        key = str(dtype)
        if key in value.reps:
            return value.reps[key]
        # cast from the most precise representation available
        src = max(value.reps.values(), key=lambda r: _tensor_dtype(r.struct_info).bits)
        name = getattr(value.primary, "name", "v")
        cast = self.builder.emit(_op.cast(src, str(dtype)), f"{name}_{_short(dtype)}")
        self._add_rep(value, dtype, cast)
        return cast

    def _orig(self, e: gx.Expr) -> gx.Expr:
        """Argument ``e`` in exactly the StructInfo it had before the pass."""
        if isinstance(e, gx.Tuple):
            fields = tuple(self._orig(f) for f in e.fields)
            if all(a is b for a, b in zip(fields, e.fields)):
                return e
            return self.builder.normalize(gx.Tuple(fields))
        if isinstance(e, gx.Constant):
            return e
        value = self._value_of(e)
        if value.orig is not None:
            return self._rep(value, value.orig)
        return self._coerce(value.primary, e.struct_info)

    def _coerce(self, new: gx.Expr, sinfo: Any) -> gx.Expr:
        """``new`` converted field by field to the dtypes of ``sinfo`` (tuples of tensors)."""
        have = new.struct_info
        if have is None or sinfo is None or sinfo_equal(have, sinfo):
            return new
        if isinstance(sinfo, TensorStructInfo) and isinstance(have, TensorStructInfo):
            if have.dtype == sinfo.dtype:
                return new
            return self.builder.emit(_op.cast(new, str(sinfo.dtype)))
        if isinstance(sinfo, TupleStructInfo) and isinstance(have, TupleStructInfo):
            fields = []
            for i, fs in enumerate(sinfo.fields):
                item = new.fields[i] if isinstance(new, gx.Tuple) else self.builder.emit(
                    gx.TupleGetItem(new, i))
                fields.append(self._coerce(item, fs))
            return self.builder.normalize(gx.Tuple(tuple(fields)))
        return new

    def _arg(self, e: gx.Expr, want: DataType | None) -> gx.Expr:
        """Argument ``e`` with its float32 tensors in ``want`` (None: original dtypes)."""
        if want is None:
            return self._orig(e)
        if isinstance(e, gx.Tuple):
            fields = tuple(self._arg(f, want) for f in e.fields)
            if all(a is b for a, b in zip(fields, e.fields)):
                return e
            return self.builder.normalize(gx.Tuple(fields))
        if _tensor_dtype(e.struct_info) == _F32:
            return self._in_dtype(e, want)
        return self._orig(e)

    # ---- op calls -----------------------------------------------------------------------------
    def _float32_args(self, call: gx.Call) -> list[gx.Expr]:
        out: list[gx.Expr] = []
        for a in call.args:
            for f in (a.fields if isinstance(a, gx.Tuple) else (a,)):
                if _tensor_dtype(f.struct_info) == _F32:
                    out.append(f)
        return out

    def _follow_dtype(self, args: Iterable[gx.Expr]) -> DataType:
        """Low precision when some input already is and none is a computed float32 value."""
        some_lp = False
        for a in args:
            if isinstance(a, gx.Constant):
                continue
            value = self._value_of(a)
            if value.cur == self.lp:
                some_lp = True
            elif not (value.free or str(self.lp) in value.reps):
                return _F32
        return self.lp if some_lp else _F32

    def _convert_op_call(self, call: gx.Call) -> tuple[gx.Expr, DataType | None]:
        name = call.op.name
        if name == "cast":
            return self._convert_cast(call)
        policy = self.policies.get(name) or get_op_def(name).mixed_precision
        f32_args = self._float32_args(call)
        want: DataType | None = None
        if f32_args and policy == MixedPrecision.ALWAYS:
            want = self.lp
        elif f32_args and policy == MixedPrecision.FOLLOW:
            want = self._follow_dtype(f32_args)
            if want == _F32:
                want = None  # float32 inputs stay float32: the original dtypes
        args = tuple(self._arg(a, want) for a in call.args)
        attrs, cur = call.attrs, None
        if want is not None and policy == MixedPrecision.ALWAYS:
            attrs, cur = self._accumulate_attrs(call)
        if all(a is b for a, b in zip(args, call.args)) and attrs is call.attrs:
            return call, None
        return call.replace(args=args, attrs=attrs), cur

    def _accumulate_attrs(self, call: gx.Call) -> tuple[Any, DataType | None]:
        """Attrs asking an op with an ``out_dtype`` to accumulate (and return) float32."""
        opdef = get_op_def(call.op.name)
        if self.accumulate is None or opdef.attrs is None:
            return call.attrs, None
        if "out_dtype" not in {f.name for f in dataclasses.fields(opdef.attrs)}:
            return call.attrs, None
        if _tensor_dtype(call.struct_info) != _F32:
            return call.attrs, None
        attrs = call.attrs if call.attrs is not None else opdef.make_attrs()
        if attrs.out_dtype not in (None, str(_F32)):
            return call.attrs, None  # the model asked for a specific result dtype: keep it
        return dataclasses.replace(attrs, out_dtype=str(self.accumulate)), self.lp

    def _convert_cast(self, call: gx.Call) -> tuple[gx.Expr, DataType | None]:
        """``cast`` reads its input in any precision; a cast to a dtype at hand is dropped."""
        (x,) = call.args
        target = as_dtype(call.attrs.dtype)
        if _tensor_dtype(x.struct_info) is None or isinstance(x, gx.Constant):
            return self._plain_call(call)
        value = self._value_of(x)
        if str(target) in value.reps:
            return value.reps[str(target)], None
        src = max(value.reps.values(), key=lambda r: _tensor_dtype(r.struct_info).bits)
        if src is x:
            return call, None
        return call.replace(args=(src,)), None

    def _plain_call(self, call: gx.Call) -> tuple[gx.Expr, DataType | None]:
        args = tuple(self._orig(a) for a in call.args)
        if all(a is b for a, b in zip(args, call.args)):
            return call, None
        return call.replace(args=args), None

    # ---- values -----------------------------------------------------------------------------
    def _convert(self, value: gx.Expr) -> tuple[gx.Expr, DataType | None]:
        """The new form of a bound value and, when it differs from the new dtype, its logical
        dtype (an accumulating op's float32 result that stands for a low-precision value)."""
        if isinstance(value, gx.Call):
            if isinstance(value.op, gx.Op) and value.op.name != "call_tir":
                return self._convert_op_call(value)
            return self._plain_call(value)
        if isinstance(value, gx.Var):
            src = self._value_of(value)
            return src.primary, src.cur
        if isinstance(value, gx.Tuple):
            fields = []
            for f in value.fields:
                if _tensor_dtype(f.struct_info) is not None and not isinstance(f, gx.Constant):
                    v = self._value_of(f)
                    fields.append(self._rep(v, v.cur))
                else:
                    fields.append(self._orig(f) if not gx.is_leaf(f) else self.visit_expr(f))
            if all(a is b for a, b in zip(fields, value.fields)):
                return value, None
            return gx.Tuple(tuple(fields)), None
        if isinstance(value, gx.TupleGetItem):
            tv = self._value_of(value.tuple_value).primary
            if tv is value.tuple_value:
                return value, None
            return gx.TupleGetItem(tv, value.index), None
        if isinstance(value, gx.If):
            cond = self._orig(value.cond)
            tb = self.visit_with_new_scope(value.true_branch)
            fb = self.visit_with_new_scope(value.false_branch)
            if cond is value.cond and tb is value.true_branch and fb is value.false_branch:
                return value, None
            return gx.If(cond, tb, fb), None
        return self.visit_expr(value), None

    def visit_Var(self, v: gx.Var) -> gx.Expr:
        value = self.values.get(v)
        return value.primary if value is not None else self.var_remap.get(v, v)

    def visit_VarBinding(self, b: gx.VarBinding) -> None:
        new, cur = self._convert(b.value)
        if new is b.value:
            self.builder.emit_normalized(b)
            value = self._new_value(b.var, b.var.struct_info)
            self._note_exact_cast(value, new)
            self.values[b.var] = value
            return
        new = self.builder.normalize(new, anf=True)
        if isinstance(new, gx.Var) and (isinstance(b.var, gx.DataflowVar)
                                        or not isinstance(new, gx.DataflowVar)):
            # the value is already at hand (a dropped cast or an alias): no binding needed
            value = self._value_of(b.value) if isinstance(b.value, gx.Var) else None
            self.values[b.var] = value or self._new_value(new, b.var.struct_info, cur)
            self.var_remap[b.var] = new
            return
        orig_dt, new_dt = _tensor_dtype(b.var.struct_info), _tensor_dtype(new.struct_info)
        if (self.builder.current_block_is_dataflow() and not isinstance(b.var, gx.DataflowVar)
                and orig_dt is not None and new_dt != orig_dt):
            self._bind_block_output(b, new, cur, orig_dt)
            return
        var = b.var
        if not sinfo_equal(var.struct_info, new.struct_info):
            var = var.replace(struct_info=new.struct_info)
            self.var_remap[b.var] = var
        self.builder.emit_normalized(gx.VarBinding(var, new))
        value = self._new_value(var, b.var.struct_info, cur)
        self._note_exact_cast(value, new)
        self.values[b.var] = value

    def _bind_block_output(self, b: gx.VarBinding, new: gx.Expr, cur: DataType | None,
                           orig_dt: DataType) -> None:
        """An output of a dataflow block leaves it in its original dtype: the cast back is
        made inside the block (where fusion can merge it into its producer); consumers in the
        block may still use the low-precision value."""
        if isinstance(new, gx.Var):
            inner = new
        else:
            hint = f"{b.var.name}_{_short(_tensor_dtype(new.struct_info))}"
            inner = self.builder.emit(new, hint)
        inner_value = self._new_value(inner, b.var.struct_info, cur)
        self._note_exact_cast(inner_value, new)
        out = self.builder.normalize(_op.cast(inner, str(orig_dt)))
        self.builder.emit_normalized(gx.VarBinding(b.var, out))
        value = self._new_value(b.var, b.var.struct_info)
        self._add_rep(value, _tensor_dtype(inner.struct_info), inner)
        self.values[b.var] = value

    def _note_exact_cast(self, value: _Value, new: gx.Expr) -> None:
        """A widening cast's result remembers its exact narrow source (no cast pairs later)."""
        if not (isinstance(new, gx.Call) and isinstance(new.op, gx.Op)
                and new.op.name == "cast"):
            return
        src = new.args[0]
        src_dt, dst_dt = _tensor_dtype(src.struct_info), _tensor_dtype(new.struct_info)
        if src_dt is not None and (str(src_dt), str(dst_dt)) in _EXACT_WIDENING:
            self._add_rep(value, src_dt, src)

    def visit_MatchCast(self, b: gx.MatchCast) -> None:
        new = self._orig(b.value)
        if new is b.value:
            self.builder.emit_normalized(b)
        else:
            self.builder.emit_normalized(gx.MatchCast(b.var, new, b.struct_info))
        self.values[b.var] = self._new_value(b.var, b.var.struct_info)

    # ---- scopes -------------------------------------------------------------------------------
    def visit_DataflowBlock(self, b: gx.DataflowBlock) -> gx.BindingBlock:
        self._push()
        try:
            return self._rebuild_block(b, dataflow=True)
        finally:
            self._pop()

    def visit_with_new_scope(self, e: gx.Expr, params: tuple[gx.Var, ...] = ()) -> gx.Expr:
        self._push()
        try:
            if isinstance(e, gx.SeqExpr):
                return super().visit_with_new_scope(e, params)
            wrapped = gx.SeqExpr((), e)  # a bare branch: give it a SeqExpr to cast in
            new = super().visit_with_new_scope(wrapped, params)
            return e if new is wrapped else new
        finally:
            self._pop()

    def visit_SeqExpr(self, s: gx.SeqExpr) -> gx.Expr:
        blocks: list[gx.BindingBlock] = []
        changed = False
        for b in s.blocks:
            nb = self.visit_binding_block(b)
            changed |= nb is not b
            if nb.bindings:
                blocks.append(nb)
            else:
                changed |= bool(b.bindings)
        # results (of functions and branches) keep their original dtypes
        self.builder.begin_binding_block()
        body = self._orig(s.body)
        tail = self.builder.end_block()
        if tail.bindings:
            blocks.append(tail)
            changed = True
        if not changed and body is s.body:
            return s
        return self.builder.normalize(gx.SeqExpr(tuple(blocks), body))

    def visit_Function(self, f: gx.Function) -> gx.Expr:
        for p in f.params:
            self.values[p] = self._new_value(p, p.struct_info, free=True)
        body = self.visit_with_new_scope(f.body, f.params)
        if body is f.body:
            return f
        return self.builder.normalize(gx.Function(f.params, body, f.ret_struct_info, f.attrs))


def _policy_overrides(keep_fp32_ops: Iterable[str], low_precision_ops: Iterable[str]
                      ) -> dict[str, MixedPrecision]:
    known = set(list_ops())
    for what, names in (("keep_fp32_ops", keep_fp32_ops), ("low_precision_ops",
                                                           low_precision_ops)):
        if isinstance(names, str) or not all(isinstance(n, str) for n in names):
            raise KilnError(f"ToMixedPrecision: {what} must be a list of op names, got {names!r}")
    keep, low = tuple(keep_fp32_ops), tuple(low_precision_ops)
    for what, names in (("keep_fp32_ops", keep), ("low_precision_ops", low)):
        unknown = sorted(set(names) - known)
        if unknown:
            raise KilnError(f"ToMixedPrecision: {what} names unknown operator(s) {unknown}")
    both = sorted(set(keep) & set(low))
    if both:
        raise KilnError(f"ToMixedPrecision: {both} in both keep_fp32_ops and low_precision_ops")
    policies = {n: MixedPrecision.NEVER for n in keep}
    policies.update({n: MixedPrecision.ALWAYS for n in low})
    return policies


@function_pass(opt_level=0)
class ToMixedPrecision:
    """Compute float32 ops in float16/bfloat16 as each op's mixed-precision policy allows.

    ``out_dtype``: ``"float16"`` or ``"bfloat16"``. ``keep_fp32_ops``: op names treated as
    NEVER (they keep their original dtypes). ``low_precision_ops``: op names the user opts in
    to ALWAYS (e.g. ``"nn.layer_norm"``, ``"nn.softmax"``). ``accumulate_dtype``: what ops
    with an ``out_dtype`` attribute accumulate in (None: the low-precision type itself).
    """

    def __init__(self, out_dtype: str = "float16", keep_fp32_ops: Iterable[str] = (),
                 low_precision_ops: Iterable[str] = (),
                 accumulate_dtype: str | None = "float32"):
        if str(out_dtype) not in LOW_PRECISION_DTYPES:
            raise KilnError(f"ToMixedPrecision: out_dtype must be one of {LOW_PRECISION_DTYPES}, "
                            f"got {out_dtype!r}")
        self.out_dtype = as_dtype(str(out_dtype))
        self.accumulate_dtype = None if accumulate_dtype is None else as_dtype(accumulate_dtype)
        self.policies = _policy_overrides(keep_fp32_ops, low_precision_ops)

    def transform_function(self, func: gx.Function, mod: IRModule,
                           ctx: PassContext) -> gx.Function:
        conv = _Converter(mod, self.out_dtype, self.policies, self.accumulate_dtype)
        return conv.visit(func)
