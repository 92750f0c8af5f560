"""Numerics of ``dynamic_col2im`` and ``dynamic_pad``'s wrap mode against numpy.

Each graph is compiled once; the shape-setting values (image/block shapes, pads) are graph
inputs, the output dims are bound by a host shape function, and every run must match numpy.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import kiln
from kiln import graph as g
from kiln import op, tir
from kiln.runtime import shape_funcs

RNG = np.random.default_rng(11)


def _build(params, body):
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


def col2im_ref(x, image, block, strides, dil, pads):
    """Sum every column entry into the image position its block and offset cover."""
    nsp = len(image)
    k = int(np.prod(block))
    counts = [(image[i] + pads[i] + pads[nsp + i] - (block[i] - 1) * dil[i] - 1) // strides[i]
              + 1 for i in range(nsp)]
    n, ck, _ = x.shape
    out = np.zeros((n, ck // k, *image), x.dtype)
    for kf, off in enumerate(itertools.product(*[range(b) for b in block])):
        for lf, pos in enumerate(itertools.product(*[range(c) for c in counts])):
            at = [pos[i] * strides[i] - pads[i] + off[i] * dil[i] for i in range(nsp)]
            if all(0 <= a < image[i] for i, a in enumerate(at)):
                out[(slice(None), slice(None), *at)] += x[:, kf::k, lf]
    return out


@pytest.mark.parametrize("strides,dil,pads", [((1, 1), (1, 1), (0, 0, 0, 0)),
                                              ((2, 1), (1, 2), (1, 0, 1, 1))])
def test_dynamic_col2im_matches_numpy(strides, dil, pads):
    x = g.Var("x", g.TensorStructInfo((2, 8, 6), "float32"))
    image = g.Var("image", g.TensorStructInfo((2,), "int64"))
    block = g.Var("block", g.TensorStructInfo((2,), "int64"))

    def body(bb, x, image, block):
        dims = _runtime_dims(bb, "col2im", [g.ShapeExpr((2, 8, 6)), image, block,
                                            g.ShapeExpr(strides), g.ShapeExpr(dil),
                                            g.ShapeExpr(pads)], 4)
        return op.dynamic_col2im(x, image, block, dims, strides, dil, pads)

    exe = _build([x, image, block], body)
    xv = RNG.standard_normal((2, 8, 6)).astype("float32")
    ran = 0
    for blk in ((2, 2), (1, 4), (4, 1), (2, 1), (1, 2)):
        for h in range(1, 9):
            for w in range(1, 9):
                try:  # only the geometries that give exactly 6 blocks
                    want_shape = shape_funcs.col2im((2, 8, 6), np.array([h, w]), np.array(blk),
                                                    strides, dil, pads)
                except ValueError:
                    continue
                want = col2im_ref(xv, (h, w), blk, strides, dil, pads)
                got = exe(xv, np.array([h, w]), np.array(blk))
                assert got.shape == want_shape == want.shape
                np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
                ran += 1
    assert ran >= 3
    with pytest.raises(Exception, match="does not hold"):
        exe(xv, np.array([5, 5]), np.array([2, 2]))


@pytest.mark.parametrize("pads", [(1, 2, 0, 3), (4, 0, 5, 1), (-1, 0, 2, -1)])
def test_dynamic_pad_wrap_matches_numpy(pads):
    x = g.Var("x", g.TensorStructInfo((3, 4), "float32"))
    p = g.Var("pads", g.TensorStructInfo((4,), "int64"))

    def body(bb, x, p):
        dims = _runtime_dims(bb, "pad", [g.ShapeExpr((3, 4)), p, g.ShapeExpr((0, 1))], 2)
        return op.dynamic_pad(x, p, g.const(np.float32(0)), (0, 1), dims, mode="wrap")

    exe = _build([x, p], body)
    xv = RNG.standard_normal((3, 4)).astype("float32")
    b0, b1, e0, e1 = pads
    # numpy's wrap after cropping the negative sides (wrap pads of a cropped axis index the
    # original axis periodically: the same as numpy's wrap of the full axis, then cropped)
    want = np.pad(xv, ((max(b0, 0), max(e0, 0)), (max(b1, 0), max(e1, 0))), mode="wrap")
    want = want[max(-b0, 0):want.shape[0] - max(-e0, 0), max(-b1, 0):want.shape[1] - max(-e1, 0)]
    np.testing.assert_array_equal(exe(xv, np.array(pads)), want)
