"""Recurrent ONNX operators: RNN, GRU, LSTM.

kiln has no loop construct in its graph IR, so a recurrent layer is unrolled over its (static)
sequence length into per-step graph ops: the input projection of every step is one matmul
(``X @ W^T + Wb`` for the whole sequence), each step then adds ``H_{t-1} @ R^T + Rb``, applies
the gate activations and updates the state. ``sequence_lens`` is honoured with masks: a batch
entry past its length keeps its state and outputs zeros -- which is also exactly the reverse
direction's semantics (it starts at ``len - 1``), so one rule serves both directions.

Gate order follows ONNX: LSTM ``i, o, f, c`` (peepholes ``P = [Pi, Po, Pf]``), GRU ``z, r, h``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .... import op
from ..registry import converter
from .common import dtype_of, scalar, shape_of, static_int
from .control_flow import MAX_UNROLL
from .elementwise import softplus_of

Act = Callable[[Any], Any]

# (default alpha, default beta) per activation that takes them
_ACT_DEFAULTS = {
    "affine": (1.0, 0.0), "leakyrelu": (0.01, None), "thresholdedrelu": (1.0, None),
    "scaledtanh": (1.0, 1.0), "hardsigmoid": (0.2, 0.5), "elu": (1.0, None),
}


def _activation(node: Any, name: str, alpha: float | None, beta: float | None, dt: str) -> Act:
    """The ONNX activation ``name`` as a function on graph exprs of dtype ``dt``."""
    key = name.lower()
    da, db = _ACT_DEFAULTS.get(key, (None, None))
    a = da if alpha is None else alpha
    b = db if beta is None else beta

    def s(v: float) -> Any:
        return scalar(v, dt)

    table: dict[str, Act] = {
        "sigmoid": op.sigmoid,
        "tanh": op.tanh,
        "relu": op.relu,
        "affine": lambda x: op.add(op.multiply(x, s(a)), s(b)),
        "leakyrelu": lambda x: op.where(op.less(x, s(0)), op.multiply(x, s(a)), x),
        "thresholdedrelu": lambda x: op.where(op.greater(x, s(a)), x, s(0)),
        "scaledtanh": lambda x: op.multiply(s(a), op.tanh(op.multiply(x, s(b)))),
        "hardsigmoid": lambda x: op.clip(op.add(op.multiply(x, s(a)), s(b)), 0.0, 1.0),
        "elu": lambda x: op.where(op.greater(x, s(0)), x,
                                  op.multiply(s(a), op.subtract(op.exp(x), s(1)))),
        "softsign": lambda x: op.divide(x, op.add(op.abs(x), s(1))),
        "softplus": lambda x: softplus_of(x, dtype_of(x)),
    }
    if key not in table:
        raise node.error(f"unsupported activation {name!r}")
    return table[key]


def _activations(node: Any, defaults: list[str], num_dirs: int, dt: str) -> list[list[Act]]:
    """Per direction, the activation functions (ONNX lists forward's then reverse's)."""
    names = node.attr("activations", None)
    names = [n.decode() if isinstance(n, bytes) else n for n in names] if names else None
    alphas = list(node.attr("activation_alpha", None) or [])
    betas = list(node.attr("activation_beta", None) or [])
    k = len(defaults)
    if names is None:
        names = defaults * num_dirs
    elif len(names) == k and num_dirs == 2:
        names = names * 2
    if len(names) != k * num_dirs:
        raise node.error(f"expected {k * num_dirs} activations, got {len(names)}")
    acts = []
    for i, name in enumerate(names):
        alpha = alphas[i] if i < len(alphas) else None
        beta = betas[i] if i < len(betas) else None
        acts.append(_activation(node, name, alpha, beta, dt))
    return [acts[d * k:(d + 1) * k] for d in range(num_dirs)]


class _Layer:
    """The inputs of one recurrent node, normalized to time-major layout."""

    def __init__(self, ctx: Any, node: Any, gates: int):
        self.ctx, self.node = ctx, node
        x = node.input(0)
        if int(node.attr("layout", 0)) == 1:
            x = ctx.emit(op.transpose(x, (1, 0, 2)))
        self.x = x
        self.dt = dtype_of(x)
        shape = ctx.shape(x)
        seq = static_int(shape[0])
        if seq is None:
            raise node.error("the sequence length is symbolic; recurrent layers are unrolled "
                             "and need a static sequence length")
        if seq > MAX_UNROLL:
            raise node.error(f"{seq} time steps exceed the unrolling limit {MAX_UNROLL}")
        self.seq_len, self.batch = seq, shape[1]
        direction = node.attr("direction", "forward")
        if direction not in ("forward", "reverse", "bidirectional"):
            raise node.error(f"unknown direction {direction!r}")
        self.direction = direction
        self.num_dirs = 2 if direction == "bidirectional" else 1
        self.gates = gates
        self.hidden = self._hidden_size()
        clip = node.attr("clip", None)
        self.clip = None if clip is None else float(clip)
        self.mask = self._masks()

    def _hidden_size(self) -> int:
        """``hidden_size``, or the one ``W`` (num_directions, gates * hidden, input) implies;
        the weights' shapes must agree with it and with the directions."""
        node = self.node
        dims = [static_int(d) for d in shape_of(node.input(1))] if node.has_input(1) else []
        rdims = [static_int(d) for d in shape_of(node.input(2))] if node.has_input(2) else []
        if len(dims) != 3 or len(rdims) != 3 or None in dims[:2] or None in rdims:
            raise node.error("W and R must be 3-D with static dims (num_directions, gates * "
                             f"hidden_size, ...), got {dims} and {rdims}")
        given = node.attr("hidden_size", None)
        hidden = int(given) if given is not None else dims[1] // self.gates
        want = [self.num_dirs, self.gates * hidden]
        if hidden < 1 or dims[:2] != want or rdims != [*want, hidden]:
            raise node.error(f"W {dims} and R {rdims} do not fit {self.num_dirs} direction(s) "
                             f"of {self.gates} gates of hidden_size {hidden}")
        return hidden

    def dir_input(self, i: int, d: int) -> Any:
        """Input ``i`` (W, R, B, initial state...) of direction ``d`` with that axis dropped,
        or None when absent."""
        v = self.node.input(i)
        if v is None:
            return None
        return op.squeeze(op.strided_slice(v, (d,), (d + 1,), None, (0,)), axis=(0,))

    def initial(self, i: int, d: int) -> Any:
        v = self.node.input(i)
        if v is None:
            return self.ctx.emit(op.broadcast_to(scalar(0, self.dt), (self.batch, self.hidden)))
        if int(self.node.attr("layout", 0)) == 1:
            v = op.transpose(v, (1, 0, 2))
        return self.ctx.emit(op.squeeze(op.strided_slice(v, (d,), (d + 1,), None, (0,)),
                                        axis=(0,)))

    def _masks(self) -> list[Any] | None:
        """Per step, a [batch, 1] bool mask of the entries still inside their sequence; None
        when ``sequence_lens`` is absent or covers every step."""
        if not self.node.has_input(4):
            return None
        const = self.node.const_value(4)
        if const is not None and np.all(np.asarray(const) >= self.seq_len):
            return None
        lens = op.reshape(op.cast(self.node.input(4), "int64"), (self.batch, 1))
        lens = self.ctx.emit(lens)
        return [self.ctx.emit(op.less(scalar(t, "int64"), lens)) for t in range(self.seq_len)]

    def projected_inputs(self, d: int, bias: Any) -> list[Any]:
        """Per step, ``X_t @ W^T (+ Wb)`` of direction ``d``: shape [batch, gates*hidden]."""
        w = self.ctx.emit(op.transpose(self.dir_input(1, d), (1, 0)))
        xw = op.matmul(self.x, w)
        if bias is not None:
            xw = op.add(xw, bias)
        xw = self.ctx.emit(xw)
        return [self.ctx.emit(op.squeeze(op.strided_slice(xw, (t,), (t + 1,), None, (0,)),
                                         axis=(0,)))
                for t in range(self.seq_len)]

    def biases(self, d: int) -> tuple[Any, Any]:
        """(Wb, Rb) of direction ``d``, or (None, None) without ``B``."""
        b = self.dir_input(3, d)
        if b is None:
            return None, None
        gh = self.gates * self.hidden
        wb = self.ctx.emit(op.strided_slice(b, (0,), (gh,), None, (0,)))
        rb = self.ctx.emit(op.strided_slice(b, (gh,), (2 * gh,), None, (0,)))
        return wb, rb

    def steps(self, d: int) -> list[int]:
        forward = self.direction == "forward" or (self.direction == "bidirectional" and d == 0)
        return list(range(self.seq_len)) if forward else list(range(self.seq_len - 1, -1, -1))

    def clipped(self, x: Any) -> Any:
        if self.clip is None:
            return x
        return op.clip(x, -self.clip, self.clip)

    def gate(self, x: Any, k: int, n: int = 1) -> Any:
        """Gate block ``k`` (``n`` blocks wide) of a [batch, gates*hidden] tensor."""
        h = self.hidden
        return op.strided_slice(x, (k * h,), ((k + n) * h,), None, (1,))

    def masked(self, t: int, new: Any, old: Any) -> Any:
        if self.mask is None:
            return new
        return op.where(self.mask[t], new, old)

    def output(self, t: int, h: Any) -> Any:
        if self.mask is None:
            return h
        return op.where(self.mask[t], h, scalar(0, self.dt))

    def assemble(self, ys: list[list[Any]], finals: list[list[Any]]) -> list[Any]:
        """ONNX outputs from per-direction per-time-step outputs ``ys[d][t]`` ([batch, hidden])
        and per-direction final states ``finals[d] = [h, (c)]``."""
        layout = int(self.node.attr("layout", 0))
        per_dir = [op.concat([op.expand_dims(y, (0,)) for y in ys_d], axis=0) for ys_d in ys]
        y = op.concat([op.expand_dims(p, (1,)) for p in per_dir], axis=1)  # [T, D, B, H]
        outs = [op.transpose(y, (2, 0, 1, 3)) if layout == 1 else y]
        for k in range(len(finals[0])):
            s = op.concat([op.expand_dims(f[k], (0,)) for f in finals], axis=0)  # [D, B, H]
            outs.append(op.transpose(s, (1, 0, 2)) if layout == 1 else s)
        return outs


def _recurrence(ctx: Any, h: Any, r_t: Any, rb: Any) -> Any:
    """``h @ R^T (+ Rb)``."""
    hr = op.matmul(h, r_t)
    return hr if rb is None else op.add(hr, rb)


@converter("RNN", since=7)
def rnn(ctx: Any, node: Any) -> Any:
    layer = _Layer(ctx, node, gates=1)
    acts = _activations(node, ["Tanh"], layer.num_dirs, layer.dt)
    ys, finals = [], []
    for d in range(layer.num_dirs):
        (f,) = acts[d]
        wb, rb = layer.biases(d)
        xs = layer.projected_inputs(d, wb)
        r_t = ctx.emit(op.transpose(layer.dir_input(2, d), (1, 0)))
        h = layer.initial(5, d)
        y = [None] * layer.seq_len
        for t in layer.steps(d):
            new = ctx.emit(f(layer.clipped(op.add(xs[t], _recurrence(ctx, h, r_t, rb)))))
            y[t] = ctx.emit(layer.output(t, new)) if layer.mask else new
            h = ctx.emit(layer.masked(t, new, h)) if layer.mask else new
        ys.append(y)
        finals.append([h])
    return layer.assemble(ys, finals)


@converter("GRU", since=7)
def gru(ctx: Any, node: Any) -> Any:
    layer = _Layer(ctx, node, gates=3)
    lbr = int(node.attr("linear_before_reset", 0))
    acts = _activations(node, ["Sigmoid", "Tanh"], layer.num_dirs, layer.dt)
    one = scalar(1, layer.dt)
    ys, finals = [], []
    for d in range(layer.num_dirs):
        f, g = acts[d]
        wb, rb = layer.biases(d)
        xs = layer.projected_inputs(d, wb)
        r_t = ctx.emit(op.transpose(layer.dir_input(2, d), (1, 0)))  # [H, 3H]
        hid = layer.hidden
        r_zr = ctx.emit(op.strided_slice(r_t, (0,), (2 * hid,), None, (1,)))
        r_h = ctx.emit(op.strided_slice(r_t, (2 * hid,), (3 * hid,), None, (1,)))
        rb_zr = rb_h = None
        if rb is not None:
            rb_zr = ctx.emit(layer.gate(op.expand_dims(rb, (0,)), 0, 2))
            rb_h = ctx.emit(layer.gate(op.expand_dims(rb, (0,)), 2))
        h = layer.initial(5, d)
        y = [None] * layer.seq_len
        for t in layer.steps(d):
            zr = ctx.emit(op.add(layer.gate(xs[t], 0, 2), _recurrence(ctx, h, r_zr, rb_zr)))
            z = ctx.emit(f(layer.clipped(layer.gate(zr, 0))))
            r = ctx.emit(f(layer.clipped(layer.gate(zr, 1))))
            if lbr:
                rec = op.multiply(r, _recurrence(ctx, h, r_h, rb_h))
            else:
                rec = _recurrence(ctx, op.multiply(r, h), r_h, rb_h)
            cand = ctx.emit(g(layer.clipped(op.add(layer.gate(xs[t], 2), rec))))
            new = ctx.emit(op.add(op.multiply(op.subtract(one, z), cand), op.multiply(z, h)))
            y[t] = ctx.emit(layer.output(t, new)) if layer.mask else new
            h = ctx.emit(layer.masked(t, new, h)) if layer.mask else new
        ys.append(y)
        finals.append([h])
    return layer.assemble(ys, finals)


@converter("LSTM", since=7)
def lstm(ctx: Any, node: Any) -> Any:
    layer = _Layer(ctx, node, gates=4)
    input_forget = int(node.attr("input_forget", 0))
    acts = _activations(node, ["Sigmoid", "Tanh", "Tanh"], layer.num_dirs, layer.dt)
    one = scalar(1, layer.dt)
    ys, finals = [], []
    for d in range(layer.num_dirs):
        f, g, hact = acts[d]
        wb, rb = layer.biases(d)
        xs = layer.projected_inputs(d, wb)
        r_t = ctx.emit(op.transpose(layer.dir_input(2, d), (1, 0)))
        peep = layer.dir_input(7, d)
        p_i = p_o = p_f = None
        if peep is not None:
            hid = layer.hidden
            p_i, p_o, p_f = (ctx.emit(op.strided_slice(peep, (k * hid,), ((k + 1) * hid,),
                                                        None, (0,))) for k in range(3))
        h, c = layer.initial(5, d), layer.initial(6, d)
        y = [None] * layer.seq_len
        for t in layer.steps(d):
            pre = ctx.emit(op.add(xs[t], _recurrence(ctx, h, r_t, rb)))
            pi, po, pf, pc = (layer.gate(pre, k) for k in range(4))
            if p_i is not None:
                pi, pf = op.add(pi, op.multiply(p_i, c)), op.add(pf, op.multiply(p_f, c))
            i = ctx.emit(f(layer.clipped(pi)))
            fg = op.subtract(one, i) if input_forget else f(layer.clipped(pf))
            cand = g(layer.clipped(pc))
            c_new = ctx.emit(op.add(op.multiply(fg, c), op.multiply(i, cand)))
            if p_o is not None:
                po = op.add(po, op.multiply(p_o, c_new))
            o = f(layer.clipped(po))
            h_new = ctx.emit(op.multiply(o, hact(c_new)))
            y[t] = ctx.emit(layer.output(t, h_new)) if layer.mask else h_new
            if layer.mask:
                h = ctx.emit(layer.masked(t, h_new, h))
                c = ctx.emit(layer.masked(t, c_new, c))
            else:
                h, c = h_new, c_new
        ys.append(y)
        finals.append([h, c])
    return layer.assemble(ys, finals)
