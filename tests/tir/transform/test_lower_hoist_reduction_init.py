"""hoist_reduction_init: a reduction over a symbolic extent stores its identity even when the
extent is 0 at run time (the guarded in-loop init would never run)."""

from __future__ import annotations

import numpy as np

import kiln
from kiln import graph as g
from kiln import op, tir


def _reduce_module(shape, dtype, make):
    x = g.Var("x", g.TensorStructInfo(shape, dtype))
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(make(x))
        bb.emit_func_output(out)
    return bb.get()


def test_sum_over_an_empty_symbolic_axis_is_zero():
    n = tir.Var("n", "int64")
    exe = kiln.build(_reduce_module((n,), "int64", op.sum))
    assert int(np.asarray(exe(np.ones(5, np.int64)))) == 5
    # the output storage still holds 5 from the first run: the kernel must overwrite it
    assert int(np.asarray(exe(np.ones(0, np.int64)))) == 0


def test_row_sums_with_empty_rows():
    n = tir.Var("n", "int64")
    exe = kiln.build(_reduce_module((3, n), "float32", lambda x: op.sum(x, axis=[1])))
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_allclose(np.asarray(exe(x)), x.sum(axis=1))
    np.testing.assert_array_equal(np.asarray(exe(np.ones((3, 0), np.float32))), np.zeros(3))


def test_static_reductions_are_untouched():
    from kiln import te
    from kiln.tir.transform.hoist_reduction_init import hoist_reduction_init

    a = te.placeholder((4, 8), "float32", name="A")
    k = te.reduce_axis((0, 8), name="k")
    s = te.compute((4,), lambda i: te.sum(a[i, k], axis=k), name="S")
    func = te.create_prim_func([a, s])
    assert hoist_reduction_init(func) is func
