"""Loss functions as graph code: emitted into a function being built, or as a whole function.

A loss turns a model's prediction and a target into one float scalar (shape ``()``), the mean
over the batch (the first axis). Each loss can

- ``emit(bb, prediction, target) -> Var``: emit its bindings into the function ``bb`` is
  building (so it composes with any model code), and
- ``function(prediction_sinfo) -> graph.Function``: be a standalone ``(prediction, target) ->
  loss`` graph function,

and :func:`attach_loss` composes one with a model function of an IRModule. Everything is made
of registered operators, so the gradient pass differentiates losses like any model code.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import graph as g
from .. import op
from ..graph.block_builder import BlockBuilder
from ..graph.struct_info import TensorStructInfo
from ..ir.dtype import as_dtype
from ..ir.errors import KilnError, StructInfoError
from ..ir.module import IRModule

__all__ = ["Loss", "MSELoss", "SoftmaxCrossEntropy", "attach_loss"]


def _static_shape(sinfo: Any, what: str) -> tuple[int, ...]:
    if not isinstance(sinfo, TensorStructInfo) or not sinfo.is_static:
        raise StructInfoError(f"{what} must be a tensor of static shape, got {sinfo}")
    return sinfo.static_shape()


def _float_dtype(sinfo: TensorStructInfo, what: str) -> str:
    dt = as_dtype(sinfo.dtype)
    if not dt.is_float:
        raise StructInfoError(f"{what} must be a float tensor, got dtype {dt}")
    return str(dt)


class Loss:
    """Base class: ``target_sinfo``, ``emit``; ``function`` comes for free."""

    #: name used for the target parameter of generated functions
    target_name = "y"

    def target_sinfo(self, prediction: TensorStructInfo) -> TensorStructInfo:
        """The StructInfo the target must have for a prediction of ``prediction``."""
        raise NotImplementedError

    def emit(self, bb: BlockBuilder, prediction: g.Expr, target: g.Expr) -> g.Var:
        """Emit the loss bindings; returns the var holding the scalar loss."""
        raise NotImplementedError

    def check_target(self, prediction: TensorStructInfo, target: Any) -> None:
        want = self.target_sinfo(prediction)
        got = target.struct_info
        ok = (isinstance(got, TensorStructInfo) and got.dtype == want.dtype
              and got.is_static and got.static_shape() == want.static_shape())
        if not ok:
            raise StructInfoError(
                f"{type(self).__name__}: target must be {want} for a prediction of "
                f"{prediction}, got {got}"
            )

    def function(self, prediction: TensorStructInfo, name: str = "loss") -> g.Function:
        """The standalone graph function ``(prediction, target) -> loss``."""
        pred = g.Var("prediction", prediction)
        target = g.Var(self.target_name, self.target_sinfo(prediction))
        bb = BlockBuilder()
        with bb.function(name, [pred, target]):
            with bb.dataflow():
                out = bb.emit_output(self.emit(bb, pred, target))
            bb.emit_func_output(out)
        return bb.get()[name]


class SoftmaxCrossEntropy(Loss):
    """``mean_n(-sum_c onehot[n, c] * log_softmax(logits)[n, c])`` for logits ``(N, C)``.

    ``labels="int64"``: the target is ``(N,)`` int64 class indices (an out-of-range index
    contributes 0 to the loss); ``labels="onehot"``: the target is ``(N, C)`` of the logits'
    dtype (any distribution over classes: soft labels work too).
    """

    def __init__(self, labels: str = "int64"):
        if labels not in ("int64", "onehot"):
            raise KilnError(f"SoftmaxCrossEntropy: labels must be 'int64' or 'onehot', "
                            f"got {labels!r}")
        self.labels = labels

    def _classes(self, prediction: TensorStructInfo) -> tuple[int, int, str]:
        shape = _static_shape(prediction, "SoftmaxCrossEntropy: logits")
        if len(shape) != 2:
            raise StructInfoError(
                f"SoftmaxCrossEntropy: logits must be (batch, classes), got shape {shape}")
        return shape[0], shape[1], _float_dtype(prediction, "SoftmaxCrossEntropy: logits")

    def target_sinfo(self, prediction: TensorStructInfo) -> TensorStructInfo:
        n, c, dtype = self._classes(prediction)
        if self.labels == "int64":
            return TensorStructInfo((n,), "int64")
        return TensorStructInfo((n, c), dtype)

    def emit(self, bb: BlockBuilder, prediction: g.Expr, target: g.Expr) -> g.Var:
        psinfo = prediction.struct_info
        n, c, dtype = self._classes(psinfo)
        self.check_target(psinfo, target)
        if self.labels == "int64":
            classes = g.const(np.arange(c, dtype=np.int64).reshape(1, c))
            hit = bb.emit(op.equal(op.expand_dims(target, 1), classes))
            onehot = bb.emit(op.cast(hit, dtype))
        else:
            onehot = target
        logp = bb.emit(op.nn.log_softmax(prediction, axis=-1))
        picked = bb.emit(op.sum(op.multiply(onehot, logp), axis=1))
        return bb.emit(op.negative(op.mean(picked)))


class MSELoss(Loss):
    """``mean((prediction - target) ** 2)`` over every element; target shaped like the
    prediction."""

    def target_sinfo(self, prediction: TensorStructInfo) -> TensorStructInfo:
        _static_shape(prediction, "MSELoss: prediction")
        _float_dtype(prediction, "MSELoss: prediction")
        return prediction

    def emit(self, bb: BlockBuilder, prediction: g.Expr, target: g.Expr) -> g.Var:
        self.check_target(prediction.struct_info, target)
        diff = bb.emit(op.subtract(prediction, target))
        return bb.emit(op.mean(op.multiply(diff, diff)))


def attach_loss(mod: IRModule, loss: Loss, func: str = "main",
                name: str | None = None) -> IRModule:
    """A copy of ``mod`` with function ``name`` (default ``"<func>_loss"``): ``func``'s
    parameters plus the target, returning ``loss(func(...), target)``.

    The model's bindings are copied into the new function (no call), so the gradient pass sees
    one flat function.
    """
    if func not in mod:
        raise KilnError(f"attach_loss: the module has no function {func!r}")
    model = mod[func]
    if not isinstance(model, g.Function):
        raise KilnError(f"attach_loss: {func!r} is not a graph function")
    name = name or f"{func}_loss"
    pred_sinfo = model.ret_struct_info
    if not isinstance(pred_sinfo, TensorStructInfo):
        raise StructInfoError(f"attach_loss: {func!r} must return one tensor, got {pred_sinfo}")
    params = [g.Var(p.name_hint, p.struct_info) for p in model.params]
    target = g.Var(loss.target_name, loss.target_sinfo(pred_sinfo))
    bb = BlockBuilder(mod)
    with bb.function(name, [*params, target]):
        with bb.dataflow():
            pred = emit_body(bb, model, params)
            out = bb.emit_output(loss.emit(bb, pred, target))
        bb.emit_func_output(out)
    return bb.get()


def emit_body(bb: BlockBuilder, func: g.Function, args: list[g.Expr]) -> g.Expr:
    """Emit the bindings of ``func`` into the current (dataflow) block with its parameters
    replaced by ``args``; returns the value of its body. Used to compose graph functions."""
    return _Copier(bb, dict(zip(func.params, args))).copy(func.body)


class _Copier(g.ExprMutator):
    """Re-emit a function body's bindings into another builder's current block."""

    def __init__(self, bb: BlockBuilder, remap: dict[Any, Any]):
        super().__init__(bb)
        self.var_remap.update(remap)

    def copy(self, body: g.SeqExpr) -> g.Expr:
        for block in body.blocks:
            for binding in block.bindings:
                if isinstance(binding, g.MatchCast):
                    raise KilnError("attach_loss: models with match_cast are not supported")
                value = self.visit(binding.value)
                self.var_remap[binding.var] = self.builder.emit(value, binding.var.name_hint)
        return self.visit(body.body)
