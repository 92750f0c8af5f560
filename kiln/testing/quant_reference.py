"""A numpy model of a quantized graph (what ``kiln.quantize.QuantizeGraph`` produces), written
from the operators' specification (``kiln/op/quantize.py``) and numpy alone: no kiln kernel, TE
compute or NPU lowering is used, so a target that matches it bit for bit computes the scheme,
not merely what another kiln path computes.

Integer ops are exact (int64 arithmetic); the float ops a quantized graph keeps between
``qnn.dequantize`` and ``qnn.quantize`` (add, multiply, relu, max pooling, views) are single
IEEE float32 operations and hence exact too. Float ops whose result depends on the summation
order or on approximations (a float convolution, softmax, average pooling) are computed in
float64 and rounded once: close to, not bit-equal with, a target's result.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .. import graph as g
from ..ir.errors import KilnError
from ..ir.module import IRModule

__all__ = ["EXACT_OPS", "run_quantized_graph"]

F32 = np.float32


def _shape(var: Any) -> tuple[int, ...]:
    return tuple(int(getattr(d, "value", d)) for d in var.struct_info.shape)


def _quantize(call: Any, x: np.ndarray) -> np.ndarray:
    inv = F32(1.0 / call.attrs.scale)
    y = (x.astype(F32) * inv).astype(F32)
    return np.clip(np.rint(y), -128, 127).astype(np.int8)


def _dequantize(call: Any, q: np.ndarray) -> np.ndarray:
    return (q.astype(F32) * F32(call.attrs.scale)).astype(F32)


def _requantize(call: Any, acc: np.ndarray, bias: np.ndarray, mult: np.ndarray) -> np.ndarray:
    at = call.attrs
    shape = [1] * acc.ndim
    shape[at.axis % acc.ndim] = -1
    a = acc.astype(np.int64) + bias.astype(np.int64).reshape(shape)
    a = np.clip(a, -(2 ** 31), 2 ** 31 - 1)
    r = (a * mult.astype(np.int64).reshape(shape) + (1 << (at.shift - 1))) >> at.shift
    return np.clip(r, at.out_min, at.out_max).astype(np.int8)


def _is_int(*xs: np.ndarray) -> bool:
    return all(np.issubdtype(x.dtype, np.integer) for x in xs)


def _out_dtype(call: Any, x: np.ndarray) -> Any:
    return np.dtype(call.attrs.out_dtype or x.dtype)


def _conv2d(call: Any, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    at = call.attrs
    if at.data_layout != "NCHW" or at.kernel_layout != "OIHW":
        raise KilnError(f"quant_reference: conv2d layout {at.data_layout}/{at.kernel_layout}")
    exact = _is_int(x, w)
    wide = np.int64 if exact else np.float64
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    (sh, sw), (dh, dw) = at.strides, at.dilation
    pt, pl, pb, pr = at.padding
    xp = np.pad(x.astype(wide), ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    oh = (h + pt + pb - (kh - 1) * dh - 1) // sh + 1
    ow = (wd + pl + pr - (kw - 1) * dw - 1) // sw + 1
    groups = at.groups
    og = o // groups
    out = np.zeros((n, o, oh, ow), dtype=wide)
    for gi in range(groups):
        xs = xp[:, gi * cg:(gi + 1) * cg]
        ws = w[gi * og:(gi + 1) * og].astype(wide)
        for a in range(kh):
            for b in range(kw):
                tap = xs[:, :, a * dh:a * dh + (oh - 1) * sh + 1:sh,
                         b * dw:b * dw + (ow - 1) * sw + 1:sw]
                out[:, gi * og:(gi + 1) * og] += np.einsum("nchw,oc->nohw", tap, ws[:, :, a, b])
    return out.astype(_out_dtype(call, x))


def _product(call: Any, x: np.ndarray, w: np.ndarray, transpose: bool) -> np.ndarray:
    wide = np.int64 if _is_int(x, w) else np.float64
    wm = w.astype(wide)
    return np.matmul(x.astype(wide), wm.T if transpose else wm).astype(_out_dtype(call, x))


def _max_pool2d(call: Any, x: np.ndarray) -> np.ndarray:
    at = call.attrs
    if at.layout != "NCHW" or at.ceil_mode:
        raise KilnError("quant_reference: max_pool2d needs NCHW without ceil_mode")
    (kh, kw), (sh, sw), (dh, dw) = at.pool_size, at.strides, at.dilation
    pt, pl, pb, pr = at.padding
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)), constant_values=-np.inf)
    oh = (xp.shape[2] - (kh - 1) * dh - 1) // sh + 1
    ow = (xp.shape[3] - (kw - 1) * dw - 1) // sw + 1
    taps = [xp[:, :, a * dh:a * dh + (oh - 1) * sh + 1:sh, b * dw:b * dw + (ow - 1) * sw + 1:sw]
            for a in range(kh) for b in range(kw)]
    return np.max(np.stack(taps), axis=0)


def _axes(call: Any, x: np.ndarray) -> tuple[int, ...]:
    ax = call.attrs.axis
    return tuple(range(x.ndim)) if ax is None else \
        tuple(a % x.ndim for a in ((ax,) if isinstance(ax, int) else ax))


def _sum(call: Any, x: np.ndarray) -> np.ndarray:
    wide = np.int64 if _is_int(x) else np.float64
    s = np.sum(x.astype(wide), axis=_axes(call, x), keepdims=call.attrs.keepdims)
    if _is_int(x) and (s.min(initial=0) < np.iinfo(x.dtype).min or
                       s.max(initial=0) > np.iinfo(x.dtype).max):
        raise KilnError("quant_reference: an integer sum overflows its dtype (the targets "
                        "differ there: wrap vs saturation)")
    return s.astype(x.dtype)


def _softmax(call: Any, x: np.ndarray) -> np.ndarray:
    z = x.astype(np.float64)
    e = np.exp(z - z.max(axis=call.attrs.axis, keepdims=True))
    return (e / e.sum(axis=call.attrs.axis, keepdims=True)).astype(x.dtype)


def _binary(fn: Callable[[Any, Any], Any]) -> Callable[..., np.ndarray]:
    def run(call: Any, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.asarray(fn(a, b)).astype(np.result_type(a, b))
    return run


_OPS: dict[str, Callable[..., np.ndarray]] = {
    "qnn.quantize": _quantize,
    "qnn.dequantize": _dequantize,
    "qnn.requantize": _requantize,
    "nn.conv2d": _conv2d,
    "dense": lambda call, x, w: _product(call, x, w, True),
    "matmul": lambda call, x, w: _product(call, x, w, False),
    "cast": lambda call, x: x.astype(call.attrs.dtype),
    "sum": _sum,
    "add": _binary(np.add),
    "subtract": _binary(np.subtract),
    "multiply": _binary(np.multiply),
    "maximum": _binary(np.maximum),
    "minimum": _binary(np.minimum),
    "relu": lambda call, x: np.maximum(x, x.dtype.type(0)),
    "clip": lambda call, x: np.clip(x, -np.inf if call.attrs.min is None else call.attrs.min,
                                    np.inf if call.attrs.max is None else call.attrs.max
                                    ).astype(x.dtype),
    "nn.max_pool2d": _max_pool2d,
    "nn.softmax": _softmax,
    "mean": lambda call, x: np.mean(x.astype(np.float64), axis=_axes(call, x),
                                    keepdims=call.attrs.keepdims).astype(x.dtype),
}
#: The ops this model computes bit-exactly (the rest: float64, rounded once).
EXACT_OPS = ("qnn.quantize", "qnn.dequantize", "qnn.requantize", "cast", "sum", "add",
             "subtract", "multiply", "maximum", "minimum", "relu", "clip", "nn.max_pool2d",
             "reshape", "squeeze", "expand_dims", "nn.conv2d (integer)", "dense (integer)",
             "matmul (integer)")
_VIEWS = ("reshape", "squeeze", "expand_dims")


def run_quantized_graph(mod: IRModule, *inputs: np.ndarray) -> Any:
    """Run ``main`` of ``mod`` on ``inputs`` in numpy (see the module docstring); raises
    KilnError naming an op the model does not know."""
    main = mod["main"]
    env: dict[int, Any] = {}
    if len(inputs) != len(main.params):
        raise KilnError(f"quant_reference: main takes {len(main.params)} inputs, got "
                        f"{len(inputs)}")
    for p, x in zip(main.params, inputs):
        env[id(p)] = np.asarray(x)

    def value(e: Any) -> Any:
        if isinstance(e, g.Var):
            return env[id(e)]
        if isinstance(e, g.Constant):
            return np.asarray(e.data)
        if isinstance(e, g.Tuple):
            return tuple(value(f) for f in e.fields)
        raise KilnError(f"quant_reference: cannot evaluate {type(e).__name__}")

    for blk in main.body.blocks:
        for b in blk.bindings:
            v = b.value
            if isinstance(v, g.Call) and isinstance(v.op, g.Op):
                name = v.op.name
                args = [value(a) for a in v.args]
                if name in _VIEWS:
                    env[id(b.var)] = args[0].reshape(_shape(b.var))
                elif name in _OPS:
                    env[id(b.var)] = _OPS[name](v, *args)
                else:
                    raise KilnError(f"quant_reference: no numpy model of {name}")
            else:
                env[id(b.var)] = value(v)
    return value(main.body.body)
