"""Numerics of the run-time-shape operators (kiln/op/dynamic.py) against numpy.

Each op is built in a graph whose output shape is bound by a match_cast of a host shape
function (``kiln.runtime.shape_funcs``), compiled once and run with several values.
"""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln import graph as g
from kiln import op, tir
from kiln.ir.errors import ArgumentError, StructInfoError
from kiln.runtime import shape_funcs

RNG = np.random.default_rng(7)


def _build(params, body):
    """Compile ``main(*params)``; ``body(bb, *params) -> result`` emits the bindings."""
    bb = g.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(body(bb, *params))
        bb.emit_func_output(out)
    mod = bb.get()
    kiln.graph.well_formed(mod)
    return kiln.build(mod)


def _runtime_dims(bb, fn, args, ndim):
    call = g.Call(g.ExternFunc(shape_funcs.PREFIX + fn), args,
                  sinfo_args=[g.ShapeStructInfo(ndim=ndim)])
    dims = tuple(tir.Var(f"d{i}", "int64") for i in range(ndim))
    bb.match_cast(bb.emit(call), g.ShapeStructInfo(dims))
    return dims


def test_dynamic_reshape_runs_with_several_shapes():
    x = g.Var("x", g.TensorStructInfo((2, 3, 4), "float32"))
    s = g.Var("s", g.TensorStructInfo((2,), "int64"))

    def body(bb, x, s):
        dims = _runtime_dims(bb, "reshape", [g.ShapeExpr((2, 3, 4)), s, g.PrimValue(0)], 2)
        return op.dynamic_reshape(bb.emit(op.multiply(x, x)), dims)

    exe = _build([x, s], body)
    xv = RNG.standard_normal((2, 3, 4)).astype("float32")
    for target, want in (([4, 6], (4, 6)), ([-1, 8], (3, 8)), ([0, -1], (2, 12))):
        got = exe(xv, np.array(target))
        assert got.shape == want
        np.testing.assert_allclose(got, (xv * xv).reshape(want), rtol=1e-6)
    with pytest.raises(ArgumentError, match="cannot reshape"):
        exe(xv, np.array([5, 5]))


@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_dynamic_arange(dtype):
    start = g.Var("start", g.TensorStructInfo((), dtype))
    limit = g.Var("limit", g.TensorStructInfo((), dtype))
    delta = g.Var("delta", g.TensorStructInfo((), dtype))

    def body(bb, start, limit, delta):
        (n,) = _runtime_dims(bb, "range", [start, limit, delta], 1)
        return op.dynamic_arange(start, delta, (n,))

    exe = _build([start, limit, delta], body)
    for a, b, d in ((1, 9, 2), (5, -3, -3), (0, 0, 1), (2, 3, 5)):
        args = [np.array(v, dtype) for v in (a, b, d)]
        np.testing.assert_allclose(exe(*args), np.arange(*args).astype(dtype))


def test_dynamic_strided_slice_matches_numpy():
    x = g.Var("x", g.TensorStructInfo((6, 5, 4), "float32"))
    starts = g.Var("starts", g.TensorStructInfo((2,), "int64"))
    ends = g.Var("ends", g.TensorStructInfo((2,), "int64"))
    steps = g.Var("steps", g.TensorStructInfo((2,), "int64"))
    axes = (0, 2)

    def body(bb, x, starts, ends, steps):
        dims = _runtime_dims(bb, "slice", [g.ShapeExpr((6, 5, 4)), starts, ends,
                                           g.ShapeExpr(axes), steps], 3)
        return op.dynamic_strided_slice(x, starts, steps, axes, dims)

    exe = _build([x, starts, ends, steps], body)
    xv = RNG.standard_normal((6, 5, 4)).astype("float32")
    cases = [([1, 0], [5, 4], [2, 1]), ([-1, 3], [-7, -100], [-1, -2]),
             ([100, -2], [200, 4], [1, 1]), ([0, 1], [2**62, 2], [3, 1])]
    for st, en, sp in cases:
        got = exe(xv, np.array(st), np.array(en), np.array(sp))
        want = xv[st[0]:en[0]:sp[0], :, st[1]:en[1]:sp[1]]
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect"])
def test_dynamic_pad_matches_numpy(mode):
    x = g.Var("x", g.TensorStructInfo((3, 4), "float32"))
    pads = g.Var("pads", g.TensorStructInfo((2,), "int64"))

    def body(bb, x, pads):
        dims = _runtime_dims(bb, "pad", [g.ShapeExpr((3, 4)), pads, g.ShapeExpr((1,))], 2)
        return op.dynamic_pad(x, pads, g.const(np.float32(1.5)), (1,), dims, mode=mode)

    exe = _build([x, pads], body)
    xv = RNG.standard_normal((3, 4)).astype("float32")
    for b, a in ((1, 2), (0, 3), (2, 0)):
        kw = {"constant_values": 1.5} if mode == "constant" else {}
        want = np.pad(xv, ((0, 0), (b, a)), mode=mode, **kw)
        np.testing.assert_array_equal(exe(xv, np.array([b, a])), want)
    if mode == "constant":  # negative pads crop
        np.testing.assert_array_equal(exe(xv, np.array([-1, -2])), xv[:, 1:2])


def test_dynamic_nonzero_matches_numpy():
    x = g.Var("x", g.TensorStructInfo((4, 5), "float32"))

    def body(bb, x):
        mask = bb.emit(op.cast(op.not_equal(x, g.const(np.float32(0))), "int64"))
        counts = bb.emit(op.cumsum(mask))
        total = bb.emit(op.sum(mask))
        (n,) = _runtime_dims(bb, "values", [total], 1)
        return op.dynamic_nonzero(x, counts, (2, n))

    exe = _build([x], body)
    for density in (0.0, 0.3, 1.0):
        xv = RNG.standard_normal((4, 5)).astype("float32")
        xv[RNG.random((4, 5)) >= density] = 0
        np.testing.assert_array_equal(exe(xv), np.array(np.nonzero(xv)))


def test_dynamic_ops_check_their_inputs():
    x = g.Var("x", g.TensorStructInfo((3, 4), "float32"))
    starts = g.Var("starts", g.TensorStructInfo((2,), "int32"))
    bb = g.BlockBuilder()
    with pytest.raises(StructInfoError, match="int64"):
        with bb.function("main", [x, starts]):
            bb.emit(op.dynamic_strided_slice(x, starts, starts, (0, 1), (2, 2)))


def test_dynamic_shape_of_reads_symbolic_dims():
    n = tir.Var("n", "int64")
    x = g.Var("x", g.TensorStructInfo((n, 3), "float32"))
    exe = _build([x], lambda bb, x: op.dynamic_shape_of(x))
    for rows in (0, 4):
        np.testing.assert_array_equal(exe(np.zeros((rows, 3), np.float32)), [rows, 3])
