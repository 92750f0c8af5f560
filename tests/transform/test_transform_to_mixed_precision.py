"""ToMixedPrecision: per-op policies, casts only at dtype boundaries, original dtypes kept for
NEVER ops (never forced to float32), and the conv2d -> relu -> layer_norm scenario through the
fusion pipeline with the well-formed check after every pass."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import kiln
from kiln import graph as g
from kiln import op
from kiln.ir import KilnError, WellFormedError, assert_structural_equal
from kiln.transform import (
    AnnotateTIROpPattern,
    DeadCodeElimination,
    FuseOps,
    FuseTIR,
    LegalizeOps,
    PassContext,
    Sequential,
    ToMixedPrecision,
    WellFormedInstrument,
    list_passes,
    module_pass,
)

F32, F16, BF16 = "float32", "float16", "bfloat16"
RNG = np.random.default_rng(7)
#: Unit roundoff of each low-precision type (half the distance from 1 to the next value).
UNIT_ROUNDOFF = {F16: 2.0**-11, BF16: 2.0**-8}


def t(shape, dtype=F32):
    return g.TensorStructInfo(shape, dtype)


def np_dtype(dtype):
    return ml_dtypes.bfloat16 if dtype == BF16 else np.dtype(dtype)


def func_of(mod):
    return mod["main"]


# ---------------------------------------------------------------------------------------------
# the scenario model: conv2d -> relu -> layer_norm
# ---------------------------------------------------------------------------------------------
GAMMA = (1 + 0.1 * RNG.standard_normal(8)).astype(F32)
BETA = (0.1 * RNG.standard_normal(8)).astype(F32)
#: The scenario normalizes each sample over (C, H, W): rows of 8 relu outputs can have a tiny
#: variance that magnifies any input rounding without bound, which measures nothing useful.
LN_AXES = (1, 2, 3)
GAMMA3 = (1 + 0.1 * RNG.standard_normal((8, 8, 8))).astype(F32)
BETA3 = (0.1 * RNG.standard_normal((8, 8, 8))).astype(F32)


def conv_relu_ln(lp_in_model=None):
    """main(x, w) = layer_norm(relu(conv2d(x, w))) over the last axis, all float32."""
    bb = g.BlockBuilder()
    x = g.Var("x", t((1, 4, 8, 8)))
    w = g.Var("w", t((8, 4, 3, 3)))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            c = bb.emit(op.nn.conv2d(x, w, padding=1))
            r = bb.emit(op.nn.relu(c))
            out = bb.emit_output(op.nn.layer_norm(r, g.const(GAMMA), g.const(BETA)))
        bb.emit_func_output(out)
    return bb.get()


def test_conv_relu_layer_norm_float16_structure():
    got = ToMixedPrecision(F16)(conv_relu_ln())

    bb = g.BlockBuilder()
    x = g.Var("x", t((1, 4, 8, 8)))
    w = g.Var("w", t((8, 4, 3, 3)))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            x16 = bb.emit(op.cast(x, F16))
            w16 = bb.emit(op.cast(w, F16))
            c = bb.emit(op.nn.conv2d(x16, w16, padding=1, out_dtype=F32))  # f32 accumulation
            c16 = bb.emit(op.cast(c, F16))
            r = bb.emit(op.nn.relu(c16))  # FOLLOW: runs in float16
            r32 = bb.emit(op.cast(r, F32))  # NEVER: layer_norm keeps its float32 input
            out = bb.emit_output(op.nn.layer_norm(r32, g.const(GAMMA), g.const(BETA)))
        bb.emit_func_output(out)
    assert_structural_equal(func_of(got), func_of(bb.get()))


def test_never_op_after_conv_reads_the_float32_accumulator():
    """conv -> layer_norm and conv -> relu: one cast (for relu), no f32->f16->f32 round trip."""
    bb = g.BlockBuilder()
    x = g.Var("x", t((1, 4, 8, 8)))
    w = g.Var("w", t((8, 4, 3, 3)))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            c = bb.emit(op.nn.conv2d(x, w, padding=1))
            ln = bb.emit(op.nn.layer_norm(c, g.const(GAMMA), g.const(BETA)))
            out = bb.emit_output(op.add(ln, op.nn.relu(c)))
        bb.emit_func_output(out)
    got = ToMixedPrecision(F16)(bb.get())

    bb = g.BlockBuilder()
    x = g.Var("x", t((1, 4, 8, 8)))
    w = g.Var("w", t((8, 4, 3, 3)))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            c = bb.emit(op.nn.conv2d(bb.emit(op.cast(x, F16)), bb.emit(op.cast(w, F16)),
                                     padding=1, out_dtype=F32))
            ln = bb.emit(op.nn.layer_norm(c, g.const(GAMMA), g.const(BETA)))
            r = bb.emit(op.nn.relu(bb.emit(op.cast(c, F16))))
            # add(float32 computed value, float16 value): FOLLOW runs in float32
            out = bb.emit_output(op.add(ln, bb.emit(op.cast(r, F32))))
        bb.emit_func_output(out)
    assert_structural_equal(func_of(got), func_of(bb.get()))


def test_model_already_in_float16_is_left_alone():
    """The bug this pass must not have: a NEVER op on float16 data stays float16."""
    bb = g.BlockBuilder()
    x = g.Var("x", t((1, 4, 8, 8), F16))
    w = g.Var("w", t((8, 4, 3, 3), F16))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            r = bb.emit(op.nn.relu(bb.emit(op.nn.conv2d(x, w, padding=1))))
            ln = bb.emit(op.nn.layer_norm(r, g.const(GAMMA.astype(F16)),
                                          g.const(BETA.astype(F16))))
            idx = bb.emit(op.argmax(ln, axis=-1))  # int64 result
            out = bb.emit_output(g.Tuple((ln, idx)))
        bb.emit_func_output(out)
    mod = bb.get()
    for lp in (F16, BF16):
        got = ToMixedPrecision(lp)(mod)
        assert got["main"] is mod["main"]


def test_float16_input_is_used_directly_no_cast_pair():
    """x16 -> cast(f32) -> conv: the conv reads x16 itself, not cast(cast(x16, f32), f16)."""
    bb = g.BlockBuilder()
    x = g.Var("x", t((1, 4, 8, 8), F16))
    w = g.Var("w", t((8, 4, 3, 3)))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            x32 = bb.emit(op.cast(x, F32))
            out = bb.emit_output(op.nn.conv2d(x32, w, padding=1))
        bb.emit_func_output(out)
    got = ToMixedPrecision(F16)(bb.get())

    bb = g.BlockBuilder()
    x = g.Var("x", t((1, 4, 8, 8), F16))
    w = g.Var("w", t((8, 4, 3, 3)))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            bb.emit(op.cast(x, F32))  # the model's own cast: dead now, DCE's job
            out = bb.emit_output(op.nn.conv2d(x, bb.emit(op.cast(w, F16)), padding=1,
                                              out_dtype=F32))
        bb.emit_func_output(out)
    assert_structural_equal(func_of(got), func_of(bb.get()))
    cleaned = DeadCodeElimination()(got)
    casts_of_x = [b for blk in cleaned["main"].body.blocks for b in blk.bindings
                  if isinstance(b.value, g.Call) and b.value.args[0] is x]
    assert not casts_of_x


def test_redundant_casts_in_the_model_are_dropped():
    """cast(v, f16) where v is already float16 and cast(v, f32) of the f32 accumulator."""
    bb = g.BlockBuilder()
    x = g.Var("x", t((16, 32)))
    w = g.Var("w", t((8, 32)))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            d = bb.emit(op.dense(x, w))
            same = bb.emit(op.cast(d, F32))  # identity cast in the model
            r = bb.emit(op.nn.relu(d))
            r16 = bb.emit(op.cast(r, F16))  # r is float16 after the pass: dropped
            out = bb.emit_output(g.Tuple((same, r16)))
        bb.emit_func_output(out)
    got = ToMixedPrecision(F16)(bb.get())

    bb = g.BlockBuilder()
    x = g.Var("x", t((16, 32)))
    w = g.Var("w", t((8, 32)))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            d = bb.emit(op.dense(bb.emit(op.cast(x, F16)), bb.emit(op.cast(w, F16)),
                                 out_dtype=F32))
            r = bb.emit(op.nn.relu(bb.emit(op.cast(d, F16))))
            out = bb.emit_output(g.Tuple((d, r)))
        bb.emit_func_output(out)
    assert_structural_equal(func_of(got), func_of(bb.get()))


def test_int32_index_path_keeps_its_dtypes():
    bb = g.BlockBuilder()
    x = g.Var("x", t((16, 32)))
    w = g.Var("w", t((24, 32)))
    idx = g.Var("idx", t((5,), "int32"))
    with bb.function("main", [x, w, idx]):
        with bb.dataflow():
            d = bb.emit(op.dense(x, w))
            i2 = bb.emit(op.add(idx, g.const(np.array([1], "int32"))))
            rows = bb.emit(op.take(d, i2, axis=0))
            out = bb.emit_output(op.nn.relu(rows))
        bb.emit_func_output(out)
    mod = bb.get()
    got = ToMixedPrecision(F16)(mod)

    bb = g.BlockBuilder()
    x = g.Var("x", t((16, 32)))
    w = g.Var("w", t((24, 32)))
    idx = g.Var("idx", t((5,), "int32"))
    with bb.function("main", [x, w, idx]):
        with bb.dataflow():
            d = bb.emit(op.dense(bb.emit(op.cast(x, F16)), bb.emit(op.cast(w, F16)),
                                 out_dtype=F32))
            i2 = bb.emit(op.add(idx, g.const(np.array([1], "int32"))))
            rows = bb.emit(op.take(bb.emit(op.cast(d, F16)), i2, axis=0))
            r = bb.emit(op.nn.relu(rows))
            out = bb.emit_output(op.cast(r, F32))  # the result keeps its float32 dtype
        bb.emit_func_output(out)
    assert_structural_equal(func_of(got), func_of(bb.get()))
    # the integer binding is the very same object: untouched
    orig_add = mod["main"].body.blocks[0].bindings[1]
    assert any(b is orig_add for b in got["main"].body.blocks[0].bindings)

    xv = RNG.standard_normal((16, 32)).astype(F32)
    wv = RNG.standard_normal((24, 32)).astype(F32)
    iv = np.array([0, 3, 7, 14, 2], "int32")
    ref = kiln.build(mod)(xv, wv, iv)
    out = kiln.build(got)(xv, wv, iv)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, ref, atol=4 * UNIT_ROUNDOFF[F16] * np.abs(ref).max())


def test_layer_norm_opt_in_runs_in_low_precision():
    got = ToMixedPrecision(BF16, low_precision_ops=["nn.layer_norm"])(conv_relu_ln())

    bb = g.BlockBuilder()
    x = g.Var("x", t((1, 4, 8, 8)))
    w = g.Var("w", t((8, 4, 3, 3)))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            c = bb.emit(op.nn.conv2d(bb.emit(op.cast(x, BF16)), bb.emit(op.cast(w, BF16)),
                                     padding=1, out_dtype=F32))
            r = bb.emit(op.nn.relu(bb.emit(op.cast(c, BF16))))
            gamma = g.const(GAMMA.astype(ml_dtypes.bfloat16))  # converted at compile time
            beta = g.const(BETA.astype(ml_dtypes.bfloat16))
            ln = bb.emit(op.nn.layer_norm(r, gamma, beta))
            out = bb.emit_output(op.cast(ln, F32))
        bb.emit_func_output(out)
    assert_structural_equal(func_of(got), func_of(bb.get()))


def test_keep_fp32_ops_leaves_a_float32_model_alone():
    mod = conv_relu_ln()
    got = ToMixedPrecision(F16, keep_fp32_ops=("nn.conv2d",))(mod)
    assert got["main"] is mod["main"]


def test_graph_function_calls_and_branches_get_original_dtypes():
    bb = g.BlockBuilder()
    y = g.Var("y", t((4, 8)))
    with bb.function("helper", [y]):
        with bb.dataflow():
            o = bb.emit_output(op.exp(y))
        bb.emit_func_output(o)
    x = g.Var("x", t((4, 8)))
    w = g.Var("w", t((8, 8)))
    cond = g.Var("cond", t((), "bool"))
    with bb.function("main", [x, w, cond]):
        with bb.dataflow():
            d = bb.emit_output(op.dense(x, w))
        h = bb.emit(g.Call(g.GlobalVar("helper"), (d,)))  # reads the float32 accumulator
        r = bb.emit(op.nn.relu(d))  # float16 after the pass
        sel = bb.emit(g.If(cond, r, x))  # the branch casts it back to float32
        bb.emit_func_output(g.Tuple((h, sel)))
    mod = bb.get()
    with PassContext(instruments=[WellFormedInstrument()]):  # well formed after the pass
        got = ToMixedPrecision(F16)(mod)
    assert got["helper"] is mod["helper"]  # only exp: nothing to convert
    main = got["main"]
    assert main.params == mod["main"].params
    assert_structural_equal(main.ret_struct_info, mod["main"].ret_struct_info)
    dense = main.body.blocks[0].bindings[-1]
    assert str(dense.var.struct_info.dtype) == F32  # the accumulator
    call, d16, relu, branch = main.body.blocks[1].bindings
    assert call.value.args[0] is dense.var  # no cast for the helper
    assert d16.value.op.name == "cast" and d16.value.args[0] is dense.var
    assert str(relu.var.struct_info.dtype) == F16
    true_branch = branch.value.true_branch  # a SeqExpr now: the cast back is in the branch
    cast_back = true_branch.blocks[0].bindings[0].value
    assert cast_back.op.name == "cast" and cast_back.args[0] is relu.var
    orig_false = mod["main"].body.blocks[1].bindings[-1].value.false_branch
    assert branch.value.false_branch is orig_false  # x stays x: nothing to cast
    assert str(branch.var.struct_info.dtype) == F32


def test_split_and_concat_follow_their_inputs():
    bb = g.BlockBuilder()
    x = g.Var("x", t((8, 16)))
    w = g.Var("w", t((16, 16)))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            d = bb.emit(op.dense(x, w))
            parts = bb.emit(op.split(d, 2, axis=1))
            a = bb.emit(g.TupleGetItem(parts, 0))
            b = bb.emit(g.TupleGetItem(parts, 1))
            out = bb.emit_output(op.concat([b, a], axis=1))
        bb.emit_func_output(out)
    mod = bb.get()
    got = ToMixedPrecision(F16)(mod)
    dtypes = {b.var.name: str(b.var.struct_info.dtype) for blk in got["main"].body.blocks
              for b in blk.bindings if isinstance(b.var.struct_info, g.TensorStructInfo)}
    assert dtypes["lv2"] == dtypes["lv3"] == F16  # the tuple items are float16
    assert got["main"].ret_struct_info.dtype == F32
    xv = RNG.standard_normal((8, 16)).astype(F32)
    wv = RNG.standard_normal((16, 16)).astype(F32)
    ref = kiln.build(mod)(xv, wv)
    np.testing.assert_allclose(kiln.build(got)(xv, wv), ref, rtol=2e-3, atol=2e-2)


def test_constants_are_converted_at_compile_time():
    wv = RNG.standard_normal((8, 32)).astype(F32)
    bb = g.BlockBuilder()
    x = g.Var("x", t((4, 32)))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(op.dense(x, g.const(wv)))
        bb.emit_func_output(out)
    got = ToMixedPrecision(F16)(bb.get())
    dense = got["main"].body.blocks[0].bindings[1].value
    assert isinstance(dense.args[1], g.Constant)
    np.testing.assert_array_equal(dense.args[1].data, wv.astype(F16))


def test_accumulate_dtype_none_computes_entirely_in_low_precision():
    wv = RNG.standard_normal((8, 32)).astype(F32)
    bb = g.BlockBuilder()
    x = g.Var("x", t((4, 32)))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(op.nn.relu(op.dense(x, g.const(wv))))
        bb.emit_func_output(out)
    got = ToMixedPrecision(BF16, accumulate_dtype=None)(bb.get())

    bb = g.BlockBuilder()
    x = g.Var("x", t((4, 32)))
    with bb.function("main", [x]):
        with bb.dataflow():
            d = bb.emit(op.dense(bb.emit(op.cast(x, BF16)), g.const(wv.astype(ml_dtypes.bfloat16))))
            r = bb.emit(op.nn.relu(d))
            out = bb.emit_output(op.cast(r, F32))
        bb.emit_func_output(out)
    assert_structural_equal(func_of(got), func_of(bb.get()))


def test_bad_arguments_are_named():
    with pytest.raises(KilnError, match="out_dtype must be one of"):
        ToMixedPrecision("float64")
    with pytest.raises(KilnError, match=r"unknown operator\(s\) \['nn.conv9d'\]"):
        ToMixedPrecision(F16, keep_fp32_ops=["nn.conv9d"])
    with pytest.raises(KilnError, match="relu"):
        ToMixedPrecision(F16, keep_fp32_ops=["relu"], low_precision_ops=["relu"])
    with pytest.raises(KilnError, match="list of op names"):
        ToMixedPrecision(F16, low_precision_ops="nn.softmax")


def test_declared_pass():
    names = {name: (level, summary) for name, level, summary in list_passes()}
    assert names["ToMixedPrecision"][0] == 0
    assert "float16/bfloat16" in names["ToMixedPrecision"][1]


# ---------------------------------------------------------------------------------------------
# the scenario, end to end: ToMixedPrecision -> LegalizeOps -> AnnotateTIROpPattern -> FuseOps
# -> FuseTIR, well_formed after every pass, build, compare with float32
# ---------------------------------------------------------------------------------------------
def _variant(name):
    """(module, input makers, ToMixedPrecision options) of one scenario variant."""
    bb = g.BlockBuilder()
    w_val = (0.3 * RNG.standard_normal((8, 4, 3, 3))).astype(F32)
    opts = {}
    x_dtype = F16 if name == "float16_input" else F32
    x = g.Var("x", t((2, 4, 8, 8), x_dtype))
    params = [x]
    idx = None
    if name == "int32_index_path":
        idx = g.Var("idx", t((2, 8, 8), "int32"))
        params.append(idx)
    with bb.function("main", params):
        with bb.dataflow():
            h = bb.emit(op.cast(x, F32)) if x_dtype == F16 else x
            c = bb.emit(op.nn.conv2d(h, g.const(w_val), padding=1))
            r = bb.emit(op.nn.relu(c))
            if name == "float16_island":
                # a part of the model that already is float16, layer_norm included (NEVER:
                # it must stay float16, not be forced to float32)
                r16 = bb.emit(op.cast(r, F16))
                ln16 = bb.emit(op.nn.layer_norm(r16, g.const(GAMMA3.astype(F16)),
                                                g.const(BETA3.astype(F16)), axes=LN_AXES))
                out = bb.emit_output(op.cast(ln16, F32))
            else:
                ln = bb.emit(op.nn.layer_norm(r, g.const(GAMMA3), g.const(BETA3), axes=LN_AXES))
                if idx is not None:
                    # integer arithmetic next to the float path, then a gather by it
                    flat = bb.emit(op.reshape(ln, (2 * 8 * 8 * 8,)))
                    pos = bb.emit(op.mod(op.add(idx, g.const(np.array([3], "int32"))),
                                         g.const(np.array([2 * 8 * 8 * 8], "int32"))))
                    out = bb.emit_output(g.Tuple((ln, op.take(flat, pos, axis=0), pos)))
                else:
                    out = bb.emit_output(ln)
        bb.emit_func_output(out)
    if name == "layer_norm_low_precision":
        opts["low_precision_ops"] = ("nn.layer_norm",)
    if name == "layer_norm_kept":
        opts["keep_fp32_ops"] = ("nn.layer_norm",)

    def inputs(seed):
        rng = np.random.default_rng(seed)
        vals = [rng.standard_normal((2, 4, 8, 8)).astype(x_dtype)]
        if idx is not None:
            vals.append(rng.integers(0, 2 * 8 * 8 * 8, (2, 8, 8)).astype("int32"))
        return vals

    return bb.get(), inputs, opts


VARIANTS = ["float32_model", "float16_input", "int32_index_path", "float16_island",
            "layer_norm_kept", "layer_norm_low_precision"]


def _rel_err(out, ref):
    out = np.asarray(out, np.float64)
    ref = np.asarray(ref, np.float64)
    return np.abs(out - ref).max() / max(np.abs(ref).max(), 1e-30)


def _dtypes_of(mod):
    found = set()
    for _, f in mod.items():
        if isinstance(f, g.Function):
            for blk in f.body.blocks:
                for b in blk.bindings:
                    if isinstance(b.var.struct_info, g.TensorStructInfo):
                        found.add(str(b.var.struct_info.dtype))
    return found


@pytest.mark.parametrize("lp", [F16, BF16])
@pytest.mark.parametrize("variant", VARIANTS)
def test_scenario_through_fusion_matches_float32(variant, lp):
    mod, inputs, opts = _variant(variant)
    after: dict[str, object] = {}

    @module_pass(opt_level=0, name="_RecordMixedPrecisionIR")
    def record(m, ctx):  # keeps the IR right after ToMixedPrecision for the checks below
        after["mod"] = m
        return m.copy()

    pipeline = Sequential([ToMixedPrecision(lp, **opts), record, LegalizeOps(),
                           AnnotateTIROpPattern(), FuseOps(), FuseTIR()])
    with PassContext(instruments=[WellFormedInstrument()]):
        lowp = kiln.build(mod, pipeline=pipeline)
        ref_exe = kiln.build(mod)
    converted = after["mod"]
    assert lp in _dtypes_of(converted)  # the model really runs in low precision
    if variant == "float16_island":
        ln = [b for blk in converted["main"].body.blocks for b in blk.bindings
              if isinstance(b.value, g.Call) and getattr(b.value.op, "name", "") ==
              "nn.layer_norm"]
        assert [str(b.var.struct_info.dtype) for b in ln] == [F16]
    # measured on random weights and inputs: at most ~2 unit roundoffs of the type; 8 leaves
    # room without letting a real precision loss (e.g. float16 accumulation) through
    tol = 8 * UNIT_ROUNDOFF[lp]
    worst = 0.0
    for seed in range(2):
        args = inputs(seed)
        ref = ref_exe(*args)
        out = lowp(*args)
        refs = ref if isinstance(ref, (tuple, list)) else (ref,)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        for o, r in zip(outs, refs):
            assert o.dtype == r.dtype and o.shape == r.shape
            if o.dtype.kind in "iu":
                np.testing.assert_array_equal(o, r)  # the integer path is exact
            else:
                worst = max(worst, _rel_err(o, r))
    assert worst < tol, f"{variant} {lp}: relative error {worst:.3g} >= {tol:.3g}"
    if variant != "layer_norm_kept" or lp != F16:
        assert worst > 0  # it did compute in low precision


# ---------------------------------------------------------------------------------------------
# a broken pass is caught by well_formed right after it runs
# ---------------------------------------------------------------------------------------------
def test_dtype_mismatched_call_tir_is_reported_at_once():
    bb = g.BlockBuilder()
    x = g.Var("x", t((4, 8)))
    with bb.function("main", [x]):
        with bb.dataflow():
            r = bb.emit(op.nn.relu(x))
            out = bb.emit_output(op.exp(r))
        bb.emit_func_output(out)
    legal = LegalizeOps()(bb.get())

    @module_pass(opt_level=0, name="_HalfArgumentsOnly")
    def half_args(mod, ctx):
        """Casts the input of the exp kernel to float16 but leaves its buffers float32 (the
        kind of inconsistency that used to surface only inside FuseTIR)."""
        bb = g.BlockBuilder(mod.without("main"))
        main = mod["main"]
        with bb.function("main", list(main.params)):
            with bb.dataflow():
                env = {}
                for binding in main.body.blocks[0].bindings:
                    v = binding.value
                    gv, args = v.args
                    args = [env.get(a, a) for a in args.fields]
                    if gv.name == "exp":
                        args = [bb.emit(op.cast(args[0], F16), "relu_out_fp16")]
                    new = g.call_tir(gv, args, v.sinfo_args[0])
                    env[binding.var] = (bb.emit_output(new, binding.var.name)
                                        if not isinstance(binding.var, g.DataflowVar)
                                        else bb.emit(new, binding.var.name))
            bb.emit_func_output(env[main.body.body])
        return bb.get()

    with PassContext(instruments=[WellFormedInstrument()]):
        pipeline = Sequential([half_args, AnnotateTIROpPattern(), FuseOps(), FuseTIR()])
        with pytest.raises(WellFormedError) as err:
            pipeline(legal)
    msg = str(err.value)
    assert "_HalfArgumentsOnly" in msg  # the pass that broke it, not FuseTIR later
    assert "call_tir exp" in msg
    assert "argument 0 has dtype float16 but buffer 'A' of exp has dtype float32" in msg
    assert "argument 0 is relu_out_fp16" in msg  # both sides named
    assert "FuseTIR" not in msg
