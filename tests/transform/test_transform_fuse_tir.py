"""FuseTIR: Primitive functions become one PrimFunc; structure, attrs and numerics."""

import numpy as np
import pytest

import kiln
from kiln import graph as g
from kiln import op, te, tir
from kiln.ir import KilnError, assert_structural_equal
from kiln.op.registry import OpPattern
from kiln.transform import FuseOps, FuseTIR, LegalizeOps, PassContext, Sequential
from kiln.transform.fuse_tir import FusedGroup

T = g.TensorStructInfo
RNG = np.random.default_rng(3)


def rand(*shape):
    return RNG.standard_normal(shape).astype("float32")


def ct(gv, args, sinfo):
    return g.call_tir(gv, list(args), sinfo)


def members(shape):
    """Two hand-written PrimFuncs: ``double(A) = 2 A`` and ``addb(X, B) = X + B[j]``."""
    a = te.placeholder(shape, "float32", name="A")
    double = te.create_prim_func([a, te.compute(shape, lambda i, j: a[i, j] * 2.0,
                                                name="double")])
    x = te.placeholder(shape, "float32", name="X")
    b = te.placeholder((shape[1],), "float32", name="B")
    addb = te.create_prim_func([x, b, te.compute(shape, lambda i, j: x[i, j] + b[j],
                                                 name="addb")])
    return double, addb


def module(shape, chain=("double", "addb")):
    """main(x, b) calls Primitive ``fused`` which runs ``chain`` (double / addb) on x."""
    double, addb = members(shape)
    bb = g.BlockBuilder()
    gvs = {"double": bb.add_func(double, "double"), "addb": bb.add_func(addb, "addb")}
    px, pb = g.Var("x", T(shape, "float32")), g.Var("b", T((shape[1],), "float32"))
    with bb.function("fused", [px, pb], attrs={"Primitive": True}):
        with bb.dataflow():
            h = px
            for k, name in enumerate(chain):
                args = [h] if name == "double" else [h, pb]
                call = ct(gvs[name], args, T(shape, "float32"))
                h = bb.emit_output(call) if k == len(chain) - 1 else bb.emit(call)
        bb.emit_func_output(h)
    x, b = g.Var("x", T(shape, "float32")), g.Var("b", T((shape[1],), "float32"))
    with bb.function("main", [x, b]):
        with bb.dataflow():
            r = bb.emit_output(g.Call(g.GlobalVar("fused"), (x, b)))
        bb.emit_func_output(r)
    return bb.get()


class _Rescope(tir.Mutator):
    def __init__(self, mapping):
        self.mapping = mapping

    def visit_Buffer(self, b):
        return self.mapping.get(b, b)


def expected_double_addb(shape):
    x = te.placeholder(shape, "float32", name="x")
    b = te.placeholder((shape[1],), "float32", name="b")
    # the product stays inside the kernel: rounded before the addition (no FMA across ops)
    d = te.compute(shape, lambda i, j: tir.rounded(x[i, j] * 2.0), name="double")
    s = te.compute(shape, lambda i, j: d[i, j] + b[j], name="addb")
    f = te.create_prim_func([x, b, s])
    (alloc,) = f.body.block.alloc_buffers
    local = tir.Buffer(alloc.name, alloc.shape, alloc.dtype, None, (), None, "local")
    return f.with_body(_Rescope({alloc: local}).visit(f.body))


def test_structure_of_a_fused_chain():
    mod = module((4, 8))
    out = FuseTIR()(mod)
    assert sorted(out.functions) == ["fused", "main"]  # members and the Primitive fn are gone
    fused = out["fused"]
    assert isinstance(fused, tir.PrimFunc)
    assert_structural_equal(fused.replace(attrs={}), expected_double_addb((4, 8)).replace(
        attrs={}))
    attrs = fused.attrs
    assert attrs["num_outputs"] == 1
    assert attrs["fused_ops"] == ("double", "addb")
    # no op declares these PrimFuncs: the anchor is the strongest derived pattern (BROADCAST)
    assert attrs["op_pattern"] == int(OpPattern.BROADCAST) and "op_name" not in attrs
    assert attrs["kiln.anchor_blocks"] == ("addb",)
    record = attrs["kiln.fused_group"]
    assert isinstance(record, FusedGroup)
    assert record.func is mod["fused"]
    assert [n for n, _ in record.members] == ["double", "addb"]
    assert record.members[0][1] is mod["double"]
    (binding,) = out["main"].body.blocks[0].bindings
    assert g.is_call_tir(binding.value) and binding.value.args[0].name == "fused"


def test_symbolic_shapes_bind_member_dims():
    n = tir.Var("n", "int64")
    out = FuseTIR()(module((n, 8)))
    fused = out["fused"]
    assert_structural_equal(fused.replace(attrs={}), expected_double_addb(
        (tir.Var("m", "int64"), 8)).replace(attrs={}))
    xs, bs = rand(5, 8), rand(8)
    with PassContext(opt_level=0):
        got = kiln.build(out)(xs, bs)
    np.testing.assert_allclose(got, 2 * xs + bs, rtol=1e-6)


def test_member_called_twice_gets_fresh_loops_and_unique_block_names():
    mod = module((4, 8), chain=("double", "double", "addb", "double"))
    fused = FuseTIR()(mod)["fused"]
    names = []
    tir.post_order_visit(fused.body, lambda n: names.append(n.name_hint)
                         if isinstance(n, tir.Block) else None)
    # clashing names get a suffix; the anchor (addb, the strongest pattern) keeps its own
    assert names == ["double", "double_1", "addb", "double_2", "root"]
    loop_vars = []
    tir.post_order_visit(fused.body, lambda n: loop_vars.append(n.loop_var)
                         if isinstance(n, tir.For) else None)
    assert len({id(v) for v in loop_vars}) == len(loop_vars)
    xs, bs = rand(4, 8), rand(8)
    with PassContext(opt_level=0):
        got = kiln.build(FuseTIR()(mod))(xs, bs)
    np.testing.assert_allclose(got, 2 * (4 * xs + bs), rtol=1e-6)


def test_multi_output_group():
    shape = (4, 8)
    double, addb = members(shape)
    bb = g.BlockBuilder()
    gd, ga = bb.add_func(double, "double"), bb.add_func(addb, "addb")
    px, pb = g.Var("x", T(shape, "float32")), g.Var("b", T((8,), "float32"))
    with bb.function("fused", [px, pb], attrs={"Primitive": True}):
        with bb.dataflow():
            d = bb.emit_output(ct(gd, [px], T(shape, "float32")))
            s = bb.emit_output(ct(ga, [d, pb], T(shape, "float32")))
        bb.emit_func_output([s, d])
    x, b = g.Var("x", T(shape, "float32")), g.Var("b", T((8,), "float32"))
    with bb.function("main", [x, b]):
        with bb.dataflow():
            tup = bb.emit(g.Call(g.GlobalVar("fused"), (x, b)))
            first = bb.emit(g.TupleGetItem(tup, 0))
            second = bb.emit(g.TupleGetItem(tup, 1))
            r = bb.emit_output(op.add(first, second))
        bb.emit_func_output(r)
    out = FuseTIR()(bb.get())
    fused = out["fused"]
    assert fused.attrs["num_outputs"] == 2
    assert len(fused.buffers) == 4  # x, b, then the two results
    for buf in fused.buffers[2:]:
        assert_structural_equal(buf.shape, fused.buffers[0].shape)
    assert not fused.body.block.alloc_buffers  # both results are outputs
    xs, bs = rand(*shape), rand(8)
    with PassContext(opt_level=0):
        got = kiln.build(out)(xs, bs)
    np.testing.assert_allclose(got, (2 * xs + bs) + 2 * xs, rtol=1e-6)


def conv_bias_relu_module():
    x, w, b = (g.Var("x", T((1, 3, 8, 8), "float32")), g.Var("w", T((4, 3, 3, 3), "float32")),
               g.Var("b", T((1, 4, 1, 1), "float32")))
    bb = g.BlockBuilder()
    with bb.function("main", [x, w, b]):
        with bb.dataflow():
            h = bb.emit(op.nn.conv2d(x, w, padding=1))
            h = bb.emit(op.add(h, b))
            h = bb.emit(op.nn.relu(h))
            r = bb.emit_output(op.nn.softmax(h, axis=1))
        bb.emit_func_output(r)
    return LegalizeOps()(bb.get())


def test_op_group_keeps_anchor_names_and_attrs():
    legal = conv_bias_relu_module()
    out = FuseTIR()(FuseOps()(legal))
    assert sorted(out.functions) == ["fused_conv2d_add_relu", "main", "softmax"]
    fused = out["fused_conv2d_add_relu"]
    assert fused.attrs["op_name"] == "nn.conv2d"
    assert fused.attrs["op_pattern"] == int(OpPattern.OUT_EWISE_FUSABLE)
    assert fused.attrs["fused_ops"] == ("nn.conv2d", "add", "relu")
    assert fused.attrs["kiln.anchor_blocks"] == ("conv2d_pad", "conv2d")
    sch = tir.Schedule(fused)
    assert sch.get(sch.get_block("conv2d")).name_hint == "conv2d"
    allocs = fused.body.block.alloc_buffers
    assert [a.scope for a in allocs if a.name != "conv2d_pad"] == ["local", "local"]
    inputs = [rand(1, 3, 8, 8), rand(4, 3, 3, 3), rand(1, 4, 1, 1)]
    with PassContext(opt_level=0):
        want = kiln.build(legal)(*inputs)
        got = kiln.build(out)(*inputs)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_identical_groups_share_one_prim_func():
    x = g.Var("x", T((4, 8), "float32"))
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(op.tanh(bb.emit(op.exp(x))))
            c = bb.emit(op.nn.softmax(a))
            r = bb.emit_output(op.tanh(bb.emit(op.exp(c))))
        bb.emit_func_output(r)
    with PassContext(opt_level=2):
        out = Sequential([LegalizeOps(), FuseOps(), FuseTIR()])(bb.get())
    callees = [b.value.args[0].name for b in out["main"].body.blocks[0].bindings]
    assert callees == ["fused_exp_tanh", "softmax", "fused_exp_tanh"]


def test_primitive_function_with_an_op_call_is_an_error():
    x = g.Var("x", T((4,), "float32"))
    bb = g.BlockBuilder()
    with bb.function("fused", [x], attrs={"Primitive": True}):
        with bb.dataflow():
            r = bb.emit_output(op.exp(x))
        bb.emit_func_output(r)
    y = g.Var("y", T((4,), "float32"))
    with bb.function("main", [y]):
        with bb.dataflow():
            r = bb.emit_output(g.Call(g.GlobalVar("fused"), (y,)))
        bb.emit_func_output(r)
    with pytest.raises(KilnError, match="fused.*not a call_tir"):
        FuseTIR()(bb.get())


def test_no_primitive_functions_is_a_no_op():
    legal = conv_bias_relu_module()
    out = FuseTIR()(legal)
    assert out is not legal and sorted(out.functions) == sorted(legal.functions)


def test_compound_symbolic_dims_become_kernel_variables():
    n = tir.Var("n", "int64")
    x = g.Var("x", T((n, 4), "float32"))
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            r = bb.emit(op.reshape(x, (n * 4,)))
            s = bb.emit(op.nn.softmax(r))
            t = bb.emit(op.add(bb.emit(op.exp(s)), r))
            out = bb.emit_output(op.tanh(bb.emit(op.concat([t, t], axis=0))))
        bb.emit_func_output(out)
    mod = bb.get()
    with PassContext(opt_level=2):
        fused_mod = Sequential([LegalizeOps(), FuseOps(), FuseTIR()])(mod)
    fused = fused_mod["fused_exp_add_concat_tanh"]
    # inputs of shape 4n and the output of shape 8n: plain variables the kernel can bind
    dims = [buf.shape[0] for buf in fused.buffers]
    assert all(isinstance(d, tir.Var) for d in dims)
    assert dims[0] is dims[1] and dims[2] is not dims[0]
    xs = rand(3, 4)
    with PassContext(opt_level=0):
        want = kiln.build(mod)(xs)
    with PassContext(opt_level=2):
        got = kiln.build(mod)(xs)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _rounded_calls(func):
    found = []
    tir.post_order_visit(func.body, lambda n: found.append(n)
                         if isinstance(n, tir.Call) and n.op == "rounded" else None)
    return found


def test_products_between_fused_ops_are_rounded_as_node_by_node():
    # x*x - c, fused: an FMA would compute it exactly; the ops one after the other round x*x
    # first. 1 + 2^-12 squared is 1 + 2^-11 + 2^-24, which rounds (to even) to 1 + 2^-11.
    bb = g.BlockBuilder()
    x = g.Var("x", T((64,), "float32"))
    c = g.Var("c", T((64,), "float32"))
    with bb.function("main", [x, c]):
        with bb.dataflow():
            sq = bb.emit(op.multiply(x, x))
            out = bb.emit_output(op.subtract(sq, c))
        bb.emit_func_output(out)
    mod = bb.get()
    xs = np.full(64, 1 + 2.0 ** -12, np.float32)
    cs = np.full(64, 1 + 2.0 ** -11, np.float32)
    got = kiln.build(mod)(xs, cs)
    np.testing.assert_array_equal(got, xs * xs - cs)  # numpy rounds the product: exactly 0
    assert not got.any()
    # overflow: a product rounded to inf minus inf is NaN, as node by node
    big = np.full(64, 3e38, np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        want = big * big - np.full(64, np.inf, np.float32)
    np.testing.assert_array_equal(kiln.build(mod)(big, np.full(64, np.inf, np.float32)), want)


def test_gemm_like_anchors_keep_fma_in_their_epilogue():
    legal = conv_bias_relu_module()
    fused = FuseTIR()(FuseOps()(legal))["fused_conv2d_add_relu"]
    assert not _rounded_calls(fused)
    chain = FuseTIR()(module((4, 8)))["fused"]  # x*2 + b: element-wise, the product rounded
    assert len(_rounded_calls(chain)) == 1
