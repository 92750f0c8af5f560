"""The special-function ops (kiln/op/special.py): declarations and attribute errors, then the
numbers against scipy.special (independent implementations) on grids that cross every branch
of the helpers (series / asymptotic switches, reflection, poles), torch's conventions at the
edges (NaN, infinities, zeros, negative degrees), float32 and float16 inputs, and nextafter
against numpy. Each group is one C module (``run_cases``); with KILN_TEST_TARGETS=c,opencl
the same cases run as OpenCL kernels too."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.special as sp

from kiln import graph as g
from kiln import op
from kiln.codegen.c.special_math import SPECIAL_C
from kiln.codegen.gpu.build import compile_program
from kiln.ir import KilnError, StructInfoError
from kiln.op.registry import NON_DIFFERENTIABLE, get_op_def
from kiln.op.special import BINARY_FUNCTIONS, UNARY_FUNCTIONS
from kiln.op.special import POLYNOMIALS as POLYNOMIAL_KINDS
from kiln.schedule.gpu import schedule_prim_func
from kiln.target import Target
from kiln.testing.op_testing import infer, run_cases, scheduled, tvar
from kiln.tir.expr import SPECIAL_FUNCTIONS

RNG = np.random.default_rng(24)
NAN, INF = np.nan, np.inf


def _close(got, want, rtol, atol, what):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    same_nan = np.isnan(got) == np.isnan(want)
    assert same_nan.all(), f"{what}: NaN at {np.flatnonzero(~same_nan)[:5]}"
    ok = ~np.isnan(want)
    np.testing.assert_allclose(got[ok], want[ok], rtol=rtol, atol=atol, err_msg=what)


def test_declarations_and_attribute_errors():
    for name in ("special_function", "special_function2", "orthogonal_polynomial", "nextafter"):
        assert get_op_def(name).gradient is NON_DIFFERENTIABLE
    # every intrinsic has its C helper, and every op function is an intrinsic
    assert set(SPECIAL_FUNCTIONS) <= set(SPECIAL_C)
    assert {*UNARY_FUNCTIONS, *BINARY_FUNCTIONS, *POLYNOMIAL_KINDS} == set(SPECIAL_FUNCTIONS)
    x = tvar("x", (3, 1))
    n = tvar("n", (4,))
    assert infer(op.orthogonal_polynomial(x, n, kind="hermite_h")).static_shape() == (3, 4)
    with pytest.raises(KilnError, match="kind must be one of chebyshev_t"):
        op.orthogonal_polynomial(x, n, kind="jacobi")
    with pytest.raises(KilnError, match="function must be one of bessel_j0"):
        op.special_function(x, function="gamma")
    i = tvar("i", (3,), "int32")
    with pytest.raises(StructInfoError, match="special_function: x must be a float tensor"):
        infer(op.special_function(i, function="bessel_j0"))
    with pytest.raises(StructInfoError, match="special_function2: lhs has dtype float32 but rhs"):
        infer(op.special_function2(x, g.Var("q", g.TensorStructInfo((3,), "float64")),
                                   function="zeta"))


# ---- one-argument functions ------------------------------------------------------------------
#: kiln name -> scipy reference
UNARY = {
    "bessel_j0": sp.j0, "bessel_j1": sp.j1, "bessel_y0": sp.y0, "bessel_y1": sp.y1,
    "bessel_i0": sp.i0, "bessel_i1": sp.i1, "bessel_k0": sp.k0, "bessel_k1": sp.k1,
    "bessel_k0e": sp.k0e, "bessel_k1e": sp.k1e, "airy_ai": lambda v: sp.airy(v)[0],
    "spherical_j0": lambda v: sp.spherical_jn(0, v),
}
#: float64 accuracy: J, Y and Ai switch from series to asymptotics at moderate arguments,
#: where about 1e-11 absolute remains; the others are near machine precision
UNARY_ATOL = {"bessel_j0": 1e-10, "bessel_j1": 1e-10, "bessel_y0": 1e-10, "bessel_y1": 1e-10,
              "airy_ai": 1e-11}


def test_unary_functions_float64_against_scipy():
    grid = np.concatenate([np.linspace(-40.0, 40.0, 4001), RNG.uniform(-300, 300, 500),
                           [1e-300, 1e-8, 0.5, 2.0, 15.0, 30.0, 700.0, 750.0, -7.0, -6.99]])
    cases = [("special_function", [grid], {"function": f}) for f in UNARY]
    for (_, _, attrs), got in zip(cases, run_cases(cases)):
        f = attrs["function"]
        with np.errstate(all="ignore"):
            want = UNARY[f](grid)
        _close(got, want, 1e-12, UNARY_ATOL.get(f, 1e-15), f)


def test_unary_edges_follow_torch():
    edges = np.array([INF, -INF, NAN, 0.0, -0.0, -1.0, 800.0])
    want = {
        "bessel_j0": [NAN, NAN, NAN, 1, 1, sp.j0(-1.0), sp.j0(800.0)],
        "bessel_y0": [NAN, NAN, NAN, -INF, -INF, NAN, sp.y0(800.0)],
        "bessel_y1": [NAN, NAN, NAN, -INF, -INF, NAN, sp.y1(800.0)],
        "bessel_i0": [NAN, NAN, NAN, 1, 1, sp.i0(1.0), INF],
        "bessel_i1": [NAN, NAN, NAN, 0, 0, -sp.i1(1.0), INF],
        "bessel_k0": [0, NAN, NAN, INF, INF, NAN, 0],
        "bessel_k1e": [0, NAN, NAN, INF, INF, NAN, sp.k1e(800.0)],
        "airy_ai": [NAN, NAN, NAN, sp.airy(0.0)[0], sp.airy(0.0)[0], sp.airy(-1.0)[0], 0],
        "spherical_j0": [0, 0, NAN, 1, 1, np.sin(1.0), np.sin(800.0) / 800.0],
    }
    cases = [("special_function", [edges], {"function": f}) for f in want]
    for (_, _, attrs), got in zip(cases, run_cases(cases)):
        _close(got, want[attrs["function"]], 1e-12, 1e-15, attrs["function"])


def test_float32_and_float16_inputs_round_once():
    x = RNG.uniform(-9, 9, 300).astype(np.float32)
    h = x.astype(np.float16)
    cases = [("special_function", [x], {"function": "bessel_j1"}),
             ("special_function", [h], {"function": "airy_ai"})]
    got32, got16 = run_cases(cases)
    assert got32.dtype == np.float32 and got16.dtype == np.float16
    np.testing.assert_array_equal(got32, sp.j1(x.astype(np.float64)).astype(np.float32))
    want16 = sp.airy(h.astype(np.float64))[0].astype(np.float16)
    # float16 rounding of values computed to ~1e-11: equal up to rare ties
    assert np.mean(got16 == want16) > 0.99


# ---- zeta and the incomplete gamma functions ---------------------------------------------------
def test_zeta_and_incomplete_gamma_against_scipy():
    x = np.concatenate([RNG.uniform(1.01, 30, 2000), [2.0, 3.0, 4.0, 1.5]])
    q = np.concatenate([RNG.uniform(0.01, 50, 2000), [1.0, -2.5, 0.5, 1e-3]])
    a = np.concatenate([RNG.uniform(0.01, 80, 2000), RNG.exponential(2, 1000), [500.0, 1e-3]])
    v = np.concatenate([RNG.uniform(0.01, 100, 2000), RNG.exponential(2, 1000), [510.0, 1e-5]])
    cases = [("special_function2", [x, q], {"function": "zeta"}),
             ("special_function2", [a, v], {"function": "igamma"}),
             ("special_function2", [a, v], {"function": "igammac"})]
    zeta, p, qq = run_cases(cases)
    _close(zeta, sp.zeta(x, q), 1e-13, 0, "zeta")
    _close(p, sp.gammainc(a, v), 1e-11, 1e-300, "igamma")
    _close(qq, sp.gammaincc(a, v), 1e-11, 1e-300, "igammac")


def test_zeta_and_incomplete_gamma_edges_follow_torch():
    x = np.array([1.0, 0.5, 2.0, 2.0, 2.5, NAN, 2.0])
    q = np.array([2.0, 2.0, 0.0, -2.0, -2.5, 1.0, -2.5])
    a = np.array([-1.0, 1.0, 0.0, 0.0, 2.0, INF, INF, 2.0, NAN])
    v = np.array([1.0, -1.0, 1.0, 0.0, 0.0, 2.0, INF, INF, 1.0])
    cases = [("special_function2", [x, q], {"function": "zeta"}),
             ("special_function2", [a, v], {"function": "igamma"}),
             ("special_function2", [a, v], {"function": "igammac"})]
    zeta, p, qq = run_cases(cases)
    _close(zeta, [INF, NAN, INF, INF, NAN, NAN, sp.zeta(2.0, -2.5)], 1e-13, 0, "zeta")
    _close(p, [NAN, NAN, 1, NAN, 0, 0, NAN, 1, NAN], 0, 0, "igamma")
    _close(qq, [NAN, NAN, 0, NAN, 1, 1, NAN, 0, NAN], 0, 0, "igammac")


# ---- orthogonal polynomials ----------------------------------------------------------------
def _recurrence(kind, x, n):
    """Each polynomial's value from scipy's own evaluators (Chebyshev V and W from their
    relations to U: V_n(x) = U_n(x) - U_{n-1}(x), W_n(x) = U_n(x) + U_{n-1}(x))."""
    u = lambda m: sp.eval_chebyu(m, x) if m >= 0 else np.zeros_like(x)  # noqa: E731
    return {
        "chebyshev_t": lambda: sp.eval_chebyt(n, x), "chebyshev_u": lambda: sp.eval_chebyu(n, x),
        "chebyshev_v": lambda: u(n) - u(n - 1), "chebyshev_w": lambda: u(n) + u(n - 1),
        "hermite_h": lambda: sp.eval_hermite(n, x), "hermite_he": lambda: sp.eval_hermitenorm(
            n, x), "laguerre_l": lambda: sp.eval_laguerre(n, x),
        "legendre_p": lambda: sp.eval_legendre(n, x),
    }[kind]()


POLYNOMIALS = ("chebyshev_t", "chebyshev_u", "chebyshev_v", "chebyshev_w", "hermite_h",
               "hermite_he", "laguerre_l", "legendre_p")


def test_polynomials_against_scipy():
    """Degrees 0..40 (the recurrence and, for Chebyshev inside (-1, 1), the trigonometric
    form) at points inside and outside [-1, 1], n given as a float tensor per element."""
    degrees = np.arange(0, 41)
    x = np.concatenate([RNG.uniform(-1, 1, 12), RNG.uniform(-3, 3, 6), [1.0, -1.0, 0.0]])
    xx, nn = np.meshgrid(x, degrees)
    cases = [("orthogonal_polynomial", [xx.ravel(), nn.ravel().astype(np.float64)],
              {"kind": k}) for k in POLYNOMIALS]
    for (_, _, attrs), got in zip(cases, run_cases(cases)):
        k = attrs["kind"]
        want = np.array([_recurrence(k, np.array([xv]), int(nv))[0]
                         for xv, nv in zip(xx.ravel(), nn.ravel())])
        scale = np.maximum(np.abs(want), 1.0)
        np.testing.assert_allclose(got / scale, want / scale, rtol=0, atol=1e-11, err_msg=k)


def test_polynomial_degrees_follow_torch():
    """Degrees are truncated toward zero; negative, NaN and infinite degrees give 0; the
    degree broadcasts against x; float32 tensors keep their dtype."""
    x = np.array([[0.3], [-2.0]], np.float32)
    n = np.array([3.7, -0.5, -1.0, NAN, INF, 2.0], np.float32)
    cases = [("orthogonal_polynomial", [x, n], {"kind": k}) for k in ("hermite_he", "legendre_p")]
    he, p = run_cases(cases)
    assert he.dtype == np.float32 and he.shape == (2, 6)
    for got, k in ((he, "hermite_he"), (p, "legendre_p")):
        for r in range(2):
            want = [_recurrence(k, x[r].astype(np.float64), 3)[0], 1.0, 0, 0, 0,
                    _recurrence(k, x[r].astype(np.float64), 2)[0]]
            np.testing.assert_allclose(got[r], want, rtol=1e-6, err_msg=k)


# ---- nextafter -------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_nextafter_against_numpy(dtype):
    tiny = np.finfo(dtype).smallest_subnormal
    big = np.finfo(dtype).max
    special = np.array([0.0, -0.0, 0.0, 1.0, 1.0, -1.0, INF, big, NAN, 1.0, tiny, -tiny, 5.0],
                       dtype)
    toward = np.array([1.0, -1.0, -1.0, 1.0, 2.0, -INF, 0.0, INF, 1.0, NAN, 0.0, 0.0, -5.0],
                      dtype)
    x = np.concatenate([special, RNG.standard_normal(200).astype(dtype)])
    y = np.concatenate([toward, RNG.standard_normal(200).astype(dtype)])
    (got,) = run_cases([("nextafter", [x, y], {})])
    with np.errstate(over="ignore"):
        want = np.nextafter(x, y)
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got[~np.isnan(got)]),
                                  np.signbit(want[~np.isnan(want)]))


# ---- GPU code ----------------------------------------------------------------------------------
def test_every_helper_compiles_as_cuda():
    """The helpers are C that CUDA accepts too: every function in one NVRTC compile (OpenCL
    runs them in the numeric tests above under KILN_TEST_TARGETS=c,opencl)."""
    pytest.importorskip("cuda.bindings")
    target = Target("cuda", arch="sm_80")
    x = np.zeros((64,), np.float32)
    funcs = {}
    for k, f in enumerate(UNARY):
        funcs[f"u{k}"] = ("special_function", [x], {"function": f})
    for k, f in enumerate(("zeta", "igamma", "igammac")):
        funcs[f"b{k}"] = ("special_function2", [x, x], {"function": f})
    for k, kind in enumerate(POLYNOMIALS):
        funcs[f"p{k}"] = ("orthogonal_polynomial", [x, x], {"kind": kind})
    funcs["next"] = ("nextafter", [x, x], {})
    prims = {}
    for key, (name, arrays, attrs) in funcs.items():
        func, _ = scheduled(name, arrays, attrs, schedule=False, target=target)
        func = func.with_attr("op_name", name).with_attr("op_pattern",
                                                         int(get_op_def(name).pattern))
        prims[key] = schedule_prim_func(func, target)
    program = compile_program(prims, target)
    assert program.binaries["cubin"]
    assert program.source.count("__device__ __forceinline__ double kiln_sf_") >= 23
