"""nn operators: StructInfo inference, declarations, and numerics of the CPU schedules.

The numpy references are written out here (convolution as a sum of strided views of the padded
input, pooling as explicit window loops) rather than derived from kiln's own formulas.
"""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln import graph as g
from kiln import op, te, tir
from kiln.graph.block_builder import BlockBuilder
from kiln.graph.struct_info import TensorStructInfo
from kiln.ir.errors import KilnError, StructInfoError
from kiln.op.registry import MixedPrecision, OpPattern, get_op_def
from kiln.schedule import lookup_schedule
from kiln.target import Target
from kiln.testing.op_testing import check, dims, infer, make_rand, run_cases, tvar
from kiln.tir.schedule import Schedule

TARGET = Target("c")
RNG = np.random.default_rng(2)


rand = make_rand(RNG, int_range=(-20, 20))


def pad4(p):
    if isinstance(p, int):
        return (p,) * 4
    return (p[0], p[1], p[0], p[1]) if len(p) == 2 else tuple(p)


def pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


# ---------------------------------------------------------------------------------------------
# numpy references
# ---------------------------------------------------------------------------------------------
def conv2d_ref(x, w, strides=1, padding=0, dilation=1, groups=1):
    (sh, sw), (dh, dw) = pair(strides), pair(dilation)
    pt, pl, pb, pr = pad4(padding)
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    n, _, hp, wp = xp.shape
    o, ig, kh, kw = w.shape
    oh, ow = (hp - dh * (kh - 1) - 1) // sh + 1, (wp - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((n, o, oh, ow))
    og = o // groups
    for gi in range(groups):
        xs = xp[:, gi * ig:(gi + 1) * ig]
        ws = w[gi * og:(gi + 1) * og].astype(np.float64)
        for ry in range(kh):
            for rx in range(kw):
                patch = xs[:, :, ry * dh: ry * dh + sh * (oh - 1) + 1: sh,
                           rx * dw: rx * dw + sw * (ow - 1) + 1: sw]
                out[:, gi * og:(gi + 1) * og] += np.einsum("nchw,oc->nohw", patch,
                                                           ws[:, :, ry, rx])
    return out


def pool_out(size, k, s, d, lo, hi, ceil):
    span = size + lo + hi - d * (k - 1) - 1
    out = (-(-span // s) if ceil else span // s) + 1
    if ceil and (out - 1) * s >= size + lo:
        out -= 1
    return out


def pool2d_ref(x, kind, pool_size, strides=1, padding=0, dilation=1, ceil_mode=False,
               count_include_pad=False):
    """Explicit window loops. Average divisor: taps inside the input, or inside the padded
    input with count_include_pad (taps past the padding, from ceil_mode, never count)."""
    (kh, kw), (sh, sw), (dh, dw) = pair(pool_size), pair(strides), pair(dilation)
    pt, pl, pb, pr = pad4(padding)
    n, c, h, w = x.shape
    oh = pool_out(h, kh, sh, dh, pt, pb, ceil_mode)
    ow = pool_out(w, kw, sw, dw, pl, pr, ceil_mode)
    out = np.zeros((n, c, oh, ow), np.float64 if kind == "avg" else x.dtype)
    for y in range(oh):
        for xx in range(ow):
            hs = [y * sh - pt + r * dh for r in range(kh)]
            ws = [xx * sw - pl + r * dw for r in range(kw)]
            hin = [v for v in hs if 0 <= v < h]
            win = [v for v in ws if 0 <= v < w]
            vals = x[:, :, hin][:, :, :, win]
            if kind == "max":
                out[:, :, y, xx] = vals.max(axis=(2, 3))
                continue
            if kind == "nanmax":  # NaNs skipped; a window of NaNs only gives -inf
                out[:, :, y, xx] = np.fmax.reduce(vals.reshape(n, c, -1), axis=2)
                out[:, :, y, xx][np.isnan(out[:, :, y, xx])] = -np.inf
                continue
            if count_include_pad:
                cnt = len([v for v in hs if -pt <= v < h + pb]) * len(
                    [v for v in ws if -pl <= v < w + pr])
            else:
                cnt = len(hin) * len(win)
            out[:, :, y, xx] = vals.astype(np.float64).sum(axis=(2, 3)) / cnt
    return out


def adaptive_ref(x, kind, output_size):
    n, c, h, w = x.shape
    oh, ow = pair(output_size)
    out = np.zeros((n, c, oh, ow), np.float64 if kind == "avg" else x.dtype)
    for y in range(oh):
        for xx in range(ow):
            hs, he = (y * h) // oh, -(-((y + 1) * h) // oh)
            ws, we = (xx * w) // ow, -(-((xx + 1) * w) // ow)
            win = x[:, :, hs:he, ws:we]
            out[:, :, y, xx] = win.max(axis=(2, 3)) if kind == "max" else win.mean(axis=(2, 3))
    return out


def softmax_ref(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def log_softmax_ref(x, axis):
    m = x.max(axis=axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=axis, keepdims=True))


def layer_norm_ref(x, gamma, beta, axes, eps):
    axes = tuple(a % x.ndim for a in axes)
    x64 = x.astype(np.float64)
    mean = x64.mean(axis=axes, keepdims=True)
    var = ((x64 - mean) ** 2).mean(axis=axes, keepdims=True)
    shape = [x.shape[d] if d in axes else 1 for d in range(x.ndim)]
    return (x64 - mean) / np.sqrt(var + eps) * gamma.reshape(shape) + beta.reshape(shape)


def batch_norm_ref(x, gamma, beta, mean, var, axis, eps):
    shape = [1] * x.ndim
    shape[axis] = x.shape[axis]

    def r(t):
        return t.astype(np.float64).reshape(shape)

    return (x - r(mean)) / np.sqrt(r(var) + eps) * r(gamma) + r(beta)


def test_pool_reference_agrees_with_onnxruntime():
    """The hand-written pooling reference matches ONNX Runtime on a padded, ceil-mode case."""
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper

    x = rand((1, 2, 8, 9))
    for op_type, extra in (("MaxPool", {}), ("AveragePool", {"count_include_pad": 0})):
        node = helper.make_node(op_type, ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2],
                                pads=[1, 0, 1, 1], ceil_mode=1, **extra)
        graph = helper.make_graph(
            [node], "p", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
        model.ir_version = 9
        sess = ort.InferenceSession(model.SerializeToString(),
                                    providers=["CPUExecutionProvider"])
        (got,) = sess.run(None, {"x": x})
        kind = "max" if op_type == "MaxPool" else "avg"
        ref = pool2d_ref(x, kind, 3, 2, (1, 0, 1, 1), ceil_mode=True)
        check(got, ref)


# ---------------------------------------------------------------------------------------------
# declarations
# ---------------------------------------------------------------------------------------------
def test_declarations():
    expect = {
        "nn.conv2d": (OpPattern.OUT_EWISE_FUSABLE, MixedPrecision.ALWAYS),
        "nn.max_pool2d": (OpPattern.OUT_EWISE_FUSABLE, MixedPrecision.FOLLOW),
        "nn.avg_pool2d": (OpPattern.OUT_EWISE_FUSABLE, MixedPrecision.FOLLOW),
        "nn.adaptive_avg_pool2d": (OpPattern.OUT_EWISE_FUSABLE, MixedPrecision.FOLLOW),
        "nn.softmax": (OpPattern.OPAQUE, MixedPrecision.NEVER),
        "nn.log_softmax": (OpPattern.OPAQUE, MixedPrecision.NEVER),
        "nn.layer_norm": (OpPattern.OPAQUE, MixedPrecision.NEVER),
        "nn.batch_norm": (OpPattern.BROADCAST, MixedPrecision.FOLLOW),
        "nn.dropout": (OpPattern.ELEMWISE, MixedPrecision.FOLLOW),
    }
    for name, (pattern, mp) in expect.items():
        d = get_op_def(name)
        assert (d.pattern, d.mixed_precision) == (pattern, mp), name
        assert lookup_schedule(d.name, "c") is not None and callable(d.gradient)
    assert op.nn.conv2d is get_op_def("nn.conv2d")
    # activations declared with the element-wise ops are reachable as nn.*
    assert op.nn.relu is get_op_def("relu") and op.nn.gelu is get_op_def("gelu")
    assert "relu" not in op.nn.__all__


def test_attrs_normalize():
    a = op.nn.conv2d(tvar("x", (1, 3, 8, 8)), tvar("w", (4, 3, 3, 3)), strides=2,
                     padding=(1, 2), dilation=[1, 2]).attrs
    assert (a.strides, a.padding, a.dilation) == ((2, 2), (1, 2, 1, 2), (1, 2))
    assert op.nn.max_pool2d(tvar("x", (1, 1, 4, 4)), 2, padding=1).attrs.padding == (1,) * 4
    with pytest.raises(KilnError, match="padding"):
        op.nn.conv2d(tvar("x", (1, 3, 8, 8)), tvar("w", (4, 3, 3, 3)), padding=(1, 2, 3))
    with pytest.raises(KilnError, match="strides"):
        op.nn.conv2d(tvar("x", (1, 3, 8, 8)), tvar("w", (4, 3, 3, 3)), strides=0)
    with pytest.raises(KilnError, match="smaller than the"):
        op.nn.max_pool2d(tvar("x", (1, 1, 4, 4)), 2, padding=2)
    with pytest.raises(KilnError, match="rate"):
        op.nn.dropout(tvar("x", (2,)), rate=1.5)


# ---------------------------------------------------------------------------------------------
# inference
# ---------------------------------------------------------------------------------------------
def test_conv2d_inference():
    x = tvar("x", (2, 4, 9, 13))
    assert dims(infer(op.nn.conv2d(x, tvar("w", (8, 4, 3, 3)), padding=1))) == (2, 8, 9, 13)
    assert dims(infer(op.nn.conv2d(x, tvar("w", (8, 4, 3, 3)), strides=2))) == (2, 8, 4, 6)
    assert dims(infer(op.nn.conv2d(x, tvar("w", (8, 4, 3, 3)), dilation=2))) == (2, 8, 5, 9)
    assert dims(infer(op.nn.conv2d(x, tvar("w", (4, 1, 3, 3)), groups=4))) == (2, 4, 7, 11)
    half = infer(op.nn.conv2d(tvar("x", (1, 4, 8, 8), "float16"),
                              tvar("w", (2, 4, 1, 1), "float16"), out_dtype="float32"))
    assert half.dtype == "float32"
    n = tir.Var("n", "int64")
    sym = infer(op.nn.conv2d(tvar("x", (n, 3, 16, 16)), tvar("w", (4, 3, 3, 3)), padding=1))
    assert dims(sym)[0] is n and dims(sym)[1:] == (4, 16, 16)


def test_conv2d_errors_name_the_argument():
    with pytest.raises(StructInfoError,
                       match=r"nn.conv2d: data has 3 channels but weight expects 4 \(groups=1"):
        infer(op.nn.conv2d(tvar("x", (1, 3, 8, 8)), tvar("w", (8, 4, 3, 3))))
    with pytest.raises(StructInfoError, match="not divisible by groups=2"):
        infer(op.nn.conv2d(tvar("x", (1, 4, 8, 8)), tvar("w", (5, 2, 3, 3)), groups=2))
    with pytest.raises(StructInfoError, match="data must be 4-d"):
        infer(op.nn.conv2d(tvar("x", (3, 8, 8)), tvar("w", (8, 3, 3, 3))))
    with pytest.raises(StructInfoError, match="window does not fit"):
        infer(op.nn.conv2d(tvar("x", (1, 3, 2, 8)), tvar("w", (8, 3, 3, 3))))


def test_pool_inference():
    x = tvar("x", (1, 2, 9, 10))
    assert dims(infer(op.nn.max_pool2d(x, 3, 2))) == (1, 2, 4, 4)
    assert dims(infer(op.nn.max_pool2d(x, 3, 2, ceil_mode=True))) == (1, 2, 4, 5)
    assert dims(infer(op.nn.avg_pool2d(x, 2, 2, padding=1))) == (1, 2, 5, 6)
    assert dims(infer(op.nn.global_avg_pool2d(x))) == (1, 2, 1, 1)
    assert dims(infer(op.nn.adaptive_max_pool2d(x, (3, 4)))) == (1, 2, 3, 4)
    with pytest.raises(StructInfoError, match="nn.avg_pool2d: data must be a float tensor"):
        infer(op.nn.avg_pool2d(tvar("x", (1, 2, 4, 4), "int32"), 2))
    with pytest.raises(StructInfoError, match="window does not fit"):
        infer(op.nn.max_pool2d(tvar("x", (1, 2, 2, 4)), 3))


def test_softmax_norm_inference_and_errors():
    x = tvar("x", (2, 3, 4))
    assert dims(infer(op.nn.softmax(x, axis=1))) == (2, 3, 4)
    assert dims(infer(op.nn.log_softmax(x))) == (2, 3, 4)
    with pytest.raises(StructInfoError, match="nn.softmax: axis=3 is out of range"):
        infer(op.nn.softmax(x, axis=3))
    with pytest.raises(StructInfoError, match="float tensor"):
        infer(op.nn.softmax(tvar("i", (2, 3), "int32")))
    ln = op.nn.layer_norm(x, tvar("g", (4,)), tvar("b", (4,)))
    assert dims(infer(ln)) == (2, 3, 4)
    with pytest.raises(StructInfoError, match=r"nn.layer_norm: gamma has shape \(3,\)"):
        infer(op.nn.layer_norm(x, tvar("g", (3,)), tvar("b", (4,))))
    with pytest.raises(StructInfoError, match="beta must have 2 dimension"):
        infer(op.nn.layer_norm(x, tvar("g", (3, 4)), tvar("b", (4,)), axes=(1, 2)))
    c = tvar("c", (3,))
    assert dims(infer(op.nn.batch_norm(x, c, c, c, c))) == (2, 3, 4)
    with pytest.raises(StructInfoError, match="nn.batch_norm: moving_var has 4 elements"):
        infer(op.nn.batch_norm(x, c, c, c, tvar("v", (4,))))
    with pytest.raises(StructInfoError, match="gamma must be 1-d"):
        infer(op.nn.batch_norm(x, tvar("g", (3, 1)), c, c, c))
    assert dims(infer(op.nn.dropout(x, 0.1))) == (2, 3, 4)


# ---------------------------------------------------------------------------------------------
# numerics
# ---------------------------------------------------------------------------------------------
CONV_CASES = [
    ((1, 3, 7, 13), (4, 3, 3, 3), dict(padding=1)),
    ((2, 4, 9, 9), (8, 4, 3, 3), dict(strides=2, padding=(1, 2, 0, 1))),
    ((1, 4, 10, 11), (6, 4, 3, 3), dict(dilation=2, padding=2)),
    ((1, 6, 8, 8), (9, 2, 3, 3), dict(groups=3, padding=1)),
    ((1, 8, 12, 16), (8, 1, 3, 3), dict(groups=8, padding=1)),  # depthwise, vector width
    ((1, 4, 6, 6), (8, 1, 3, 3), dict(groups=4)),  # depthwise with multiplier 2
    ((2, 16, 8, 16), (32, 16, 1, 1), {}),  # 1x1
    ((1, 3, 15, 15), (5, 3, 5, 5), dict(strides=(2, 3), padding=(2, 1))),
    ((1, 2, 5, 40), (3, 2, 3, 2), dict(padding=(0, 1), dilation=(1, 3))),
    # register tiles of output channels x vectors along rows of whole vectors
    ((1, 5, 10, 32), (6, 5, 3, 3), dict(padding=1)),
    ((2, 3, 17, 64), (7, 3, 3, 3), dict(strides=2, padding=1)),
    ((1, 2, 9, 52), (3, 2, 3, 3), dict(dilation=2)),
    ((1, 4, 6, 80), (4, 2, 1, 3), dict(groups=2, padding=(0, 1))),
]


def test_conv2d_matches_numpy():
    cases = [("nn.conv2d", [rand(x), rand(w)], attrs) for x, w, attrs in CONV_CASES]
    for (_, (x, w), attrs), out in zip(cases, run_cases(cases)):
        check(out, conv2d_ref(x, w, **attrs))


def test_conv2d_integer_accumulation():
    x, w = rand((1, 3, 6, 8), "int8"), rand((4, 3, 3, 3), "int8")
    (out,) = run_cases([("nn.conv2d", [x, w], dict(padding=1, out_dtype="int32"))])
    ref = conv2d_ref(x.astype(np.int32), w.astype(np.int32), padding=1)
    np.testing.assert_array_equal(out, ref.astype(np.int32))


def test_conv2d_symbolic_batch():
    from kiln.codegen import c as codegen_c

    n = te.size_var("n")
    x = te.placeholder((n, 3, 8, 8), "float32", name="x")
    w = te.placeholder((4, 3, 3, 3), "float32", name="w")
    opdef = get_op_def("nn.conv2d")
    out = opdef.compute(x, w, attrs=opdef.make_attrs(padding=1))
    sch = Schedule(te.create_prim_func([x, w, out]))
    lookup_schedule(opdef.name, "c")(sch, TARGET)
    mod = codegen_c.build({"conv": sch.func}, TARGET)
    wv = rand((4, 3, 3, 3))
    for batch in (1, 3):
        xv = rand((batch, 3, 8, 8))
        res = np.empty((batch, 4, 8, 8), "float32")
        mod["conv"](xv, wv, res)
        check(res, conv2d_ref(xv, wv, padding=1))


POOL_CASES = [
    ((2, 3, 7, 13), dict(pool_size=3, strides=2, padding=1)),
    ((1, 2, 8, 8), dict(pool_size=2, strides=2)),
    ((1, 2, 9, 10), dict(pool_size=3, strides=2, padding=(1, 0, 1, 1), ceil_mode=True)),
    ((1, 1, 8, 16), dict(pool_size=3, strides=1)),  # vectorized along the width
    ((1, 2, 9, 9), dict(pool_size=2, strides=1, dilation=2)),
    ((1, 2, 6, 7), dict(pool_size=(2, 3), strides=(1, 2), padding=(1, 1), ceil_mode=True)),
]


def test_max_pool2d_matches_numpy():
    cases = [("nn.max_pool2d", [rand(s)], attrs) for s, attrs in POOL_CASES]
    cases.append(("nn.max_pool2d", [rand((1, 2, 7, 9), "int32")],
                  dict(pool_size=3, strides=2, padding=1)))
    for (_, (x,), attrs), out in zip(cases, run_cases(cases)):
        np.testing.assert_array_equal(out, pool2d_ref(x, "max", **attrs))


def test_max_pool2d_nan_propagates_or_is_ignored():
    """By default a NaN in a window is the window's maximum (numpy, PyTorch); ``ignore_nan``
    skips it (ONNX MaxPool), a window of NaNs only giving -inf; a window of -inf gives -inf
    either way (it gave the lowest finite float with ``ignore_nan``)."""
    cases, inputs = [], []
    for shape, attrs in POOL_CASES:
        x = rand(shape)
        x.flat[::5] = np.nan
        x[0, 0, :3, :4] = np.nan
        x[-1, -1, -3:, -4:] = -np.inf
        x[-1, -1, -1, -1] = np.nan
        inputs.append((x, attrs))
        cases.append(("nn.max_pool2d", [x], attrs))
        cases.append(("nn.max_pool2d", [x], dict(attrs, ignore_nan=True)))
    outs = run_cases(cases)
    for k, (x, attrs) in enumerate(inputs):
        propagated, ignored = outs[2 * k], outs[2 * k + 1]
        np.testing.assert_array_equal(propagated, pool2d_ref(x, "max", **attrs))
        np.testing.assert_array_equal(ignored, pool2d_ref(x, "nanmax", **attrs))
        assert np.isneginf(ignored).any() and np.isnan(propagated).any()
        assert not np.isnan(ignored).any()


def test_avg_pool2d_matches_numpy():
    cases = []
    for shape, attrs in POOL_CASES:
        for include in (False, True):
            cases.append(("nn.avg_pool2d", [rand(shape)], dict(attrs, count_include_pad=include)))
    for (_, (x,), attrs), out in zip(cases, run_cases(cases)):
        check(out, pool2d_ref(x, "avg", **attrs))


def test_adaptive_pool2d_matches_numpy():
    cases = [
        ("nn.adaptive_avg_pool2d", [rand((2, 3, 7, 13))], dict(output_size=1)),
        ("nn.adaptive_avg_pool2d", [rand((1, 2, 7, 13))], dict(output_size=(3, 4))),
        ("nn.adaptive_avg_pool2d", [rand((1, 2, 8, 12))], dict(output_size=(4, 3))),
        ("nn.adaptive_max_pool2d", [rand((1, 2, 7, 13))], dict(output_size=(2, 5))),
        ("nn.adaptive_max_pool2d", [rand((2, 3, 5, 6))], dict(output_size=1)),
    ]
    for (name, (x,), attrs), out in zip(cases, run_cases(cases)):
        kind = "max" if "max" in name else "avg"
        check(out, adaptive_ref(x, kind, attrs["output_size"]))


def test_softmax_log_softmax_match_numpy():
    # (1, 64, 1): rows of one element (SwiftFormer's softmax; the row schedule vectorized the
    # loop over rows and lost it)
    shapes = [((4, 13), -1), ((3, 16), 1), ((2, 3, 5), 1), ((6,), 0), ((2, 5, 3), 0),
              ((1, 64, 1), -1)]
    cases = []
    for shape, axis in shapes:
        x = rand(shape, scale=20.0)  # large logits: needs the max subtraction
        cases.append(("nn.softmax", [x], dict(axis=axis)))
        cases.append(("nn.log_softmax", [x], dict(axis=axis)))
    for (name, (x,), attrs), out in zip(cases, run_cases(cases)):
        x64 = x.astype(np.float64)
        ref = softmax_ref(x64, attrs["axis"]) if name == "nn.softmax" else log_softmax_ref(
            x64, attrs["axis"])
        check(out, ref)


def test_layer_norm_matches_numpy():
    configs = [((4, 13), (-1,)), ((2, 3, 16), (-1,)), ((2, 3, 4), (1, 2)), ((2, 5, 3), (1,)),
               ((3, 8), (0, 1))]
    cases = []
    for shape, axes in configs:
        pshape = tuple(shape[a] for a in sorted(a % len(shape) for a in axes))
        x = rand(shape, scale=3.0) + 5.0  # an offset mean tests the two-pass variance
        cases.append(("nn.layer_norm", [x, rand(pshape), rand(pshape)],
                      dict(axes=axes, epsilon=1e-5)))
    for (_, (x, gm, bt), attrs), out in zip(cases, run_cases(cases)):
        check(out, layer_norm_ref(x, gm, bt, attrs["axes"], attrs["epsilon"]))


def test_batch_norm_and_dropout_match_numpy():
    cases = []
    for shape, axis in (((2, 3, 5, 7), 1), ((4, 6), 1), ((2, 3, 4), -1)):
        c = shape[axis]
        var = RNG.uniform(0.5, 2.0, c).astype("float32")
        cases.append(("nn.batch_norm", [rand(shape), rand((c,)), rand((c,)), rand((c,)), var],
                      dict(axis=axis, epsilon=1e-3)))
    cases.append(("nn.dropout", [rand((3, 17))], dict(rate=0.3)))
    results = run_cases(cases)
    for (name, arrays, attrs), out in zip(cases, results):
        if name == "nn.dropout":
            np.testing.assert_array_equal(out, arrays[0])
        else:
            axis = attrs["axis"] % arrays[0].ndim
            check(out, batch_norm_ref(*arrays, axis, attrs["epsilon"]))


def test_row_schedule_parallelizes_and_vectorizes():
    opdef = get_op_def("nn.softmax")
    x = te.placeholder((256, 128), "float32", name="x")
    sch = Schedule(te.create_prim_func([x, opdef.compute(x, attrs=opdef.make_attrs())]))
    lookup_schedule(opdef.name, "c")(sch, TARGET)
    kinds = []
    tir.post_order_visit(sch.func.body,
                         lambda n: kinds.append(n.kind) if isinstance(n, tir.For) else None)
    assert kinds.count(tir.ForKind.PARALLEL) == 1 and tir.ForKind.VECTORIZED in kinds
    small = te.placeholder((4, 13), "float32", name="x")  # too little work for threads
    sch = Schedule(te.create_prim_func([small, opdef.compute(small, attrs=opdef.make_attrs())]))
    lookup_schedule(opdef.name, "c")(sch, TARGET)
    kinds = []
    tir.post_order_visit(sch.func.body,
                         lambda n: kinds.append(n.kind) if isinstance(n, tir.For) else None)
    assert tir.ForKind.PARALLEL not in kinds


# ---------------------------------------------------------------------------------------------
# through kiln.build
# ---------------------------------------------------------------------------------------------
def test_build_small_convnet():
    x = g.Var("x", TensorStructInfo((2, 3, 9, 11), "float32"))
    w1, w2 = rand((8, 3, 3, 3)), rand((8, 1, 3, 3))
    gm, bt, mu = rand((8,)), rand((8,)), rand((8,))
    var = RNG.uniform(0.5, 2.0, 8).astype("float32")
    bb = BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(op.nn.conv2d(x, g.const(w1), padding=1))
            h = bb.emit(op.nn.batch_norm(h, g.const(gm), g.const(bt), g.const(mu),
                                         g.const(var)))
            h = bb.emit(op.nn.relu(h))
            h = bb.emit(op.nn.conv2d(h, g.const(w2), padding=1, groups=8))
            h = bb.emit(op.nn.max_pool2d(h, 3, 2, padding=1, ceil_mode=True))
            h = bb.emit(op.nn.avg_pool2d(h, 2, 1, padding=1, count_include_pad=True))
            h = bb.emit(op.nn.global_avg_pool2d(h))
            h = bb.emit(op.reshape(h, (2, 8)))
            out = bb.emit_output(op.nn.log_softmax(h))
        bb.emit_func_output(out)
    exe = kiln.build(bb.get(), "c")
    xv = rand((2, 3, 9, 11))
    r = conv2d_ref(xv, w1, padding=1)
    r = np.maximum(batch_norm_ref(r, gm, bt, mu, var, 1, 1e-5), 0)
    r = conv2d_ref(r, w2, padding=1, groups=8)
    r = pool2d_ref(r, "max", 3, 2, 1, ceil_mode=True)
    r = pool2d_ref(r, "avg", 2, 1, 1, count_include_pad=True)
    r = r.mean(axis=(2, 3))
    check(exe(xv), log_softmax_ref(r, -1), rtol=1e-4)


def test_build_layer_norm_softmax():
    x = g.Var("x", TensorStructInfo((4, 24), "float32"))
    gm, bt = rand((24,)), rand((24,))
    bb = BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(op.nn.layer_norm(x, g.const(gm), g.const(bt)))
            out = bb.emit_output(op.nn.softmax(h))
        bb.emit_func_output(out)
    exe = kiln.build(bb.get(), "c")
    xv = rand((4, 24))
    check(exe(xv), softmax_ref(layer_norm_ref(xv, gm, bt, (-1,), 1e-5), -1))


def test_symbolic_batch_for_row_ops_and_pooling():
    """Schedules fall back to parallel-only loops on symbolic extents; results stay right."""
    from kiln.codegen import c as codegen_c

    n, h = te.size_var("n"), te.size_var("h")
    funcs = {}
    specs = {
        "softmax": ("nn.softmax", [(n, 19)], {}),
        "layer_norm": ("nn.layer_norm", [(n, 16), (16,), (16,)], {}),
        "max_pool": ("nn.max_pool2d", [(n, 2, 9, 9)], dict(pool_size=3, strides=2, padding=1)),
        "avg_pool": ("nn.avg_pool2d", [(n, 2, 8, 16)], dict(pool_size=3, strides=1)),
        "gap": ("nn.adaptive_avg_pool2d", [(n, 3, h, 5)], {}),
    }
    for key, (name, in_shapes, attrs) in specs.items():
        opdef = get_op_def(name)
        phs = [te.placeholder(s, "float32", name=f"in{i}") for i, s in enumerate(in_shapes)]
        out = opdef.compute(*phs, attrs=opdef.make_attrs(**attrs))
        sch = Schedule(te.create_prim_func([*phs, out]))
        lookup_schedule(opdef.name, "c")(sch, TARGET)
        funcs[key] = sch.func
    mod = codegen_c.build(funcs, TARGET)
    for batch in (1, 3):
        x = rand((batch, 19))
        out = np.empty_like(x)
        mod["softmax"](x, out)
        check(out, softmax_ref(x.astype(np.float64), -1))
        x, gm, bt = rand((batch, 16)), rand((16,)), rand((16,))
        out = np.empty_like(x)
        mod["layer_norm"](x, gm, bt, out)
        check(out, layer_norm_ref(x, gm, bt, (-1,), 1e-5))
        x = rand((batch, 2, 9, 9))
        out = np.empty((batch, 2, 5, 5), "float32")
        mod["max_pool"](x, out)
        np.testing.assert_array_equal(out, pool2d_ref(x, "max", 3, 2, 1))
        x = rand((batch, 2, 8, 16))
        out = np.empty((batch, 2, 6, 14), "float32")
        mod["avg_pool"](x, out)
        check(out, pool2d_ref(x, "avg", 3, 1))
        x = rand((batch, 3, batch + 2, 5))
        out = np.empty((batch, 3, 1, 1), "float32")
        mod["gap"](x, out)
        check(out, x.mean(axis=(2, 3), keepdims=True))
