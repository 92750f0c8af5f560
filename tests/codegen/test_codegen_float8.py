"""Generated C for float8/float6/float4 and 2/4-bit integers, bit for bit against ml_dtypes.

Every conversion goes through kiln's whole path (graph cast -> te -> schedule, vectorized where
the schedule vectorizes -> C): float32 -> each format over a sweep of float32 values (random
magnitudes, every 4099th bit pattern, the special values and the rounding ties), and each
format -> float32 over all of its bit patterns. Array lengths are not multiples of the vector
width, so vector bodies and scalar tails both run.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import kiln
from kiln import graph as g
from kiln import op
from kiln.ir import ArgumentError
from kiln.ir.dtype import MINIFLOATS

FORMATS = [f.name for f in MINIFLOATS.values()]
INTS = ["int2", "uint2", "int4", "uint4"]
RNG = np.random.default_rng(0)


def _build(params: list[tuple[str, tuple, str]], body) -> kiln.Executable:
    """A graph function of ``params`` (name, shape, dtype) whose outputs ``body`` emits."""
    bb = g.BlockBuilder()
    xs = [g.Var(n, g.TensorStructInfo(shape, dt)) for n, shape, dt in params]
    with bb.function("main", xs):
        outs = [bb.emit(e) for e in body(*xs)]
        bb.emit_func_output(g.Tuple(outs) if len(outs) > 1 else outs[0])
    return kiln.build(bb.get())


def _sweep() -> np.ndarray:
    mags = np.float32(10.0) ** RNG.integers(-45, 39, 20000).astype(np.float32)
    with np.errstate(over="ignore"):
        rand = RNG.standard_normal(20000).astype(np.float32) * mags
    patterns = np.arange(0, 2**32, 40009, dtype=np.uint64).astype(np.uint32).view(np.float32)
    special = np.float32([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e-45, 2**-127,
                          1.5 * 2**-127, 448, 464, 465, 480, 240, 57344, 61440, 1.5, 3, 6, 0.25,
                          0.75, 2.5, -3.5, 5, 1e6, -1e6])
    return np.concatenate([rand, patterns, special])


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint8)


@pytest.fixture(scope="module")
def float_casts():
    x = _sweep()
    ins = [("x", x.shape, "float32")] + [(f"p{i}", (1 << f.bits,), f.name)
                                          for i, f in enumerate(MINIFLOATS.values())]

    def body(x, *ps):
        return [op.cast(x, f) for f in FORMATS] + [op.cast(p, "float32") for p in ps]

    pats = [np.arange(1 << f.bits, dtype=np.uint8).view(getattr(ml_dtypes, f.name))
            for f in MINIFLOATS.values()]
    outs = _build(ins, body)(x, *pats)
    n = len(FORMATS)
    return x, pats, dict(zip(FORMATS, outs[:n])), dict(zip(FORMATS, outs[n:]))


@pytest.mark.parametrize("name", FORMATS)
def test_float32_to_format_bit_exact(float_casts, name):
    x, _, to_fmt, _ = float_casts
    got = to_fmt[name]
    assert got.dtype == np.dtype(getattr(ml_dtypes, name))
    with np.errstate(all="ignore"):
        want = x.astype(getattr(ml_dtypes, name))
    bad = _bits(got) != _bits(want)
    assert not bad.any(), f"{bad.sum()} mismatches, e.g. {x[bad][:4]}: {_bits(got)[bad][:4]} " \
                          f"instead of {_bits(want)[bad][:4]}"


@pytest.mark.parametrize("name", FORMATS)
def test_format_to_float32_every_pattern(float_casts, name):
    _, pats, _, from_fmt = float_casts
    i = FORMATS.index(name)
    got, want = from_fmt[name], pats[i].astype(np.float32)
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    assert same.all(), f"patterns {np.flatnonzero(~same)[:4]}"


def test_float8_arithmetic_rounds_once_per_store():
    a = (RNG.standard_normal(1003) * 8).astype(ml_dtypes.float8_e4m3fn)
    b = (RNG.standard_normal(1003) * 8).astype(ml_dtypes.float8_e5m2)
    exe = _build([("a", a.shape, "float8_e4m3fn"), ("b", b.shape, "float8_e5m2")],
                 lambda a, b: [op.multiply(a, op.cast(b, "float8_e4m3fn")),
                               op.cast(a, "float8_e5m2"), op.cast(a, "float16")])
    prod, a_e5m2, a_f16 = exe(a, b)
    want = (a.astype(np.float32) * b.astype(ml_dtypes.float8_e4m3fn).astype(np.float32))
    with np.errstate(all="ignore"):
        assert (_bits(prod) == _bits(want.astype(ml_dtypes.float8_e4m3fn))).all()
    assert (_bits(a_e5m2) == _bits(a.astype(ml_dtypes.float8_e5m2))).all()
    np.testing.assert_array_equal(a_f16, a.astype(np.float16))


def test_float64_source_rounds_through_float32_like_ml_dtypes():
    ties = np.float64([1.125, 1.375, 3.5, 0.0546875]) + 1e-12  # just above e5m2 ties
    x = np.concatenate([ties, -ties, RNG.standard_normal(997) * 1e3])
    got = _build([("x", x.shape, "float64")], lambda x: [op.cast(x, "float8_e5m2")])(x)
    assert (_bits(got) == _bits(x.astype(ml_dtypes.float8_e5m2))).all()


def test_float8_reductions_start_from_finite_extremes():
    """e4m3fn has no Inf: max/min reductions must start from -448/448, not from NaN."""
    x = (-np.abs(RNG.standard_normal((7, 33))) * 10).astype(ml_dtypes.float8_e4m3fn)
    exe = _build([("x", x.shape, "float8_e4m3fn")],
                 lambda x: [op.max(x, axis=1), op.min(op.negative(x), axis=0), op.exp(x)])
    mx, mn, ex = exe(x)
    x32 = x.astype(np.float32)
    np.testing.assert_array_equal(mx.astype(np.float32), x32.max(1))
    np.testing.assert_array_equal(mn.astype(np.float32), (-x32).min(0))
    # exp in float32 (libm and numpy may differ by a float32 ulp), rounded once to e4m3fn:
    # at most one e4m3fn step apart (3 mantissa bits; subnormal step 2^-9)
    want = np.exp(x32).astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    np.testing.assert_allclose(ex.astype(np.float32), want, rtol=2.0**-3, atol=2.0**-9)


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2",
                                  "float8_e5m2fnuz", "float4_e2m1fn"])
def test_saturating_cast_clamps_to_the_largest_finite_value(name):
    t = getattr(ml_dtypes, name)
    x = np.concatenate([_sweep()[:5000], np.float32([np.inf, -np.inf, np.nan, 1e30, -1e30])])
    with np.errstate(over="ignore"):
        h = x.astype(np.float16)
    exe = _build([("x", x.shape, "float32"), ("h", h.shape, "float16")],
                 lambda x, h: [op.cast(x, name, saturate=True), op.cast(h, name, saturate=True)])
    got32, got16 = exe(x, h)
    hi = float(ml_dtypes.finfo(t).max)
    with np.errstate(all="ignore"):
        want32 = np.clip(x, -hi, hi).astype(t)  # np.clip keeps NaN
        want16 = np.clip(h.astype(np.float32), -hi, hi).astype(t)
    assert (_bits(got32) == _bits(want32)).all()
    assert (_bits(got16) == _bits(want16)).all()


@pytest.mark.parametrize("mode", ["up", "down", "nearest"])
@pytest.mark.parametrize("saturate", [True, False])
def test_e8m0_round_modes_follow_onnx(mode, saturate):
    from onnx.numpy_helper import to_float8e8m0

    mags = np.float32(2.0) ** RNG.integers(-126, 128, 3000).astype(np.float32)
    x = np.concatenate([(RNG.uniform(-2, 2, 3000).astype(np.float32) * mags),
                        np.float32([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, 0.5, 3.0,
                                    2.0**127, 3.0 * 2**126, 1.9 * 2**127, 2.0**-126])])
    x = x[np.isnan(x) | ~np.isfinite(x) | (np.abs(x) >= 2.0**-126) | (x == 0)]
    got = _build([("x", x.shape, "float32")],
                 lambda x: [op.cast(x, "float8_e8m0fnu", saturate=saturate, round_mode=mode)])(x)
    want = to_float8e8m0(x, saturate=saturate, round_mode=mode)
    bad = _bits(got) != _bits(want)
    assert not bad.any(), f"{x[bad][:4]}: {_bits(got)[bad][:4]} vs {_bits(want)[bad][:4]}"


@pytest.mark.parametrize("name", INTS)
def test_subbyte_int_casts_and_wrapping_arithmetic(name):
    t = getattr(ml_dtypes, name)
    info = ml_dtypes.iinfo(t)
    x = (RNG.standard_normal(1001) * 6).astype(np.float32)
    i = RNG.integers(-300, 300, 1001).astype(np.int32)
    a = RNG.integers(int(info.min), int(info.max) + 1, 1001).astype(t)
    b = RNG.integers(int(info.min), int(info.max) + 1, 1001).astype(t)
    exe = _build([("x", x.shape, "float32"), ("i", i.shape, "int32"), ("a", a.shape, name),
                  ("b", b.shape, name)],
                 lambda x, i, a, b: [op.cast(x, name), op.cast(i, name), op.add(a, b),
                                     op.multiply(a, b), op.cast(a, "float32"),
                                     op.cast(a, "int32")])
    fx, fi, s, p, af, ai = exe(x, i, a, b)
    # the stored bytes are ml_dtypes' (zero-extended patterns), not just the values
    assert (_bits(fx) == _bits(x.astype(t))).all()
    assert (_bits(fi) == _bits(i.astype(t))).all()
    assert (_bits(s) == _bits(a + b)).all() and (_bits(p) == _bits(a * b)).all()
    np.testing.assert_array_equal(af, a.astype(np.float32))
    np.testing.assert_array_equal(ai, a.astype(np.int32))


def test_wrong_dtype_is_an_argument_error_naming_both_types():
    exe = _build([("x", (4,), "float8_e4m3fn")], lambda x: [op.cast(x, "float32")])
    with pytest.raises(ArgumentError, match="float8_e4m3fn"):
        exe(np.zeros(4, ml_dtypes.float8_e5m2))
