"""FuseOps: which call_tir bindings fuse (TVM's dominator rules), IR before/after."""

import numpy as np
import pytest

import kiln
from kiln import graph as g
from kiln import op, te
from kiln.ir import IRModule, KilnError, assert_structural_equal
from kiln.transform import FuseOps, FuseTIR, LegalizeOps, PassContext, Sequential
from kiln.transform.fuse_ops import MAX_ARGS_KEY, MAX_DEPTH_KEY, group_name, partition_block

T = g.TensorStructInfo


def legalized(params, body):
    """LegalizeOps of ``main(params)`` whose dataflow block is built by ``body(bb, *params)``
    (which returns the output value)."""
    bb = g.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(body(bb, *params))
        bb.emit_func_output(out)
    return LegalizeOps()(bb.get())


def ct(name, args, sinfo):
    return g.call_tir(g.GlobalVar(name), list(args), sinfo)


def fused_function(bb, name, params, members):
    """Add Primitive function ``name``: ``members`` is a list of (PrimFunc name, arg indices)
    where an index < 0 refers to a parameter (-1 - i) and >= 0 to an earlier member."""
    with bb.function(name, params, attrs={"Primitive": True}):
        with bb.dataflow():
            vals = []
            for k, (callee, idx, sinfo) in enumerate(members):
                args = [params[-1 - i] if i < 0 else vals[i] for i in idx]
                call = ct(callee, args, sinfo)
                vals.append(bb.emit_output(call) if k == len(members) - 1 else bb.emit(call))
        bb.emit_func_output(vals[-1])
    return g.GlobalVar(name)


def prims_only(mod):
    return IRModule({k: f for k, f in mod.items() if not isinstance(f, g.Function)})


def check_function(after, expected, name):
    assert name in after, sorted(after.functions)
    assert_structural_equal(after[name], expected[name])


def graph_functions(mod):
    return sorted(k for k, f in mod.items() if isinstance(f, g.Function))


def run_both(before, after, inputs):
    with PassContext(opt_level=0):
        a = kiln.build(before)(*inputs)
        b = kiln.build(after, pipeline=Sequential([FuseTIR()]))(*inputs)
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


RNG = np.random.default_rng(0)


def rand(*shape):
    return RNG.standard_normal(shape).astype("float32")


# ---------------------------------------------------------------------------------------------
def test_conv_bias_relu():
    x, w, b = g.Var("x", T((1, 3, 8, 8), "float32")), g.Var("w", T((4, 3, 3, 3), "float32")), \
        g.Var("b", T((1, 4, 1, 1), "float32"))

    def body(bb, x, w, b):
        h = bb.emit(op.nn.conv2d(x, w, padding=1))
        h = bb.emit(op.add(h, b))
        return op.nn.relu(h)

    before = legalized([x, w, b], body)
    after = FuseOps()(before)

    out = T((1, 4, 8, 8), "float32")
    bb = g.BlockBuilder(prims_only(before))
    ps = [g.Var(n, v.struct_info) for n, v in zip("xwb", (x, w, b))]
    gv = fused_function(bb, "fused_conv2d_add_relu", ps,
                        [("conv2d", [-1, -2], out), ("add", [0, -3], out), ("relu", [1], out)])
    mx, mw, mb = (g.Var(n, v.struct_info) for n, v in zip("xwb", (x, w, b)))
    with bb.function("main", [mx, mw, mb]):
        with bb.dataflow():
            r = bb.emit_output(g.Call(gv, (mx, mw, mb)))
        bb.emit_func_output(r)
    expected = bb.get()
    check_function(after, expected, "main")
    check_function(after, expected, "fused_conv2d_add_relu")
    assert graph_functions(after) == ["fused_conv2d_add_relu", "main"]
    run_both(before, after, [rand(1, 3, 8, 8), rand(4, 3, 3, 3), rand(1, 4, 1, 1)])


def test_dense_add_relu_then_softmax_stays_alone():
    x, w, b = g.Var("x", T((4, 16), "float32")), g.Var("w", T((8, 16), "float32")), \
        g.Var("b", T((8,), "float32"))

    def body(bb, x, w, b):
        h = bb.emit(op.dense(x, w))
        h = bb.emit(op.nn.relu(bb.emit(op.add(h, b))))
        return op.nn.softmax(h)

    before = legalized([x, w, b], body)
    after = FuseOps()(before)
    out = T((4, 8), "float32")
    bb = g.BlockBuilder(prims_only(before))
    ps = [g.Var(n, v.struct_info) for n, v in zip("xwb", (x, w, b))]
    gv = fused_function(bb, "fused_dense_add_relu", ps,
                        [("dense", [-1, -2], out), ("add", [0, -3], out), ("relu", [1], out)])
    mx, mw, mb = (g.Var(n, v.struct_info) for n, v in zip("xwb", (x, w, b)))
    with bb.function("main", [mx, mw, mb]):
        with bb.dataflow():
            h = bb.emit(g.Call(gv, (mx, mw, mb)))
            r = bb.emit_output(ct("softmax", [h], out))
        bb.emit_func_output(r)
    expected = bb.get()
    check_function(after, expected, "main")
    check_function(after, expected, "fused_dense_add_relu")
    run_both(before, after, [rand(4, 16), rand(8, 16), rand(8)])


def test_elementwise_chain_with_broadcast():
    x, b = g.Var("x", T((4, 8), "float32")), g.Var("b", T((8,), "float32"))
    before = legalized([x, b], lambda bb, x, b: op.tanh(bb.emit(op.add(bb.emit(op.exp(x)), b))))
    after = FuseOps()(before)
    out = T((4, 8), "float32")
    bb = g.BlockBuilder(prims_only(before))
    ps = [g.Var("x", x.struct_info), g.Var("b", b.struct_info)]
    gv = fused_function(bb, "fused_exp_add_tanh", ps,
                        [("exp", [-1], out), ("add", [0, -2], out), ("tanh", [1], out)])
    mx, mb = g.Var("x", x.struct_info), g.Var("b", b.struct_info)
    with bb.function("main", [mx, mb]):
        with bb.dataflow():
            r = bb.emit_output(g.Call(gv, (mx, mb)))
        bb.emit_func_output(r)
    check_function(after, bb.get(), "main")
    check_function(after, bb.get(), "fused_exp_add_tanh")


def test_reduction_fuses_its_elementwise_and_injective_inputs_not_its_consumers():
    x = g.Var("x", T((4, 8), "float32"))

    def body(bb, x):
        t = bb.emit(op.transpose(bb.emit(op.exp(x))))
        s = bb.emit(op.sum(t, axis=[1]))
        return op.nn.relu(s)

    before = legalized([x], body)
    after = FuseOps()(before)
    bb = g.BlockBuilder(prims_only(before))
    ps = [g.Var("x", x.struct_info)]
    gv = fused_function(bb, "fused_exp_transpose_sum", ps,
                        [("exp", [-1], T((4, 8), "float32")),
                         ("transpose", [0], T((8, 4), "float32")),
                         ("sum", [1], T((8,), "float32"))])
    mx = g.Var("x", x.struct_info)
    with bb.function("main", [mx]):
        with bb.dataflow():
            s = bb.emit(g.Call(gv, (mx,)))
            r = bb.emit_output(ct("relu", [s], T((8,), "float32")))
        bb.emit_func_output(r)
    check_function(after, bb.get(), "main")
    check_function(after, bb.get(), "fused_exp_transpose_sum")
    run_both(before, after, [rand(4, 8)])


def test_out_ewise_fusable_stops_at_an_injective_consumer():
    x, w = g.Var("x", T((4, 16), "float32")), g.Var("w", T((8, 16), "float32"))

    def body(bb, x, w):
        h = bb.emit(op.nn.relu(bb.emit(op.dense(x, w))))
        return op.transpose(h)

    before = legalized([x, w], body)
    after = FuseOps()(before)
    block = after["main"].body.blocks[0]
    values = [b.value for b in block.bindings]
    assert isinstance(values[0].op, g.GlobalVar) and values[0].op.name == "fused_dense_relu"
    assert g.is_call_tir(values[1]) and values[1].args[0].name == "transpose"
    assert len(values) == 2


def test_diamond_fuses_into_one_group():
    x, w = g.Var("x", T((1, 2, 6, 6), "float32")), g.Var("w", T((4, 2, 3, 3), "float32"))

    def body(bb, x, w):
        c = bb.emit(op.nn.relu(bb.emit(op.nn.conv2d(x, w, padding=1))))
        a = bb.emit(op.exp(c))
        n = bb.emit(op.negative(c))
        return op.add(a, n)

    before = legalized([x, w], body)
    after = FuseOps()(before)
    out = T((1, 4, 6, 6), "float32")
    bb = g.BlockBuilder(prims_only(before))
    ps = [g.Var("x", x.struct_info), g.Var("w", w.struct_info)]
    gv = fused_function(bb, "fused_conv2d_relu_exp_negative_add", ps,
                        [("conv2d", [-1, -2], out), ("relu", [0], out), ("exp", [1], out),
                         ("negative", [1], out), ("add", [2, 3], out)])
    mx, mw = g.Var("x", x.struct_info), g.Var("w", w.struct_info)
    with bb.function("main", [mx, mw]):
        with bb.dataflow():
            r = bb.emit_output(g.Call(gv, (mx, mw)))
        bb.emit_func_output(r)
    check_function(after, bb.get(), "main")
    check_function(after, bb.get(), "fused_conv2d_relu_exp_negative_add")
    run_both(before, after, [rand(1, 2, 6, 6), rand(4, 2, 3, 3)])


def test_diamond_through_an_injective_branch_keeps_the_conv_group_small():
    x, w = g.Var("x", T((1, 2, 6, 6), "float32")), g.Var("w", T((4, 2, 3, 3), "float32"))

    def body(bb, x, w):
        c = bb.emit(op.nn.relu(bb.emit(op.nn.conv2d(x, w, padding=1))))
        t = bb.emit(op.transpose(bb.emit(op.transpose(c, (0, 1, 3, 2))), (0, 1, 3, 2)))
        return op.add(c, t)

    before = legalized([x, w], body)
    after = FuseOps()(before)
    names = [b.value.op.name if isinstance(b.value.op, g.GlobalVar) else b.value.args[0].name
             for b in after["main"].body.blocks[0].bindings]
    # relu's post-dominator is the add, reached through INJECTIVE transposes: the conv group
    # stops at relu; the transposes (phase 1) fuse into the add
    assert names == ["fused_conv2d_relu", "fused_transpose_transpose_add"]
    run_both(before, after, [rand(1, 2, 6, 6), rand(4, 2, 3, 3)])


def test_elementwise_side_input_joins_the_conv_epilogue():
    x, w, y = (g.Var("x", T((1, 2, 6, 6), "float32")), g.Var("w", T((4, 2, 3, 3), "float32")),
               g.Var("y", T((1, 4, 6, 6), "float32")))

    def body(bb, x, w, y):
        e = bb.emit(op.exp(y))
        c = bb.emit(op.nn.conv2d(x, w, padding=1))
        return op.add(c, e)

    before = legalized([x, w, y], body)
    after = FuseOps()(before)
    (binding,) = after["main"].body.blocks[0].bindings
    assert binding.value.op.name == "fused_exp_conv2d_add"
    run_both(before, after, [rand(1, 2, 6, 6), rand(4, 2, 3, 3), rand(1, 4, 6, 6)])


def test_opaque_breaks_chains():
    x = g.Var("x", T((4, 8), "float32"))

    def body(bb, x):
        h = bb.emit(op.nn.relu(bb.emit(op.exp(x))))
        h = bb.emit(op.nn.softmax(h))
        return op.negative(bb.emit(op.tanh(h)))

    before = legalized([x], body)
    after = FuseOps()(before)
    names = [b.value.op.name if isinstance(b.value.op, g.GlobalVar) else b.value.args[0].name
             for b in after["main"].body.blocks[0].bindings]
    assert names == ["fused_exp_relu", "softmax", "fused_tanh_negative"]


def test_nothing_to_fuse_leaves_the_module_alone():
    x = g.Var("x", T((4, 8), "float32"))
    before = legalized([x], lambda bb, x: op.nn.softmax(bb.emit(op.nn.softmax(x))))
    after = FuseOps()(before)
    assert_structural_equal(after["main"], before["main"])
    assert graph_functions(after) == ["main"]


def chain5(bb, x):
    h = x
    for name in ("exp", "negative", "tanh", "abs"):
        h = bb.emit(getattr(op, name)(h))
    return op.sigmoid(h)


def _group_sizes(mod):
    return [len(grp) for grp in partition_block(mod["main"].body.blocks[0], mod,
                                                max_depth=2)]


def test_max_group_size_from_config_and_option():
    x = g.Var("x", T((4, 8), "float32"))
    before = legalized([x], chain5)
    assert _group_sizes(before) == [2, 2, 1]
    with PassContext(config={MAX_DEPTH_KEY: 2}):
        after = FuseOps()(before)
    names = [b.value.op.name if isinstance(b.value.op, g.GlobalVar) else b.value.args[0].name
             for b in after["main"].body.blocks[0].bindings]
    assert names == ["fused_exp_negative", "fused_tanh_abs", "sigmoid"]
    assert_structural_equal(FuseOps(max_depth=2)(before)["main"], after["main"])
    whole = FuseOps()(before)
    assert len(whole["main"].body.blocks[0].bindings) == 1
    with pytest.raises(KilnError, match="expects int"):
        PassContext(config={MAX_DEPTH_KEY: "2"})


def test_block_outputs_end_groups_and_are_kept():
    x = g.Var("x", T((4, 8), "float32"))
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit_output(op.nn.relu(bb.emit(op.exp(x))))  # visible after the block
            c = bb.emit_output(op.negative(bb.emit(op.tanh(a))))
        bb.emit_func_output([a, c])
    before = LegalizeOps()(bb.get())
    after = FuseOps()(before)
    bindings = after["main"].body.blocks[0].bindings
    assert [b.value.op.name for b in bindings] == ["fused_exp_relu", "fused_tanh_negative"]
    assert bindings[0].var is before["main"].body.blocks[0].bindings[1].var
    run_both(before, after, [rand(4, 8)])


def test_symbolic_shapes_and_constants_become_parameters():
    from kiln import tir

    n = tir.Var("n", "int64")
    x = g.Var("x", T((n, 8), "float32"))
    bias = np.arange(8, dtype="float32")
    before = legalized([x], lambda bb, x: op.nn.relu(bb.emit(op.add(x, g.const(bias)))))
    after = FuseOps()(before)
    fused = after["fused_add_relu"]
    assert [p.struct_info.dtype for p in fused.params] == ["float32", "float32"]
    (binding,) = after["main"].body.blocks[0].bindings
    assert isinstance(binding.value.args[1], g.Constant)
    xs = rand(5, 8)
    with PassContext(opt_level=0):
        got = kiln.build(after, pipeline=Sequential([FuseTIR()]))(xs)
    np.testing.assert_allclose(got, np.maximum(xs + bias, 0), rtol=1e-6)


def test_hand_written_prim_funcs_use_the_derived_pattern():
    a = te.placeholder((4, 8), "float32", name="A")
    double = te.create_prim_func([a, te.compute((4, 8), lambda i, j: a[i, j] * 2.0, name="d")])
    bb = g.BlockBuilder()
    gv = bb.add_func(double, "double")
    x = g.Var("x", T((4, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(ct(gv.name, [x], T((4, 8), "float32")))
            r = bb.emit_output(op.exp(h))
        bb.emit_func_output(r)
    after = FuseOps()(LegalizeOps()(bb.get()))
    (binding,) = after["main"].body.blocks[0].bindings
    assert binding.value.op.name == "fused_double_exp"


def test_fuse_ops_is_declared_at_opt_level_2():
    assert FuseOps.info.opt_level == 2
    x = g.Var("x", T((4, 8), "float32"))
    before = legalized([x], lambda bb, x: op.tanh(bb.emit(op.exp(x))))
    with PassContext(opt_level=1):
        gated = Sequential([FuseOps()])(before)
    assert graph_functions(gated) == ["main"]


def _sum_of(n):
    """main(x0..x{n-1}) = x0 + x1 + ... (one element-wise chain reading n distinct tensors)."""
    xs = [g.Var(f"x{i}", T((4, 8), "float32")) for i in range(n)]

    def body(bb, *params):
        s = params[0]
        for p in params[1:]:
            s = bb.emit(op.add(s, p))
        return s

    return xs, legalized(xs, body)


def test_max_args_caps_the_tensors_a_fused_kernel_takes():
    def calls(mod):
        return [b.value for b in mod["main"].body.blocks[0].bindings
                if isinstance(b.value, g.Call)]

    xs, before = _sum_of(40)
    whole = calls(FuseOps()(before))
    assert len(whole) == 1 and len(whole[0].args) == 40
    with PassContext(config={MAX_ARGS_KEY: 10}):
        after = FuseOps()(before)
    for call in calls(after):  # each kernel: at most 9 inputs and its output
        assert len(call.args) + 1 <= 10
    assert len(calls(after)) >= 4
    assert_structural_equal(FuseOps(max_args=10)(before)["main"], after["main"])
    run_both(before, FuseOps(max_args=10)(before), [rand(4, 8) for _ in xs])


def test_long_group_names_are_cut():
    assert group_name(["conv2d", "add", "relu"]) == "fused_conv2d_add_relu"
    long = group_name(["add"] * 119)
    assert len(long) <= 64 and long.startswith("fused_add_add") and long.endswith("_more")
    assert long == group_name(["add"] * 119)  # deterministic
