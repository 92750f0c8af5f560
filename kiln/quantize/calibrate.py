"""Calibration: run the float model on sample inputs and record each tensor's range.

``calibrate(mod, params, samples)`` first prepares the graph the way the NPU build does
(``BindParams``, then ``kiln.build.npu_pipeline``: batch norm folded into multiply/add, graph
cleanup), so the ranges belong to the tensors :class:`~.rewrite.QuantizeGraph` rewrites. It then
builds a copy of ``main`` for the CPU that returns every float32 tensor of the graph, runs it on
each sample and keeps per tensor:

- ``"minmax"``: the largest magnitude seen (the default; no value saturates);
- ``"percentile"``: the ``percentile``-th percentile of the magnitudes (99.99 by default), which
  clips rare outliers for a finer step on the bulk of the values. The magnitudes are kept as
  a random subsample of at most ``max_samples`` values per tensor (seeded: reproducible).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import graph as g
from ..build import build, npu_pipeline
from ..ir.module import IRModule
from ..transform.bind_params import BindParams
from .scheme import QuantizationError, activation_scale

__all__ = ["CALIBRATION_METHODS", "Calibration", "TensorRange", "calibrate", "prepare"]

CALIBRATION_METHODS = ("minmax", "percentile")


@dataclass(frozen=True)
class TensorRange:
    """What calibration saw of one tensor: its min and max and the magnitude its scale is
    taken from (``absmax``: max |x| for minmax, the percentile otherwise)."""

    lo: float
    hi: float
    absmax: float

    @property
    def scale(self) -> float:
        return activation_scale(self.absmax)


@dataclass
class Calibration:
    """The prepared graph and the range of each of its float32 tensors (keyed by the graph's
    own variables: rewrite ``calibration.mod``, not another copy of the model)."""

    mod: IRModule
    ranges: dict[g.Var, TensorRange] = field(default_factory=dict)
    method: str = "minmax"

    def scale(self, var: g.Var) -> float:
        try:
            return self.ranges[var].scale
        except KeyError:
            raise QuantizationError(f"no calibration range for {var.name_hint!r} (calibrate "
                                    "the module being quantized: calibration.mod)") from None


def prepare(mod: IRModule, params: Mapping[str, Any] | None = None) -> IRModule:
    """``mod`` with ``params`` bound and the NPU build's graph simplifications applied."""
    if params:
        mod = BindParams("main", dict(params))(mod)
    return npu_pipeline()(mod)


def _substitute(e: Any, env: dict[int, Any]) -> Any:
    if isinstance(e, g.Var):
        return env.get(id(e), e)
    if isinstance(e, g.Call):
        return g.Call(e.op, tuple(_substitute(a, env) for a in e.args), e.attrs)
    if isinstance(e, g.Tuple):
        return g.Tuple(tuple(_substitute(f, env) for f in e.fields))
    if isinstance(e, g.TupleGetItem):
        return g.TupleGetItem(_substitute(e.tuple_value, env), e.index)
    return e


def _is_f32(var: Any) -> bool:
    si = var.struct_info
    return isinstance(si, g.TensorStructInfo) and str(si.dtype) == "float32"


def observed_module(mod: IRModule) -> tuple[IRModule, list[g.Var]]:
    """A copy of ``main`` whose result is the tuple of all its float32 tensors (parameters
    and bindings), and those tensors' variables in ``mod``."""
    main = mod["main"]
    if not isinstance(main, g.Function) or not isinstance(main.body, g.SeqExpr):
        raise QuantizationError("calibration needs a graph function 'main'")
    env: dict[int, Any] = {}
    params = []
    for p in main.params:
        np_ = g.Var(p.name_hint, p.struct_info)
        env[id(p)] = np_
        params.append(np_)
    observed = [p for p in main.params if _is_f32(p)]
    bb = g.BlockBuilder()
    with bb.function("main", params):
        for blk in main.body.blocks:
            for b in blk.bindings:
                if not isinstance(b, g.VarBinding):
                    raise QuantizationError(f"calibration: {type(b).__name__} bindings are "
                                            "not supported")
                env[id(b.var)] = bb.emit(_substitute(b.value, env), b.var.name_hint)
                if _is_f32(b.var):
                    observed.append(b.var)
        bb.emit_func_output(g.Tuple(tuple(env[id(v)] for v in observed)))
    return bb.get(), observed


def _samples(sample_inputs: Iterable[Any]) -> list[tuple[np.ndarray, ...]]:
    out = []
    for s in sample_inputs:
        out.append(tuple(s) if isinstance(s, (tuple, list)) else (s,))
    if not out:
        raise QuantizationError("calibration needs at least one sample input")
    return out


def calibrate(mod: IRModule, params: Mapping[str, Any] | None = None,
              sample_inputs: Iterable[Sequence[np.ndarray] | np.ndarray] = (),
              method: str = "minmax", percentile: float = 99.99,
              max_samples: int = 1 << 20) -> Calibration:
    """Ranges of every float32 tensor of the prepared ``mod`` over ``sample_inputs`` (each one
    call's inputs: an array, or a tuple of arrays for several inputs)."""
    if method not in CALIBRATION_METHODS:
        raise QuantizationError(f"unknown calibration method {method!r} (methods: "
                                f"{', '.join(CALIBRATION_METHODS)})")
    if not 0 < percentile <= 100:
        raise QuantizationError(f"percentile must be in (0, 100], got {percentile}")
    prepared = prepare(mod, params)
    obs_mod, observed = observed_module(prepared)
    exe = build(obs_mod, target="c")
    lo = [np.inf] * len(observed)
    hi = [-np.inf] * len(observed)
    mags: list[list[np.ndarray]] = [[] for _ in observed]
    rng = np.random.default_rng(0)
    for sample in _samples(sample_inputs):
        outs = exe(*sample)
        outs = outs if isinstance(outs, (tuple, list)) else (outs,)
        for i, v in enumerate(outs):
            v = np.asarray(v, dtype=np.float32)
            if v.size == 0:
                continue
            lo[i] = min(lo[i], float(v.min()))
            hi[i] = max(hi[i], float(v.max()))
            if method == "percentile":
                a = np.abs(v).reshape(-1)
                if a.size > max_samples:
                    a = rng.choice(a, max_samples, replace=False)
                mags[i].append(a)
    ranges = {}
    for i, var in enumerate(observed):
        if lo[i] > hi[i]:
            continue
        absmax = max(abs(lo[i]), abs(hi[i]))
        if method == "percentile":
            a = np.concatenate(mags[i])
            if a.size > max_samples:
                a = rng.choice(a, max_samples, replace=False)
            absmax = float(np.percentile(a, percentile))
        ranges[var] = TensorRange(lo[i], hi[i], absmax)
    return Calibration(prepared, ranges, method)
