"""Depthwise (nn.depthwise_conv2d_nchwc) and grouped (nn.conv2d_nchwc with groups) convolutions
on channel-blocked NCHW[x]c data: StructInfo inference, errors, the CPU schedule's loop nest, and
numerics against a float64 numpy reference written out here (a sum of strided views of the
padded input per group), on random inputs.
"""

from __future__ import annotations

import numpy as np
import pytest

from kiln import op, te, tir
from kiln.codegen import c as codegen_c
from kiln.ir.errors import KilnError, StructInfoError
from kiln.op.layout import transform_array
from kiln.op.registry import get_op_def
from kiln.schedule import lookup_schedule
from kiln.schedule.knobs import active_schedule
from kiln.target import Target
from kiln.testing.op_testing import check, dims, infer, make_rand, run_cases, tvar
from kiln.tir.schedule import Schedule

TARGET = Target("c")
RNG = np.random.default_rng(11)
rand = make_rand(RNG)
DW = "nn.depthwise_conv2d_nchwc"


def conv_ref(x, w, strides, padding, dilation, groups):
    """NCHW/OIHW grouped convolution in float64; ``padding`` is (top, left, bottom, right)."""
    (sh, sw), (dh, dw) = strides, dilation
    pt, pl, pb, pr = padding
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
                patch = xs[:, :, ry * dh:ry * dh + sh * (oh - 1) + 1:sh,
                           rx * dw:rx * dw + sw * (ow - 1) + 1:sw]
                out[:, gi * og:(gi + 1) * og] += np.einsum("nchw,oc->nohw", patch,
                                                           ws[:, :, ry, rx])
    return out


def _attrs(strides=1, padding=0, dilation=1):
    def pair(v):
        return (v, v) if isinstance(v, int) else tuple(v)

    pad = (padding,) * 4 if isinstance(padding, int) else tuple(padding)
    return dict(strides=pair(strides), padding=pad, dilation=pair(dilation))


# ---- depthwise ---------------------------------------------------------------------------------
def test_depthwise_inference_and_errors():
    x = tvar("x", (2, 3, 9, 13, 8))
    w = tvar("w", (3, 1, 3, 3, 8))
    assert dims(infer(op.nn.depthwise_conv2d_nchwc(x, w, padding=1))) == (2, 3, 9, 13, 8)
    assert dims(infer(op.nn.depthwise_conv2d_nchwc(x, w, strides=2))) == (2, 3, 4, 6, 8)
    assert dims(infer(op.nn.depthwise_conv2d_nchwc(x, w, dilation=2))) == (2, 3, 5, 9, 8)
    with pytest.raises(StructInfoError, match=r"has 3 channel blocks but weight .* has 2"):
        infer(op.nn.depthwise_conv2d_nchwc(x, tvar("w", (2, 1, 3, 3, 8))))
    with pytest.raises(StructInfoError, match="channel block size"):
        infer(op.nn.depthwise_conv2d_nchwc(x, tvar("w", (3, 1, 3, 3, 4))))
    with pytest.raises(StructInfoError, match="input channels"):
        infer(op.nn.depthwise_conv2d_nchwc(x, tvar("w", (3, 2, 3, 3, 8))))
    with pytest.raises(StructInfoError, match="weight must be 5-d"):
        infer(op.nn.depthwise_conv2d_nchwc(x, tvar("w", (3, 1, 3, 3, 1, 8))))
    with pytest.raises(KilnError, match="nn.depthwise_conv2d_nchwc: strides"):
        op.nn.depthwise_conv2d_nchwc(x, w, strides=0)


DW_SPECS = [  # (N, C, H, W), kernel, attrs, channel block
    ((1, 16, 12, 12), 3, _attrs(padding=1), 8),
    ((2, 8, 11, 9), 3, _attrs(strides=2, padding=1), 8),
    ((1, 16, 10, 13), 5, _attrs(padding=(2, 1, 2, 3)), 8),
    ((1, 8, 13, 13), 3, _attrs(dilation=2, padding=2), 4),
    ((1, 24, 7, 7), 3, _attrs(strides=(2, 1)), 8),
    ((1, 8, 9, 8), 5, _attrs(strides=2, padding=2, dilation=(1, 2)), 8),
]


@pytest.mark.parametrize("target", [TARGET, Target("c", num_threads=64)],
                         ids=["default", "many_threads"])
def test_depthwise_matches_numpy(target):
    """``many_threads``: too few channel blocks per thread, so the schedule parallelizes over
    output rows and copies the padded rows per output row (the other code path)."""
    cases, refs = [], []
    for (n, c, h, wd), k, attrs, blk in DW_SPECS:
        x, w = rand((n, c, h, wd)), rand((c, 1, k, k))
        cases.append((DW, [transform_array(x, "NCHW", f"NCHW{blk}c"),
                           transform_array(w, "OIHW", f"OIHW{blk}o")], attrs))
        ref = conv_ref(x, w, attrs["strides"], attrs["padding"], attrs["dilation"], c)
        refs.append(transform_array(ref, "NCHW", f"NCHW{blk}c"))
    for out, ref in zip(run_cases(cases, target=target), refs):
        check(out, ref)


def test_depthwise_schedule_shape():
    """Parallel outer loop, taps unrolled, a row segment unrolled, lanes vectorized; the zero
    padding is inlined (no padded copy) and the tile accumulates in a local buffer that is
    written out once."""
    opdef = get_op_def(DW)
    lanes = TARGET.vector_lanes("float32")
    x = te.placeholder((1, 4, 16, 16, lanes), "float32", name="x")
    w = te.placeholder((4, 1, 3, 3, lanes), "float32", name="w")
    out = opdef.compute(x, w, attrs=opdef.make_attrs(padding=1))
    sch = Schedule(te.create_prim_func([x, w, out]))
    lookup_schedule(opdef.name, "c")(sch, TARGET)
    loops = [sch.get(lp) for lp in sch.get_loops(sch.get_block("depthwise_conv2d_nchwc"))]
    kinds = [lp.kind for lp in loops]
    assert kinds[0] == tir.ForKind.PARALLEL
    assert kinds[-1] == tir.ForKind.VECTORIZED and loops[-1].extent.value == lanes
    assert kinds[-4:-1] == [tir.ForKind.UNROLLED] * 3  # ry, rx, x_inner
    names = {sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_block("root"))}
    assert "depthwise_conv2d_nchwc_pad" not in names
    write_back = sch.get_loops(sch.get_block("depthwise_conv2d_nchwc_local"))
    assert sch.get(write_back[-1]).kind == tir.ForKind.VECTORIZED


@pytest.mark.parametrize("knobs", [{"depthwise_inline_pad": False},
                                   {"depthwise_register_tile": False},
                                   {"depthwise_inline_pad": False,
                                    "depthwise_register_tile": False}],
                         ids=["padded_copy", "in_place", "padded_copy_in_place"])
def test_depthwise_knobs_compute_the_same(knobs):
    """The schedule's other choices (a padded copy of the input instead of the inlined zero
    padding, the accumulation in the output buffer instead of a register tile) compute the
    same convolution, with a bias + ReLU epilogue fused in (the tile's write-back path)."""
    lanes = TARGET.vector_lanes("float32")
    for (n, c, h, wd), k, attrs in [((1, 2 * lanes, 9, 11), 3, _attrs(padding=1)),
                                    ((1, lanes, 12, 12), 3, _attrs(strides=2, padding=1)),
                                    ((1, lanes, 8, 9), 5, _attrs(padding=2, dilation=(1, 2)))]:
        x, w, bias = rand((n, c, h, wd)), rand((c, 1, k, k)), rand((c,))
        xb = te.placeholder((n, c // lanes, h, wd, lanes), "float32", name="x")
        wb = te.placeholder((c // lanes, 1, k, k, lanes), "float32", name="w")
        bb = te.placeholder((c // lanes, lanes), "float32", name="b")
        conv = get_op_def(DW).compute(xb, wb, attrs=get_op_def(DW).make_attrs(**attrs))
        out = te.compute(conv.shape, lambda i, cb, yy, xx, ci, conv=conv, bb=bb: tir.max(
            conv[i, cb, yy, xx, ci] + bb[cb, ci], tir.const("float32", 0.0)), name="relu")
        for name, values in (("base", {}), ("other", knobs)):
            sch = Schedule(te.create_prim_func([xb, wb, bb, out]))
            sch.knob_values = dict(values)
            with active_schedule(sch):
                lookup_schedule(DW, "c")(sch, TARGET)
            assert {k: sch.knob_decisions()[k] for k in values} == values
            mod = codegen_c.build({name: sch.func}, TARGET)
            got = np.full(tuple(d.value for d in out.shape), np.nan, "float32")
            mod[name](transform_array(x, "NCHW", f"NCHW{lanes}c"),
                      transform_array(w, "OIHW", f"OIHW{lanes}o"),
                      bias.reshape(c // lanes, lanes), got)
            ref = np.maximum(conv_ref(x, w, attrs["strides"], attrs["padding"],
                                      attrs["dilation"], c) + bias[None, :, None, None], 0)
            check(transform_array(got, f"NCHW{lanes}c", "NCHW"), ref)


# ---- grouped conv2d_nchwc ------------------------------------------------------------------------
def test_grouped_nchwc_inference_and_errors():
    x = tvar("x", (1, 4, 9, 9, 8))  # 32 channels
    w = tvar("w", (4, 2, 3, 3, 8, 8))  # 2 groups of 16 input channels, 32 outputs
    assert dims(infer(op.nn.conv2d_nchwc(x, w, groups=2, padding=1))) == (1, 4, 9, 9, 8)
    with pytest.raises(StructInfoError, match=r"4 channel blocks but the weight expects 2 per "
                                              r"group x groups=4"):
        infer(op.nn.conv2d_nchwc(x, w, groups=4))
    with pytest.raises(StructInfoError, match="3 output channel blocks do not split"):
        infer(op.nn.conv2d_nchwc(x, tvar("w", (3, 2, 3, 3, 8, 8)), groups=2))
    with pytest.raises(KilnError, match="groups must be a positive int"):
        op.nn.conv2d_nchwc(x, w, groups=0)


def test_grouped_nchwc_matches_numpy():
    specs = [  # (N, C, H, W), O, kernel, groups, attrs, in block, out block
        ((1, 16, 8, 8), 16, 3, 2, _attrs(padding=1), 8, 8),
        ((2, 16, 9, 7), 32, 3, 4, _attrs(strides=2, padding=(1, 0, 1, 1)), 4, 8),
        ((1, 24, 6, 6), 12, 1, 3, _attrs(), 8, 4),
        ((1, 32, 9, 9), 16, 3, 2, _attrs(dilation=2, padding=2), 8, 8),
    ]
    cases, refs = [], []
    for (n, c, h, wd), o, k, grp, attrs, ib, ob in specs:
        x, w = rand((n, c, h, wd)), rand((o, c // grp, k, k))
        cases.append(("nn.conv2d_nchwc", [transform_array(x, "NCHW", f"NCHW{ib}c"),
                                          transform_array(w, "OIHW", f"OIHW{ib}i{ob}o")],
                      dict(attrs, groups=grp)))
        ref = conv_ref(x, w, attrs["strides"], attrs["padding"], attrs["dilation"], grp)
        refs.append(transform_array(ref, "NCHW", f"NCHW{ob}c"))
    for out, ref in zip(run_cases(cases), refs):
        check(out, ref)
