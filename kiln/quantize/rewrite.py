"""QuantizeGraph: rewrite a calibrated float graph into int8 compute (the scheme of
:mod:`.scheme`, the operators of :mod:`kiln.op.quantize`).

``main`` is walked in order. A **quantized layer** is a product with a constant weight --
``nn.conv2d`` (NCHW/OIHW; groups 1 or depthwise), ``dense``, ``matmul`` with a 2-D right
operand -- and the epilogue that follows it, each step the only use of the previous one:
``multiply`` / ``add`` by per-output-channel constants (a folded batch norm, a bias) and a final
``relu`` or ``clip`` (ReLU6). The per-channel affine part is folded into the weights and an
int32 bias, the activation clamp into the requantization's ``out_min``/``out_max``, and the
layer becomes::

    acc = conv2d/dense/matmul(q_x: int8, q_w: int8, out_dtype="int32")   # int32 accumulation
    q_y = qnn.requantize(acc, q_bias, multiplier, shift, axis, out_min, out_max)   # int8

(a depthwise one too; the NPU's vector unit widens its operands to int32, its tensor unit
takes them as they are). A global
average pool (``mean`` over trailing axes, ``nn.adaptive_avg_pool2d`` to 1x1) becomes an int32
``sum`` of the int8 values and a requantization by ``scale_x / (n * scale_y)``, so it is exact
on every target. Views (reshape, squeeze, expand_dims) pass int8 values through. Every other op
runs as it was, in float32: its operands are dequantized where they exist only in int8
(``qnn.dequantize``, made once and shared), and a float value that a quantized layer consumes
is quantized with that tensor's calibrated scale (``qnn.quantize``, shared too). The function's
results are float32 as before.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .. import graph as g
from .. import op
from ..ir.module import IRModule
from ..transform.pass_infra import PassContext, module_pass
from .calibrate import Calibration
from .scheme import QuantizationError, fixed_point, quantize_bias, quantize_weight

__all__ = ["QUANTIZED_OPS", "QuantizeGraph"]

#: Products QuantizeGraph computes in int8.
QUANTIZED_OPS = ("nn.conv2d", "dense", "matmul")
_VIEWS = ("reshape", "squeeze", "expand_dims")


def _shape(e: Any) -> tuple[int, ...]:
    return tuple(int(getattr(d, "value", d)) for d in e.struct_info.shape)


def _dtype(e: Any) -> str:
    return str(getattr(e.struct_info, "dtype", ""))


def _name(call: Any) -> str:
    return call.op.name if isinstance(call, g.Call) and isinstance(call.op, g.Op) else ""


@dataclass
class _Layer:
    """A product and its folded epilogue: ``y = scale[c] * (x (*) W)[c] + bias[c]``, clamped to
    ``[lo, hi]`` (real values), ``end`` the last binding it covers (exclusive)."""

    call: g.Call
    axis: int  # the output's channel axis
    w_axis: int  # the weight's output-channel axis
    channels: int
    scale: np.ndarray
    bias: np.ndarray
    lo: float | None
    hi: float | None
    out: g.Var
    end: int


def _channel_vector(value: np.ndarray, out_shape: tuple[int, ...], axis: int, n: int
                    ) -> np.ndarray | None:
    """A constant operand as one value per channel (``axis`` of the result), if it is one."""
    v = np.asarray(value, dtype=np.float64)
    if v.ndim > len(out_shape):
        return None
    shape = (1,) * (len(out_shape) - v.ndim) + v.shape
    if any(d != 1 for i, d in enumerate(shape) if i != axis) or shape[axis] not in (1, n):
        return None
    return np.broadcast_to(v.reshape(-1), (n,)).copy()


def _inline_constants(call: Any, consts: dict[int, g.Constant]) -> Any:
    """``call`` with operands bound to constants replaced by the constants."""
    if not isinstance(call, g.Call) or not any(id(a) in consts for a in call.args):
        return call
    return g.Call(call.op, tuple(consts.get(id(a), a) for a in call.args), call.attrs)


def _layer_start(b: g.VarBinding) -> _Layer | None:
    call = b.value
    name = _name(call)
    if name not in QUANTIZED_OPS or len(call.args) != 2 or \
            not isinstance(call.args[1], g.Constant) or _dtype(call.args[0]) != "float32" or \
            _dtype(b.var) != "float32":
        return None
    w = np.asarray(call.args[1].data)
    out_shape = _shape(b.var)
    if name == "nn.conv2d":
        at = call.attrs
        if at.data_layout != "NCHW" or at.kernel_layout != "OIHW":
            return None
        cin = _shape(call.args[0])[1]
        if at.groups != 1 and not (at.groups == cin == w.shape[0] and w.shape[1] == 1):
            return None
        axis, w_axis = 1, 0
    elif name == "dense":
        axis, w_axis = len(out_shape) - 1, 0
    else:
        if w.ndim != 2:
            return None
        axis, w_axis = len(out_shape) - 1, 1
    n = w.shape[w_axis]
    return _Layer(call, axis, w_axis, n, np.ones(n), np.zeros(n), None, None, b.var, 0)


def _clamp_layer(layer: _Layer, lo: float | None, hi: float | None) -> None:
    """Narrow the layer's output clamp to ``[lo, hi]`` (None: open)."""
    if lo is not None:
        layer.lo = lo if layer.lo is None else max(layer.lo, lo)
    if hi is not None:
        layer.hi = hi if layer.hi is None else min(layer.hi, hi)


def _find_layer(bindings: list[Any], i: int, uses: dict[int, int]) -> _Layer | None:
    """The quantized layer starting at binding ``i`` (constants inlined), if any."""
    layer = _layer_start(bindings[i])
    if layer is None:
        return None
    j = i + 1
    prev = bindings[i].var
    out_shape = _shape(prev)
    while j < len(bindings) and uses.get(id(prev)) == 1:
        b = bindings[j]
        call, name = b.value, _name(b.value)
        if not (isinstance(call, g.Call) and call.args and call.args[0] is prev and
                _dtype(b.var) == "float32" and _shape(b.var) == out_shape):
            break
        const = np.asarray(call.args[1].data, np.float64) if len(call.args) == 2 and \
            isinstance(call.args[1], g.Constant) else None
        clamped = layer.lo is not None or layer.hi is not None
        if name in ("multiply", "add") and const is not None and not clamped:
            v = _channel_vector(const, out_shape, layer.axis, layer.channels)
            if v is None:
                break
            if name == "multiply":
                layer.scale, layer.bias = layer.scale * v, layer.bias * v
            else:
                layer.bias = layer.bias + v
        elif name == "relu":
            layer.lo = max(layer.lo if layer.lo is not None else 0.0, 0.0)
        elif name == "clip":
            _clamp_layer(layer, call.attrs.min, call.attrs.max)
        elif name in ("maximum", "minimum") and const is not None and const.size == 1:
            c = float(const.reshape(-1)[0])
            _clamp_layer(layer, c if name == "maximum" else None,
                         c if name == "minimum" else None)
        else:
            break
        prev = b.var
        j += 1
    layer.out, layer.end = prev, j
    return layer


def _clamp(lo: float | None, hi: float | None, scale: float) -> tuple[int, int]:
    qlo = -128 if lo is None else int(np.clip(np.rint(lo / scale), -128, 127))
    qhi = 127 if hi is None else int(np.clip(np.rint(hi / scale), -128, 127))
    if qlo > qhi:
        raise QuantizationError(f"clip range [{lo}, {hi}] is empty at scale {scale}")
    return qlo, qhi


class _Rewriter:
    def __init__(self, calib: Calibration, skip: set[str]):
        self.calib = calib
        self.skip = skip
        self.bb = g.BlockBuilder()
        self.f32: dict[int, Any] = {}  # original var -> its float32 value in the new graph
        self.q8: dict[int, tuple[Any, float]] = {}  # original var -> (int8 value, scale)
        self.orig: dict[int, Any] = {}

    # ---- values --------------------------------------------------------------------------
    def float_of(self, e: Any) -> Any:
        if not isinstance(e, g.Var):
            return e if not isinstance(e, (g.Tuple, g.Call)) else self.sub(e)
        if id(e) not in self.f32:
            q, s = self.q8[id(e)]
            self.f32[id(e)] = self.bb.emit(op.qnn_dequantize(q, s), f"{e.name_hint}_f32")
        return self.f32[id(e)]

    def output(self, e: g.Var) -> Any:
        """A result of the function, float32 (dequantized as it leaves the dataflow block)."""
        if id(e) in self.f32:
            return self.bb.emit_output(self.f32[id(e)])
        q, s = self.q8[id(e)]
        return self.bb.emit_output(op.qnn_dequantize(q, s), e.name_hint)

    def int8_of(self, e: Any) -> tuple[Any, float]:
        if not isinstance(e, g.Var):
            raise QuantizationError("a quantized layer's input must be a graph value")
        if id(e) not in self.q8:
            s = self.calib.scale(e)
            q = self.bb.emit(op.qnn_quantize(self.float_of(e), s), f"{e.name_hint}_q")
            self.q8[id(e)] = (q, s)
        return self.q8[id(e)]

    def sub(self, e: Any) -> Any:
        if isinstance(e, g.Var):
            return self.float_of(e)
        if isinstance(e, g.Call):
            return g.Call(e.op, tuple(self.sub(a) for a in e.args), e.attrs)
        if isinstance(e, g.Tuple):
            return g.Tuple(tuple(self.sub(f) for f in e.fields))
        if isinstance(e, g.TupleGetItem):
            return g.TupleGetItem(self.sub(e.tuple_value), e.index)
        return e

    # ---- rewrites ------------------------------------------------------------------------
    def layer(self, ly: _Layer) -> None:
        call = ly.call
        qx, sx = self.int8_of(call.args[0])
        sy = self.calib.scale(ly.out)
        w = np.asarray(call.args[1].data, dtype=np.float64)
        wshape = [1] * w.ndim
        wshape[ly.w_axis] = -1
        q_w, sw = quantize_weight(w * ly.scale.reshape(wshape), ly.w_axis)
        acc_scale = sx * sw
        q_b = quantize_bias(ly.bias, acc_scale)
        mult, shift = fixed_point(acc_scale / sy)
        name = _name(call)
        if name == "nn.conv2d":
            # a depthwise one too: int8 x int8 -> int32, which a target widens where its
            # MACs need it (the NPU's vector unit; its tensor unit takes int8 as it is)
            acc = g.Call(call.op, (qx, g.const(q_w)), replace(call.attrs, out_dtype="int32"))
        else:
            acc = g.Call(call.op, (qx, g.const(q_w)), replace(call.attrs, out_dtype="int32"))
        acc_v = self.bb.emit(acc, f"{ly.out.name_hint}_acc")
        lo, hi = _clamp(ly.lo, ly.hi, sy)
        q = self.bb.emit(op.qnn_requantize(acc_v, g.const(q_b), g.const(mult), shift=shift,
                                           axis=ly.axis, out_min=lo, out_max=hi),
                         f"{ly.out.name_hint}_q")
        self.q8[id(ly.out)] = (q, sy)

    def global_pool(self, b: g.VarBinding) -> bool:
        """A global average pool as an int32 sum and a requantization; False if ``b`` is not
        one."""
        call, name = b.value, _name(b.value)
        if name not in ("mean", "nn.adaptive_avg_pool2d") or "avg_pool" in self.skip or \
                _dtype(b.var) != "float32" or not isinstance(call.args[0], g.Var):
            return False
        shape = _shape(call.args[0])
        rank = len(shape)
        if name == "mean":
            ax = call.attrs.axis
            axes = list(range(rank)) if ax is None else \
                sorted(a % rank for a in ((ax,) if isinstance(ax, int) else ax))
            keep = call.attrs.keepdims
        else:
            if call.attrs.layout != "NCHW" or _shape(b.var)[2:] != (1, 1):
                return False
            axes, keep = [2, 3], True
        if not axes or axes != list(range(rank - len(axes), rank)):
            return False
        qx, sx = self.int8_of(call.args[0])
        sy = self.calib.scale(b.var)
        n = int(np.prod([shape[a] for a in axes]))
        mult, shift = fixed_point(np.array([sx / (n * sy)]))
        x32 = self.bb.emit(op.cast(qx, "int32"), f"{b.var.name_hint}_x32")
        s = self.bb.emit(op.sum(x32, axis=tuple(axes), keepdims=keep), f"{b.var.name_hint}_sum")
        q = self.bb.emit(op.qnn_requantize(s, g.const(np.zeros(1, np.int32)), g.const(mult),
                                           shift=shift, axis=0), f"{b.var.name_hint}_q")
        self.q8[id(b.var)] = (q, sy)
        return True

    def binding(self, b: g.VarBinding) -> None:
        v = b.value
        name = _name(v)
        if name in _VIEWS and isinstance(v.args[0], g.Var) and id(v.args[0]) in self.q8:
            q, s = self.q8[id(v.args[0])]
            args = (q, *(self.sub(a) for a in v.args[1:]))
            self.q8[id(b.var)] = (self.bb.emit(g.Call(v.op, args, v.attrs), b.var.name_hint), s)
            return
        if self.global_pool(b):
            return
        self.f32[id(b.var)] = self.bb.emit(self.sub(v), b.var.name_hint)


@module_pass(opt_level=0)
class QuantizeGraph:
    """Rewrite ``main`` of a calibrated module (``calibration.mod``) to int8 compute (see the
    module docstring). ``skip_ops``: op names to leave in float32 (``"nn.conv2d"``, ``"dense"``,
    ``"matmul"``, ``"avg_pool"`` for the global pools)."""

    def __init__(self, calibration: Calibration, skip_ops: Iterable[str] = ()):
        self.calibration = calibration
        self.skip = set(skip_ops)

    def transform_module(self, mod: IRModule, ctx: PassContext) -> IRModule:
        main = mod["main"]
        if not isinstance(main, g.Function) or not isinstance(main.body, g.SeqExpr):
            raise QuantizationError("QuantizeGraph needs a graph function 'main'")
        bindings = [b for blk in main.body.blocks for b in blk.bindings]
        for b in bindings:
            if not isinstance(b, g.VarBinding):
                raise QuantizationError(f"QuantizeGraph: {type(b).__name__} bindings are not "
                                        "supported")
        # operands bound to constants (a frontend's bias variables) are inlined: the
        # epilogue's constants are then operands of its calls, its bindings consecutive
        consts = {id(b.var): b.value for b in bindings if isinstance(b.value, g.Constant)}
        body = main.body.body
        outs = list(body.fields) if isinstance(body, g.Tuple) else [body]
        bindings = [b if id(b.var) not in consts or any(o is b.var for o in outs) else None
                    for b in bindings]
        bindings = [g.VarBinding(b.var, _inline_constants(b.value, consts))
                    for b in bindings if b is not None]
        uses = g.binding_uses(main)
        rw = _Rewriter(self.calibration, self.skip)
        params = [g.Var(p.name_hint, p.struct_info) for p in main.params]
        for p, new in zip(main.params, params):
            rw.f32[id(p)] = new
        with rw.bb.function("main", params):
            with rw.bb.dataflow():
                i = 0
                while i < len(bindings):
                    ly = None if _name(bindings[i].value) in self.skip else \
                        _find_layer(bindings, i, uses)
                    if ly is not None:
                        rw.layer(ly)
                        i = ly.end
                        continue
                    rw.binding(bindings[i])
                    i += 1
                res = [rw.output(o) if isinstance(o, g.Var) else o for o in outs]
            rw.bb.emit_func_output(g.Tuple(tuple(res)) if isinstance(body, g.Tuple) else res[0])
        return mod.with_function("main", rw.bb.get()["main"])
