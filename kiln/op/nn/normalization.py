"""Normalizations: ``nn.layer_norm`` (OPAQUE: reductions and element-wise passes over the
normalized axes, scheduled like softmax's rows) and ``nn.batch_norm`` in inference form (plain
per-channel arithmetic, BROADCAST, so it fuses like any element-wise op).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ... import te, tir
from ...graph.shape_utils import normalize_axes, normalize_axis
from ...graph.struct_info import TensorStructInfo
from ...ir.dtype import DataType
from ...ir.errors import KilnError, StructInfoError
from ..common import assume, equal_dims, scalar, shape_attr
from ..elementwise import add, multiply, negative, rsqrt, subtract
from ..linalg import const_int, fmt_dim, fmt_shape, provably_unequal, tensor_arg
from ..reduce import mean
from ..reduce import sum as reduce_sum
from ..registry import MixedPrecision, OpPattern, register_op
from ..shape import reshape
from .softmax import ROW_AXES, drop_axes, row_compute_dtype
from .window import i64, set_frozen


@dataclass(frozen=True)
class LayerNormAttrs:
    """``axes``: the normalized axes (gamma and beta have their sizes); ``epsilon`` is added
    to the variance."""

    axes: Any = (-1,)
    epsilon: float = 1e-5

    def __post_init__(self):
        axes = self.axes
        if isinstance(axes, int) and not isinstance(axes, bool):
            axes = (axes,)
        if not isinstance(axes, Sequence) or not axes or not all(
            isinstance(a, int) and not isinstance(a, bool) for a in axes
        ):
            raise KilnError(f"nn.layer_norm: axes must be an int or a list of ints, got {axes!r}")
        set_frozen(self, "axes", tuple(int(a) for a in axes))
        set_frozen(self, "epsilon", float(self.epsilon))


def _infer_layer_norm(call: Any) -> Any:
    op = "nn.layer_norm"
    x = tensor_arg(call, 0, op, "data")
    gamma = tensor_arg(call, 1, op, "gamma")
    beta = tensor_arg(call, 2, op, "beta")
    if not x.dtype.is_float:
        raise StructInfoError(f"{op}: data must be a float tensor, got dtype {x.dtype}")
    for name, p in (("gamma", gamma), ("beta", beta)):
        if p.dtype != x.dtype:
            raise StructInfoError(f"{op}: {name} has dtype {p.dtype} but data has {x.dtype}")
    if x.ndim < 0:
        return TensorStructInfo(None, x.dtype)
    axes = normalize_axes(call.attrs.axes, x.ndim, op)
    for name, p in (("gamma", gamma), ("beta", beta)):
        if p.ndim >= 0 and p.ndim != len(axes):
            raise StructInfoError(
                f"{op}: {name} must have {len(axes)} dimension(s) (one per normalized axis), "
                f"got {p.ndim}"
            )
        if p.shape is not None and x.shape is not None:
            want = tuple(x.shape[a] for a in sorted(axes))
            if any(provably_unequal(a, b) for a, b in zip(p.shape, want)):
                raise StructInfoError(
                    f"{op}: {name} has shape {fmt_shape(p.shape)} but the normalized axes of "
                    f"data {fmt_shape(x.shape)} have {fmt_shape(want)}"
                )
    return TensorStructInfo(x.shape, x.dtype, x.ndim)


def _count(shape: Sequence[Any], axes: Sequence[int], dtype: DataType) -> Any:
    """Number of elements over ``axes`` as a ``dtype`` value."""
    static, symbolic = 1, []
    for a in axes:
        if const_int(shape[a]) is not None:
            static *= const_int(shape[a])
        else:
            symbolic.append(shape[a])
    if not symbolic:
        return tir.const(dtype, static)
    total = i64(static)
    for d in symbolic:
        total = total * d
    return tir.cast(dtype, total)


def _layer_norm_compute(x: Any, gamma: Any, beta: Any, *, attrs: LayerNormAttrs) -> Any:
    """Two passes over each group: the mean, then the mean squared deviation; then
    ``(x - mean) * rsqrt(var + eps) * gamma + beta``."""
    axes = sorted(a % x.ndim for a in attrs.axes)
    ct = row_compute_dtype(x.dtype)
    red_shape = drop_axes(x.shape, axes)
    inv_n = tir.const(ct, 1.0) / _count(x.shape, axes, ct)

    def full_index(i: Sequence[Any], ks: Sequence[Any]) -> tuple:
        it, kt = iter(i), iter(ks)
        return tuple(next(kt) if d in axes else next(it) for d in range(x.ndim))

    ks = [te.reduce_axis((0, x.shape[a]), name=f"k{a}") for a in axes]
    total = te.compute(
        red_shape, lambda *i: te.sum(tir.cast(ct, x[full_index(i, ks)]), axis=ks),
        name="layer_norm_sum",
    )
    ks2 = [te.reduce_axis((0, x.shape[a]), name=f"k{a}") for a in axes]

    def sq_body(*i):
        dev = tir.cast(ct, x[full_index(i, ks2)]) - total[i] * inv_n
        return te.sum(dev * dev, axis=ks2)

    sq = te.compute(red_shape, sq_body, name="layer_norm_sqsum")
    eps = tir.const(ct, attrs.epsilon)

    def body(*i):
        r = drop_axes(i, axes)
        p = tuple(i[a] for a in axes)
        norm = (tir.cast(ct, x[i]) - total[r] * inv_n) * tir.rsqrt(sq[r] * inv_n + eps)
        return tir.cast(x.dtype, norm * tir.cast(ct, gamma[p]) + tir.cast(ct, beta[p]))

    want = [x.shape[a] for a in axes]
    checks = equal_dims([(d, w, f"nn.layer_norm: {name} {fmt_shape(p.shape)} must have the "
                                f"shape {fmt_shape(want)} of the normalized axes")
                         for name, p in (("gamma", gamma), ("beta", beta))
                         for d, w in zip(p.shape, want)])
    return te.compute(x.shape, body, name="layer_norm",
                      attrs={ROW_AXES: tuple(axes)} | assume(checks))


def _layer_norm_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    """With ``xh = (x - mean) rstd`` and ``gh = g gamma``: ``dx = rstd (gh - mean(gh) -
    xh mean(gh xh))``, ``dgamma = sum(g xh)``, ``dbeta = sum(g)`` (sums over the other axes)."""
    x, gamma, _ = call.args
    xs = x.struct_info
    if xs.shape is None:
        raise KilnError("nn.layer_norm gradient: needs data of known shape")
    ndim = len(xs.shape)
    axes = tuple(sorted(a % ndim for a in call.attrs.axes))
    others = tuple(d for d in range(ndim) if d not in axes)
    g = output_grad
    mu = bb.emit(mean(x, axes, True))
    xc = bb.emit(subtract(x, mu))
    var = mean(multiply(xc, xc), axes, True)
    rstd = bb.emit(rsqrt(add(var, scalar(call.attrs.epsilon, xs.dtype))))
    xh = bb.emit(multiply(xc, rstd))
    gamma_b = gamma
    if axes != tuple(range(ndim - len(axes), ndim)):  # not trailing: place gamma's axes
        gamma_b = reshape(gamma, shape_attr(xs.shape[d] if d in axes else 1
                                            for d in range(ndim)))
    gh = bb.emit(multiply(g, gamma_b))
    dx = multiply(rstd, subtract(subtract(gh, mean(gh, axes, True)),
                                 multiply(xh, mean(multiply(gh, xh), axes, True))))
    dgamma = multiply(g, xh)
    dbeta = g
    if others:
        dgamma, dbeta = reduce_sum(dgamma, others), reduce_sum(dbeta, others)
    return [dx, dgamma, dbeta]


layer_norm = register_op(
    "nn.layer_norm",
    inputs=("data", "gamma", "beta"),
    attrs=LayerNormAttrs,
    infer=_infer_layer_norm,
    pattern=OpPattern.OPAQUE,
    compute=_layer_norm_compute,
    mixed_precision=MixedPrecision.NEVER,
    gradient=_layer_norm_grad,
    doc="Layer normalization over ``axes`` with scale ``gamma`` and shift ``beta``.",
)


@dataclass(frozen=True)
class BatchNormAttrs:
    """``axis``: the channel axis; ``epsilon`` is added to the variance."""

    axis: int = 1
    epsilon: float = 1e-5

    def __post_init__(self):
        if not isinstance(self.axis, int) or isinstance(self.axis, bool):
            raise KilnError(f"nn.batch_norm: axis must be an int, got {self.axis!r}")
        set_frozen(self, "epsilon", float(self.epsilon))


_BN_PARAMS = ("gamma", "beta", "moving_mean", "moving_var")


def _infer_batch_norm(call: Any) -> Any:
    op = "nn.batch_norm"
    x = tensor_arg(call, 0, op, "data")
    if not x.dtype.is_float:
        raise StructInfoError(f"{op}: data must be a float tensor, got dtype {x.dtype}")
    params = [tensor_arg(call, i + 1, op, n, ndim=1) for i, n in enumerate(_BN_PARAMS)]
    for name, p in zip(_BN_PARAMS, params):
        if p.dtype != x.dtype:
            raise StructInfoError(f"{op}: {name} has dtype {p.dtype} but data has {x.dtype}")
    if x.ndim < 0:
        return TensorStructInfo(None, x.dtype)
    axis = normalize_axis(call.attrs.axis, x.ndim, op)
    if x.shape is not None:
        c = x.shape[axis]
        for name, p in zip(_BN_PARAMS, params):
            if p.shape is not None and provably_unequal(p.shape[0], c):
                raise StructInfoError(
                    f"{op}: {name} has {fmt_dim(p.shape[0])} elements but data "
                    f"{fmt_shape(x.shape)} has {fmt_dim(c)} channels on axis {axis}"
                )
    return TensorStructInfo(x.shape, x.dtype, x.ndim)


def _batch_norm_compute(x: Any, gamma: Any, beta: Any, mean: Any, var: Any, *,
                        attrs: BatchNormAttrs) -> Any:
    """``(x - mean[c]) * gamma[c] / sqrt(var[c] + eps) + beta[c]`` along the channel axis."""
    axis = attrs.axis % x.ndim
    ct = row_compute_dtype(x.dtype)
    eps = tir.const(ct, attrs.epsilon)

    def body(*i):
        c = i[axis]

        def p(t: Any) -> Any:
            return tir.cast(ct, t[c])

        scale = p(gamma) * tir.rsqrt(p(var) + eps)
        return tir.cast(x.dtype, (tir.cast(ct, x[i]) - p(mean)) * scale + p(beta))

    checks = equal_dims([(t.shape[0], x.shape[axis], f"nn.batch_norm: {name} has "
                          f"{fmt_dim(t.shape[0])} elements but data has {fmt_dim(x.shape[axis])} "
                          f"channels") for name, t in zip(_BN_PARAMS, (gamma, beta, mean, var))])
    return te.compute(x.shape, body, name="batch_norm", attrs=assume(checks))


def _batch_norm_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    """Inference batch norm ``y = (x - m) gamma rstd + beta`` with ``rstd = (v + eps)^-1/2``
    per channel: ``dx = g gamma rstd``, ``dgamma = sum(g (x - m)) rstd``, ``dbeta = sum(g)``,
    ``dm = -sum(g) gamma rstd``, ``dv = -sum(g (x - m)) gamma rstd^3 / 2``."""
    x, gamma, _, m, v = call.args
    xs = x.struct_info
    if xs.ndim < 0:
        raise KilnError("nn.batch_norm gradient: needs data of known rank")
    ndim = xs.ndim
    axis = call.attrs.axis % ndim
    others = tuple(d for d in range(ndim) if d != axis)

    def chan(t: Any) -> Any:  # a per-channel vector broadcast along the channel axis
        trailing = ndim - axis - 1
        return reshape(t, (-1,) + (1,) * trailing) if trailing else t

    g = output_grad
    rstd = bb.emit(rsqrt(add(v, scalar(call.attrs.epsilon, xs.dtype))))
    scale = bb.emit(multiply(gamma, rstd))
    dx = multiply(g, chan(scale))
    sg = bb.emit(reduce_sum(g, others) if others else g)
    sgx = bb.emit(reduce_sum(multiply(g, subtract(x, chan(m))), others) if others
                  else multiply(g, subtract(x, m)))
    dgamma = multiply(sgx, rstd)
    dmean = negative(multiply(sg, scale))
    dvar = multiply(multiply(sgx, scale), multiply(multiply(rstd, rstd),
                                                   scalar(-0.5, xs.dtype)))
    return [dx, dgamma, sg, dmean, dvar]


batch_norm = register_op(
    "nn.batch_norm",
    inputs=("data", *_BN_PARAMS),
    attrs=BatchNormAttrs,
    infer=_infer_batch_norm,
    pattern=OpPattern.BROADCAST,
    compute=_batch_norm_compute,
    mixed_precision=MixedPrecision.FOLLOW,
    gradient=_batch_norm_grad,
    doc="Batch normalization in inference form: normalizes with the given moving statistics "
    "(no batch statistics are computed or updated) and returns only the normalized tensor.",
)
