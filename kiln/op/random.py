"""Random numbers: ``random_seed``, ``random_uniform``, ``random_normal``, ``bernoulli`` and
``categorical_sample`` (the Multinomial kernel).

Why a counter-based generator (Philox-4x32-10, Salmon et al., SC'11): every element's random
bits are a pure function ``philox(counter=(element index, stream), key=seed)``, computed in the
kernel itself. There is no generator state to thread through the graph, loops may run in any
order, in parallel or vectorized, and a given seed gives the same tensor whatever the schedule
or thread count. Ten rounds of two 32x32->64-bit multiplies pass BigCrush; the rounds are
written as TIR ``Let`` bindings so each intermediate word is computed once.

Seeds are a 0-d ``uint64`` tensor input of every random op (the Philox key): a constant when the
model fixes a seed (reproducible), else the output of ``random_seed()``, an op whose kernel
draws a fresh value on every run (a process-wide atomic counter mixed with the time and an
address, through splitmix64; not cryptographic). A seed *input*, rather than a seed made inside
each kernel, keeps the sampling kernels pure functions of their inputs (they can be fused,
tested and constant-folded when seeded) and confines the one impure step to a one-element
kernel. Op names containing ``random`` are impure for the graph passes (never folded or merged;
see :func:`kiln.transform.dead_code_elimination.op_is_pure`), so two unseeded ops get two
seeds.

Each op also takes a ``stream`` (a 32-bit word of the counter): ops sharing a seed draw
independent numbers when their streams differ. Floats: uniform values are ``k * 2**-b`` for a
``b``-bit integer ``k`` (24 bits for float32, 53 for float64, the mantissa width for 16-bit
floats), so ``[low, high)`` is half open before the final scaling rounds; normal values use
Box-Muller on two uniforms (``u1`` in ``(0, 1]`` so the logarithm is finite).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .. import te
from ..ir.dtype import DataType, as_dtype
from ..ir.errors import DTypeError, KilnError, StructInfoError
from ..tir import expr as tx
from .common import arg_ndim, arg_shape, tensor_arg, tensor_sinfo
from .registry import NON_DIFFERENTIABLE, MixedPrecision, OpPattern, register_op

__all__ = ["bernoulli", "categorical_sample", "philox4x32", "random_normal", "random_seed",
           "random_uniform"]

U32, U64, F32, F64 = (DataType(t) for t in ("uint32", "uint64", "float32", "float64"))
SEED_DTYPE = U64

_PHILOX_M = (0xD2511F53, 0xCD9E8D57)
_PHILOX_W = (0x9E3779B9, 0xBB67AE85)


# ---- the generator --------------------------------------------------------------------------
class LetChain:
    """Collects ``var = value`` bindings and wraps a body in them (innermost last), so shared
    intermediate values appear once in the expression tree."""

    def __init__(self) -> None:
        self.bindings: list[tuple[tx.Var, tx.PrimExpr]] = []

    def bind(self, value: tx.PrimExpr, name: str) -> tx.Var:
        v = tx.Var(f"{name}{len(self.bindings)}", value.dtype)
        self.bindings.append((v, value))
        return v

    def wrap(self, body: tx.PrimExpr) -> tx.PrimExpr:
        for v, value in reversed(self.bindings):
            body = tx.Let(v, value, body)
        return body


def _mul_hi_lo(a: tx.PrimExpr, m: int) -> tuple[tx.PrimExpr, tx.PrimExpr]:
    p = tx.cast(U64, a) * tx.const(U64, m)
    return tx.cast(U32, tx.shift_right(p, 32)), tx.cast(U32, p)


def philox4x32(counter: tuple[tx.PrimExpr, ...], key: tuple[tx.PrimExpr, ...],
               chain: LetChain, rounds: int = 10) -> tuple[tx.PrimExpr, ...]:
    """Philox-4x32 of four uint32 counter words under a two-word uint32 key; the round values
    are bound in ``chain`` (wrap the final expression with ``chain.wrap``)."""
    c = [chain.bind(tx.cast(U32, w), "ph_c") for w in counter]
    k0, k1 = (chain.bind(tx.cast(U32, w), "ph_k") for w in key)
    for r in range(rounds):
        if r:
            k0 = chain.bind(k0 + tx.const(U32, _PHILOX_W[0]), "ph_k")
            k1 = chain.bind(k1 + tx.const(U32, _PHILOX_W[1]), "ph_k")
        hi0, lo0 = _mul_hi_lo(c[0], _PHILOX_M[0])
        hi1, lo1 = _mul_hi_lo(c[2], _PHILOX_M[1])
        words = (tx.bitwise_xor(tx.bitwise_xor(hi1, c[1]), k0), lo1,
                 tx.bitwise_xor(tx.bitwise_xor(hi0, c[3]), k1), lo0)
        c = [chain.bind(w, "ph_x") for w in words]
    return tuple(c)


def _random_words(seed: tx.PrimExpr, index: tx.PrimExpr, stream: int,
                  chain: LetChain) -> tuple[tx.PrimExpr, ...]:
    """The four random uint32 words of element ``index`` (int64) under ``seed`` (uint64)."""
    idx = tx.cast(U64, index)
    counter = (tx.cast(U32, idx), tx.cast(U32, tx.shift_right(idx, 32)),
               tx.const(U32, stream & 0xFFFFFFFF), tx.const(U32, 0))
    key = (tx.cast(U32, seed), tx.cast(U32, tx.shift_right(seed, 32)))
    return philox4x32(counter, key, chain)


def _mantissa_bits(dt: DataType) -> int:
    return {64: 53, 32: 24}.get(dt.bits, 11) if not dt.is_bfloat else 8


def _uniform01(words: tuple[tx.PrimExpr, ...], dt: DataType, first: int = 0,
               open_low: bool = False) -> tx.PrimExpr:
    """A uniform value in ``[0, 1)`` (``(0, 1]`` with ``open_low``) from ``words[first:]``,
    computed in float64 for float64 results and in float32 otherwise (exact: at most 24
    bits)."""
    bits = _mantissa_bits(dt)
    if bits == 53:
        hi = tx.cast(F64, tx.shift_right(words[first], 5))  # 27 bits
        lo = tx.cast(F64, tx.shift_right(words[first + 1], 6))  # 26 bits
        k = hi * tx.const(F64, 2.0**26) + lo
        ct = F64
    else:
        k = tx.cast(F32, tx.shift_right(words[first], 32 - bits))
        ct = F32
    if open_low:
        k = k + tx.const(ct, 1.0)
    return k * tx.const(ct, 2.0**-bits)


def _flat_index(idx: tuple[Any, ...], shape: tuple[Any, ...]) -> tx.PrimExpr:
    flat: tx.PrimExpr = tx.const("int64", 0)
    for i, n in zip(idx, shape):
        flat = flat * tx.cast("int64", n) + tx.cast("int64", i)
    return flat


def _seed_of(seed: te.Tensor) -> tx.PrimExpr:
    return seed() if not seed.shape else seed(*([0] * len(seed.shape)))


# ---- attributes -----------------------------------------------------------------------------
def _float_dtype(dtype: Any, op: str) -> str:
    try:
        dt = as_dtype(dtype)
    except (DTypeError, TypeError, ValueError) as err:
        raise KilnError(f"{op}: bad dtype {dtype!r}: {err}") from err
    if dt.lanes != 1 or not dt.is_float or dt.is_minifloat:
        raise KilnError(f"{op}: dtype must be float16/bfloat16/float32/float64, got {dt}")
    return str(dt)


def _static_shape(shape: Any, op: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(d) for d in shape)
    except (TypeError, ValueError) as err:
        raise KilnError(f"{op}: shape must be a sequence of ints, got {shape!r}") from err
    if any(d < 0 for d in dims):
        raise KilnError(f"{op}: negative dimension in shape {dims}")
    return dims


@dataclass(frozen=True)
class RandomUniformAttrs:
    """``shape`` (static), ``dtype`` (a float type), values in ``[low, high)``; ``stream``
    selects an independent sequence for one seed."""

    shape: tuple[int, ...]
    dtype: str = "float32"
    low: float = 0.0
    high: float = 1.0
    stream: int = 0

    def __post_init__(self):
        object.__setattr__(self, "shape", _static_shape(self.shape, "random_uniform"))
        object.__setattr__(self, "dtype", _float_dtype(self.dtype, "random_uniform"))
        object.__setattr__(self, "low", float(self.low))
        object.__setattr__(self, "high", float(self.high))
        object.__setattr__(self, "stream", int(self.stream))


@dataclass(frozen=True)
class RandomNormalAttrs:
    """``shape`` (static), ``dtype`` (a float type), ``mean`` and ``scale`` (standard
    deviation); ``stream`` as for :class:`RandomUniformAttrs`."""

    shape: tuple[int, ...]
    dtype: str = "float32"
    mean: float = 0.0
    scale: float = 1.0
    stream: int = 0

    def __post_init__(self):
        object.__setattr__(self, "shape", _static_shape(self.shape, "random_normal"))
        object.__setattr__(self, "dtype", _float_dtype(self.dtype, "random_normal"))
        object.__setattr__(self, "mean", float(self.mean))
        object.__setattr__(self, "scale", float(self.scale))
        object.__setattr__(self, "stream", int(self.stream))


@dataclass(frozen=True)
class BernoulliAttrs:
    """``dtype``: the result type (None: the probabilities' type); ``stream`` as above."""

    dtype: str | None = None
    stream: int = 0

    def __post_init__(self):
        if self.dtype is not None:
            dt = as_dtype(self.dtype)
            if dt.lanes != 1 or dt.is_handle:
                raise KilnError(f"bernoulli: dtype must be a scalar tensor type, got {dt}")
            object.__setattr__(self, "dtype", str(dt))
        object.__setattr__(self, "stream", int(self.stream))


@dataclass(frozen=True)
class CategoricalAttrs:
    """``dtype``: the index type of the samples (int32 or int64)."""

    dtype: str = "int32"

    def __post_init__(self):
        if str(as_dtype(self.dtype)) not in ("int32", "int64"):
            raise KilnError(f"categorical_sample: dtype must be int32 or int64, got "
                            f"{self.dtype!r}")
        object.__setattr__(self, "dtype", str(as_dtype(self.dtype)))


# ---- inference ------------------------------------------------------------------------------
def _check_seed(call: Any, index: int, op: str) -> None:
    s = tensor_arg(call, index, op, "seed")
    shape = arg_shape(s)
    if as_dtype(s.dtype) != SEED_DTYPE or (shape is not None and len(shape) != 0):
        raise StructInfoError(f"{op}: seed must be a 0-d uint64 tensor, got {s.dtype} "
                              f"with shape {shape}")


def _seed_infer(call: Any) -> Any:
    return tensor_sinfo((), SEED_DTYPE, ndim=0)


def _shaped_infer(op: str):
    def infer(call: Any) -> Any:
        _check_seed(call, 0, op)
        return tensor_sinfo(call.attrs.shape, call.attrs.dtype, ndim=len(call.attrs.shape))

    return infer


def _bernoulli_infer(call: Any) -> Any:
    p = tensor_arg(call, 0, "bernoulli", "p")
    if not as_dtype(p.dtype).is_float:
        raise StructInfoError(f"bernoulli: p must be a float tensor, got {p.dtype}")
    _check_seed(call, 1, "bernoulli")
    attrs = call.attrs or BernoulliAttrs()
    return tensor_sinfo(arg_shape(p), attrs.dtype or p.dtype, ndim=arg_ndim(p))


def _categorical_infer(call: Any) -> Any:
    cdf = tensor_arg(call, 0, "categorical_sample", "cdf")
    u = tensor_arg(call, 1, "categorical_sample", "u")
    if not as_dtype(cdf.dtype).is_float or u.dtype != cdf.dtype:
        raise StructInfoError(f"categorical_sample: cdf and u must be float tensors of one "
                              f"dtype, got {cdf.dtype} and {u.dtype}")
    cs, us = arg_shape(cdf), arg_shape(u)
    if arg_ndim(cdf) not in (-1, 2) or arg_ndim(u) not in (-1, 2):
        raise StructInfoError("categorical_sample: cdf (batch, classes) and u (batch, samples) "
                              "must be 2-D")
    shape = None if cs is None or us is None else (cs[0], us[1])
    return tensor_sinfo(shape, call.attrs.dtype, ndim=2)


# ---- computes -------------------------------------------------------------------------------
def _fresh_seed_compute(attrs: Any = None) -> te.Tensor:
    return te.compute((), lambda: tx.Call(SEED_DTYPE, "fresh_seed", ()), name="random_seed")


def _uniform_compute(seed: te.Tensor, attrs: RandomUniformAttrs) -> te.Tensor:
    dt = as_dtype(attrs.dtype)
    shape = attrs.shape

    def f(*idx):
        chain = LetChain()
        words = _random_words(_seed_of(seed), _flat_index(idx, shape), attrs.stream, chain)
        u = _uniform01(words, dt)
        ct = u.dtype
        value = tx.const(ct, attrs.low) + tx.const(ct, attrs.high - attrs.low) * u
        return chain.wrap(tx.cast(dt, value))

    return te.compute(shape, f, name="random_uniform")


def _normal_compute(seed: te.Tensor, attrs: RandomNormalAttrs) -> te.Tensor:
    dt = as_dtype(attrs.dtype)
    shape = attrs.shape

    def f(*idx):
        chain = LetChain()
        words = _random_words(_seed_of(seed), _flat_index(idx, shape), attrs.stream, chain)
        wide = dt.bits == 64
        u1 = _uniform01(words, dt, 0, open_low=True)
        u2 = _uniform01(words, dt, 2 if wide else 1)
        ct = u1.dtype
        radius = tx.sqrt(tx.const(ct, -2.0) * tx.log(u1))
        z = radius * tx.cos(tx.const(ct, 2.0 * math.pi) * u2)
        value = tx.const(ct, attrs.mean) + tx.const(ct, attrs.scale) * z
        return chain.wrap(tx.cast(dt, value))

    return te.compute(shape, f, name="random_normal")


def _bernoulli_compute(p: te.Tensor, seed: te.Tensor, attrs: BernoulliAttrs) -> te.Tensor:
    out = as_dtype((attrs or BernoulliAttrs()).dtype or p.dtype)
    stream = (attrs or BernoulliAttrs()).stream

    def f(*idx):
        chain = LetChain()
        words = _random_words(_seed_of(seed), _flat_index(idx, p.shape), stream, chain)
        prob = p(*idx)
        wide = prob.dtype.bits == 64
        u = _uniform01(words, F64 if wide else F32)
        hit = tx.lt(u, tx.cast(u.dtype, prob))
        return chain.wrap(tx.cast(out, hit))

    return te.compute(p.shape, f, name="bernoulli")


def _categorical_compute(cdf: te.Tensor, u: te.Tensor, attrs: CategoricalAttrs) -> te.Tensor:
    """Sample ``s`` of row ``b`` is the first class whose cumulative weight exceeds
    ``u[b, s] * total``: the number of earlier classes (all but the last) at or below it."""
    batch, classes = cdf.shape
    out = as_dtype(attrs.dtype)
    last = tx.cast("int64", classes) - tx.const("int64", 1)
    c = te.reduce_axis((0, classes - 1), name="c")

    def f(b, s):
        target = u(b, s) * cdf(b, last)
        return te.sum(tx.cast(out, tx.le(cdf(b, c), target)), axis=c)

    return te.compute((batch, u.shape[1]), f, name="categorical_sample")


# ---- declarations ---------------------------------------------------------------------------
_ND = NON_DIFFERENTIABLE
_N = MixedPrecision.NEVER

random_seed = register_op(
    "random_seed",
    inputs=(),
    infer=_seed_infer,
    pattern=OpPattern.OPAQUE,
    compute=_fresh_seed_compute,
    mixed_precision=_N,
    gradient=_ND,
    doc="A fresh 0-d uint64 seed on every run (the seed of unseeded random ops).",
)

random_uniform = register_op(
    "random_uniform",
    inputs=("seed",),
    attrs=RandomUniformAttrs,
    infer=_shaped_infer("random_uniform"),
    pattern=OpPattern.INJECTIVE,
    compute=_uniform_compute,
    mixed_precision=_N,
    gradient=_ND,
    doc="Uniform values in ``[low, high)`` of ``shape``, from Philox(seed, element index).",
)

random_normal = register_op(
    "random_normal",
    inputs=("seed",),
    attrs=RandomNormalAttrs,
    infer=_shaped_infer("random_normal"),
    pattern=OpPattern.INJECTIVE,
    compute=_normal_compute,
    mixed_precision=_N,
    gradient=_ND,
    doc="Normal values (``mean``, ``scale``) of ``shape``, Box-Muller on Philox uniforms.",
)

bernoulli = register_op(
    "bernoulli",
    inputs=("p", "seed"),
    attrs=BernoulliAttrs,
    infer=_bernoulli_infer,
    pattern=OpPattern.INJECTIVE,
    compute=_bernoulli_compute,
    mixed_precision=_N,
    gradient=_ND,
    doc="1 with probability ``p`` (element-wise), else 0, in ``dtype`` (default p's).",
)

categorical_sample = register_op(
    "categorical_sample",
    inputs=("cdf", "u"),
    attrs=CategoricalAttrs,
    infer=_categorical_infer,
    pattern=OpPattern.OPAQUE,
    compute=_categorical_compute,
    mixed_precision=_N,
    gradient=_ND,
    doc="Class indices drawn by inverse CDF: ``cdf`` (batch, classes) holds cumulative "
        "weights, ``u`` (batch, samples) uniforms in [0, 1).",
)
