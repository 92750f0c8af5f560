"""The NPU partitioning passes (kiln/transform/npu): AnnotateTarget, MergeCompilerRegions,
PartitionGraph and AnnotateMemoryScope, each before/after on small graphs, and the partitioned
module built and run against numpy (cycles through CPU calls never merged)."""

import numpy as np
import pytest

import kiln
from kiln import cli, op
from kiln import graph as g
from kiln.codegen.npu import NPUUnsupportedError, build_npu
from kiln.codegen.npu.executable import CpuStep, NpuStep
from kiln.graph.well_formed import well_formed
from kiln.ir import KilnError
from kiln.ir.module import IRModule
from kiln.schedule.npu import DramTensor
from kiln.schedule.npu.lowering import lowering_rejection
from kiln.schedule.npu.residency import RESIDENCY_KEY
from kiln.target.npu import load_config
from kiln.transform.npu import (
    AnnotateMemoryScope,
    AnnotateTarget,
    MergeCompilerRegions,
    PartitionGraph,
    npu_functions,
    partition_for_npu,
)
from kiln.transform.pass_infra import PassContext

RNG = np.random.default_rng(28)


def _cpu_op(x):
    """``mod(x, 1.5)``, an op without an NPU lowering that PreProcess does not rewrite either
    (the CPU side of heterogeneous graphs; silu, which the tests used, now runs on the NPU)."""
    return op.mod(x, g.const(np.float32(1.5)))


def _cpu_ref(x):
    return np.mod(x, np.float32(1.5))


def _module(body, shapes, dtype="float32"):
    """``main(x0, x1, ...)`` whose bindings ``body(bb, *xs)`` emits (named), returning its
    result variable."""
    bb = g.BlockBuilder()
    xs = [g.Var(f"x{i}" if len(shapes) > 1 else "x", g.TensorStructInfo(s, dtype))
          for i, s in enumerate(shapes)]
    with bb.function("main", xs):
        with bb.dataflow():
            out = body(bb, *xs)
        bb.emit_func_output(out)
    return bb.get()


def _marks(mod):
    return mod["main"].attrs["npu.target"]


def _regions(mod):
    return MergeCompilerRegions()(AnnotateTarget()(mod))["main"].attrs["npu.region"]


def _run(mod, *xs, hw="default"):
    exe = build_npu(mod, kiln.Target("npu", hw=hw))
    return exe, exe(*xs)


# ---------------------------------------------------------------------------------------------
# AnnotateTarget
# ---------------------------------------------------------------------------------------------
def test_annotate_target_asks_the_lowerings():
    w = RNG.standard_normal((8, 4, 3, 3)).astype("float32")

    def body(bb, x):
        a = bb.emit(op.nn.relu(x), "a")
        wr = bb.emit(op.abs(g.const(w)), "wr")  # weights computed at run time
        b = bb.emit(op.nn.conv2d(a, wr, padding=(1, 1)), "b")
        c = bb.emit(op.silu(b), "c")
        d = bb.emit(op.reshape(c, (1, 512)), "d")
        e = bb.emit(op.nn.softmax(d, axis=0), "e")
        return bb.emit_output(op.nn.softmax(e, axis=-1), "f")

    mod = _module(body, [(1, 4, 8, 8)])
    before = mod["main"]
    out = AnnotateTarget("edge")(mod)
    assert "npu.target" not in before.attrs  # passes never modify their input
    marks = _marks(out)
    assert marks["a"] == marks["d"] == marks["f"] == "npu"
    assert marks["b"] == "cpu: nn.conv2d: weights computed at run time"
    assert marks["c"] == "cpu: no NPU lowering"
    assert marks["e"] == "cpu: nn.softmax: only over the last axis, in float32"
    assert out["main"].attrs["npu.hw"] == "edge"
    # the reason is the lowering's own (not a second list of rules)
    call = [b for b in g_bindings(out) if b.var.name_hint == "b"][0].value
    from_lowering = lowering_rejection(load_config("edge"), call, [
        DramTensor(0, (1, 4, 8, 8), "float32"), DramTensor(0, w.shape, "float32")],
        ((1, 8, 8, 8), "float32"))
    assert marks["b"] == f"cpu: {from_lowering}"


def g_bindings(mod):
    return [b for blk in mod["main"].body.blocks for b in blk.bindings]


def test_annotate_target_depends_on_the_description_and_static_shapes():
    # a 4096-wide softmax row fits the default L0 buffers, not the edge ones
    mod = _module(lambda bb, x: bb.emit_output(op.nn.softmax(x), "y"), [(2, 16384)])
    assert _marks(AnnotateTarget("default")(mod))["y"] == "npu"
    assert _marks(AnnotateTarget("edge")(mod))["y"].startswith("cpu: ")
    n = kiln.tir.Var("n", "int64")
    dyn = _module(lambda bb, x: bb.emit_output(op.nn.relu(x), "y"), [(n, 8)])
    assert "static shape" in _marks(AnnotateTarget()(dyn))["y"]


def test_annotate_target_renames_repeated_variables():
    x = g.Var("x", g.TensorStructInfo((4, 4), "float32"))
    v1 = g.DataflowVar("v", g.TensorStructInfo((4, 4), "float32"))
    v2 = g.DataflowVar("v", g.TensorStructInfo((4, 4), "float32"))
    out = g.Var("out", g.TensorStructInfo((4, 4), "float32"))
    bb = g.BlockBuilder()
    blk = g.DataflowBlock((g.VarBinding(v1, bb.normalize(op.nn.relu(x))),
                           g.VarBinding(v2, bb.normalize(op.exp(v1))),
                           g.VarBinding(out, bb.normalize(op.add(v1, v2)))))
    mod = IRModule({"main": g.Function((x,), g.SeqExpr((blk,), out))})
    ann = AnnotateTarget()(mod)
    names = [b.var.name_hint for b in g_bindings(ann)]
    assert names == ["v", "v_1", "out"] and set(_marks(ann)) == set(names)
    xs = RNG.standard_normal((4, 4)).astype("float32")
    _, y = _run(ann, xs)
    r = np.maximum(xs, 0)
    np.testing.assert_allclose(y, r + np.exp(r), rtol=2e-3)


# ---------------------------------------------------------------------------------------------
# MergeCompilerRegions
# ---------------------------------------------------------------------------------------------
def test_merge_keeps_neighbours_together():
    def body(bb, x):
        a = bb.emit(op.nn.relu(x), "a")
        b = bb.emit(op.exp(x), "b")  # independent of a: same region, no CPU call between
        c = bb.emit(_cpu_op(a), "c")
        d = bb.emit(op.add(c, b), "d")
        return bb.emit_output(op.nn.relu(d), "e")

    assert _regions(_module(body, [(4, 8)])) == {"a": 0, "b": 0, "d": 1, "e": 1}


def _cpu_call_between(bb, x):
    """a (NPU) feeds the CPU call c; b (NPU) is independent of c; d (NPU) consumes both."""
    a = bb.emit(op.nn.relu(x), "a")
    c = bb.emit(_cpu_op(a), "c")
    b = bb.emit(op.exp(x), "b")
    return bb.emit_output(op.add(b, c), "d")


def test_merge_never_closes_a_cycle_through_a_cpu_call():
    # putting d in a's region would need the region before c (a feeds c) and after c (c feeds d)
    mod = _module(_cpu_call_between, [(4, 8)])
    assert _regions(mod) == {"a": 0, "b": 0, "d": 1}
    x = RNG.standard_normal((4, 8)).astype("float32")
    exe, y = _run(mod, x)
    np.testing.assert_allclose(y, np.exp(x) + _cpu_ref(np.maximum(x, 0)), rtol=2e-3, atol=1e-5)
    assert [type(s) for s in exe.steps] == [NpuStep, CpuStep, NpuStep]


def test_merge_follows_dependences_through_other_regions():
    # region 1 (b, z) depends on region 0 through the CPU call c; w (CPU) depends on region 1;
    # v reads a (region 0) and w: joining region 0 would close 0 -> c -> 1 -> w -> 0, joining
    # region 1 would close 1 -> w -> 1
    def body(bb, x):
        a = bb.emit(op.nn.relu(x), "a")
        c = bb.emit(_cpu_op(a), "c")
        b = bb.emit(op.exp(c), "b")
        z = bb.emit(op.negative(x), "z")
        w = bb.emit(_cpu_op(z), "w")
        v = bb.emit(op.add(a, w), "v")
        return bb.emit_output(op.multiply(b, v), "y")

    mod = _module(body, [(4, 8)])
    regions = _regions(mod)
    assert regions["a"] == 0 and regions["b"] == regions["z"] == 1 and regions["v"] == 2
    x = RNG.standard_normal((4, 8)).astype("float32")
    exe, y = _run(mod, x)
    ref = np.exp(_cpu_ref(np.maximum(x, 0))) * (np.maximum(x, 0) + _cpu_ref(-x))
    np.testing.assert_allclose(y, ref, rtol=2e-3, atol=1e-5)
    assert [s.region for s in exe.steps if isinstance(s, NpuStep)] == \
        ["npu_region0", "npu_region1", "npu_region2"]


def test_merge_needs_annotations():
    with pytest.raises(KilnError, match="run AnnotateTarget first"):
        MergeCompilerRegions()(_module(lambda bb, x: bb.emit_output(op.exp(x)), [(2, 2)]))
    with pytest.raises(KilnError, match="MergeCompilerRegions first"):
        PartitionGraph()(AnnotateTarget()(_module(lambda bb, x: bb.emit_output(op.exp(x)),
                                                  [(2, 2)])))


# ---------------------------------------------------------------------------------------------
# PartitionGraph
# ---------------------------------------------------------------------------------------------
def test_partition_outlines_regions_and_orders_main():
    mod = _module(_cpu_call_between, [(4, 8)])
    part = PartitionGraph()(MergeCompilerRegions()(AnnotateTarget()(mod)))
    assert npu_functions(part) == ["npu_region0", "npu_region1"]
    r0, r1 = part["npu_region0"], part["npu_region1"]
    assert r0.attrs["Codegen"] == "npu" and r0.attrs["global_symbol"] == "npu_region0"
    assert [p.name_hint for p in r0.params] == ["x"]
    assert isinstance(r0.body.body, g.Tuple) and len(r0.body.body.fields) == 2  # a and b
    assert sorted(p.name_hint for p in r1.params) == ["b", "c"]
    main = part["main"]
    values = [b.value for b in g_bindings(part)]
    callee = [getattr(v.op, "name", None) if isinstance(v, g.Call) else type(v).__name__
              for v in values]
    # region 0 first (a and b), its tuple unpacked, then the CPU call, then region 1
    assert callee == ["npu_region0", "TupleGetItem", "TupleGetItem", "mod", "npu_region1"]
    assert main.attrs["npu.target"] == {"c": "cpu: no NPU lowering"}
    assert "npu.region" not in main.attrs
    well_formed(part)  # raises on a problem


def test_partition_leaves_lone_views_in_main():
    def body(bb, x):
        t = bb.emit(_cpu_op(x), "t")
        r = bb.emit(op.reshape(t, (8, 4)), "r")
        return bb.emit_output(_cpu_op(r), "y")

    part = partition_for_npu()(_module(body, [(4, 8)]))
    assert npu_functions(part) == []
    assert [b.var.name_hint for b in g_bindings(part)] == ["t", "r", "y"]
    x = RNG.standard_normal((4, 8)).astype("float32")
    _, y = _run(part, x)
    np.testing.assert_allclose(y, _cpu_ref(_cpu_ref(x).reshape(8, 4)), rtol=1e-5)


def test_strict_names_each_cpu_op_with_the_recorded_reason():
    mod = _module(lambda bb, x: bb.emit_output(op.nn.softmax(_cpu_op(x), axis=0), "y"),
                  [(4, 8)])
    with pytest.raises(NPUUnsupportedError, match=r"mod \(.*\): no NPU lowering; "
                       r"nn\.softmax \(y\): nn\.softmax: only over the last axis"):
        build_npu(mod, kiln.Target("npu"), strict=True)


def test_build_refuses_a_module_partitioned_for_another_description():
    mod = partition_for_npu("edge")(_module(lambda bb, x: bb.emit_output(op.exp(x)), [(2, 2)]))
    with pytest.raises(KilnError, match="partitioned for 'edge'"):
        build_npu(mod, kiln.Target("npu", hw="default"))


# ---------------------------------------------------------------------------------------------
# AnnotateMemoryScope
# ---------------------------------------------------------------------------------------------
def test_memory_scope_follows_the_dma_traffic():
    w = RNG.standard_normal((8, 4, 3, 3)).astype("float32")

    def body(bb, x):
        a = bb.emit(op.nn.relu(x), "a")
        c = bb.emit(op.nn.conv2d(a, g.const(w), padding=(1, 1)), "c")
        d = bb.emit(op.add(c, g.const(np.float32(1))), "d")
        return bb.emit_output(op.nn.relu(d), "e")

    for hw in ("default", "edge"):
        mod = PartitionGraph()(MergeCompilerRegions()(AnnotateTarget(hw)(
            _module(body, [(1, 4, 8, 8)]))))
        assert "npu.memory_scope" not in mod["npu_region0"].attrs
        with PassContext(config={RESIDENCY_KEY: False}):
            scopes = AnnotateMemoryScope(hw)(mod)["npu_region0"].attrs["npu.memory_scope"]
        assert scopes == {
            "x": "dram -> l0.input",  # read by relu's vector kernel
            "a": "l0.acc -> dram -> l1, l0.input",  # conv rows staged in L1, gathered to L0
            "c": "l0.acc (fused, never in DRAM)",  # add+relu run on the conv's tiles
            "d": "l0.acc (fused, never in DRAM)",  # add and relu are one kernel
            "e": "l0.acc -> dram",
        }
        with PassContext(config={"npu.fuse_epilogue": False, RESIDENCY_KEY: False}):
            scopes = AnnotateMemoryScope(hw)(mod)["npu_region0"].attrs["npu.memory_scope"]
        assert scopes["c"] == "l0.acc -> dram -> l0.input"  # read by add+relu's kernel
        assert scopes["d"] == "l0.acc (fused, never in DRAM)"
        # as the build places them: the relu's result stays in L1 for the convolution
        scopes = AnnotateMemoryScope(hw)(mod)["npu_region0"].attrs["npu.memory_scope"]
        on_chip = "l1 (kept on chip, never in DRAM)"
        assert scopes == {
            "x": "dram -> l0.input", "a": f"l0.acc -> {on_chip} -> l1, l0.input",
            "c": "l0.acc (fused, never in DRAM)", "d": "l0.acc (fused, never in DRAM)",
            "e": "l0.acc -> dram",  # the region's result: read outside, so in DRAM
        }


def test_kiln_show_prints_the_partitioned_module(capsys):
    assert cli.main(["show", "demo:small_cnn", "--target", "npu -hw=edge", "--stage",
                     "partition"]) == 0
    out = capsys.readouterr().out
    assert '"Codegen": "npu"' in out and '"npu.memory_scope"' in out
    assert '"l0.acc (fused, never in DRAM)"' in out  # batch norm's multiply, fused
    assert cli.main(["show", "demo:mlp", "--stage", "partition"]) != 0
    assert "is for --target npu" in capsys.readouterr().err
