"""Layouts: parsing, layout_transform (inference, numerics), conv2d in NHWC/HWIO and other
layout permutations, nn.conv2d_nchwc, pooling in NHWC / NCHW8c, and conv2d's CPU alter-layout
hook.

References are plain numpy: the convolution is a sum over taps of strided views of the padded
NCHW input, blocked layouts are written out with reshape/transpose here.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from kiln import op, te, tir
from kiln.graph.block_builder import BlockBuilder
from kiln.ir.errors import KilnError, StructInfoError
from kiln.op.layout import Layout, LayoutRewrite, transform_array, transform_shape
from kiln.op.registry import OpPattern, get_op_def
from kiln.schedule import lookup_schedule
from kiln.target import Target
from kiln.testing.op_testing import check, dims, infer, make_rand, run_cases, tvar
from kiln.tir.schedule import Schedule

TARGET = Target("c")
RNG = np.random.default_rng(7)


rand = make_rand(RNG)
check = functools.partial(check, check_shape=False)


def conv_ref(x, w, strides=1, padding=0, groups=1):
    """NCHW x OIHW reference (float64), symmetric padding."""
    x, w = x.astype("float64"), w.astype("float64")
    p = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    n, c, hh, ww = p.shape
    o, ig, kh, kw = w.shape
    oh, ow = (hh - kh) // strides + 1, (ww - kw) // strides + 1
    out = np.zeros((n, o, oh, ow))
    og = o // groups
    for gi in range(groups):
        xs = p[:, gi * ig:(gi + 1) * ig]
        ws = w[gi * og:(gi + 1) * og]
        for i in range(kh):
            for j in range(kw):
                patch = xs[:, :, i:i + strides * oh:strides, j:j + strides * ow:strides]
                out[:, gi * og:(gi + 1) * og] += np.einsum("nchw,oc->nohw", patch, ws[:, :, i, j])
    return out


# ---- Layout ------------------------------------------------------------------------------------
def test_layout_parsing():
    lay = Layout("NCHW8c")
    assert lay.axes == (("N", None), ("C", None), ("H", None), ("W", None), ("c", 8))
    assert lay.primal == "NCHW" and lay.ndim == 5 and lay.factor("C") == 8
    assert lay.index("c") == 4 and lay.index("O") == -1 and lay.is_split()
    assert Layout("OIHW8i16o").factor("O") == 16
    assert Layout("NHWC").same_axes(Layout("NCHW4c"))
    assert not Layout("NCHW").same_axes(Layout("OIHW"))
    for bad, msg in (("NCHW0c", "positive factor"), ("NC8HW", "cannot have a factor"),
                     ("NCHWc", "positive factor"), ("NCHN", "more than once"),
                     ("NHW8c", "no primal axis 'C'"), ("NC-HW", "cannot parse"), ("", "non-empty")):
        with pytest.raises(KilnError, match=msg):
            Layout(bad)


def test_transform_shape_and_array():
    assert dims_of(transform_shape((2, 16, 5, 7), "NCHW", "NCHW8c")) == (2, 2, 5, 7, 8)
    assert dims_of(transform_shape((2, 2, 5, 7, 8), "NCHW8c", "NHWC")) == (2, 5, 7, 16)
    assert dims_of(transform_shape((8, 4, 3, 3), "OIHW", "OIHW2i4o")) == (2, 2, 3, 3, 2, 4)
    with pytest.raises(StructInfoError, match=r"axis 'C' of length 12 cannot be split into "
                                              r"blocks of 8"):
        transform_shape((1, 12, 4, 4), "NCHW", "NCHW8c")
    a = rand((2, 16, 3, 5))
    blocked = transform_array(a, "NCHW", "NCHW8c")
    np.testing.assert_array_equal(blocked, a.reshape(2, 2, 8, 3, 5).transpose(0, 1, 3, 4, 2))
    np.testing.assert_array_equal(transform_array(blocked, "NCHW8c", "NHWC"),
                                  a.transpose(0, 2, 3, 1))
    # broadcastable constants: right-aligned, length-1 axes stay length 1
    bias = rand((16, 1, 1))
    b = transform_array(bias, "NCHW", "NCHW8c")
    assert b.shape == (1, 2, 1, 1, 8)
    np.testing.assert_array_equal((blocked + b), transform_array(a + bias, "NCHW", "NCHW8c"))
    assert transform_array(np.float32(3).reshape(1), "NCHW", "NCHW8c").shape == (1,) * 5


def dims_of(shape):
    return tuple(int(d) if isinstance(d, int) else d.value for d in shape)


# ---- layout_transform ---------------------------------------------------------------------------
def test_layout_transform_declaration_and_inference():
    opdef = get_op_def("layout_transform")
    assert opdef is op.layout_transform and opdef.pattern == OpPattern.INJECTIVE
    x = tvar("x", (2, 16, 5, 7))
    assert dims(infer(op.layout_transform(x, "NCHW", "NCHW4c"))) == (2, 4, 5, 7, 4)
    n = tir.Var("n", "int64")
    sym = infer(op.layout_transform(tvar("x", (n, 16, 5, 7)), "NCHW", "NHWC"))
    assert sym.shape[0] is n and dims(sym)[1:] == (5, 7, 16)
    with pytest.raises(StructInfoError, match="layout_transform: axis 'C' of length 6 cannot"):
        infer(op.layout_transform(tvar("x", (1, 6, 2, 2)), "NCHW", "NCHW4c"))
    with pytest.raises(StructInfoError, match="data has 3 dimensions but src_layout 'NCHW'"):
        infer(op.layout_transform(tvar("x", (1, 6, 2)), "NCHW", "NHWC"))
    with pytest.raises(StructInfoError, match="sub-axis 'c', but src_layout 'NCHW8c' says 8"):
        infer(op.layout_transform(tvar("x", (1, 2, 2, 2, 4)), "NCHW8c", "NCHW"))
    with pytest.raises(KilnError, match="different primal axes"):
        op.layout_transform(x, "NCHW", "OIHW")
    with pytest.raises(KilnError, match="src_layout"):
        op.layout_transform(x, "NCHW2", "NCHW")
    # a symbolic channel count cannot be proven divisible
    c = tir.Var("c", "int64")
    with pytest.raises(StructInfoError, match="not provably divisible"):
        infer(op.layout_transform(tvar("x", (1, c, 2, 2)), "NCHW", "NCHW8c"))


def test_layout_transform_matches_numpy():
    cases = [
        ((2, 16, 5, 7), "NCHW", "NCHW8c"),
        ((2, 2, 5, 7, 8), "NCHW8c", "NCHW"),
        ((2, 2, 5, 7, 8), "NCHW8c", "NHWC4c"),
        ((2, 5, 7, 12), "NHWC", "NCHW"),
        ((8, 6, 3, 3), "OIHW", "OIHW3i4o"),
        ((3, 3, 6, 8), "HWIO", "OIHW2i8o"),
    ]
    arrays = [rand(s) for s, _, _ in cases]
    outs = run_cases([("layout_transform", [a], dict(src_layout=s, dst_layout=d))
                      for a, (_, s, d) in zip(arrays, cases)])
    for a, (_, s, d), out in zip(arrays, cases, outs):
        np.testing.assert_array_equal(out, transform_array(a, s, d))


# ---- conv2d layouts -----------------------------------------------------------------------------
def test_conv2d_layout_attrs_and_inference():
    x = tvar("x", (2, 9, 13, 4))
    w = tvar("w", (3, 3, 4, 8))
    out = infer(op.nn.conv2d(x, w, padding=1, data_layout="NHWC", kernel_layout="HWIO"))
    assert dims(out) == (2, 9, 13, 8)
    out = infer(op.nn.conv2d(x, tvar("w", (8, 3, 3, 4)), strides=2, data_layout="NHWC",
                             kernel_layout="OHWI"))
    assert dims(out) == (2, 4, 6, 8)
    assert op.nn.conv2d(x, w).attrs.data_layout == "NCHW"
    with pytest.raises(KilnError, match="data_layout must be a permutation of 'NCHW'"):
        op.nn.conv2d(x, w, data_layout="NCHW8c")
    with pytest.raises(KilnError, match="kernel_layout must be a permutation of 'OIHW'"):
        op.nn.conv2d(x, w, kernel_layout="NCHW")
    with pytest.raises(StructInfoError, match="data has 4 channels but weight expects 3"):
        infer(op.nn.conv2d(x, tvar("w", (3, 3, 3, 8)), data_layout="NHWC",
                           kernel_layout="HWIO"))


def _to(arr, src, dst):
    return transform_array(arr, src, dst)


def test_conv2d_other_layouts_match_numpy():
    cases = []
    refs = []
    specs = [  # (x NCHW shape, w OIHW shape, attrs, data_layout, kernel_layout)
        ((2, 5, 9, 11), (16, 5, 3, 3), dict(padding=1), "NHWC", "HWIO"),
        ((1, 8, 8, 8), (8, 8, 3, 3), dict(strides=2, padding=1), "NHWC", "HWIO"),
        ((1, 4, 7, 7), (6, 4, 1, 1), {}, "NHWC", "HWIO"),  # channels not a vector multiple
        ((1, 8, 6, 6), (8, 1, 3, 3), dict(padding=1, groups=8), "NHWC", "HWIO"),  # depthwise
        ((1, 4, 6, 7), (8, 4, 3, 3), dict(padding=1), "NHWC", "OHWI"),  # generic schedule
        ((1, 4, 6, 7), (8, 4, 3, 3), dict(padding=1), "NCHW", "HWIO"),
    ]
    for xs, ws, attrs, dl, kl in specs:
        x, w = rand(xs), rand(ws)
        cases.append(("nn.conv2d", [_to(x, "NCHW", dl), _to(w, "OIHW", kl)],
                      dict(attrs, data_layout=dl, kernel_layout=kl)))
        refs.append(_to(conv_ref(x, w, attrs.get("strides", 1), attrs.get("padding", 0),
                                 attrs.get("groups", 1)), "NCHW", dl))
    for out, ref in zip(run_cases(cases), refs):
        check(out, ref)


def test_conv2d_nhwc_schedule_vectorizes_channels():
    opdef = get_op_def("nn.conv2d")
    x = te.placeholder((1, 8, 8, 4), "float32", name="x")
    w = te.placeholder((3, 3, 4, 16), "float32", name="w")
    out = opdef.compute(x, w, attrs=opdef.make_attrs(padding=1, data_layout="NHWC",
                                                     kernel_layout="HWIO"))
    sch = Schedule(te.create_prim_func([x, w, out]))
    lookup_schedule(opdef.name, "c")(sch, TARGET)
    kinds = [sch.get(lp).kind for lp in sch.get_loops(sch.get_block("conv2d"))]
    assert kinds[-1] == tir.ForKind.VECTORIZED and kinds[-2] == tir.ForKind.UNROLLED


# ---- conv2d_nchwc -------------------------------------------------------------------------------
def test_conv2d_nchwc_inference_and_errors():
    x = tvar("x", (2, 2, 9, 13, 4))
    w = tvar("w", (3, 2, 3, 3, 4, 8))
    assert dims(infer(op.nn.conv2d_nchwc(x, w, padding=1))) == (2, 3, 9, 13, 8)
    assert dims(infer(op.nn.conv2d_nchwc(x, w, strides=2))) == (2, 3, 4, 6, 8)
    with pytest.raises(StructInfoError, match=r"has 2 input channel blocks but weight .* has 3"):
        infer(op.nn.conv2d_nchwc(x, tvar("w", (3, 3, 3, 3, 4, 8))))
    with pytest.raises(StructInfoError, match="input channel block size"):
        infer(op.nn.conv2d_nchwc(x, tvar("w", (3, 2, 3, 3, 2, 8))))
    with pytest.raises(StructInfoError, match="weight must be 6-d"):
        infer(op.nn.conv2d_nchwc(x, tvar("w", (3, 2, 3, 3))))


def test_conv2d_nchwc_matches_numpy():
    specs = [  # x NCHW, w OIHW, attrs, ic block, oc block
        ((2, 8, 9, 10), (16, 8, 3, 3), dict(padding=1), 8, 8),
        ((1, 3, 8, 8), (8, 3, 3, 3), dict(padding=1), 3, 8),
        ((1, 8, 9, 9), (8, 8, 3, 3), dict(strides=2), 4, 4),
        ((1, 4, 7, 7), (12, 4, 1, 1), {}, 2, 4),
    ]
    cases, refs = [], []
    for xs, ws, attrs, ic, oc in specs:
        x, w = rand(xs), rand(ws)
        cases.append(("nn.conv2d_nchwc", [_to(x, "NCHW", f"NCHW{ic}c"),
                                          _to(w, "OIHW", f"OIHW{ic}i{oc}o")], attrs))
        ref = conv_ref(x, w, attrs.get("strides", 1), attrs.get("padding", 0))
        refs.append(_to(ref, "NCHW", f"NCHW{oc}c"))
    for out, ref in zip(run_cases(cases), refs):
        check(out, ref)


def test_conv2d_nchwc_schedule_shape():
    opdef = get_op_def("nn.conv2d_nchwc")
    lanes = TARGET.vector_lanes("float32")
    x = te.placeholder((1, 2, 8, 8, 8), "float32", name="x")
    w = te.placeholder((2, 2, 3, 3, 8, lanes), "float32", name="w")
    out = opdef.compute(x, w, attrs=opdef.make_attrs(padding=1))
    sch = Schedule(te.create_prim_func([x, w, out]))
    lookup_schedule(opdef.name, "c")(sch, TARGET)
    loops = [sch.get(lp) for lp in sch.get_loops(sch.get_block("conv2d_nchwc"))]
    assert loops[0].kind == tir.ForKind.PARALLEL
    assert loops[-1].kind == tir.ForKind.VECTORIZED and loops[-1].extent.value == lanes
    assert loops[-2].kind == tir.ForKind.UNROLLED


def _nchwc_conv(x, w, lanes):
    """NCHW input and OIHW weight blocked by ``lanes`` and the (unscheduled) NCHWc convolution
    of them, padding 1: ``(blocked input, blocked weight, schedule)``."""
    xb, wb = _to(x, "NCHW", f"NCHW{lanes}c"), _to(w, "OIHW", f"OIHW{lanes}i{lanes}o")
    opdef = get_op_def("nn.conv2d_nchwc")
    data = te.placeholder(xb.shape, "float32", name="data")
    weight = te.placeholder(wb.shape, "float32", name="weight")
    out = opdef.compute(data, weight, attrs=opdef.make_attrs(padding=1))
    return xb, wb, Schedule(te.create_prim_func([data, weight, out]))


def _check_nchwc_conv(sch, target, x, w, xb, wb):
    """Build the scheduled convolution and compare it with numpy's."""
    import kiln.codegen.c as cg

    lanes = target.vector_lanes("float32")
    ref = _to(conv_ref(x, w, padding=1), "NCHW", f"NCHW{lanes}c")
    got = np.zeros(ref.shape, "float32")
    cg.build({"conv": sch.func}, target)["conv"](xb, wb, got)
    check(got, ref)


@pytest.mark.parametrize("shape, wshape, rows_outer", [
    ((1, 16, 32, 32), (16, 16, 3, 3), True),   # input larger than weight: threads share rows
    ((1, 64, 6, 6), (64, 64, 3, 3), False),    # few rows, large weight: channel blocks
])
def test_conv2d_nchwc_thread_split_orders(shape, wshape, rows_outer):
    """Both ways of sharing a convolution among threads compute the convolution; with rows
    shared, the padded rows are made inside the parallel loop (no separate padding pass)."""
    from kiln.schedule.cpu import convolution as knn

    target = Target("c", num_threads=2)
    x, w = rand(shape), rand(wshape)
    xb, wb, sch = _nchwc_conv(x, w, target.vector_lanes("float32"))
    block = sch.get_block("conv2d_nchwc")
    assert knn._rows_outer(sch, block, shape[2], target) is rows_outer
    lookup_schedule("nn.conv2d_nchwc", "c")(sch, target)
    pad_loops = [sch.get(lp) for lp in sch.get_loops(sch.get_block("conv2d_nchwc_pad"))]
    conv_loops = [sch.get(lp) for lp in sch.get_loops(sch.get_block("conv2d_nchwc"))]
    assert conv_loops[0].kind == tir.ForKind.PARALLEL
    # rows shared: the padding runs under the convolution's parallel loop
    assert (pad_loops[0] is conv_loops[0]) is rows_outer
    _check_nchwc_conv(sch, target, x, w, xb, wb)


def test_conv2d_nchwc_symbolic_batch_shares_rows():
    """With a dynamic batch the threads still share the rows: the parallel loop fuses the batch
    with the row blocks (at batch 1 a loop over the batch alone would leave one thread idle),
    and the padded rows are made inside it."""
    import kiln.codegen.c as cg

    target = Target("c", num_threads=2)
    lanes = target.vector_lanes("float32")
    n = tir.Var("n", "int64")
    opdef = get_op_def("nn.conv2d_nchwc")
    data = te.placeholder((n, 2, 32, 32, lanes), "float32", name="data")
    weight = te.placeholder((2, 2, 3, 3, lanes, lanes), "float32", name="weight")
    out = opdef.compute(data, weight, attrs=opdef.make_attrs(padding=1))
    sch = Schedule(te.create_prim_func([data, weight, out]))
    lookup_schedule(opdef.name, "c")(sch, target)
    conv_loops = [sch.get(lp) for lp in sch.get_loops(sch.get_block("conv2d_nchwc"))]
    pad_loops = [sch.get(lp) for lp in sch.get_loops(sch.get_block("conv2d_nchwc_pad"))]
    par = conv_loops[0]
    assert par.kind == tir.ForKind.PARALLEL and pad_loops[0] is par
    assert "n" in str(par.extent) and str(par.extent) != "n"
    mod = cg.build({"conv": sch.func}, target)
    for batch in (1, 3):
        x, w = rand((batch, 2 * lanes, 32, 32)), rand((2 * lanes, 2 * lanes, 3, 3))
        xb, wb = _to(x, "NCHW", f"NCHW{lanes}c"), _to(w, "OIHW", f"OIHW{lanes}i{lanes}o")
        ref = _to(conv_ref(x, w, padding=1), "NCHW", f"NCHW{lanes}c")
        got = np.zeros(ref.shape, "float32")
        mod["conv"](xb, wb, got)
        check(got, ref)


@pytest.mark.parametrize("lanes, expect", [
    # AVX2: 6 x 2 blocks where the row tail wastes little, 5 x 2 on 7-pixel rows
    (8, {56: (6, 2), 28: (6, 2), 14: (6, 2), 7: (5, 2), 3: (3, 1)}),
    # AVX-512: 7 x 2 divides ResNet's rows; 8 x 2 where 7 would waste a third of a tile
    (16, {112: (7, 2), 56: (7, 2), 28: (7, 2), 14: (7, 2), 7: (7, 2), 8: (8, 2), 3: (3, 1)}),
])
def test_conv2d_nchwc_tile_follows_the_vector_length(lanes, expect):
    from kiln.schedule.cpu import convolution as knn

    assert {ow: knn._nchwc_tile(ow, 4, lanes) for ow in expect} == expect
    assert knn._nchwc_tile(14, 3, lanes) == (7, 1)  # an odd block count: one block wide


@pytest.mark.parametrize("features", [{"avx2", "fma"}, {"avx2", "fma", "avx512f"}],
                         ids=["avx2", "avx512"])
def test_conv2d_nchwc_each_tile_matches_numpy(features, monkeypatch):
    """Both vector lengths' tiles, whatever this machine has (GCC splits wider vectors), on
    rows their tiles divide and rows with a tail."""
    monkeypatch.delenv("KILN_VECTOR_BITS", raising=False)  # the override would win
    target = Target("c", features=frozenset(features))
    lanes = target.vector_lanes("float32")
    for hw in (14, 10):
        x, w = rand((1, lanes, hw, hw)), rand((4 * lanes, lanes, 3, 3))
        xb, wb, sch = _nchwc_conv(x, w, lanes)
        lookup_schedule("nn.conv2d_nchwc", "c")(sch, target)
        _check_nchwc_conv(sch, target, x, w, xb, wb)


# threads share output channel blocks (few rows) / rows (more rows, a small weight)
@pytest.mark.parametrize("h, blocks", [(7, 16), (16, 4)])
def test_conv2d_nchwc_jams_small_row_tails(h, blocks):
    """9-pixel rows in 6-pixel tiles leave a 3 x 2-block tail (6 accumulators, too few to keep
    the FMA pipes busy): the row loop asks for the tails of 2 rows to be jammed, and the
    lowered kernel runs them in one loop nest; the result is numpy's."""
    from kiln.schedule.cpu import convolution as knn
    from kiln.tir.transform.lower import lower

    assert knn._tail_jam(9, 6, 2) == 2 and knn._tail_jam(7, 5, 2) == 2
    assert knn._tail_jam(7, 5, 1) == 4 and knn._tail_jam(28, 6, 2) is None
    assert knn._tail_jam(12, 6, 2) is None
    target = Target("c", num_threads=2)
    lanes = target.vector_lanes("float32")
    x, w = rand((1, 4 * lanes, h, 9)), rand((blocks * lanes, 4 * lanes, 3, 3))
    xb, wb, sch = _nchwc_conv(x, w, lanes)
    lookup_schedule("nn.conv2d_nchwc", "c")(sch, target)
    jammed = []  # the second row's accumulators
    tir.post_order_visit(lower(sch.func).body, lambda n: jammed.append(n) if isinstance(
        n, tir.Allocate) and n.buffer.name.endswith("_j1") else None)
    assert jammed
    _check_nchwc_conv(sch, target, x, w, xb, wb)


# ---- pooling layouts ----------------------------------------------------------------------------
def pool_ref(x, kind, k, s, p):
    """NCHW max/avg pool reference (avg excludes padding)."""
    n, c, h, w = x.shape
    oh, ow = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    out = np.zeros((n, c, oh, ow), "float64")
    for i in range(oh):
        for j in range(ow):
            y0, x0 = i * s - p, j * s - p
            win = x[:, :, max(y0, 0):min(y0 + k, h), max(x0, 0):min(x0 + k, w)]
            out[:, :, i, j] = win.max(axis=(2, 3)) if kind == "max" else win.mean(axis=(2, 3))
    return out


def test_pool_layout_attr_inference():
    x = tvar("x", (1, 9, 10, 16))
    assert dims(infer(op.nn.max_pool2d(x, 3, 2, layout="NHWC"))) == (1, 4, 4, 16)
    x5 = tvar("x", (1, 2, 9, 10, 8))
    assert dims(infer(op.nn.avg_pool2d(x5, 2, 2, layout="NCHW8c"))) == (1, 2, 4, 5, 8)
    assert dims(infer(op.nn.global_avg_pool2d(x5, layout="NCHW8c"))) == (1, 2, 1, 1, 8)
    with pytest.raises(StructInfoError, match="data must be 5-d for layout 'NCHW8c'"):
        infer(op.nn.max_pool2d(x, 2, layout="NCHW8c"))
    with pytest.raises(KilnError, match="unsplit H and W"):
        op.nn.max_pool2d(x, 2, layout="NCHW2h")
    with pytest.raises(KilnError, match="unsplit H and W"):
        op.nn.max_pool2d(x, 2, layout="NC")


@pytest.mark.parametrize("layout", ["NHWC", "NCHW8c"])
def test_pools_in_other_layouts_match_numpy(layout):
    x = rand((2, 16, 9, 10))
    xl = _to(x, "NCHW", layout)
    specs = [("nn.max_pool2d", dict(pool_size=3, strides=2, padding=1), "max", (3, 2, 1)),
             ("nn.avg_pool2d", dict(pool_size=2, strides=2), "avg", (2, 2, 0)),
             ("nn.avg_pool2d", dict(pool_size=3, strides=1, padding=1), "avg", (3, 1, 1))]
    cases = [(name, [xl], dict(attrs, layout=layout)) for name, attrs, _, _ in specs]
    cases.append(("nn.adaptive_avg_pool2d", [xl], dict(output_size=1, layout=layout)))
    cases.append(("nn.adaptive_max_pool2d", [xl], dict(output_size=(3, 4), layout=layout)))
    outs = run_cases(cases)
    for out, (_, _, kind, (k, s, p)) in zip(outs, specs):
        check(out, _to(pool_ref(x, kind, k, s, p), "NCHW", layout))
    check(outs[3], _to(x.mean(axis=(2, 3), keepdims=True), "NCHW", layout))
    ymax = np.stack([np.stack([x[:, :, (i * 9) // 3:-(-(i + 1) * 9 // 3),
                                 (j * 10) // 4:-(-(j + 1) * 10 // 4)].max(axis=(2, 3))
                               for j in range(4)], -1) for i in range(3)], -2)
    check(outs[4], _to(ymax, "NCHW", layout))


# ---- the alter-layout hook ----------------------------------------------------------------------
def test_conv2d_alter_layout_hook():
    hook = get_op_def("nn.conv2d").alter_layout["c"]
    lanes = TARGET.vector_lanes("float32")
    bb = BlockBuilder()
    x = tvar("x", (1, 3, 8, 8))

    def call(data, weight, **attrs):
        return bb.normalize(op.nn.conv2d(data, weight, **attrs))

    req = hook(call(x, tvar("w", (2 * lanes, 3, 3, 3)), padding=1), TARGET)
    assert isinstance(req, LayoutRewrite)
    assert req.inputs == (("NCHW", "NCHW3c"), ("OIHW", f"OIHW3i{lanes}o"))
    assert req.output == ("NCHW", f"NCHW{lanes}c")
    new = req.build(tvar("d", (1, 1, 8, 8, 3)), tvar("k", (2, 1, 3, 3, 3, lanes)))
    assert new.op.name == "nn.conv2d_nchwc" and new.attrs.padding == (1, 1, 1, 1)
    x16 = tvar("x", (1, 2 * lanes, 8, 8))
    req = hook(call(x16, tvar("w", (lanes, 2 * lanes, 1, 1))), TARGET)
    assert req.inputs[0] == ("NCHW", f"NCHW{lanes}c")
    # depthwise: nn.depthwise_conv2d_nchwc (tests/transform/test_transform_alter_layout_depthwise)
    dw = hook(call(x16, tvar("w", (2 * lanes, 1, 3, 3)), groups=2 * lanes), TARGET)
    assert dw.inputs[1] == ("OIHW", f"OIHW{lanes}o")
    # declined: output channels not a vector multiple, a channel multiplier, other layouts,
    # other dtypes
    assert hook(call(x, tvar("w", (lanes + 1, 3, 3, 3))), TARGET) is None
    assert hook(call(x16, tvar("w", (4 * lanes, 1, 3, 3)), groups=2 * lanes), TARGET) is None
    assert hook(call(tvar("x", (1, 8, 8, 3)), tvar("w", (3, 3, 3, lanes)),
                     data_layout="NHWC", kernel_layout="HWIO"), TARGET) is None
    assert hook(call(tvar("x", (1, 3, 8, 8), "float16"),
                     tvar("w", (lanes, 3, 3, 3), "float16")), TARGET) is None


def test_conv2d_alter_layout_takes_half_vectors_for_odd_channel_blocks(monkeypatch):
    """On AVX-512 (16 lanes) 24 output channels (MobileNetV2's projections) take blocks of 8
    (half a vector) rather than staying NCHW between layout transforms; 20 stay declined."""
    monkeypatch.delenv("KILN_VECTOR_BITS", raising=False)  # the override would win
    hook = get_op_def("nn.conv2d").alter_layout["c"]
    avx512 = Target("c", features=frozenset({"avx2", "fma", "avx512f"}))
    bb = BlockBuilder()
    x = tvar("x", (1, 32, 8, 8))
    req = hook(bb.normalize(op.nn.conv2d(x, tvar("w", (24, 32, 1, 1)))), avx512)
    assert req.inputs == (("NCHW", "NCHW16c"), ("OIHW", "OIHW16i8o"))
    assert req.output == ("NCHW", "NCHW8c")
    req = hook(bb.normalize(op.nn.conv2d(x, tvar("w", (32, 32, 1, 1)))), avx512)
    assert req.output == ("NCHW", "NCHW16c")
    assert hook(bb.normalize(op.nn.conv2d(x, tvar("w", (20, 32, 1, 1)))), avx512) is None


def test_pool_vectorizes_the_carried_channel_block():
    opdef = get_op_def("nn.max_pool2d")
    lanes = TARGET.vector_lanes("float32")

    def inner_kind(padding):
        x = te.placeholder((1, 2, 8, 8, lanes), "float32", name="x")
        out = opdef.compute(x, attrs=opdef.make_attrs(pool_size=2, strides=2, padding=padding,
                                                      layout=f"NCHW{lanes}c"))
        sch = Schedule(te.create_prim_func([x, out]))
        lookup_schedule(opdef.name, "c")(sch, TARGET)
        return sch.get(sch.get_loops(sch.get_block("max_pool2d"))[-1]).kind

    assert inner_kind(0) == tir.ForKind.VECTORIZED
    assert inner_kind(1) == tir.ForKind.VECTORIZED  # padded windows too (a guarded vector load)
