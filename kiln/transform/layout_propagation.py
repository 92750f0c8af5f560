"""Layout propagation: the engine behind ConvertLayout and AlterOpLayout.

A pass built on it says, for each op call, whether to compute it in other layouts (a
:class:`~kiln.op.layout.LayoutRewrite`: the layouts its inputs are needed in, the layout of
its new result, how to build the new call). The engine then rewrites a graph function so that

- the chosen ops get their inputs in the layouts they asked for: a ``layout_transform`` is
  inserted for a variable, and a constant is transformed at compile time (numpy, exact; once
  per constant, however many calls read it); the hooks see a variable bound to a constant as
  that Constant;
- ops that do not care about the layout *follow* an input that is already in a new layout
  instead of forcing it back: element-wise ops (any ``ELEMWISE`` op), broadcasting ops without
  attributes (``add``, ``multiply``, ``where``...; a broadcast constant such as a per-channel
  bias is transformed at compile time, another variable gets a ``layout_transform``),
  ``nn.batch_norm`` (its channel axis moves; not when the channels are split into blocks) and
  the pooling ops (their ``layout`` attribute changes);
- every other op (reshape, dense, softmax...) gets its inputs back in their original layout:
  ``layout_transform`` ops appear only at such boundaries, and at the outputs of dataflow
  blocks, which keep their original StructInfo.

The rewriting is done in one walk over each dataflow block. Every value of the original
function is a *logical tensor*; the engine remembers, per logical tensor, the variables that
hold it in each layout it has been materialized in (``versions``), and creates a version only
when an op needs it, from any existing one (layout transforms compose: NHWC -> NCHW8c is one
transform). So a transform and its inverse never both appear: the second use finds the
original version. An explicit ``layout_transform`` of the input graph joins its input's
logical tensor the same way, which removes inverse pairs left by earlier passes.

Only dataflow blocks are rewritten (they are pure, and their DataflowVars cannot be seen
outside, so the new layouts stay local).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from ..graph import expr as gx
from ..graph.functor import ExprMutator
from ..graph.struct_info import TensorStructInfo, shapes_equal, sinfo_equal
from ..ir.errors import InternalError, KilnError
from ..op.layout import Layout, LayoutRewrite, layout_transform, transform_array, transform_shape
from ..op.registry import OpPattern, get_op_def

__all__ = ["LayoutRewriter", "POOL_OPS"]

#: Pooling ops with a ``layout`` attribute (they follow any layout with unsplit H and W).
POOL_OPS = ("nn.max_pool2d", "nn.avg_pool2d", "nn.adaptive_avg_pool2d",
            "nn.adaptive_max_pool2d")

Decide = Callable[[gx.Call], "LayoutRewrite | None"]


class _Value:
    """What the new function has for one variable of the original function.

    ``layout``: the layout of the original value (None while unknown); ``versions``: the
    variables holding its logical tensor, by layout (shared by all variables of one logical
    tensor); ``plain``: the new expression of the value as it was, when its layout is unknown;
    ``primary``: the layout the value was computed in (ops following layouts adopt it, even
    when the original layout was also made for some other consumer).
    """

    __slots__ = ("layout", "plain", "primary", "versions")

    def __init__(self, versions: dict[str, gx.Expr], layout: str | None,
                 plain: gx.Expr | None = None, primary: str | None = None):
        self.versions = versions
        self.layout = layout
        self.plain = plain
        self.primary = primary


def _ndim(e: gx.Expr) -> int:
    s = e.struct_info
    return s.ndim if isinstance(s, TensorStructInfo) else -1


def _shape(e: gx.Expr) -> Any:
    s = e.struct_info
    return s.shape if isinstance(s, TensorStructInfo) else None


def _transformable(e: gx.Expr, src: str, dst: str) -> bool:
    """Whether a value of ``e``'s type can be moved from ``src`` to ``dst`` exactly."""
    shape = _shape(e)
    if shape is None or len(shape) != Layout(src).ndim or not Layout(src).same_axes(
            Layout(dst)):
        return False
    try:
        transform_shape(shape, src, dst)
    except KilnError:
        return False
    return True


class LayoutRewriter(ExprMutator):
    """Rewrites one graph function (see the module docstring); ``decide(call)`` returns a
    LayoutRewrite for the calls to move to other layouts, else None."""

    def __init__(self, mod: Any, decide: Decide):
        super().__init__(mod)
        self.decide = decide
        self.values: dict[gx.Var, _Value] = {}
        self.constants: dict[gx.Var, gx.Constant] = {}
        self._const_cache: dict[tuple[int, str, str], gx.Constant] = {}
        self._in_dataflow = False

    # ---- variables ---------------------------------------------------------------------------
    def visit_Var(self, v: gx.Var) -> gx.Expr:
        val = self.values.get(v)
        if val is None:
            return super().visit_Var(v)
        return self._base(val)

    def _base(self, val: _Value) -> gx.Expr:
        """The new expression holding the original value as it was (made on demand)."""
        if val.layout is None:
            return val.plain
        found = val.versions.get(val.layout)
        return found if found is not None else self._make_version(val.versions, val.layout)

    def _make_version(self, versions: dict[str, gx.Expr], layout: str) -> gx.Expr:
        if not versions:
            raise InternalError(f"layout propagation: no version to make {layout} from")
        src_layout, src = next(iter(versions.items()))
        new = self.builder.emit(layout_transform(src, src_layout, layout))
        versions[layout] = new
        return new

    def _value_of(self, v: gx.Var) -> _Value:
        val = self.values.get(v)
        if val is None:
            val = _Value({}, None, super().visit_Var(v))
            self.values[v] = val
        return val

    def _constant(self, e: gx.Expr) -> gx.Constant | None:
        if isinstance(e, gx.Constant):
            return e
        return self.constants.get(e) if isinstance(e, gx.Var) else None

    def _constants_shown(self, call: gx.Call) -> gx.Call:
        """``call`` as the layout hooks see it: arguments bound to constants are the Constants
        (a weight FoldConstant made is a variable bound to one, read by every time step of an
        unrolled RNN), so a hook that packs constant weights at compile time recognizes it."""
        args = tuple(self.constants.get(a, a) if isinstance(a, gx.Var) else a
                     for a in call.args)
        if all(x is y for x, y in zip(args, call.args)):
            return call
        return call.replace(args=args, struct_info=call.struct_info)

    def _get(self, arg: gx.Expr, declared: str, want: str) -> gx.Expr:
        """``arg`` (whose original value is in layout ``declared``) in layout ``want``."""
        const = self._constant(arg)
        if const is not None:
            if declared == want:
                return const
            key = (id(const), declared, want)
            if key not in self._const_cache:
                data = transform_array(const.data, declared, want)
                self._const_cache[key] = gx.Constant(data)
            return self._const_cache[key]
        if not isinstance(arg, gx.Var):
            new = self.visit_expr(arg)
            return new if declared == want else self.builder.emit(
                layout_transform(new, declared, want))
        val = self._value_of(arg)
        if val.layout is None:
            val.layout = declared
            val.versions[declared] = val.plain
        if val.layout != declared:  # read in another layout by another op: transform as is
            base = self._base(val)
            return base if declared == want else self.builder.emit(
                layout_transform(base, declared, want))
        found = val.versions.get(want)
        return found if found is not None else self._make_version(val.versions, want)

    def _preferred(self, call: gx.Call) -> tuple[str, str] | None:
        """``(original layout, new layout)`` of the first argument computed in a new layout
        (an op following layouts adopts it), else None."""
        for a in call.args:
            val = self.values.get(a) if isinstance(a, gx.Var) else None
            if val is None or val.layout is None or val.primary in (None, val.layout):
                continue
            if val.primary in val.versions:
                return val.layout, val.primary
        return None

    # ---- blocks and bindings --------------------------------------------------------------------
    def visit_DataflowBlock(self, b: gx.DataflowBlock) -> gx.BindingBlock:
        self._in_dataflow = True
        try:
            return super().visit_DataflowBlock(b)
        finally:
            self._in_dataflow = False
            self._forget_dataflow_vars()

    def _forget_dataflow_vars(self) -> None:
        """DataflowVars are gone once their block ends: drop them from every version table."""
        seen: set[int] = set()
        for val in self.values.values():
            if id(val.versions) in seen:
                continue
            seen.add(id(val.versions))
            for layout in [k for k, e in val.versions.items() if isinstance(e, gx.DataflowVar)]:
                del val.versions[layout]

    def visit_VarBinding(self, b: gx.VarBinding) -> None:
        if isinstance(b.value, gx.Constant):
            self.constants[b.var] = b.value
        call = b.value
        if (not self._in_dataflow or not isinstance(call, gx.Call)
                or not isinstance(call.op, gx.Op) or call.op.name == "call_tir"
                or not isinstance(call.struct_info, TensorStructInfo)):
            super().visit_VarBinding(b)
            return
        if call.op.name == "layout_transform" and self._explicit_transform(b, call):
            return
        req = self.decide(self._constants_shown(call))
        if req is not None and self._rewrite(b, call, req):
            return
        pref = self._preferred(call)
        if pref is not None and self._follow(b, call, *pref):
            return
        super().visit_VarBinding(b)

    # ---- rewriting a decided op -----------------------------------------------------------------
    def _rewrite(self, b: gx.VarBinding, call: gx.Call, req: LayoutRewrite) -> bool:
        if len(req.inputs) != len(call.args):
            raise InternalError(f"{call.op.name}: the layout request has {len(req.inputs)} "
                                f"inputs for {len(call.args)} arguments")
        for a, spec in zip(call.args, req.inputs):
            if spec is not None and not _transformable(a, *spec):
                return False
        if not _transformable(call, *req.output):
            return False
        args = [self.visit_expr(a) if spec is None else self._get(a, *spec)
                for a, spec in zip(call.args, req.inputs)]
        new = self.builder.normalize(req.build(*args), anf=True)
        self._bind(b, call, new, *req.output)
        return True

    def _bind(self, b: gx.VarBinding, call: gx.Call, new: gx.Call, orig: str,
              layout: str) -> None:
        """Bind ``new`` (``call`` computed in ``layout``; the original is in ``orig``)."""
        want = transform_shape(_shape(call), orig, layout)
        if not shapes_equal(_shape(new), want) or new.struct_info.dtype != call.struct_info.dtype:
            raise InternalError(
                f"{call.op.name}: the call rewritten to {layout} gives {new.struct_info}, "
                f"expected shape {want} (binding {b.var.name})"
            )
        if layout == orig:
            self._emit_as(b.var, new)
            return
        versions: dict[str, gx.Expr] = {}
        output = not isinstance(b.var, gx.DataflowVar)
        var = self.builder.emit(new, name_hint="" if output else b.var.name)
        versions[layout] = var
        if output:  # a block output keeps its original layout
            back = self.builder.normalize(layout_transform(var, layout, orig))
            versions[orig] = self._emit_as(b.var, back)
        self.values[b.var] = _Value(versions, orig, primary=layout)

    def _emit_as(self, old: gx.Var, value: gx.Expr) -> gx.Var:
        var = old
        if not sinfo_equal(old.struct_info, value.struct_info):
            var = old.replace(struct_info=value.struct_info)
            self.var_remap[old] = var
        self.builder.emit_normalized(gx.VarBinding(var, value))
        return var

    def _explicit_transform(self, b: gx.VarBinding, call: gx.Call) -> bool:
        """``y = layout_transform(x, S, D)``: y joins x's logical tensor in layout D."""
        x = call.args[0]
        src, dst = call.attrs.src_layout, call.attrs.dst_layout
        if not isinstance(x, gx.Var) or self._constant(x) is not None:
            return False
        val = self._value_of(x)
        if val.layout is None:
            val.layout = src
            val.versions[src] = val.plain
        if val.layout != src:
            return False
        found = val.versions.get(dst)
        if isinstance(b.var, gx.DataflowVar):
            if found is None:
                found = self._make_version(val.versions, dst)
            self.values[b.var] = _Value(val.versions, dst, primary=val.primary)
            return True
        if found is None:
            src_layout, source = next(iter(val.versions.items()))
            value = self.builder.normalize(call.replace(
                args=(source,), attrs=dataclasses.replace(call.attrs, src_layout=src_layout)))
        else:
            value = found
        val.versions[dst] = self._emit_as(b.var, value)
        self.values[b.var] = _Value(val.versions, dst, primary=val.primary)
        return True

    # ---- ops following a layout -----------------------------------------------------------------
    def _follow(self, b: gx.VarBinding, call: gx.Call, orig: str, layout: str) -> bool:
        plan = self._follow_plan(call, orig, layout)
        if plan is None:
            return False
        arg_plans, attrs = plan
        args = []
        for a, how in zip(call.args, arg_plans):
            args.append(self.visit_expr(a) if how is None else self._get(a, orig, layout))
        new = self.builder.normalize(call.replace(args=tuple(args), attrs=attrs), anf=True)
        self._bind(b, call, new, orig, layout)
        return True

    def _follow_plan(self, call: gx.Call, orig: str, layout: str) -> Any:
        """``(per argument: None to keep it or True to move it, new attrs)`` when ``call`` can
        be computed in ``layout`` instead of ``orig``; else None."""
        name = call.op.name
        opdef = get_op_def(name)
        ndim = Layout(orig).ndim
        if _ndim(call) != ndim or not _transformable(call, orig, layout):
            return None
        if name == "nn.batch_norm":
            letter = Layout(orig).axes[call.attrs.axis % ndim][0]
            if Layout(layout).factor(letter) is not None or not self._movable(
                    call.args[0], orig, layout):
                return None
            attrs = dataclasses.replace(call.attrs, axis=Layout(layout).index(letter))
            return [True] + [None] * (len(call.args) - 1), attrs
        if name in POOL_OPS:
            lay = Layout(layout)
            if call.attrs.layout != orig or lay.factor("H") or lay.factor("W"):
                return None
            if not self._movable(call.args[0], orig, layout):
                return None
            return [True], dataclasses.replace(call.attrs, layout=layout)
        elementwise = opdef.pattern == OpPattern.ELEMWISE or (
            opdef.pattern == OpPattern.BROADCAST and call.attrs is None)
        if not elementwise:
            return None
        plans: list[Any] = []
        for a in call.args:
            if _ndim(a) == 0:
                plans.append(None)
            elif not self._movable(a, orig, layout):
                return None
            else:
                plans.append(True)
        return plans, call.attrs

    def _movable(self, a: gx.Expr, orig: str, layout: str) -> bool:
        """Whether argument ``a`` (read as being in ``orig``) can be had in ``layout``."""
        const = self._constant(a)
        if const is not None:
            if const.data.ndim > Layout(orig).ndim:
                return False
            try:
                transform_array(const.data, orig, layout)
            except KilnError:
                return False
            return True
        if isinstance(a, gx.Var):
            val = self.values.get(a)
            if val is not None and val.layout is not None and val.layout != orig:
                return False
        return _transformable(a, orig, layout)
