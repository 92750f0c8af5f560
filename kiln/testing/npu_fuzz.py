"""Random models for the NPU build: layer graphs drawn from a seed, built for a hardware
description, simulated, and checked three ways.

The op tests check one op at a time; what breaks once a compiler has cross-layer passes is their
combinations: a product whose fused epilogue adds a residual that residency kept in L1, a
depthwise convolution whose producer stores float16 for it, a pooling kernel whose buffers the
bank placement moved, a prefetched load across the barrier of a concat. :func:`make_case` draws
a network from a seed -- a CNN (convolutions of random kernel, stride, padding, dilation and
groups incl. depthwise, with bias, batch norm, ReLU/ReLU6/sigmoid/tanh, residual adds, channel
concats, max/average pooling, a global pool and dense head) or a sequence model (dense layers,
layer norm, GELU-free attention: batched products of run-time operands, softmax, transposes)
-- with sizes that are often primes, and :func:`check_case` runs it:

1. **against float64 torch** (CPU, an independent implementation of every op): within the
   rounding of float16 products (``tolerance``);
2. **the build's optimizations off** (residency, prefetch, bank placement, DRAM reuse): the
   same bits -- they move the same bytes in the same order;
3. **the other lowering route** (``npu.lowering`` ``"emit"`` against ``"tir"``): the same bits;
   **the epilogue unfused** and **depthwise convolutions forced onto each route**
   (``npu.depthwise``: diagonal, banded, vector): within the tolerance of the reference;
4. for the ``int8`` kind (a CNN of the layers whose quantized form is exact), **the model
   quantized** (``kiln.quantize``, calibrated on four inputs): the bits of the numpy model of
   quantized graphs (``kiln.testing.quant_reference``) where every op is exact, and the same
   bits with the optimizations off; for the float kinds, **the model in float16 and in
   bfloat16** (``ToMixedPrecision``): within ``MIXED_TOLERANCE`` of the reference.

Every exception is a finding (a small model the NPU build must take: an op it cannot run goes
to the CPU, it does not fail). ``benchmarks/npu_fuzz.py`` runs seeds and prints what failed;
tests run a few per description.
"""

from __future__ import annotations

import math
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from .. import graph as g
from .. import op
from ..build import npu_pipeline
from ..codegen.npu import DEPTHWISE_KEY, LOWERING_KEY, build_npu
from ..ir.module import IRModule
from ..quantize import quantize_model
from ..target import Target
from ..transform.pass_infra import PassContext
from ..transform.to_mixed_precision import ToMixedPrecision
from .quant_reference import EXACT_OPS, run_quantized_graph

__all__ = ["MIXED_TOLERANCE", "NpuCase", "NpuOutcome", "TOLERANCE", "check_case", "is_exact",
           "make_case", "quantized"]

#: Largest error allowed against the float64 reference, relative to ``max(1, max|ref|)``:
#: every product rounds its operands to float16 (11 significant bits) and accumulates in
#: float32; a few layers deep that is a few parts in a thousand.
TOLERANCE = 2e-2
#: The same for the model in mixed precision (``ToMixedPrecision``): float16 activations keep
#: float16's 11 bits, bfloat16's keep 8 -- its bound is float16's scaled by their ratio, 2**3.
MIXED_TOLERANCE = {"float16": TOLERANCE, "bfloat16": 8 * TOLERANCE}

_PRIMES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37)


@dataclass
class NpuCase:
    """A random model: the graph, its inputs and the float64 reference of its output."""

    seed: int
    kind: str
    layers: list[str]
    mod: IRModule
    inputs: list[np.ndarray]
    reference: np.ndarray


@dataclass
class NpuOutcome:
    """What :func:`check_case` found for one case on one description."""

    seed: int
    hw: str
    kind: str
    layers: list[str]
    failures: list[str] = field(default_factory=list)
    error: float = 0.0
    cycles: float = 0.0
    cpu_ops: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures


class _Net:
    """A graph under construction and its torch float64 twin, op by op."""

    def __init__(self, bb: g.BlockBuilder, rng: np.random.Generator, wide: int,
                 int8: bool = False):
        self.bb, self.rng = bb, rng
        #: layers whose quantized form the numpy model of int8 graphs computes exactly
        #: (``kiln.testing.quant_reference.EXACT_OPS``): no sigmoid/tanh, average pooling,
        #: concat or softmax
        self.int8 = int8
        #: the largest channel count a layer draws (some cases are wide enough for several
        #: tiles per core, most are small and quick)
        self.wide = wide
        self.layers: list[str] = []
        #: (graph value, float64 torch value) of every tensor so far (residual/concat sources)
        self.values: list[tuple[Any, torch.Tensor]] = []

    def emit(self, name: str, expr: Any, ref: torch.Tensor) -> tuple[Any, torch.Tensor]:
        v = (self.bb.emit(expr), ref)
        self.layers.append(name)
        self.values.append(v)
        return v

    def const(self, *shape: int, scale: float = 1.0) -> tuple[Any, torch.Tensor]:
        arr = (self.rng.standard_normal(shape) * scale).astype("float32")
        return g.const(arr), torch.from_numpy(arr.astype(np.float64))


def _dim(rng: np.random.Generator, lo: int, hi: int) -> int:
    """A size in [lo, hi], a prime half of the time (tiles never divide them)."""
    primes = [p for p in _PRIMES if lo <= p <= hi]
    if primes and rng.random() < 0.5:
        return int(rng.choice(primes))
    return int(rng.integers(lo, hi + 1))


def _activation(net: _Net, x: Any, r: torch.Tensor) -> tuple[Any, torch.Tensor]:
    kind = net.rng.choice(["relu", "relu6", "sigmoid", "tanh", "none"],
                          p=[.5, .3, 0, 0, .2] if net.int8 else [.4, .2, .1, .1, .2])
    if kind == "relu":
        return net.emit("relu", op.nn.relu(x), torch.relu(r))
    if kind == "relu6":
        return net.emit("clip", op.clip(x, 0.0, 6.0), r.clamp(0.0, 6.0))
    if kind == "sigmoid":
        return net.emit("sigmoid", op.sigmoid(x), torch.sigmoid(r))
    if kind == "tanh":
        return net.emit("tanh", op.tanh(x), torch.tanh(r))
    return x, r


def _conv(net: _Net, x: Any, r: torch.Tensor) -> tuple[Any, torch.Tensor]:
    rng = net.rng
    c, h, w = r.shape[1:]
    depthwise = c > 1 and rng.random() < 0.3
    groups = c if depthwise else 1
    if not depthwise and c % 2 == 0 and c >= 4 and rng.random() < 0.1:
        groups = 2
    cout = c if depthwise else _dim(rng, 1, net.wide) * groups
    k = int(rng.choice([1, 3, 3, 5])) if min(h, w) >= 5 else int(rng.choice([1, 3]))
    dil = 2 if k == 3 and min(h, w) >= 7 and rng.random() < 0.15 else 1
    span = (k - 1) * dil + 1
    pad = int(rng.integers(0, k // 2 + 1)) * dil
    if span > min(h, w) + 2 * pad:
        k, dil, pad, span = 1, 1, 0, 1
    stride = 2 if rng.random() < 0.3 and min(h, w) >= 4 else 1
    wt, wr = net.const(cout, c // groups, k, k, scale=1.0 / math.sqrt(c // groups * k * k))
    x, r = net.emit(f"conv{k}x{k}/{stride}{' dw' if depthwise else ''}"
                    f"{f' g{groups}' if 1 < groups < c else ''}",
                    op.nn.conv2d(x, wt, strides=(stride, stride), padding=(pad, pad),
                                 dilation=(dil, dil), groups=groups),
                    F.conv2d(r, wr, stride=stride, padding=pad, dilation=dil, groups=groups))
    if rng.random() < 0.4:
        gamma, gr = net.const(cout, scale=0.1)
        beta, br = net.const(cout, scale=0.1)
        mean, mr = net.const(cout, scale=0.1)
        var_arr = (1.0 + 0.1 * rng.random(cout)).astype("float32")
        var, vr = g.const(var_arr), torch.from_numpy(var_arr.astype(np.float64))
        sh = (1, -1, 1, 1)
        ref = (r - mr.reshape(sh)) / torch.sqrt(vr.reshape(sh) + 1e-5) * \
            (1 + gr).reshape(sh) + br.reshape(sh)
        one = g.const((1 + gr.numpy()).astype("float32"))
        x, r = net.emit("batch_norm", op.nn.batch_norm(x, one, beta, mean, var, axis=1,
                                                       epsilon=1e-5), ref)
    elif rng.random() < 0.6:
        b, br = net.const(cout, 1, 1, scale=0.1)
        x, r = net.emit("bias", op.add(x, b), r + br)
    return _activation(net, x, r)


def _pool(net: _Net, x: Any, r: torch.Tensor) -> tuple[Any, torch.Tensor]:
    rng = net.rng
    h, w = r.shape[2:]
    k = int(rng.choice([2, 3])) if min(h, w) >= 3 else 2 if min(h, w) >= 2 else 1
    stride = int(rng.choice([1, 2]))
    pad = int(rng.integers(0, k // 2 + 1))
    if net.int8 or rng.random() < 0.5:
        return net.emit(f"maxpool{k}/{stride}", op.nn.max_pool2d(
            x, pool_size=(k, k), strides=(stride, stride), padding=(pad, pad)),
            F.max_pool2d(r, k, stride=stride, padding=pad))
    include = bool(rng.random() < 0.5)
    return net.emit(f"avgpool{k}/{stride}", op.nn.avg_pool2d(
        x, pool_size=(k, k), strides=(stride, stride), padding=(pad, pad),
        count_include_pad=include),
        F.avg_pool2d(r, k, stride=stride, padding=pad, count_include_pad=include))


def _merge(net: _Net, x: Any, r: torch.Tensor) -> tuple[Any, torch.Tensor] | None:
    """A residual add of an earlier tensor of this shape, or a channel concat of one of this
    image size; None when there is none."""
    same = [v for v in net.values[:-1] if tuple(v[1].shape) == tuple(r.shape)]
    if same and net.rng.random() < 0.6:
        y, yr = same[int(net.rng.integers(len(same)))]
        x, r = net.emit("residual", op.add(x, y), r + yr)
        return net.emit("relu", op.nn.relu(x), torch.relu(r))
    cat = [] if net.int8 else [v for v in net.values[:-1] if tuple(v[1].shape[2:]) ==
                               tuple(r.shape[2:]) and v[1].shape[0] == r.shape[0]]
    if cat:
        y, yr = cat[int(net.rng.integers(len(cat)))]
        return net.emit("concat", op.concat([x, y], axis=1), torch.cat([r, yr], 1))
    return None


def _cnn(net: _Net, x: Any, r: torch.Tensor) -> tuple[Any, torch.Tensor]:
    net.values.append((x, r))
    for _ in range(int(net.rng.integers(2, 7))):
        roll = net.rng.random()
        if roll < 0.55:
            x, r = _conv(net, x, r)
        elif roll < 0.75 and min(r.shape[2:]) >= 2:
            x, r = _pool(net, x, r)
        else:
            merged = _merge(net, x, r)
            x, r = merged if merged is not None else _conv(net, x, r)
    n, c = r.shape[:2]
    if net.rng.random() < 0.5:
        x, r = net.emit("global_pool", op.nn.adaptive_avg_pool2d(x, output_size=(1, 1)),
                        r.mean(dim=(2, 3), keepdim=True))
        x, r = net.emit("reshape", op.reshape(x, (n, c)), r.reshape(n, c))
        classes = _dim(net.rng, 2, 17)
        w, wr = net.const(classes, c, scale=1.0 / math.sqrt(c))
        x, r = net.emit("dense", op.dense(x, w), r @ wr.T)
        if not net.int8 and net.rng.random() < 0.5:
            x, r = net.emit("softmax", op.nn.softmax(x, axis=-1), torch.softmax(r, -1))
    return x, r


def _sequence(net: _Net, x: Any, r: torch.Tensor) -> tuple[Any, torch.Tensor]:
    """Dense layers with layer norm and an attention of run-time operands."""
    net.values.append((x, r))
    b, s, d = r.shape
    for _ in range(int(net.rng.integers(1, 4))):
        roll = net.rng.random()
        if roll < 0.4:
            e = _dim(net.rng, 3, net.wide)
            w, wr = net.const(e, d, scale=1.0 / math.sqrt(d))
            x2, r2 = net.emit("reshape", op.reshape(x, (b * s, d)), r.reshape(b * s, d))
            x2, r2 = net.emit("dense", op.dense(x2, w), r2 @ wr.T)
            bias, br = net.const(e, scale=0.1)
            x2, r2 = net.emit("bias", op.add(x2, bias), r2 + br)
            x2, r2 = _activation(net, x2, r2)
            x, r = net.emit("reshape", op.reshape(x2, (b, s, e)), r2.reshape(b, s, e))
            d = e
        elif roll < 0.6:
            gamma, gr = net.const(d)
            beta, br = net.const(d, scale=0.1)
            x, r = net.emit("layer_norm", op.nn.layer_norm(x, gamma, beta, axes=-1,
                                                           epsilon=1e-5),
                            F.layer_norm(r, (d,), gr, br, eps=1e-5))
        else:
            kt, kr = net.emit("transpose", op.transpose(x, axes=(0, 2, 1)), r.transpose(1, 2))
            sc, scr = net.emit("matmul", op.matmul(x, kt), r @ kr)
            scale = np.float32(1.0 / math.sqrt(d))
            sc, scr = net.emit("scale", op.multiply(sc, g.const(scale)), scr * float(scale))
            p, pr = net.emit("softmax", op.nn.softmax(sc, axis=-1), torch.softmax(scr, -1))
            o, orf = net.emit("matmul", op.matmul(p, x), pr @ r)
            x, r = net.emit("residual", op.add(o, x), orf + r)
    return x, r


def make_case(seed: int) -> NpuCase:
    """The random model of ``seed`` (the same model for the same seed)."""
    rng = np.random.default_rng(seed)
    kind = str(rng.choice(["cnn", "int8", "sequence"], p=[.55, .15, .3]))
    large = rng.random() < 0.25
    wide = 160 if large else 40
    if kind != "sequence":
        size = 48 if large else 23
        shape: tuple[int, ...] = (int(rng.integers(1, 3)), _dim(rng, 1, 24), _dim(rng, 3, size),
                                  _dim(rng, 3, size))
        body: Callable[..., Any] = _cnn
    else:
        shape = (int(rng.integers(1, 3)), _dim(rng, 2, 160 if large else 40),
                 _dim(rng, 2, wide))
        body = _sequence
    bb = g.BlockBuilder()
    x = g.Var("x", g.TensorStructInfo(shape, "float32"))
    xv = rng.standard_normal(shape).astype("float32")
    net = _Net(bb, rng, wide, int8=kind == "int8")
    with bb.function("main", [x]):
        with bb.dataflow():
            y, ref = body(net, x, torch.from_numpy(xv.astype(np.float64)))
            out = bb.emit_output(op.add(y, g.const(np.float32(0.0))) if y is x else y)
        bb.emit_func_output(out)
    return NpuCase(seed, kind, net.layers, bb.get(), [xv], ref.numpy())


def _error(out: np.ndarray, ref: np.ndarray) -> float:
    diff = np.abs(out.astype(np.float64) - ref)
    if np.isnan(diff).any():
        return math.inf
    return float(diff.max(initial=0.0)) / max(1.0, float(np.abs(ref).max(initial=0.0)))


def _build(mod: IRModule, hw: str, route: str | None = None, depthwise: str | None = None,
           **options: Any) -> Any:
    config = {LOWERING_KEY: route} if route else {}
    if depthwise:
        config[DEPTHWISE_KEY] = depthwise
    target = Target("npu", hw=hw)
    with PassContext(config=config):
        return build_npu(npu_pipeline(target=target)(mod), target, **options)


def quantized(case: NpuCase) -> IRModule:
    """``case``'s model calibrated (min/max) on its input and three more of the seed's, in
    int8 (``kiln.quantize``)."""
    rng = np.random.default_rng(case.seed + 1)
    x = case.inputs[0]
    samples = [x] + [rng.standard_normal(x.shape).astype(x.dtype) for _ in range(3)]
    return quantize_model(case.mod, None, samples)


def is_exact(mod: IRModule) -> bool:
    """Whether every op of ``mod``'s main is one the numpy model of quantized graphs computes
    exactly (its products integer): then a target must match it bit for bit. A layer the
    quantizer leaves in float (a grouped convolution) rounds differently per target."""
    main = mod["main"]
    for blk in main.body.blocks:
        for b in blk.bindings:
            if not isinstance(b.value, g.Call):
                continue
            name = b.value.op.name
            if name in ("nn.conv2d", "dense", "matmul"):
                if not str(b.value.args[0].struct_info.dtype).startswith("int"):
                    return False
            elif name not in EXACT_OPS:
                return False
    return True


def check_case(case: NpuCase, hw: str, variants: bool = True) -> NpuOutcome:
    """Build ``case`` for ``hw`` and run the checks of the module docstring (``variants``:
    also the builds with the optimizations off, the other route and the unfused epilogue)."""
    res = NpuOutcome(case.seed, hw, case.kind, case.layers)

    def attempt(what: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception as err:  # noqa: BLE001 - every exception is a finding
            res.failures.append(f"{what}: {type(err).__name__}: {err}\n" +
                                "".join(traceback.format_exception(err)[-3:]))
            return None

    exe = attempt("build", lambda: _build(case.mod, hw))
    if exe is None:
        return res
    out = attempt("run", lambda: exe(*case.inputs))
    if out is None:
        return res
    res.cycles, res.cpu_ops = exe.last_cycles, list(exe.cpu_ops)
    res.error = _error(out, case.reference)
    if not res.error <= TOLERANCE:
        res.failures.append(f"against float64 torch: error {res.error:.3g} > {TOLERANCE}")
    if not variants:
        return res
    for what, route, options in (
            ("optimizations off", None, dict(residency=False, prefetch=False, bank_plan=False,
                                             reuse_dram=False)),
            ("emit route", "emit", {})):
        other = attempt(f"{what}: build",
                        lambda r=route, o=options: _build(case.mod, hw, r, **o))
        got = attempt(f"{what}: run", lambda e=other: e(*case.inputs)) if other else None
        if got is not None and not np.array_equal(got, out, equal_nan=True):
            res.failures.append(f"{what}: not the same bits (max difference "
                                f"{float(np.nanmax(np.abs(got - out))):.3g})")
    unfused = attempt("unfused epilogue: build",
                      lambda: _build(case.mod, hw, fuse_epilogue=False))
    got = attempt("unfused epilogue: run", lambda: unfused(*case.inputs)) if unfused else None
    if got is not None and not _error(got, case.reference) <= TOLERANCE:
        res.failures.append(f"unfused epilogue: error {_error(got, case.reference):.3g} > "
                            f"{TOLERANCE}")
    for unit in ("diagonal", "banded", "vector") if any(" dw" in n for n in case.layers) else ():
        forced = attempt(f"depthwise as {unit}: build",
                         lambda u=unit: _build(case.mod, hw, depthwise=u))
        got = attempt(f"depthwise as {unit}: run",
                      lambda e=forced: e(*case.inputs)) if forced else None
        if got is not None and not _error(got, case.reference) <= TOLERANCE:
            res.failures.append(f"depthwise as {unit}: error "
                                f"{_error(got, case.reference):.3g} > {TOLERANCE}")
    if case.kind == "int8":
        _check_int8(case, hw, res, attempt)
    else:
        for dtype, tol in MIXED_TOLERANCE.items():
            low = attempt(f"{dtype}: build", lambda d=dtype: _build(
                ToMixedPrecision(d)(case.mod), hw))
            got = attempt(f"{dtype}: run", lambda e=low: e(*case.inputs)) if low else None
            if got is not None and not _error(got, case.reference) <= tol:
                res.failures.append(f"{dtype}: error {_error(got, case.reference):.3g} > {tol}")
    return res


def _check_int8(case: NpuCase, hw: str, res: NpuOutcome, attempt: Callable[..., Any]) -> None:
    """The quantized model: bit for bit the numpy model where its ops are exact, and the
    same bits with the optimizations off either way."""
    qmod = attempt("int8: quantize", lambda: quantized(case))
    if qmod is None:
        return
    exe = attempt("int8: build", lambda: _build(qmod, hw))
    out = attempt("int8: run", lambda: exe(*case.inputs)) if exe else None
    if out is None:
        return
    if is_exact(qmod):
        want = attempt("int8: numpy model", lambda: run_quantized_graph(qmod, *case.inputs))
        if want is not None and not np.array_equal(out, want):
            res.failures.append("int8: not the numpy model's bits (max difference "
                                f"{float(np.abs(out - want).max()):.3g})")
    plain = attempt("int8, optimizations off: build", lambda: _build(
        qmod, hw, residency=False, prefetch=False, bank_plan=False, reuse_dram=False))
    got = attempt("int8, optimizations off: run", lambda: plain(*case.inputs)) if plain \
        else None
    if got is not None and not np.array_equal(got, out):
        res.failures.append("int8, optimizations off: not the same bits")
