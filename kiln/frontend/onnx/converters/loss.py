"""Loss ONNX operators: NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss.

Both are decomposed into kiln ops. The per-position gather ``x[n, target[n, d...], d...]`` is
written as a one-hot selection over the class axis: ``sum_c where(target == c, x[n, c], 0)``.
That is exact (one term is selected, the others are exact zeros), reads the input once like
the log-softmax before it already does, and fuses into one reduction kernel.

Semantics (the ONNX spec): positions whose target equals ``ignore_index`` contribute 0 and
have weight 0; ``weight[c]`` scales class ``c``; ``mean`` divides by the sum of the weights of
the positions counted (their number without ``weight``). A mean over no counted position is
0 / 0 = NaN, as in PyTorch. A target outside ``[0, C)`` that is not ``ignore_index`` is an
error at run time (the model raises, naming the node).
"""

from __future__ import annotations

from typing import Any

from .... import op
from ..registry import converter
from .common import along, dtype_of, iota, ndim_of, scalar, shape_of, static_int
from .dynamic import check_range


def class_mask(target: Any, num_classes: Any, ndim: int) -> Any:
    """bool ``(N, C, d...)``: ``target[n, d...] == c`` (class axis 1 of a rank-``ndim`` input)."""
    classes = along(iota(num_classes, dtype_of(target)), 1, ndim)
    return op.equal(op.expand_dims(target, 1), classes)


def _check_targets(ctx: Any, node: Any, target: Any, valid: Any, num_classes: Any) -> None:
    """Reject (at run time, naming the node) a target outside ``[0, C)`` that is not
    ``ignore_index``: the one-hot selection would silently give it a loss of 0. Checks the
    minimum and maximum only (two small reductions), not every element on the host."""
    c = static_int(num_classes)
    if c is None:
        return
    t = op.cast(target, "int64")
    if valid is not None:
        t = op.where(valid, t, scalar(0, "int64"))
    # a valid 0 appended keeps the extremes defined for an empty target
    t = ctx.emit(op.concat([op.reshape(t, (-1,)), op.reshape(scalar(0, "int64"), (1,))], axis=0))
    bounds = op.concat([op.reshape(op.min(t), (1,)), op.reshape(op.max(t), (1,))], axis=0)
    check_range(ctx, node, ctx.emit(bounds, f"{node.name}_target_bounds"), 0, c - 1, "target")


def nll_loss(ctx: Any, node: Any, logp: Any, target: Any, weight: Any) -> Any:
    """The NegativeLogLikelihoodLoss of log-probabilities ``logp`` (N, C, d...)."""
    if ndim_of(logp) < 2:
        raise node.error(f"input must have rank >= 2 (N, C, d...), got shape {shape_of(logp)}")
    if ndim_of(target) != ndim_of(logp) - 1:
        raise node.error(f"target must have rank {ndim_of(logp) - 1} (N, d...), got shape "
                         f"{shape_of(target)}")
    reduction = node.attr("reduction", "mean")
    if reduction not in ("none", "sum", "mean"):
        raise node.error(f"reduction must be 'none', 'sum' or 'mean', got {reduction!r}")
    dt, ndim = dtype_of(logp), ndim_of(logp)
    zero = scalar(0, dt)
    mask = class_mask(target, shape_of(logp)[1], ndim)
    loss = op.negative(op.sum(op.where(mask, logp, zero), axis=1))
    ignore = node.attr("ignore_index", None)
    valid = None
    if ignore is not None:
        valid = op.not_equal(target, scalar(int(ignore), dtype_of(target)))
        loss = op.where(valid, loss, zero)
    _check_targets(ctx, node, target, valid, shape_of(logp)[1])
    w = None
    if weight is not None:  # weight[target]; 0 for ignored (possibly out-of-range) targets
        w = op.sum(op.where(mask, along(weight, 1, ndim), zero), axis=1)
        if valid is not None:
            w = op.where(valid, w, zero)
        loss = op.multiply(loss, w)
    if reduction == "none":
        return loss
    total = op.sum(loss)
    if reduction == "sum":
        return total
    if w is not None:
        return op.divide(total, op.sum(w))
    if valid is not None:
        return op.divide(total, op.sum(op.cast(valid, dt)))
    return op.mean(loss)


@converter("NegativeLogLikelihoodLoss", since=12)
def negative_log_likelihood_loss(ctx: Any, node: Any) -> Any:
    return nll_loss(ctx, node, node.input(0), node.input(1), node.input(2))


@converter("SoftmaxCrossEntropyLoss", since=12)
def softmax_cross_entropy_loss(ctx: Any, node: Any) -> Any:
    scores = node.input(0)
    if ndim_of(scores) < 2:
        raise node.error(f"scores must have rank >= 2 (N, C, d...), got shape "
                         f"{shape_of(scores)}")
    log_prob = ctx.emit(op.nn.log_softmax(scores, axis=1), f"{node.name}_log_prob")
    loss = nll_loss(ctx, node, log_prob, node.input(1), node.input(2))
    return [loss, log_prob] if node.num_outputs > 1 else loss
