"""The NPU's lowering of last resort (kiln.schedule.npu.tir_nests): injective ops with no
lowering of their own built for the NPU through their TIR and the loop pre-passes, compared
with numpy, checked to run on the NPU (no CPU step) and on which units: fills on the vector
unit and copies by the DMA engines alone (one element operation per result element),
comparisons and selects as vcmp/vsel, and what no vector form matches on the scalar unit with
its reason."""

import numpy as np
import pytest

import kiln
from kiln import cli, op
from kiln import graph as g
from kiln.schedule.npu import LoweringContext
from kiln.schedule.npu.nest_analysis import COPY_TILING, unit_shares
from kiln.schedule.npu.tir_nests import leaf_nests, op_prim_func, select_nest
from kiln.target.npu import load_config
from kiln.testing.op_testing import graph_module
from kiln.tir.transform.npu_prepare import npu_prepare

HW = ["default", "edge"]
RNG = np.random.default_rng(12)


def _build(fn, shapes, hw, dtype="float32", **kw):
    return kiln.build(graph_module(fn, shapes, dtype), target=kiln.Target("npu", hw=hw), **kw)


def _vector_only(exe, n_ops):
    """No CPU step, no scalar kernel, ``n_ops`` element operations: on the vector unit, or a
    copy's, moved by the DMA engines alone."""
    assert exe.cpu_ops == []
    shares = unit_shares(exe)
    assert shares.fallbacks == [] and shares.scalar_ops == 0
    assert shares.vector_ops + shares.dma_ops == n_ops
    assert all(k.tiling.startswith(("block ", COPY_TILING)) for k in exe.kernels), \
        exe.describe()


@pytest.mark.parametrize("hw", HW)
def test_constant_pad_is_fills_and_a_copy(hw):
    """The window select partitioned: the border as vfill kernels, the interior one strided
    copy; each result element written once."""
    pw = ((0, 0), (1, 2), (3, 1))
    x = RNG.standard_normal((2, 5, 37)).astype("float32")
    exe = _build(lambda v: op.pad(v, pw, pad_value=-1.5), [x.shape], hw)
    ref = np.pad(x, pw, constant_values=-1.5)
    np.testing.assert_array_equal(exe(x), ref)
    _vector_only(exe, ref.size)
    assert exe.last_cycles > 0 and {k.op for k in exe.kernels} == {"pad"}


@pytest.mark.parametrize("hw", HW)
def test_edge_pad_is_copies(hw):
    """The clamps branched and partitioned: every piece a copy, the corners and edges reading
    one element or row repeatedly (DMA stride 0)."""
    pw = ((2, 1), (0, 3))
    x = RNG.standard_normal((6, 33)).astype("float32")
    exe = _build(lambda v: op.pad(v, pw, mode="edge"), [x.shape], hw)
    ref = np.pad(x, pw, mode="edge")
    np.testing.assert_array_equal(exe(x), ref)
    _vector_only(exe, ref.size)


@pytest.mark.parametrize("hw", HW)
def test_where_of_a_comparison(hw):
    """greater as a vcmp (its bool result the 0/1 mask bytes), where as a vsel: two kernels,
    nothing on the CPU; a constant branch of the select is an immediate."""
    x, y = (RNG.standard_normal((3, 41)).astype("float32") for _ in range(2))
    exe = _build(lambda u, v: op.where(op.greater(u, v), u, v), [x.shape, y.shape], hw)
    np.testing.assert_array_equal(exe(x, y), np.where(x > y, x, y))
    _vector_only(exe, 2 * x.size)
    zero = g.const(np.float32(0))
    exe = _build(lambda u, v: op.where(op.less_equal(u, zero), zero, v), [x.shape, y.shape], hw)
    np.testing.assert_array_equal(exe(x, y), np.where(x <= 0, np.float32(0), y))
    _vector_only(exe, 2 * x.size)


def test_comparison_result_leaves_the_npu_as_bool():
    x, y = (RNG.integers(-3, 3, (4, 9)).astype("int32") for _ in range(2))
    exe = _build(lambda u, v: op.not_equal(u, v), [x.shape, y.shape], "edge", dtype="int32")
    got = exe(x, y)
    assert got.dtype == np.bool_
    np.testing.assert_array_equal(got, x != y)
    _vector_only(exe, x.size)


def test_logical_ops_on_the_bool_bytes():
    """and / or / not of bool tensors: vmin / vmax of the 0/1 bytes and a vcmp with 0."""
    a, b = (RNG.random((5, 13)) > 0.5 for _ in range(2))
    exe = _build(lambda u, v: op.logical_not(op.logical_or(op.logical_and(u, v), u)),
                 [a.shape, b.shape], "edge", dtype="bool")
    np.testing.assert_array_equal(exe(a, b), ~((a & b) | a))
    _vector_only(exe, 3 * a.size)


@pytest.mark.parametrize("hw", HW)
def test_broadcast_to_is_one_strided_copy(hw):
    x = RNG.standard_normal((7, 1)).astype("float32")
    exe = _build(lambda v: op.broadcast_to(v, (3, 7, 45)), [x.shape], hw)
    np.testing.assert_array_equal(exe(x), np.broadcast_to(x, (3, 7, 45)))
    _vector_only(exe, 3 * 7 * 45)
    assert len(exe.kernels) == 1


def test_tile_as_broadcast_and_reshape():
    """numpy's tile of a (3, 4) tensor by (2, 3): broadcast_to (2, 3, 3, 4) of its (1, 3, 1, 4)
    view, reshaped -- the graph the frontends build; the broadcast a strided copy, the
    reshapes views."""
    x = RNG.standard_normal((3, 4)).astype("float32")

    def tile(v):
        b = op.broadcast_to(op.reshape(v, (1, 3, 1, 4)), (2, 3, 3, 4))
        return op.reshape(b, (6, 12))

    exe = _build(tile, [x.shape], "default")
    np.testing.assert_array_equal(exe(x), np.tile(x, (2, 3)))
    _vector_only(exe, 72)


@pytest.mark.parametrize("hw", HW)
def test_reflect_pad_is_copies(hw):
    """A reflect pad's folded index (a floor-modulo of the loop, then a select) branched by
    window and partitioned: every piece a copy, the borders read backwards (negative DMA
    strides)."""
    pw = ((0, 0), (2, 1), (3, 2))
    x = RNG.standard_normal((2, 6, 29)).astype("float32")
    exe = _build(lambda v: op.pad(v, pw, mode="reflect"), [x.shape], hw)
    ref = np.pad(x, pw, mode="reflect")
    np.testing.assert_array_equal(exe(x), ref)
    _vector_only(exe, ref.size)


def test_gather_elements_runs_on_the_scalar_unit():
    """A run-time index (a load inside the load's index): no DMA form; the scalar unit loads
    the index, computes the address and copies the element."""
    data = RNG.standard_normal((4, 6)).astype("float32")
    idx = RNG.integers(-6, 6, (4, 3)).astype("int64")
    mod = graph_module(lambda d, i: op.gather_elements(d, i, axis=1), [data.shape, idx.shape],
                       ["float32", "int64"])
    exe = kiln.build(mod, target=kiln.Target("npu", hw="edge"))
    np.testing.assert_array_equal(exe(data, idx),
                                  np.take_along_axis(data, np.where(idx < 0, idx + 6, idx), 1))
    assert exe.cpu_ops == []
    shares = unit_shares(exe)
    assert shares.scalar_ops == idx.size
    assert [r for _, r in shares.fallbacks] == \
        ["gather_elements: an index that is no affine function of the loops"]


def test_nests_of_a_constant_pad():
    """The prepared PrimFunc of a pad of one axis, (1, 2), is three nests: fill, copy, fill;
    each selected onto the vector unit."""
    cfg = load_config("edge")
    ctx = LoweringContext(cfg)
    x, out = ctx.alloc((4, 8), "float32"), ctx.alloc((4, 11), "float32")
    call = op.pad(g.Var("x", g.TensorStructInfo((4, 8), "float32")), ((0, 0), (1, 2)))
    func, where = op_prim_func(call, [x], out)
    nests = leaf_nests(npu_prepare(func))
    kinds = []
    for nest in nests:
        fn, why = select_nest(ctx, nest, where)
        assert fn is not None and why == ""
        kinds.append(type(nest.store.value).__name__)
    assert sorted(kinds) == ["BufferLoad", "FloatImm", "FloatImm"]
    assert sum(n.elements for n in nests) == 4 * 11


def test_a_copy_the_vector_unit_cannot_move_runs_on_the_scalar_unit():
    """int64 is no vector dtype: a pad of int64 is scalar-unit loops (the copy's and the
    fill's nests), each listed with the vector unit's reason, exact."""
    x = RNG.integers(-2 ** 40, 2 ** 40, (3, 5), dtype=np.int64)
    exe = _build(lambda v: op.pad(v, ((1, 0), (0, 2)), pad_value=7), [x.shape], "edge",
                 dtype="int64")
    np.testing.assert_array_equal(exe(x), np.pad(x, ((1, 0), (0, 2)), constant_values=7))
    shares = unit_shares(exe)
    assert exe.cpu_ops == [] and shares.vector_ops == 0 and shares.scalar_ops == 4 * 7
    assert {r for _, r in shares.fallbacks} == {"pad: int64 is no vector dtype",
                                                "pad: the vector unit does not move int64"}


def test_show_npu_lists_the_fallback(tmp_path, capsys):
    """``kiln show --stage npu`` of an ONNX model with a GatherElements: its scalar-unit
    kernel and the reason."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    idx = numpy_helper.from_array(RNG.integers(0, 6, (3, 4)).astype(np.int64), "idx")
    graph = helper.make_graph(
        [helper.make_node("GatherElements", ["x", "idx"], ["y"], name="ge", axis=1)],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])], [idx])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    assert cli.main(["show", str(path), "--target", "npu -hw=edge", "--stage", "npu"]) == 0
    out = capsys.readouterr().out
    fallback = [line for line in out.splitlines() if line.startswith("  scalar fallback ")]
    assert len(fallback) == 1 and fallback[0].strip().endswith(
        ":gather_elements: gather_elements: an index that is no affine function of the loops")
    assert "(scalar 12, CPU 0 of " in out
