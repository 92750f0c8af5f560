"""PreProcess: split op calls the NPU has no lowering for into calls it has (the first step of
the NPU's partitioning, before :class:`~.annotate_target.AnnotateTarget`).

A model's activation the NPU lacks (SiLU/swish in every modern CNN and LLM block, GELU in
every transformer) otherwise sends the element-wise tail of each layer to the CPU, splitting
every NPU region in two with a DRAM round trip and a host step between. Each of those ops is
a short formula of ops the NPU does run, so PreProcess rewrites the call into that formula --
the *same* formula the op's own compute (``kiln/op/elementwise.py``) evaluates, so the result
is the op's up to the rounding of the NPU's units for the pieces:

- ``silu(x)`` -> ``x * sigmoid(x)``;
- ``gelu(x)`` -> ``(x * 0.5) * (1 + erf(x * (1 / sqrt 2)))``, and with ``approximate="tanh"``
  ``(x * 0.5) * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x * x * x)))``;
- ``power(x, c)`` with a scalar constant exponent that does not broadcast ``x``: ``c = 1`` ->
  ``x``, ``2`` -> ``x * x``, ``3`` -> ``x * x * x``, ``0.5`` -> ``sqrt(x)``, ``-0.5`` ->
  ``rsqrt(x)``, ``-1`` -> ``1 / x`` (IEEE ``pow`` and these agree except for the sign of
  ``sqrt(-0)`` and ``pow(-inf, 0.5) = inf`` against ``sqrt(-inf) = nan``);
- ``mean(x, axis)`` and ``sum(x, axis)`` over axes that are not the trailing ones (the NPU's
  row kernels reduce contiguous rows) -> the same reduction of ``transpose(x, kept axes then
  reduced axes)`` over its trailing axes,
  reshaped back when ``keepdims``: the same sum in another order (float rounding only), one
  DMA transpose kernel instead of a round trip through the CPU.

Only float32 calls are rewritten (the formulas above round each step in the tensor's type;
the ops compute a narrower float in float32). A rewrite is taken only when the NPU accepts
*every* call of the formula (:func:`~kiln.schedule.npu.lowering.lowering_rejection`, the
check AnnotateTarget applies) and the original call itself is rejected; otherwise the call is
left for AnnotateTarget to send to the CPU. Ops not rewritten, on purpose: ``nn.log_softmax``
(``log(softmax(x))`` is -inf where the probability underflows, for logits 88 apart in float32,
where the op is finite), reductions the NPU lacks (``max``, ``min``, ``prod``: no formula of
supported ops), comparisons and ``where`` (no NPU lowering of any of the pieces).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ... import graph as g
from ...graph import const
from ...graph.struct_info import TensorStructInfo
from ...ir.module import IRModule
from ...op.registry import get_op_def
from ...schedule.npu.emit import DramTensor
from ...schedule.npu.lowering import LOWERING_KEY, NotSupported, lowering_rejection
from ...schedule.npu.region import VIEW_OPS, static_tensor
from ...target.npu import NPUConfig, load_config
from ..pass_infra import PassContext, module_pass
from ..simplify_expr import RewriteMutator, call_op, op_name, same_tensor_type
from .common import main_function

__all__ = ["PreProcess", "POWER_FORMS", "REWRITTEN", "decompose"]

_SQRT_HALF = 1.0 / math.sqrt(2.0)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)

#: The ops PreProcess may rewrite.
REWRITTEN = ("silu", "gelu", "power", "mean", "sum")

#: Constant exponent -> how ``power(x, c)`` is written with supported ops.
POWER_FORMS: dict[float, Any] = {
    1.0: lambda x: x,
    2.0: lambda x: call_op("multiply", [x, x]),
    3.0: lambda x: call_op("multiply", [call_op("multiply", [x, x]), x]),
    0.5: lambda x: call_op("sqrt", [x]),
    -0.5: lambda x: call_op("rsqrt", [x]),
    -1.0: lambda x: call_op("divide", [const(np.float32(1.0)), x]),
}


def _c(v: float) -> g.Constant:
    return const(np.float32(v))


def _gelu(x: g.Expr, approximate: str) -> g.Expr:
    half_x = call_op("multiply", [x, _c(0.5)])
    if approximate == "tanh":
        cube = call_op("multiply", [call_op("multiply", [x, x]), x])
        inner = call_op("add", [x, call_op("multiply", [cube, _c(0.044715)])])
        t = call_op("tanh", [call_op("multiply", [inner, _c(_SQRT_2_OVER_PI)])])
        return call_op("multiply", [half_x, call_op("add", [t, _c(1.0)])])
    e = call_op("erf", [call_op("multiply", [x, _c(_SQRT_HALF)])])
    return call_op("multiply", [half_x, call_op("add", [e, _c(1.0)])])


def _reduce_trailing(call: g.Call, xs: TensorStructInfo) -> g.Expr | None:
    """``mean``/``sum`` over non-trailing axes as the same reduction over the trailing axes
    of a transpose."""
    name = op_name(call) or ""
    out = call.struct_info
    if xs.shape is None or not isinstance(out, TensorStructInfo) or out.shape is None:
        return None
    rank = len(xs.shape)
    axis = call.attrs.axis
    axes = list(range(rank)) if axis is None else sorted(
        {a % rank for a in ((axis,) if isinstance(axis, int) else axis)})
    k = len(axes)
    if not axes or axes == list(range(rank - k, rank)):
        return None  # trailing already: nothing to rewrite
    perm = tuple(d for d in range(rank) if d not in axes) + tuple(axes)
    t = call_op("transpose", [call.args[0]], get_op_def("transpose").make_attrs(axes=perm))
    m = call_op(name, [t], get_op_def(name).make_attrs(
        axis=tuple(range(rank - k, rank)), keepdims=False))
    if call.attrs.keepdims:
        m = call_op("reshape", [m], get_op_def("reshape").make_attrs(shape=tuple(out.shape)))
    return m


def decompose(call: g.Call, constant_of: Any = None) -> g.Expr | None:
    """``call`` written with ops the NPU lowers (see the module docstring), nested; None when
    it is not one PreProcess rewrites. ``constant_of(e)``: ``e`` as a Constant or None."""
    name = op_name(call)
    if name not in REWRITTEN:
        return None
    x = call.args[0]
    xs = x.struct_info
    if not isinstance(xs, TensorStructInfo) or str(xs.dtype) != "float32":
        return None
    if name in ("mean", "sum"):
        return _reduce_trailing(call, xs)
    if name == "silu":
        return call_op("multiply", [x, call_op("sigmoid", [x])])
    if name == "gelu":
        return _gelu(x, call.attrs.approximate if call.attrs is not None else "none")
    c = (constant_of or (lambda e: e if isinstance(e, g.Constant) else None))(call.args[1])
    if c is None or np.asarray(c.data).size != 1 or not same_tensor_type(xs, call.struct_info):
        return None
    form = POWER_FORMS.get(float(np.asarray(c.data).reshape(())))
    return None if form is None else form(x)


def _probe(e: Any) -> Any:
    """An operand as a lowering gets it in the probe (see ``AnnotateTarget``)."""
    if isinstance(e, g.Constant):
        return np.asarray(e.data)
    return DramTensor(0, *static_tensor(e))


class _PreProcessor(RewriteMutator):
    def __init__(self, mod: IRModule, config: NPUConfig, double_buffer: bool, route: Any):
        super().__init__(mod)
        self.config, self.double_buffer, self.route = config, double_buffer, route
        #: binding name -> the ops its call was split into
        self.rewritten: dict[str, str] = {}

    def _rejected(self, call: g.Call) -> str | None:
        try:
            if op_name(call) in VIEW_OPS:  # a DRAM alias of its operand, as AnnotateTarget
                # takes it (its operand is a variable once the formula is emitted)
                static_tensor(call)
                return None
            return lowering_rejection(self.config, call, [_probe(a) for a in call.args],
                                      static_tensor(call), self.double_buffer, self.route)
        except NotSupported as err:
            return str(err)

    def _all_accepted(self, expr: g.Expr) -> bool:
        """Whether the NPU lowers every call of the (normalized, nested) ``expr``."""
        if not isinstance(expr, g.Call):
            return True
        return all(self._all_accepted(a) for a in expr.args) and self._rejected(expr) is None

    def rewrite(self, var: g.Var, value: g.Expr) -> g.Expr | None:
        if not isinstance(value, g.Call) or op_name(value) not in REWRITTEN:
            return None
        new = decompose(value, self.constant_of)
        if new is None or self._rejected(value) is None:
            return None
        if isinstance(new, g.Call):
            new = self.builder.normalize(new)  # infer the pieces' types, emit nothing
            if not self._all_accepted(new):
                return None
        self.rewritten[var.name_hint] = op_name(value) or ""
        return new


#: Attribute of ``main`` recording PreProcess's rewrites: binding name -> the op it split.
PREPROCESS_ATTR = "npu.preprocess"


@module_pass(opt_level=0)
class PreProcess:
    """Rewrite op calls of ``main`` the NPU rejects into formulas of calls it accepts (see the
    module docstring); ``hw`` and ``double_buffer`` as for AnnotateTarget (the probe is the
    same). The rewritten bindings are recorded as main's ``"npu.preprocess"`` attribute."""

    def __init__(self, hw: str | NPUConfig = "default", double_buffer: bool = True):
        self.config = hw if isinstance(hw, NPUConfig) else load_config(hw)
        self.double_buffer = double_buffer

    def transform_module(self, mod: IRModule, ctx: PassContext) -> IRModule:
        main = main_function(mod, "PreProcess")
        p = _PreProcessor(mod, self.config, self.double_buffer,
                          PassContext.current().get_config(LOWERING_KEY))
        new = p.visit(main)
        if not p.rewritten:
            return mod
        return mod.with_function("main", new.with_attr(PREPROCESS_ATTR, p.rewritten))


__all__ += ["PREPROCESS_ATTR"]
