"""math_formulas: the vectorized exp and sigmoid, compiled, against float64 numpy in ulps."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from kiln import tir
from kiln.codegen import c as cg
from kiln.testing.tir_testing import elementwise_func
from kiln.tir.math_formulas import EXPANSIONS, exp_float32, expand_call

N = 1 << 20


@pytest.fixture(scope="module")
def mod():
    funcs = {}
    for name, fn in (("exp", tir.exp), ("sigmoid", tir.sigmoid)):
        funcs[name] = elementwise_func((N,), "float32", fn, vectorize=8)
        funcs[name + "_scalar"] = elementwise_func((N,), "float32", fn)
    for dt in ("float16", "bfloat16"):
        funcs["exp_" + dt] = elementwise_func((1024,), dt, tir.exp, vectorize=8)
    return cg.build(funcs)


def _run(mod, name, x):
    out = np.empty_like(x)
    mod[name](x, out)
    return out


def _ulps(got, ref):
    """|got - ref| in units of the float32 spacing at ref (the subnormal spacing below 2^-126)."""
    ref32 = np.abs(ref).astype(np.float32)
    spacing = np.maximum(np.spacing(ref32), np.float32(2.0 ** -149)).astype(np.float64)
    return np.abs(got.astype(np.float64) - ref) / spacing


def _exp64(x):
    with np.errstate(over="ignore"):
        return np.exp(x.astype(np.float64))


def test_exp_is_faithful_over_the_whole_float32_range(mod):
    # every result within 1 ulp of the exact value: normal, subnormal (below -87.3) and the
    # overflow edge (88.72) included
    rng = np.random.default_rng(0)
    x = np.concatenate([np.linspace(-104, 88.72, N // 2, dtype=np.float32),
                        rng.uniform(-104, 88.72, N // 2).astype(np.float32)])
    got = _run(mod, "exp", x)
    assert _ulps(got, _exp64(x)).max() <= 1.0
    sub = (x < -87.5) & (x > -103)
    assert np.all(got[sub] > 0) and np.all(got[sub] < np.finfo(np.float32).tiny)


def test_exp_special_values(mod):
    x = np.zeros(N, np.float32)
    special = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, -10000.0, -1e30, 1e30, 88.8,
                        89.0, -103.9, -104.0, -150.0, 1e-30, -1e-30], np.float32)
    x[:special.size] = special
    got = _run(mod, "exp", x)[:special.size]
    with np.errstate(over="ignore"):
        want = np.exp(special)  # float32 (correctly rounded by the C library)
    np.testing.assert_array_equal(got, want)  # NaN, inf, 0, 1 and the subnormal 1.4e-45 exact


def test_exp_of_an_unvectorized_loop_stays_close(mod):
    # a loop kiln does not vectorize calls the C library's expf (which GCC may vectorize with
    # libmvec, within a few ulp); the vector formula is the more accurate of the two here
    x = np.random.default_rng(1).uniform(-90, 88, N).astype(np.float32)
    ref = _exp64(x)
    assert _ulps(_run(mod, "exp", x), ref).max() <= 1.0
    assert _ulps(_run(mod, "exp_scalar", x), ref).max() <= 3.0


@pytest.mark.parametrize("name, max_ulps", [("sigmoid", 2.5), ("sigmoid_scalar", 4.0)])
def test_sigmoid_keeps_tiny_results(name, max_ulps, mod):
    # e / (1 + e) with e = exp(-|x|): no overflow of exp(-x) for very negative x, so results
    # down to the subnormal range keep their digits (1 / (1 + inf) would give 0)
    x = np.linspace(-120, 60, N, dtype=np.float32)
    got = _run(mod, name, x)
    x64 = x.astype(np.float64)
    want = np.where(x64 >= 0, 1 / (1 + np.exp(-np.abs(x64))),
                    np.exp(-np.abs(x64)) / (1 + np.exp(-np.abs(x64))))
    assert _ulps(got, want).max() <= max_ulps
    special = np.zeros(N, np.float32)
    special[:4] = [np.nan, np.inf, -np.inf, -1e30]
    got = _run(mod, name, special)[:4]
    assert np.isnan(got[0]) and got[1] == 1.0 and got[2] == 0.0 and got[3] == 0.0


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_narrow_floats_are_evaluated_in_float32(dtype, mod):
    np_dt = np.float16 if dtype == "float16" else ml_dtypes.bfloat16
    x = np.random.default_rng(2).uniform(-12, 11, 1024).astype(np_dt)
    got = _run(mod, "exp_" + dtype, x).astype(np.float64)
    want = np.exp(x.astype(np.float64))
    # one rounding of a faithful float32 result: within one ulp of the narrow type (relative
    # 2^-10 or 2^-7; float16's subnormals below 6e-5 are spaced 2^-24)
    mantissa = 10 if dtype == "float16" else 7
    spacing = np.maximum(want * 2.0 ** -mantissa, 2.0 ** -24 if dtype == "float16" else 0)
    assert np.all(np.abs(got - want) <= spacing)
    exact = np.exp(x.astype(np.float32)).astype(np_dt).astype(np.float64)
    assert np.mean(got == exact) > 0.99  # nearly always the correctly rounded value


def test_expansions_are_per_type():
    x32 = tir.Var("x", "float32")
    assert expand_call(tir.exp(x32)) is not None
    assert expand_call(tir.exp(tir.Var("y", "float64"))) is None
    assert expand_call(tir.tanh(x32)) is None
    assert set(EXPANSIONS) == {"exp", "sigmoid"}
    with pytest.raises(TypeError, match="float64"):
        exp_float32(tir.Var("y", "float64"))
