"""The fast_* ops (kiln/op/fast_math.py): error bounds on dense grids, special values,
low-precision inputs, and a speed print next to the libm versions."""

import math
import time

import numpy as np
import pytest

import kiln
from kiln import graph as g
from kiln import op

N = 1 << 18  # grid points per function


def _unary_exe(fn, n, dtype="float32"):
    x = g.Var("x", g.TensorStructInfo((n,), dtype))
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(fn(x))
        bb.emit_func_output(out)
    return kiln.build(bb.get())


def _erf64(x):
    return np.vectorize(math.erf)(x.astype(np.float64))


def _sigmoid64(x):
    x = x.astype(np.float64)
    return 0.5 * (1 + np.tanh(0.5 * x))


# op, grid, reference (float64), error kind, bound
CASES = [
    (op.fast_exp, (-80.0, 80.0), lambda x: np.exp(x.astype(np.float64)), "rel", 1e-6),
    (op.fast_exp, (-87.0, 88.0), lambda x: np.exp(x.astype(np.float64)), "rel", 1e-6),
    (op.fast_tanh, (-12.0, 12.0), lambda x: np.tanh(x.astype(np.float64)), "abs", 1e-6),
    (op.fast_erf, (-6.0, 6.0), _erf64, "abs", 1e-6),
    (op.fast_sigmoid, (-40.0, 40.0), _sigmoid64, "abs", 1e-6),
]


@pytest.mark.parametrize("fn, grid, ref, kind, bound", CASES,
                         ids=[f"{c[0].name}{c[1]}" for c in CASES])
def test_error_bound_on_dense_grid(fn, grid, ref, kind, bound):
    x = np.linspace(grid[0], grid[1], N, dtype=np.float32)
    # include the neighbourhood of 0 densely (relative accuracy of tiny inputs)
    x[: N // 8] = np.linspace(-1e-3, 1e-3, N // 8, dtype=np.float32)
    got = _unary_exe(fn, N)(x).astype(np.float64)
    want = ref(x)
    err = np.abs(got - want)
    if kind == "rel":
        err = err / np.abs(want)
    assert float(err.max()) < bound, f"{fn.name}: max {kind} error {err.max():.3g}"


def test_special_values():
    special = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 100.0, -200.0], np.float32)
    with np.errstate(over="ignore"):
        exp = _unary_exe(op.fast_exp, 7)(special)
    np.testing.assert_array_equal(exp, [np.nan, np.inf, 0.0, 1.0, 1.0, np.inf, 0.0])
    for fn, lo, hi in ((op.fast_tanh, -1, 1), (op.fast_erf, -1, 1), (op.fast_sigmoid, 0, 1)):
        out = _unary_exe(fn, 7)(special)
        assert np.isnan(out[0])
        np.testing.assert_allclose(out[1:3], [hi, lo], atol=1e-7)


def test_float16_inputs_are_evaluated_in_float32():
    x = np.linspace(-4, 4, 1024).astype(np.float16)
    got = _unary_exe(op.fast_tanh, 1024, "float16")(x)
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), np.tanh(x.astype(np.float32)),
                               atol=1e-3)


def test_speed_print():
    """Not an assertion: prints the fast and libm kernels' times for the record."""
    x = np.linspace(-5, 5, N, dtype=np.float32)
    out = np.empty_like(x)
    lines = []
    for exact, fast in ((op.exp, op.fast_exp), (op.tanh, op.fast_tanh), (op.erf, op.fast_erf),
                        (op.sigmoid, op.fast_sigmoid)):
        times = []
        for fn in (exact, fast):
            kernel = _unary_exe(fn, N).module[fn.name]
            kernel(x, out)
            best = min(_timed(kernel, x, out) for _ in range(5))
            times.append(best * 1e3)
        lines.append(f"{exact.name:8s} libm {times[0]:.3f} ms  fast {times[1]:.3f} ms")
    print(f"\nFastMath kernels, {N} float32 elements:\n  " + "\n  ".join(lines))


def _timed(kernel, x, out):
    t = time.perf_counter()
    kernel(x, out)
    return time.perf_counter() - t
