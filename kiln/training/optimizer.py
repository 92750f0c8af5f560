"""Optimizers as graph code: the update of parameters and optimizer states from gradients.

An optimizer has named *states* (numpy arrays kept between steps by the trainer) and an
``emit(bb, lr, params, grads, states)`` that emits the update into the function ``bb`` is
building and returns the new parameters and states. ``function(param_sinfos)`` makes the update
a standalone graph function ``(lr, *params, *grads, *states) -> (*new_params, *new_states)``.

The learning rate is a run-time scalar input (``lr``, shape ``()``), so a schedule can change it
between steps without recompiling. Parameters, gradients and states are dicts keyed by parameter
name, in parameter order; a state's name is ``"<param>.<kind>"`` (``"w1.velocity"``) or a
global name (Adam's ``"step"``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import graph as g
from .. import op
from ..graph.block_builder import BlockBuilder
from ..graph.struct_info import TensorStructInfo
from ..ir.dtype import as_dtype
from ..ir.errors import KilnError

__all__ = ["SGD", "Adam", "Optimizer"]

Exprs = dict[str, Any]


def _check_float(name: str, value: float, low: float = 0.0, high: float | None = None,
                 owner: str = "optimizer") -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise KilnError(f"{owner}: {name} must be a number, got {value!r}")
    if value < low or (high is not None and value >= high):
        bound = f"[{low}, {high})" if high is not None else f">= {low}"
        raise KilnError(f"{owner}: {name} must be in {bound}, got {value}")
    return float(value)


class Optimizer:
    """Base class. Subclasses define ``state_kinds``/``global_states`` and ``emit``."""

    #: per-parameter states, initialized to zeros shaped like the parameter
    state_kinds: tuple[str, ...] = ()
    #: states shared by all parameters: name -> (dtype, initial value), shape ()
    global_states: dict[str, tuple[str, Any]] = {}

    def __init__(self, lr: float):
        self.lr = _check_float("lr", lr, owner=type(self).__name__)

    def state_sinfo(self, params: dict[str, TensorStructInfo]) -> dict[str, TensorStructInfo]:
        """StructInfo of every state, in order (per-parameter states, then global ones)."""
        out: dict[str, TensorStructInfo] = {}
        for name, sinfo in params.items():
            if not as_dtype(sinfo.dtype).is_float:
                raise KilnError(f"{type(self).__name__}: parameter {name!r} must be a float "
                                f"tensor, got {sinfo}")
            for kind in self.state_kinds:
                out[f"{name}.{kind}"] = sinfo
        for name, (dtype, _) in self.global_states.items():
            out[name] = TensorStructInfo((), dtype)
        return out

    def init_state(self, params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Initial values of the states for the parameter arrays ``params``."""
        out: dict[str, np.ndarray] = {}
        for name, value in params.items():
            for kind in self.state_kinds:
                out[f"{name}.{kind}"] = np.zeros_like(value)
        for name, (dtype, init) in self.global_states.items():
            out[name] = np.asarray(init, dtype=as_dtype(dtype).to_numpy())
        return out

    def emit(self, bb: BlockBuilder, lr: g.Expr, params: Exprs, grads: Exprs,
             states: Exprs) -> tuple[Exprs, Exprs]:
        """Emit the update; returns ``(new_params, new_states)`` with the same keys."""
        raise NotImplementedError

    def function(self, params: dict[str, TensorStructInfo], name: str = "update",
                 lr_dtype: str = "float32") -> g.Function:
        """``(lr, *params, *grads, *states) -> (*new_params, *new_states)`` as a graph
        function."""
        lr = g.Var("lr", TensorStructInfo((), lr_dtype))
        pv = {n: g.Var(n, s) for n, s in params.items()}
        gv = {n: g.Var(f"d_{n}", s) for n, s in params.items()}
        sv = {n: g.Var(n.replace(".", "_"), s) for n, s in self.state_sinfo(params).items()}
        bb = BlockBuilder()
        with bb.function(name, [lr, *pv.values(), *gv.values(), *sv.values()]):
            with bb.dataflow():
                new_p, new_s = self.emit(bb, lr, pv, gv, sv)
                outs = [bb.emit_output(v) for v in (*new_p.values(), *new_s.values())]
            bb.emit_func_output(g.Tuple(tuple(outs)))
        return bb.get()[name]


def _scalar(value: float, like: g.Expr) -> g.Constant:
    return g.const(value, str(like.struct_info.dtype))


def _lr_for(bb: BlockBuilder, lr: g.Expr, param: g.Expr) -> g.Expr:
    """``lr`` in the parameter's dtype."""
    if as_dtype(lr.struct_info.dtype) == as_dtype(param.struct_info.dtype):
        return lr
    return bb.emit(op.cast(lr, str(param.struct_info.dtype)))


class SGD(Optimizer):
    """Stochastic gradient descent with momentum and L2 weight decay (PyTorch's convention).

    ``g = grad + weight_decay * p``; with momentum ``v = momentum * v + g`` and the step is
    ``v`` (``g + momentum * v`` when ``nesterov``); ``p = p - lr * step``. States:
    ``"<param>.velocity"`` when ``momentum > 0``.
    """

    def __init__(self, lr: float = 0.01, momentum: float = 0.0, weight_decay: float = 0.0,
                 nesterov: bool = False):
        super().__init__(lr)
        self.momentum = _check_float("momentum", momentum, 0.0, 1.0, "SGD")
        self.weight_decay = _check_float("weight_decay", weight_decay, owner="SGD")
        if nesterov and self.momentum == 0.0:
            raise KilnError("SGD: nesterov needs momentum > 0")
        self.nesterov = bool(nesterov)
        self.state_kinds = ("velocity",) if self.momentum > 0 else ()

    def emit(self, bb: BlockBuilder, lr: g.Expr, params: Exprs, grads: Exprs,
             states: Exprs) -> tuple[Exprs, Exprs]:
        new_p: Exprs = {}
        new_s: Exprs = {}
        for name, p in params.items():
            grad = grads[name]
            if self.weight_decay:
                grad = bb.emit(op.add(grad, op.multiply(_scalar(self.weight_decay, p), p)))
            step = grad
            if self.momentum > 0:
                key = f"{name}.velocity"
                v = bb.emit(op.add(op.multiply(_scalar(self.momentum, p), states[key]), grad))
                new_s[key] = v
                step = v
                if self.nesterov:
                    step = bb.emit(op.add(grad, op.multiply(_scalar(self.momentum, p), v)))
            new_p[name] = bb.emit(op.subtract(p, op.multiply(_lr_for(bb, lr, p), step)))
        return new_p, new_s


class Adam(Optimizer):
    """Adam with bias correction (Kingma & Ba); the step counter is an int64 state tensor.

    ``t = t + 1; m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g*g;
    p = p - lr * (m / (1 - b1**t)) / (sqrt(v / (1 - b2**t)) + eps)``.
    ``weight_decay`` adds ``weight_decay * p`` to the gradient (L2, PyTorch's ``Adam``), or with
    ``decoupled=True`` subtracts ``lr * weight_decay * p`` from the parameter (AdamW). States:
    ``"<param>.m"``, ``"<param>.v"`` and ``"step"``.
    """

    state_kinds = ("m", "v")
    global_states = {"step": ("int64", 0)}

    def __init__(self, lr: float = 0.001, beta1: float = 0.9, beta2: float = 0.999,
                 eps: float = 1e-8, weight_decay: float = 0.0, decoupled: bool = False):
        super().__init__(lr)
        self.beta1 = _check_float("beta1", beta1, 0.0, 1.0, "Adam")
        self.beta2 = _check_float("beta2", beta2, 0.0, 1.0, "Adam")
        self.eps = _check_float("eps", eps, owner="Adam")
        self.weight_decay = _check_float("weight_decay", weight_decay, owner="Adam")
        self.decoupled = bool(decoupled)

    def emit(self, bb: BlockBuilder, lr: g.Expr, params: Exprs, grads: Exprs,
             states: Exprs) -> tuple[Exprs, Exprs]:
        step = bb.emit(op.add(states["step"], g.const(1, "int64")))
        new_p: Exprs = {}
        new_s: Exprs = {}
        corrections: dict[str, tuple[Any, Any]] = {}
        for name, p in params.items():
            dt = str(p.struct_info.dtype)
            if dt not in corrections:  # 1 - beta**t, once per dtype
                t = bb.emit(op.cast(step, dt))
                corrections[dt] = tuple(
                    bb.emit(op.subtract(g.const(1, dt), op.power(g.const(beta, dt), t)))
                    for beta in (self.beta1, self.beta2)
                )
            bc1, bc2 = corrections[dt]
            grad = grads[name]
            if self.weight_decay and not self.decoupled:
                grad = bb.emit(op.add(grad, op.multiply(_scalar(self.weight_decay, p), p)))
            m = bb.emit(op.add(op.multiply(_scalar(self.beta1, p), states[f"{name}.m"]),
                               op.multiply(_scalar(1 - self.beta1, p), grad)))
            v = bb.emit(op.add(op.multiply(_scalar(self.beta2, p), states[f"{name}.v"]),
                               op.multiply(_scalar(1 - self.beta2, p), op.multiply(grad, grad))))
            m_hat = bb.emit(op.divide(m, bc1))
            denom = bb.emit(op.add(op.sqrt(op.divide(v, bc2)), _scalar(self.eps, p)))
            update = bb.emit(op.divide(m_hat, denom))
            if self.weight_decay and self.decoupled:
                update = bb.emit(op.add(update, op.multiply(_scalar(self.weight_decay, p), p)))
            new_p[name] = bb.emit(op.subtract(p, op.multiply(_lr_for(bb, lr, p), update)))
            new_s[f"{name}.m"] = m
            new_s[f"{name}.v"] = v
        new_s["step"] = step
        return new_p, new_s
