"""SimplifyExpr: algebraic identities and redundant data movement removed from graph functions.

Rewrites (each only when provably exact, see :func:`is_identity_constant`):

- ``x * 1``, ``1 * x``, ``x / 1``, ``x + 0``, ``0 + x``, ``x - 0`` -> ``x``: the constant must
  have x's dtype, consist only of the identity value, and broadcasting must not change x's shape
  (``x[4] + zeros[3, 4]`` is not ``x``). One deliberate liberty: ``x + 0.0`` is treated as
  ``x`` although IEEE gives ``+0.0`` for ``x = -0.0`` (the two zeros compare equal);
- ``reshape``/``squeeze``/``expand_dims``/``broadcast_to`` to the shape x already has -> ``x``;
- a reshape-like op (``reshape``, ``squeeze``, ``expand_dims``) of a reshape-like op -> one
  ``reshape`` of the original input (all three are row-major reinterpretations of the data);
- ``transpose(transpose(x, p1), p2)`` -> ``transpose(x, p1[p2])``, and a transpose with the
  identity permutation -> ``x``;
- ``cast(x, dtype)`` with x already of that dtype -> ``x``;
- ``negative(negative(x))`` -> ``x``.

A binding whose value became a variable is dropped and its uses read that variable (unless that
would let a DataflowVar escape its block: then ``gv = lv`` stays). Producers made dead by a
rewrite (the inner reshape) are left for DeadCodeElimination, which the pipelines run after.

:class:`RewriteMutator` is the shared engine of the rewriting passes (SimplifyExpr,
SimplifyInference, CanonicalizeOps, FastMath): subclasses implement ``rewrite(var, value)``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..graph import expr as gx
from ..graph.functor import ExprMutator
from ..graph.struct_info import TensorStructInfo, shapes_equal, sinfo_equal
from ..ir.errors import InternalError
from ..ir.module import IRModule
from ..op import registry
from ..tir import IntImm
from .pass_infra import PassContext, function_pass

__all__ = ["RewriteMutator", "SimplifyExpr", "is_identity_constant", "same_tensor_type"]

#: Rewrites applied to one binding before giving up (guards against rules that ping-pong).
MAX_REWRITES_PER_BINDING = 16


def same_tensor_type(a: Any, b: Any) -> bool:
    """Both tensors of the same dtype with provably equal, known shapes."""
    return (
        isinstance(a, TensorStructInfo) and isinstance(b, TensorStructInfo)
        and a.dtype == b.dtype and shapes_equal(a.shape, b.shape)
    )


def is_identity_constant(c: Any, value: float, dtype: Any) -> bool:
    """``c`` is a Constant of ``dtype`` whose every element equals ``value``."""
    if not isinstance(c, gx.Constant) or c.dtype != dtype or c.data.size == 0:
        return False
    return bool(np.all(c.data == np.asarray(value).astype(c.data.dtype)))


def call_op(name: str, args: Any, attrs: Any = None) -> gx.Call:
    """A call of registered op ``name`` (attrs given as the op's dataclass or None)."""
    return gx.Call(gx.Op(name), tuple(args), attrs)


def op_name(e: Any) -> str | None:
    """The operator name of an op call (None for anything else, including call_tir)."""
    if isinstance(e, gx.Call) and isinstance(e.op, gx.Op) and e.op.name != "call_tir":
        return e.op.name
    return None


class RewriteMutator(ExprMutator):
    """Visits every binding, asking :meth:`rewrite` for a replacement of its value.

    ``rewrite(var, value)`` sees the value with its arguments already rewritten and normalized;
    it returns a new expression (nested calls are emitted as their own bindings), a variable
    (the binding is dropped and uses are redirected) or None (keep). It is asked again about
    its own result, so rules compose. ``self.bound`` maps each variable emitted so far to its
    value, and :meth:`producer` looks through it.
    """

    def __init__(self, mod: Any = None):
        super().__init__(mod)
        self.bound: dict[gx.Var, gx.Expr] = {}

    def rewrite(self, var: gx.Var, value: gx.Expr) -> gx.Expr | None:
        return None

    def producer(self, e: gx.Expr) -> gx.Expr | None:
        """The value a variable is bound to in the function being rewritten (else None)."""
        return self.bound.get(e) if isinstance(e, gx.Var) else None

    def constant_of(self, e: gx.Expr) -> gx.Constant | None:
        """``e`` as a Constant, looking through variables bound to constants."""
        if isinstance(e, gx.Constant):
            return e
        p = self.producer(e)
        return p if isinstance(p, gx.Constant) else None

    def visit_VarBinding(self, b: gx.VarBinding) -> None:
        value = self.visit_expr(b.value)
        if value is not b.value:
            value = self.builder.normalize(value, anf=True)
        for _ in range(MAX_REWRITES_PER_BINDING):
            new = self.rewrite(b.var, value)
            if new is None or new is value:
                break
            value = self.builder.normalize(new, anf=True)
        if isinstance(value, gx.Var) and can_alias(b.var, value):
            self.var_remap[b.var] = value
            return
        var = self._def(b.var)
        if value is b.value and var is b.var:
            self.builder.emit_normalized(b)
            self.bound[b.var] = value
            return
        if value.struct_info is None:
            raise InternalError(f"binding of {b.var.name}: value has no struct_info")
        if not sinfo_equal(var.struct_info, value.struct_info):
            var = var.replace(struct_info=value.struct_info)
            self.var_remap[b.var] = var
        self.builder.emit_normalized(gx.VarBinding(var, value))
        self.bound[var] = value


def can_alias(old: gx.Var, new: gx.Var) -> bool:
    """Whether uses of ``old`` may read ``new`` instead (a DataflowVar must not escape its
    block, so a block output cannot become a DataflowVar)."""
    return not (isinstance(new, gx.DataflowVar) and not isinstance(old, gx.DataflowVar))


_ADDITIVE = {"add": (0.0, True), "subtract": (0.0, False)}
_MULTIPLICATIVE = {"multiply": (1.0, True), "divide": (1.0, False)}
_RESHAPE_LIKE = ("reshape", "squeeze", "expand_dims")


def _perm(call: gx.Call) -> tuple[int, ...] | None:
    sinfo = call.args[0].struct_info
    ndim = sinfo.ndim if isinstance(sinfo, TensorStructInfo) else -1
    if ndim < 0:
        return None
    axes = call.attrs.axes if call.attrs is not None else None
    if axes is None:
        return tuple(range(ndim - 1, -1, -1))
    return tuple(a % ndim for a in axes)


def _static_dims(shape: Any) -> tuple[Any, ...]:
    """Shape dims for a reshape attribute (constants as python ints, symbolic dims as is)."""
    return tuple(d.value if isinstance(d, IntImm) else d for d in shape)


class _Simplifier(RewriteMutator):
    def rewrite(self, var: gx.Var, value: gx.Expr) -> gx.Expr | None:
        name = op_name(value)
        if name is None:
            return None
        out = value.struct_info
        if name in _ADDITIVE or name in _MULTIPLICATIVE:
            ident, commutes = (_ADDITIVE | _MULTIPLICATIVE)[name]
            lhs, rhs = value.args
            if self._drops(rhs, lhs, ident, out):
                return lhs
            if commutes and self._drops(lhs, rhs, ident, out):
                return rhs
            return None
        x = value.args[0] if value.args else None
        if name == "cast":
            return x if same_tensor_type(x.struct_info, out) else None
        if name in (*_RESHAPE_LIKE, "broadcast_to") and same_tensor_type(x.struct_info, out):
            return x
        if name in _RESHAPE_LIKE and op_name(self.producer(x)) in _RESHAPE_LIKE:
            if isinstance(out, TensorStructInfo) and out.shape is not None:
                inner = self.producer(x).args[0]
                return call_op("reshape", [inner], registry.get_op_def("reshape").make_attrs(
                    _static_dims(out.shape)))
            return None
        if name == "transpose":
            perm = _perm(value)
            if perm is None:
                return None
            if perm == tuple(range(len(perm))):
                return x
            inner = self.producer(x)
            if op_name(inner) == "transpose":
                p1 = _perm(inner)
                if p1 is not None:
                    composed = tuple(p1[p] for p in perm)
                    attrs = registry.get_op_def("transpose").make_attrs(composed)
                    return call_op("transpose", [inner.args[0]], attrs)
            return None
        if name == "negative" and op_name(self.producer(x)) == "negative":
            return self.producer(x).args[0]
        return None

    def _drops(self, const: gx.Expr, other: gx.Expr, ident: float, out: Any) -> bool:
        """``other (op) const`` equals ``other`` (see the module docstring)."""
        c = self.constant_of(const)
        s = other.struct_info
        return (
            c is not None and isinstance(s, TensorStructInfo)
            and is_identity_constant(c, ident, s.dtype) and same_tensor_type(s, out)
        )


@function_pass(opt_level=1)
class SimplifyExpr:
    """Remove algebraic identities, no-op casts/reshapes and double transposes/negations."""

    def transform_function(self, func: gx.Function, mod: IRModule,
                           ctx: PassContext) -> gx.Function:
        return _Simplifier(mod).visit(func)
