"""The operators of kiln.op.grad (adjoints used by gradient rules): inference and numerics
against numpy references (naive loops written from the definitions)."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln import graph as g
from kiln import op
from kiln.ir import IRModule
from kiln.ir.errors import StructInfoError
from kiln.op.registry import get_op_def

RNG = np.random.default_rng(7)


def _t(*shape, dtype="float32"):
    return g.TensorStructInfo(shape, dtype)


def _infer(call):
    return g.BlockBuilder().normalize(call).struct_info


def _dims(sinfo):
    return tuple(int(d.value) for d in sinfo.shape)


def _run_all(cases):
    """``cases``: name -> (fn(*vars) -> expr, [arrays]); one library for all of them."""
    funcs = {}
    for name, (fn, arrays) in cases.items():
        params = [g.Var(f"x{i}", _t(*a.shape, dtype=str(a.dtype))) for i, a in enumerate(arrays)]
        bb = g.BlockBuilder()
        with bb.function(name, params, {"global_symbol": name}):
            with bb.dataflow():
                out = bb.emit_output(fn(*params))
            bb.emit_func_output(out)
        funcs.update(bb.get().items())
    exe = kiln.build(IRModule(funcs))
    return {name: exe[name](*arrays) for name, (_, arrays) in cases.items()}


# ---------------------------------------------------------------------------------------------
# numpy references
# ---------------------------------------------------------------------------------------------
def _ref_take_backward(grad, shape, indices, axis, mode):
    out = np.zeros(shape, grad.dtype)
    n = out.size if axis is None else shape[axis]
    idx = np.asarray(indices).astype(np.int64)
    if mode == "clip":
        idx = np.clip(idx, 0, n - 1)
    elif mode == "wrap":
        idx = np.mod(idx, n)
    else:
        idx = np.where(idx < 0, idx + n, idx)
    if axis is None:
        np.add.at(out.reshape(-1), idx, grad)
        return out
    moved = np.moveaxis(out, axis, 0)  # a view: scatter along the first axis
    gm = np.moveaxis(grad.reshape(shape[:axis] + idx.shape + shape[axis + 1:]),
                     list(range(axis, axis + idx.ndim)), list(range(idx.ndim)))
    np.add.at(moved, idx, gm)
    return out


def _ref_adjoint(forward, x_shape, grad):
    """The adjoint of a linear map, column by column: ``dx[i] = <forward(e_i), grad>``."""
    dx = np.zeros(x_shape)
    for i in range(dx.size):
        e = np.zeros(x_shape)
        e.reshape(-1)[i] = 1.0
        dx.reshape(-1)[i] = np.sum(forward(e) * grad)
    return dx


def _ref_conv2d(x, w, strides, padding, dilation, groups):
    n, c, h, wd = x.shape
    o, ig, kh, kw = w.shape
    (sh, sw), (dh, dw) = strides, dilation
    pt, pl, pb, pr = padding
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    oh = (h + pt + pb - (kh - 1) * dh - 1) // sh + 1
    ow = (wd + pl + pr - (kw - 1) * dw - 1) // sw + 1
    out = np.zeros((n, o, oh, ow))
    og = o // groups
    for oo in range(o):
        grp = oo // og
        for y in range(oh):
            for xx in range(ow):
                win = xp[:, grp * ig:(grp + 1) * ig, y * sh:y * sh + (kh - 1) * dh + 1:dh,
                         xx * sw:xx * sw + (kw - 1) * dw + 1:dw]
                out[:, oo, y, xx] = np.sum(win * w[oo], axis=(1, 2, 3))
    return out


def _windows(h, w, attrs):
    """(y, x, [(iy, ix) taps inside the input]) of each pooling window (NCHW)."""
    (kh, kw), (sh, sw), (dh, dw) = attrs["pool_size"], attrs["strides"], attrs["dilation"]
    pt, pl = attrs["padding"][0], attrs["padding"][1]
    oh, ow = attrs["out"]
    for y in range(oh):
        for x in range(ow):
            taps = [(y * sh + a * dh - pt, x * sw + b * dw - pl) for a in range(kh)
                    for b in range(kw)]
            yield y, x, taps


# ---------------------------------------------------------------------------------------------
# inference
# ---------------------------------------------------------------------------------------------
def test_collapse_sum_like_inference():
    x, t = g.Var("x", _t(2, 3, 4)), g.Var("t", _t(3, 1, dtype="float16"))
    sinfo = _infer(op.collapse_sum_like(x, t))
    assert _dims(sinfo) == (3, 1) and sinfo.dtype == "float32"
    assert _dims(_infer(op.collapse_sum_to(x, (1, 4)))) == (1, 4)
    with pytest.raises(StructInfoError, match="collapse_sum_like: cannot collapse"):
        _infer(op.collapse_sum_like(x, g.Var("u", _t(2, 4))))
    with pytest.raises(StructInfoError, match="higher-rank"):
        _infer(op.collapse_sum_to(x, (1, 2, 3, 4, 5)))


def test_backward_ops_check_the_gradient_shape():
    gr, data = g.Var("g", _t(3, 3)), g.Var("d", _t(5, 4))
    with pytest.raises(StructInfoError, match="strided_slice_backward: grad has shape"):
        _infer(op.strided_slice_backward(gr, data, (1,), (3,)))
    assert _dims(_infer(op.strided_slice_backward(gr, data, (1, 0), (4, 3)))) == (5, 4)
    idx = g.const(np.array([1, 2]))
    with pytest.raises(StructInfoError, match="take_backward: grad"):
        _infer(op.take_backward(gr, data, idx, axis=0))
    w = g.Var("w", _t(4, 2, 3, 3))
    x = g.Var("x", _t(1, 2, 7, 7))
    bad = g.Var("gb", _t(1, 4, 5, 4))
    with pytest.raises(StructInfoError, match="nn.conv2d_backward_data: grad has shape"):
        _infer(op.conv2d_backward_data(bad, w, x))
    good = g.Var("gg", _t(1, 4, 5, 5))
    assert _dims(_infer(op.conv2d_backward_weight(good, x, w))) == (4, 2, 3, 3)


def test_backward_ops_declare_their_own_gradients():
    for name in ("collapse_sum_like", "collapse_sum_to", "take_backward", "pad_backward",
                 "strided_slice_backward", "nn.conv2d_backward_data",
                 "nn.conv2d_backward_weight", "nn.avg_pool2d_backward",
                 "nn.adaptive_avg_pool2d_backward"):
        assert callable(get_op_def(name).gradient), name
    for name in ("nn.max_pool2d_backward", "nn.adaptive_max_pool2d_backward"):
        assert get_op_def(name).gradient is op.NON_DIFFERENTIABLE


# ---------------------------------------------------------------------------------------------
# numerics
# ---------------------------------------------------------------------------------------------
def test_numerics_against_numpy():
    f32 = np.float32
    x = RNG.standard_normal((2, 3, 4)).astype(f32)
    xh = RNG.standard_normal((2, 3, 4)).astype(np.float16)
    gt = RNG.standard_normal((2, 2, 2)).astype(f32)
    g_flat = RNG.standard_normal((2, 2)).astype(f32)
    g_fast = RNG.standard_normal((2, 2, 3)).astype(f32)
    idx = np.array([[0, 7], [-1, 4]])
    g_slice = RNG.standard_normal((2, 2)).astype(f32)
    g_pad = RNG.standard_normal((4, 6)).astype(f32)
    conv = {"strides": (2, 1), "padding": (1, 0, 0, 1), "dilation": (1, 2), "groups": 2}
    cx = RNG.standard_normal((2, 4, 6, 7))
    cw = RNG.standard_normal((4, 2, 3, 2))
    cy = _ref_conv2d(cx, cw, conv["strides"], conv["padding"], conv["dilation"], 2)
    cg = RNG.standard_normal(cy.shape)
    px = RNG.standard_normal((1, 2, 5, 6))
    pool = {"pool_size": (3, 2), "strides": (2, 2), "padding": (1, 1, 1, 0),
            "dilation": (1, 1), "ceil_mode": True}
    mp = op.nn.max_pool2d(g.Var("v", _t(1, 2, 5, 6, dtype="float64")), **pool)
    out_hw = _dims(_infer(mp))[2:]
    pg = RNG.standard_normal((1, 2) + out_hw)
    ag = RNG.standard_normal((1, 2, 2, 4))

    cases = {
        "csl": (lambda a, t: op.collapse_sum_like(a, t), [x, np.zeros((3, 1), f32)]),
        "csl_half": (lambda a, t: op.collapse_sum_like(a, t), [xh, np.zeros((4,), f32)]),
        "cst": (lambda a: op.collapse_sum_to(a, (2, 1, 4)), [x]),
        "take_b": (lambda a, d: op.take_backward(a, d, g.const(idx), axis=1, mode="clip"),
                   [gt, np.zeros((2, 6), f32)]),
        "take_b_flat": (lambda a, d: op.take_backward(a, d, g.const(idx), mode="wrap"),
                        [g_flat, np.zeros((3, 2), f32)]),
        "take_b_fast": (lambda a, d: op.take_backward(a, d, g.const(idx), axis=0, mode="fast"),
                        [g_fast, np.zeros((8, 3), f32)]),
        "slice_b": (lambda a, d: op.strided_slice_backward(a, d, (1, -1), (None, 0), (2, -2)),
                    [g_slice, np.zeros((5, 4), f32)]),
        "pad_b_edge": (lambda a, d: op.pad_backward(a, d, ((1, 1), (2, 1)), mode="edge"),
                       [g_pad, np.zeros((2, 3), f32)]),
        "pad_b_reflect": (lambda a, d: op.pad_backward(a, d, ((1, 1), (2, 1)), mode="reflect"),
                          [g_pad, np.zeros((2, 3), f32)]),
        "pad_b_const": (lambda a, d: op.pad_backward(a, d, ((1, 1), (2, 1))),
                        [g_pad, np.zeros((2, 3), f32)]),
        "conv_bd": (lambda a, w, d: op.conv2d_backward_data(a, w, d, **conv),
                    [cg, cw, np.zeros_like(cx)]),
        "conv_bw": (lambda a, d, w: op.conv2d_backward_weight(a, d, w, **conv),
                    [cg, cx, np.zeros_like(cw)]),
        "maxpool_b": (lambda a, d: op.max_pool2d_backward(a, d, op.nn.max_pool2d(d, **pool),
                                                          **pool), [pg, px]),
        "avgpool_b": (lambda a, d: op.avg_pool2d_backward(a, d, **pool,
                                                          count_include_pad=True), [pg, px]),
        "amax_b": (lambda a, d: op.adaptive_max_pool2d_backward(
            a, d, op.nn.adaptive_max_pool2d(d, (2, 4)), output_size=(2, 4)), [ag, px]),
        "aavg_b": (lambda a, d: op.adaptive_avg_pool2d_backward(a, d, output_size=(2, 4)),
                   [ag, px]),
    }
    got = _run_all(cases)

    np.testing.assert_allclose(got["csl"], x.sum(0).sum(-1, keepdims=True), rtol=1e-5)
    np.testing.assert_allclose(got["csl_half"], xh.astype(f32).sum((0, 1)).astype(np.float16),
                               rtol=2e-3)
    np.testing.assert_allclose(got["cst"], x.sum(1, keepdims=True), rtol=1e-5)
    np.testing.assert_allclose(got["take_b"], _ref_take_backward(gt, (2, 6), idx, 1, "clip"),
                               rtol=1e-6)
    np.testing.assert_allclose(got["take_b_flat"],
                               _ref_take_backward(g_flat, (3, 2), idx, None, "wrap"), rtol=1e-6)
    np.testing.assert_allclose(got["take_b_fast"],
                               _ref_take_backward(g_fast, (8, 3), idx, 0, "fast"), rtol=1e-6)
    want = np.zeros((5, 4), f32)
    want[1::2, -1:0:-2] = g_slice
    np.testing.assert_allclose(got["slice_b"], want)
    for mode in ("edge", "reflect", "constant"):
        key = {"edge": "pad_b_edge", "reflect": "pad_b_reflect", "constant": "pad_b_const"}[mode]
        ref = _ref_adjoint(lambda e, mode=mode: np.pad(e, ((1, 1), (2, 1)), mode=mode), (2, 3),
                           g_pad)
        np.testing.assert_allclose(got[key], ref, rtol=1e-5, atol=1e-6)
    fwd = lambda e: _ref_conv2d(e, cw, conv["strides"], conv["padding"], conv["dilation"], 2)  # noqa: E731
    np.testing.assert_allclose(got["conv_bd"], _ref_adjoint(fwd, cx.shape, cg), rtol=1e-9)
    fwd_w = lambda e: _ref_conv2d(cx, e, conv["strides"], conv["padding"], conv["dilation"], 2)  # noqa: E731
    np.testing.assert_allclose(got["conv_bw"], _ref_adjoint(fwd_w, cw.shape, cg), rtol=1e-9)

    attrs = {**pool, "out": out_hw}
    mref, aref = np.zeros_like(px), np.zeros_like(px)
    for y, x_, taps in _windows(5, 6, attrs):
        inside = [(a, b) for a, b in taps if 0 <= a < 5 and 0 <= b < 6]
        padded = [(a, b) for a, b in taps if -1 <= a < 6 and -1 <= b < 6]  # count_include_pad
        for nc in range(2):
            vals = [px[0, nc, a, b] for a, b in inside]
            a, b = inside[int(np.argmax(vals))]
            mref[0, nc, a, b] += pg[0, nc, y, x_]
            for a, b in inside:
                aref[0, nc, a, b] += pg[0, nc, y, x_] / len(padded)
    np.testing.assert_allclose(got["maxpool_b"], mref, rtol=1e-12)
    np.testing.assert_allclose(got["avgpool_b"], aref, rtol=1e-12)

    amref, aaref = np.zeros_like(px), np.zeros_like(px)
    for y in range(2):
        ys = slice(y * 5 // 2, -(-(y + 1) * 5 // 2))
        for x_ in range(4):
            xs = slice(x_ * 6 // 4, -(-(x_ + 1) * 6 // 4))
            for nc in range(2):
                win = px[0, nc, ys, xs]
                a, b = np.unravel_index(np.argmax(win), win.shape)
                amref[0, nc, ys.start + a, xs.start + b] += ag[0, nc, y, x_]
                aaref[0, nc, ys, xs] += ag[0, nc, y, x_] / win.size
    np.testing.assert_allclose(got["amax_b"], amref, rtol=1e-12)
    np.testing.assert_allclose(got["aavg_b"], aaref, rtol=1e-12)


def test_take_backward_is_a_scatter_over_lines():
    """take_backward is a loop program: one block instance per output line, the scatter
    inside serial (repeated indices accumulate)."""
    from kiln.transform import LegalizeOps

    gr = g.Var("g", _t(4, 3, 2))
    d = g.Var("d", _t(4, 10))
    bb = g.BlockBuilder()
    with bb.function("main", [gr, d]):
        out = bb.emit(op.take_backward(gr, d, g.const(np.array([[1, 1], [2, 9], [0, 3]])),
                                       axis=1))
        bb.emit_func_output(out)
    mod = LegalizeOps()(bb.get())
    (prim,) = [f for _, f in mod.items() if not isinstance(f, g.Function)]
    assert prim.attrs["op_name"] == "take_backward"
    sch = kiln.tir.Schedule(prim)
    block = sch.get(sch.get_block("take_backward"))
    assert [iv.dom.extent.value for iv in block.iter_vars] == [4]  # the lines: axis 0 of d
    assert len(prim.params) == 3  # grad, indices, result: data only gave the shape
