"""The opt-level build pipeline: fusion at opt >= 2, custom pipelines, scheduling fused kernels."""

import numpy as np
import pytest

import kiln
from kiln import graph as g
from kiln import op, tir
from kiln.build import default_pipeline, schedule_prim_func
from kiln.ir import KilnError, ScheduleError
from kiln.op.registry import get_op_def
from kiln.target import Target
from kiln.testing import models
from kiln.transform import FuseOps, FuseTIR, LegalizeOps, PassContext, Sequential
from kiln.transform.fuse_ops import MAX_DEPTH_KEY

T = g.TensorStructInfo


def names(seq):
    return [p.info.name for p in seq.passes]


def test_default_pipeline_by_opt_level():
    assert names(default_pipeline(0)) == ["LegalizeOps"]
    level1 = names(default_pipeline(1))
    assert level1[-1] == "LegalizeOps" and "FuseOps" not in level1
    level2 = names(default_pipeline(2))
    assert level2[-3:] == ["AnnotateTIROpPattern", "FuseOps", "FuseTIR"]
    with PassContext(opt_level=3):
        assert names(default_pipeline()) == names(default_pipeline(3))


@pytest.fixture(scope="module")
def resnet():
    model = models.resnet_block_cnn(batch=2, channels=16, size=12)
    exes = {}
    for level in (0, 2, 3):
        with PassContext(opt_level=level):
            exes[level] = kiln.build(model.mod)
    with PassContext(opt_level=2, disabled_pass=["AlterOpLayout"]):
        exes["nchw"] = kiln.build(model.mod)
    return model, exes


def test_resnet_fused_build_has_fewer_kernels_and_same_numerics(resnet):
    model, exes = resnet
    # opt 0: stem conv-bn-relu (3) + 2 blocks x (conv-bn-relu, conv-bn-add-relu) (14)
    #        + pool, reshape, dense, bias add (4)
    assert exes[0].num_kernels == 21
    # without layout changes: each conv with its epilogue, pool, reshape, dense+bias
    assert exes["nchw"].num_kernels == 8
    # opt 2 (and 3): AlterOpLayout runs the convs in NCHW{lanes}c (16 channels: AVX2 and
    # AVX-512 alike): one more kernel transforms the
    # input (the weights are transformed at compile time)
    assert exes[2].num_kernels == exes[3].num_kernels == 9
    out0 = exes[0](*model.inputs)
    out3 = exes[3](*model.inputs)
    np.testing.assert_allclose(exes[2](*model.inputs), out0, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(exes["nchw"](*model.inputs), out0, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out3, out0, rtol=1e-5, atol=1e-5)
    ref = model.reference(*model.inputs)
    np.testing.assert_allclose(out3, ref, rtol=1e-5, atol=1e-5 * float(np.abs(ref).max()))


def test_mlp_numerics_at_every_level():
    model = models.mlp(batch=4, sizes=(32, 48, 10))
    outs = {}
    for level in (0, 1, 2):
        with PassContext(opt_level=level):
            exe = kiln.build(model.mod)
        outs[level] = (exe.num_kernels, exe(*model.inputs))
    assert outs[2][0] < outs[0][0]
    for level in (1, 2):
        np.testing.assert_allclose(outs[level][1], outs[0][1], rtol=1e-5, atol=1e-7)


def chain_module():
    x = g.Var("x", T((4, 8), "float32"))
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            h = x
            for name in ("exp", "negative", "tanh", "abs"):
                h = bb.emit(getattr(op, name)(h))
            r = bb.emit_output(op.sigmoid(h))
        bb.emit_func_output(r)
    return bb.get()


def test_custom_pipeline_and_completion_of_fusion():
    mod = chain_module()
    xs = np.random.default_rng(1).standard_normal((4, 8)).astype("float32")
    with PassContext(opt_level=0):
        plain = kiln.build(mod)
    # passes in a Sequential are still gated by the context's opt level (FuseOps is level 2)
    with PassContext(opt_level=2):
        fused = kiln.build(mod, pipeline=Sequential([LegalizeOps(), FuseOps(), FuseTIR()]))
        # a pipeline that stops after FuseOps: the build turns the groups into kernels
        half = kiln.build(mod, pipeline=Sequential([LegalizeOps(), FuseOps()]))
        # a pipeline without LegalizeOps: the build legalizes
        empty = kiln.build(mod, pipeline=Sequential([]))
    assert (plain.num_kernels, fused.num_kernels, half.num_kernels, empty.num_kernels) == (
        5, 1, 1, 5)
    want = plain(xs)
    for exe in (fused, half, empty):
        np.testing.assert_allclose(exe(xs), want, rtol=1e-6)
    with pytest.raises(KilnError, match="pipeline must be a Pass"):
        kiln.build(mod, pipeline=[LegalizeOps()])


def test_pass_context_controls_fusion():
    mod = chain_module()
    with PassContext(opt_level=3, disabled_pass=["FuseOps"]):
        assert kiln.build(mod).num_kernels == 5
    with PassContext(opt_level=3, config={MAX_DEPTH_KEY: 2}):
        assert kiln.build(mod).num_kernels == 3


def fused_conv_func():
    x, w, b = (g.Var("x", T((1, 4, 8, 8), "float32")), g.Var("w", T((8, 4, 3, 3), "float32")),
               g.Var("b", T((1, 8, 1, 1), "float32")))
    bb = g.BlockBuilder()
    with bb.function("main", [x, w, b]):
        with bb.dataflow():
            h = bb.emit(op.add(bb.emit(op.nn.conv2d(x, w, padding=1)), b))
            r = bb.emit_output(op.nn.relu(h))
        bb.emit_func_output(r)
    with PassContext(opt_level=2, disabled_pass=["AlterOpLayout"]):  # the NCHW conv2d
        mod = default_pipeline()(bb.get())
    return bb.get(), mod["fused_conv2d_add_relu"]


def _loops_above(func, block_name):
    """Loop variables enclosing block ``block_name`` (outermost first)."""
    found = []

    def walk(stmt, loops):
        if isinstance(stmt, tir.For):
            walk(stmt.body, loops + [stmt])
        elif isinstance(stmt, tir.SeqStmt):
            for s in stmt.seq:
                walk(s, loops)
        elif isinstance(stmt, tir.BlockRealize):
            if stmt.block.name_hint == block_name:
                found.append(loops)
            walk(stmt.block.body, loops)
            if stmt.block.init is not None:
                walk(stmt.block.init, loops)

    walk(func.body, [])
    return found[0]


def test_fused_conv_schedule_computes_the_epilogue_in_the_anchor_loop():
    _, func = fused_conv_func()
    target = Target.create("c")
    scheduled = schedule_prim_func(func, target)
    assert scheduled.attrs["scheduled"]
    conv_loops = _loops_above(scheduled, "conv2d")
    epilogue = [b for b in ("relu", "add") if _has_block(scheduled, b)]
    assert epilogue == ["relu"]  # the bias add was inlined into the relu
    relu_loops = _loops_above(scheduled, "relu")
    assert relu_loops[0] is conv_loops[0]
    assert relu_loops[0].kind == tir.ForKind.PARALLEL or target.num_threads == 1


def _has_block(func, name):
    names = []
    tir.post_order_visit(func.body, lambda n: names.append(n.name_hint)
                         if isinstance(n, tir.Block) else None)
    return name in names


def test_failing_anchor_schedule_falls_back_to_the_generic_one(monkeypatch):
    graph, func = fused_conv_func()
    rng = np.random.default_rng(2)
    inputs = [rng.standard_normal(p.struct_info.static_shape()).astype("float32")
              for p in graph["main"].params]
    with PassContext(opt_level=0):
        want = kiln.build(graph)(*inputs)

    def broken(sch, target):
        raise ScheduleError("not today")

    monkeypatch.setitem(get_op_def("nn.conv2d").schedules, "c", broken)
    scheduled = schedule_prim_func(func, Target.create("c"))
    assert scheduled.attrs["scheduled"]
    with PassContext(opt_level=2):
        got = kiln.build(graph)(*inputs)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
