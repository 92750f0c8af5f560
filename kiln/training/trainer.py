"""Trainer: one compiled train step (forward + backward + optimizer update) and predict.

``Trainer(model, loss, optimizer, params, batch_size=None)`` builds, once:

1. ``<func>_loss(*model params, target)``: the model's bindings followed by the loss
   (:func:`~kiln.training.loss.attach_loss`);
2. its adjoint with ``kiln.transform.Gradient`` (gradients of the loss for the trained
   parameters);
3. ``train_step(x, target, lr, *params, *states) -> (loss, *new_params, *new_states)``: the
   adjoint's bindings followed by the optimizer update, one flat graph function;
4. ``predict(x, *params)``: the model itself;

and compiles ``train_step`` and ``predict`` with one ``kiln.build`` into one Executable, so a
step is one executor run: every kernel of forward, backward and update, no Python in between.
Parameters and optimizer states live on the trainer as numpy arrays between steps
(``trainer.params``, ``trainer.states``), passed in and taken back each step.

The model is an IRModule whose function ``func`` (default ``"main"``) takes one data input
and the parameters (any order; the parameters are the ones named in ``params``), or a builder
``model(batch_size) -> IRModule`` (or ``(IRModule, params)``) for a chosen ``batch_size``.
Shapes are static: the batch size is fixed at build time; ``predict`` takes any number of rows
and runs them in batches (padding the last).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

import kiln

from .. import graph as g
from ..graph.block_builder import BlockBuilder
from ..graph.struct_info import TensorStructInfo
from ..ir.errors import ArgumentError, KilnError
from ..ir.module import IRModule
from ..transform.gradient import Gradient
from .loss import Loss, attach_loss, emit_body
from .optimizer import Optimizer

__all__ = ["Trainer", "make_train_module"]

ModelBuilder = Callable[[int], Any]

LOSS_FUNC = "kiln_train_loss"


def _split_params(model: g.Function, names: Mapping[str, Any],
                  func: str) -> tuple[g.Var, list[g.Var]]:
    """(the data input, the trained parameters in the function's order)."""
    by_name = {p.name_hint: p for p in model.params}
    unknown = sorted(set(names) - set(by_name))
    if unknown:
        raise KilnError(f"Trainer: {func!r} has no parameter(s) {unknown}; its parameters are "
                        f"{list(by_name)}")
    data = [p for p in model.params if p.name_hint not in names]
    if len(data) != 1:
        raise KilnError(
            f"Trainer: {func!r} must have exactly one data input besides the trained "
            f"parameters, found {[p.name_hint for p in data]}"
        )
    return data[0], [p for p in model.params if p.name_hint in names]


def _gradient_pass(func: str, require: list[g.Var]) -> Any:
    return Gradient(func, require_grads=require)


def _tuple_item(bb: BlockBuilder, value: g.Expr, index: int) -> g.Expr:
    """Field ``index`` of a tuple value: the field itself when the tuple is explicit."""
    bound = bb.lookup_binding(value) if isinstance(value, g.Var) else None
    if isinstance(bound, g.Tuple):
        value = bound
    if isinstance(value, g.Tuple):
        return value.fields[index]
    return bb.emit(g.TupleGetItem(value, index))


def make_train_module(mod: IRModule, loss: Loss, optimizer: Optimizer,
                      params: Mapping[str, Any], func: str = "main") -> IRModule:
    """The IRModule with graph functions ``train_step`` and ``predict`` (see module doc).

    ``params`` names the trained parameters of ``func`` (values are not used here).
    """
    if func not in mod or not isinstance(mod[func], g.Function):
        raise KilnError(f"Trainer: the module has no graph function {func!r}")
    if not params:
        raise KilnError("Trainer: no trained parameters given (params is empty)")
    model = mod[func]
    data, trained = _split_params(model, params, func)
    with_loss = attach_loss(mod, loss, func, name=LOSS_FUNC)
    loss_fn = with_loss[LOSS_FUNC]
    loss_params = list(loss_fn.params)
    index = {p.name_hint: i for i, p in enumerate(model.params)}
    require = [loss_params[index[p.name_hint]] for p in trained]
    with_grad = _gradient_pass(LOSS_FUNC, require)(with_loss)
    adjoint = with_grad[f"{LOSS_FUNC}_adjoint"]

    # train_step(x, target, lr, *params, *states)
    p_sinfo = {p.name_hint: p.struct_info for p in trained}
    x = g.Var(data.name_hint, data.struct_info)
    target = g.Var(loss.target_name, loss_params[-1].struct_info)
    first = next(iter(p_sinfo.values()))
    lr = g.Var("lr", TensorStructInfo((), first.dtype))
    pv = {n: g.Var(n, s) for n, s in p_sinfo.items()}
    sv = {n: g.Var(n.replace(".", "_"), s) for n, s in optimizer.state_sinfo(p_sinfo).items()}
    args_by_name = {data.name_hint: x, **pv}
    call_args = [args_by_name[p.name_hint] for p in model.params] + [target]

    bb = BlockBuilder()
    with bb.function("train_step", [x, target, lr, *pv.values(), *sv.values()]):
        with bb.dataflow():
            result = emit_body(bb, adjoint, call_args)
            loss_value = _tuple_item(bb, result, 0)
            grads_value = _tuple_item(bb, result, 1)
            grads = {}
            for i, name in enumerate(p_sinfo):
                grad = _tuple_item(bb, grads_value, i)
                if not isinstance(grad.struct_info, TensorStructInfo):
                    raise KilnError(f"Trainer: no gradient for parameter {name!r}")
                grads[name] = grad
            new_p, new_s = optimizer.emit(bb, lr, pv, grads, sv)
            outs = [bb.emit_output(v) for v in (loss_value, *new_p.values(), *new_s.values())]
        bb.emit_func_output(g.Tuple(tuple(outs)))
    train_step = bb.get()["train_step"]

    # everything the model may refer to (PrimFuncs of call_tir, other graph functions) stays
    funcs: dict[str, Any] = {n: f for n, f in mod.items() if n != func}
    for name in ("train_step", "predict"):
        if name in funcs:
            raise KilnError(f"Trainer: the model module already has a function {name!r}")
    funcs["train_step"] = train_step
    funcs["predict"] = model
    return IRModule(funcs)


class Trainer:
    """A compiled training loop body: ``trainer.step(x, y) -> loss``, ``trainer.predict(x)``.

    ``params`` maps the trained parameters of the model function to their initial arrays (for
    a builder returning ``(IRModule, params)`` it may be omitted). The attribute ``lr`` is passed
    to every step (it is an input of the compiled step): changing it needs no rebuild.
    """

    def __init__(self, model: IRModule | ModelBuilder, loss: Loss, optimizer: Optimizer,
                 params: Mapping[str, np.ndarray] | None = None, *,
                 batch_size: int | None = None, func: str = "main", target: Any = "c"):
        if not isinstance(loss, Loss):
            raise KilnError(f"Trainer: loss must be a kiln.training.Loss, got {loss!r}")
        if not isinstance(optimizer, Optimizer):
            raise KilnError(f"Trainer: optimizer must be a kiln.training.Optimizer, got "
                            f"{optimizer!r}")
        mod, params = self._model_module(model, params, batch_size)
        if not params:
            raise KilnError("Trainer: params (the trained parameters' initial values) are "
                            "required")
        self.loss = loss
        self.optimizer = optimizer
        self.lr = optimizer.lr
        self.module = make_train_module(mod, loss, optimizer, params, func)
        step = self.module["train_step"]
        n_params = len(params)
        specs = {p.name_hint: p.struct_info for p in step.params[3:3 + n_params]}
        self.params = {n: self._checked(n, params[n], specs[n]) for n in specs}
        self.states = optimizer.init_state(self.params)
        self._x_name = step.params[0].name_hint
        self._x_sinfo = step.params[0].struct_info
        self._y_sinfo = step.params[1].struct_info
        self._lr_dtype = step.params[2].struct_info.dtype.to_numpy()
        self.batch_size = self._x_sinfo.static_shape()[0]
        self.executable = kiln.build(self.module, target=target)
        self._step = self.executable["train_step"]
        self._predict = self.executable["predict"]
        self.steps = 0

    @staticmethod
    def _model_module(model: Any, params: Any, batch_size: int | None) -> tuple[IRModule, Any]:
        if isinstance(model, IRModule):
            return model, params
        if not callable(model):
            raise KilnError(f"Trainer: model must be an IRModule or a builder "
                            f"(batch_size) -> IRModule, got {model!r}")
        if batch_size is None:
            raise KilnError("Trainer: a model builder needs batch_size")
        built = model(batch_size)
        if isinstance(built, tuple):
            built, built_params = built
            params = params if params is not None else built_params
        if not isinstance(built, IRModule):
            raise KilnError(f"Trainer: the model builder returned {type(built).__name__}, "
                            "not an IRModule")
        return built, params

    @staticmethod
    def _checked(name: str, value: Any, sinfo: TensorStructInfo) -> np.ndarray:
        arr = np.array(value, dtype=sinfo.dtype.to_numpy(), copy=True)
        if arr.shape != sinfo.static_shape():
            raise ArgumentError(f"Trainer: parameter {name!r} must have shape "
                                f"{sinfo.static_shape()}, got {arr.shape}")
        return arr

    def step(self, x: Any, y: Any) -> float:
        """One optimizer step on the batch ``(x, y)``; returns the batch's loss (before the
        update)."""
        x = np.asarray(x, dtype=self._x_sinfo.dtype.to_numpy())
        y = np.asarray(y, dtype=self._y_sinfo.dtype.to_numpy())
        out = self._step(x, y, np.asarray(self.lr, dtype=self._lr_dtype),
                         *self.params.values(), *self.states.values())
        n = len(self.params)
        self.params = dict(zip(self.params, out[1:1 + n]))
        self.states = dict(zip(self.states, out[1 + n:]))
        self.steps += 1
        return float(np.asarray(out[0]).reshape(()))

    def predict(self, x: Any) -> np.ndarray:
        """The model's output for every row of ``x`` (any number of rows)."""
        x = np.asarray(x, dtype=self._x_sinfo.dtype.to_numpy())
        shape = self._x_sinfo.static_shape()
        if x.shape[1:] != shape[1:]:
            raise ArgumentError(f"Trainer.predict: rows of x must have shape {shape[1:]}, "
                                f"got {x.shape[1:]}")
        b = self.batch_size
        outs = []
        for start in range(0, len(x), b):
            chunk = x[start:start + b]
            rows = len(chunk)
            if rows < b:
                chunk = np.concatenate([chunk, np.zeros((b - rows, *shape[1:]), x.dtype)])
            out = self._predict(**{self._x_name: chunk}, **self.params)
            outs.append(np.asarray(out)[:rows])
        if not outs:
            return np.zeros((0,), x.dtype)
        return np.concatenate(outs)
