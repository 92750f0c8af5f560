"""ONNX models whose shapes are computed at run time: compiled once, run with several values.

Each model's shape-determining input (Reshape's shape, Expand's shape, Slice's starts, ...) is a
graph input; the same compiled model must give onnxruntime's answer for every value.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from kiln.frontend.onnx.backend import prepare
from kiln.frontend.onnx.importer import from_onnx
from kiln.ir.errors import KilnError

RNG = np.random.default_rng(3)
F, I64 = TensorProto.FLOAT, TensorProto.INT64


def _vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def _model(nodes, inputs, out_elem=F, inits=(), opset=18):
    graph = helper.make_graph(nodes, "g", inputs, [_vi("y", out_elem, None)],
                              initializer=list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _check_runs(model, feeds_list, atol=0.0):
    """One kiln build; every feed set must match onnxruntime (shape, dtype and values; ``atol``
    for models that sum products, whose results near zero carry the rounding of O(1) terms)."""
    rep = prepare(model)
    exe = rep.exe
    sess = ort.InferenceSession(model.SerializeToString())
    names = [i.name for i in sess.get_inputs()]
    for feeds in feeds_list:
        (want,) = sess.run(None, dict(zip(names, feeds)))
        (got,) = rep.run(list(feeds))
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=atol)
    assert rep.exe is exe  # never recompiled
    return rep


def test_reshape_shape_is_a_graph_input():
    m = _model([helper.make_node("Reshape", ["x", "s"], ["y"], name="r")],
               [_vi("x", F, [2, 3, 4]), _vi("s", I64, [2])])
    x = RNG.standard_normal((2, 3, 4)).astype("float32")
    rep = _check_runs(m, [(x, np.array([6, 4])), (x, np.array([-1, 2])), (x, np.array([0, 12]))])
    with pytest.raises(Exception, match="cannot reshape"):
        rep.run([x, np.array([5, 5])])


def test_reshape_shape_computed_from_inputs():
    """The shape is arithmetic on a graph input (not a graph input itself)."""
    nodes = [helper.make_node("Mul", ["s", "two"], ["s2"]),
             helper.make_node("Reshape", ["x", "s2"], ["y"])]
    two = onnx.numpy_helper.from_array(np.array([2, 1], np.int64), "two")
    m = _model(nodes, [_vi("x", F, [4, 6]), _vi("s", I64, [2])], inits=[two])
    x = RNG.standard_normal((4, 6)).astype("float32")
    _check_runs(m, [(x, np.array([1, 12])), (x, np.array([6, -1]))])


def test_expand_with_runtime_shape():
    m = _model([helper.make_node("Expand", ["x", "s"], ["y"])],
               [_vi("x", F, [3, 1]), _vi("s", I64, [3])])
    x = RNG.standard_normal((3, 1)).astype("float32")
    _check_runs(m, [(x, np.array([2, 1, 5])), (x, np.array([1, 3, 1])), (x, np.array([1, 1, 1]))])


def test_slice_with_runtime_starts_ends_steps():
    axes = onnx.numpy_helper.from_array(np.array([0, 2], np.int64), "axes")
    m = _model([helper.make_node("Slice", ["x", "st", "en", "axes", "sp"], ["y"])],
               [_vi("x", F, [5, 3, 6]), _vi("st", I64, [2]), _vi("en", I64, [2]),
                _vi("sp", I64, [2])], inits=[axes])
    x = RNG.standard_normal((5, 3, 6)).astype("float32")
    feeds = [([1, 0], [4, 6], [1, 2]), ([-1, 5], [-10, -100], [-2, -1]), ([9, 2], [10, 3], [1, 1])]
    _check_runs(m, [(x, *(np.array(v) for v in f)) for f in feeds])


def test_range_with_runtime_bounds():
    m = _model([helper.make_node("Range", ["a", "b", "c"], ["y"])],
               [_vi("a", F, []), _vi("b", F, []), _vi("c", F, [])])
    def f32(v):
        return np.array(v, np.float32)

    _check_runs(m, [(f32(1), f32(5.5), f32(0.5)), (f32(3), f32(-2), f32(-1)),
                    (f32(0), f32(0), f32(1))])


def test_tile_constant_of_shape_and_pad_with_runtime_values():
    x = RNG.standard_normal((2, 3)).astype("float32")
    tile = _model([helper.make_node("Tile", ["x", "r"], ["y"])],
                  [_vi("x", F, [2, 3]), _vi("r", I64, [2])])
    _check_runs(tile, [(x, np.array([2, 1])), (x, np.array([1, 3]))])
    fill = helper.make_tensor("v", TensorProto.INT32, [1], [7])
    cos = _model([helper.make_node("ConstantOfShape", ["s"], ["y"], value=fill)],
                 [_vi("s", I64, [2])], out_elem=TensorProto.INT32)
    _check_runs(cos, [(np.array([2, 3]),), (np.array([0, 4]),)])
    pad = _model([helper.make_node("Pad", ["x", "p"], ["y"], mode="edge")],
                 [_vi("x", F, [2, 3]), _vi("p", I64, [4])])
    _check_runs(pad, [(x, np.array([1, 0, 0, 2])), (x, np.array([0, 2, 3, 0]))])


@pytest.mark.parametrize("mode", ["edge", "reflect", "wrap"])
def test_pad_copying_from_an_axis_found_empty_at_run_time_is_refused(mode):
    """Edge/reflect/wrap padding copies values of the axis: one a run-time slice left empty
    has none (onnxruntime refuses it; kiln read out of bounds, fuzz seed 3032582). Run-time
    pads (dynamic_pad) and constant pads over a run-time dim (pad) both check it."""
    x = RNG.standard_normal((8, 8)).astype("float32")
    slice_ = helper.make_node("Slice", ["x", "st", "en"], ["s"])
    # (constant pads in wrap mode need static dims: refused at import)
    for pads_input in (False, True) if mode != "wrap" else (True,):
        inits = [] if pads_input else [helper.make_tensor("p", I64, [4], [0, 1, 2, 2])]
        inputs = [_vi("x", F, [8, 8]), _vi("st", I64, [2]), _vi("en", I64, [2])]
        if pads_input:
            inputs.append(_vi("p", I64, [4]))
        m = _model([slice_, helper.make_node("Pad", ["s", "p"], ["y"], mode=mode, name="pad")],
                   inputs, inits=inits)
        rt = prepare(m)
        feeds = [x, np.array([2, 3]), np.array([-6, 2])]
        if pads_input:
            feeds.append(np.array([0, 1, 2, 2]))
        with pytest.raises(KilnError, match="pad.*empty"):
            rt.run(feeds)
        # a non-empty slice pads as onnxruntime does
        ok = [x, np.array([1, 2]), np.array([5, 7]), *([np.array([0, 1, 2, 2])] * pads_input)]
        want = ort.InferenceSession(m.SerializeToString()).run(
            None, dict(zip([i.name for i in m.graph.input], ok)))[0]
        np.testing.assert_array_equal(rt.run(ok)[0], want)


def test_nonzero_and_compress():
    m = _model([helper.make_node("NonZero", ["x"], ["y"])], [_vi("x", F, [3, 4])],
               out_elem=I64)
    x = RNG.standard_normal((3, 4)).astype("float32")
    x[x < 0.2] = 0
    _check_runs(m, [(x,), (np.zeros((3, 4), np.float32),), (np.ones((3, 4), np.float32),)])
    c = _model([helper.make_node("Compress", ["x", "c"], ["y"], axis=1)],
               [_vi("x", F, [3, 4]), _vi("c", TensorProto.BOOL, [3])])
    _check_runs(c, [(x, np.array([True, False, True])), (x, np.array([False] * 3))])


def test_rank_setting_inputs_need_a_static_length():
    """Squeeze's axes may be a run-time tensor, but their count sets the rank."""
    m = _model([helper.make_node("Squeeze", ["x", "axes"], ["y"], name="sq")],
               [_vi("x", F, [1, 3, 1]), _vi("axes", I64, ["k"])])
    with pytest.raises(KilnError, match="sq.*static length"):
        from_onnx(m)
    ok = _model([helper.make_node("Squeeze", ["x", "axes"], ["y"])],
                [_vi("x", F, [1, 3, 1]), _vi("axes", I64, [1])])
    x = RNG.standard_normal((1, 3, 1)).astype("float32")
    _check_runs(ok, [(x, np.array([0])), (x, np.array([-1]))])


def test_shape_of_a_symbolic_batch_feeds_reshape():
    """Shape -> Gather -> Concat -> Reshape on a dynamic batch: one build serves every batch."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
             helper.make_node("Unsqueeze", ["n", "ax"], ["n1"]),
             helper.make_node("Concat", ["n1", "rest"], ["shp"], axis=0),
             helper.make_node("Reshape", ["x", "shp"], ["r"]),
             helper.make_node("Size", ["x"], ["sz"]),
             helper.make_node("Shape", ["x"], ["tail"], start=1)]
    inits = [onnx.numpy_helper.from_array(np.array(v, np.int64), n)
             for n, v in (("zero", 0), ("ax", [0]), ("rest", [-1]))]
    graph = helper.make_graph(nodes, "g", [_vi("x", F, ["n", 3, 4])],
                              [_vi("r", F, None), _vi("sz", I64, None), _vi("tail", I64, None)],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    rep = prepare(model)
    sess = ort.InferenceSession(model.SerializeToString())
    for n in (1, 5):
        x = RNG.standard_normal((n, 3, 4)).astype("float32")
        for got, want in zip(rep.run([x]), sess.run(None, {"x": x})):
            assert got.shape == want.shape
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("axis,is_sorted", [(None, 1), (None, 0), (1, 1), (0, 0)])
def test_unique_matches_onnxruntime(axis, is_sorted):
    kw = {} if axis is None else {"axis": axis}
    node = helper.make_node("Unique", ["x"], ["y", "idx", "inv", "cnt"], sorted=is_sorted, **kw)
    graph = helper.make_graph([node], "g", [_vi("x", F, [4, 3])],
                              [_vi("y", F, None)] + [_vi(n, I64, None)
                                                     for n in ("idx", "inv", "cnt")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    rep = prepare(model)
    sess = ort.InferenceSession(model.SerializeToString())
    for x in (RNG.integers(0, 3, (4, 3)), np.repeat(RNG.integers(0, 2, (2, 3)), 2, axis=0)):
        x = x.astype("float32")
        for got, want in zip(rep.run([x]), sess.run(None, {"x": x})):
            np.testing.assert_array_equal(got, want)


def test_static_entries_of_a_partly_symbolic_shape_fold():
    """A model exported with a dynamic batch reads its static sequence length through
    Shape -> Gather -> Range (position ids): that length folds to a constant at import, so the
    positions keep a static shape; the batch entry stays a run-time value."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "one"], ["len"]),
             helper.make_node("Range", ["zero", "len", "step"], ["pos"]),
             helper.make_node("Cast", ["pos"], ["posf"], to=F),
             helper.make_node("Add", ["x", "posf"], ["y"])]
    inits = [helper.make_tensor("one", I64, [], [1]), helper.make_tensor("zero", I64, [], [0]),
             helper.make_tensor("step", I64, [], [1])]
    m = _model(nodes, [_vi("x", F, ["batch", 5])], inits=inits)
    mod, _ = from_onnx(m)
    out = mod["main"].ret_struct_info
    assert out.shape is not None and [str(d) for d in out.shape][1] == "5"
    _check_runs(m, [(RNG.standard_normal((b, 5)).astype("float32"),) for b in (1, 3)])


def test_reshape_target_built_from_a_dynamic_batch_keeps_its_shape():
    """The reshape targets of an attention block exported with a dynamic batch: Shape ->
    Gather -> Unsqueeze -> Concat with constants -> Reshape. Their entries are tracked at import,
    so the reshapes keep symbolic shapes (batch, 4, 2, 3) and the whole graph its output shape
    (a run-time reshape would leave fresh dims that the following matmul cannot relate)."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["b"]),
             helper.make_node("Gather", ["s", "one"], ["t"]),
             helper.make_node("Unsqueeze", ["b", "axes0"], ["b1"]),
             helper.make_node("Identity", ["b1"], ["b1i"]),
             helper.make_node("Unsqueeze", ["t", "axes0"], ["t1"]),
             helper.make_node("Cast", ["t1"], ["t1c"], to=I64),
             helper.make_node("Concat", ["b1i", "t1c", "heads", "dh"], ["split_shape"], axis=0),
             helper.make_node("Reshape", ["x", "split_shape"], ["q"]),
             helper.make_node("Transpose", ["q"], ["qt"], perm=[0, 2, 1, 3]),
             helper.make_node("Transpose", ["q"], ["kt"], perm=[0, 2, 3, 1]),
             helper.make_node("MatMul", ["qt", "kt"], ["att"]),
             helper.make_node("Softmax", ["att"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "qt"], ["o"]),
             helper.make_node("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3]),
             helper.make_node("Concat", ["b1", "t1", "width"], ["merge_shape"], axis=0),
             helper.make_node("Reshape", ["ot", "merge_shape"], ["y"])]
    inits = [helper.make_tensor("zero", I64, [], [0]), helper.make_tensor("one", I64, [], [1]),
             helper.make_tensor("axes0", I64, [1], [0]), helper.make_tensor("heads", I64, [1], [2]),
             helper.make_tensor("dh", I64, [1], [3]), helper.make_tensor("width", I64, [1], [6])]
    m = _model(nodes, [_vi("x", F, ["batch", 4, 6])], inits=inits)
    mod, _ = from_onnx(m)
    out = mod["main"].ret_struct_info
    assert out.shape is not None and [str(d) for d in out.shape] == ["batch", "4", "6"]
    assert "dynamic_reshape" not in str(mod)
    _check_runs(m, [(RNG.standard_normal((b, 4, 6)).astype("float32"),) for b in (1, 3)],
                atol=1e-6)


def test_reshape_of_the_sum_of_two_run_time_reshapes():
    """The sum of two run-time reshapes, whose dims cannot be related at import: each dim of
    the sum is decided while the model runs (max of the two, each 1 or equal to it), so a
    reshape of it works, broadcasting included, and a sum that does not broadcast fails."""
    nodes = [helper.make_node("Reshape", ["x", "s1"], ["a"]),
             helper.make_node("Reshape", ["w", "s2"], ["b"]),
             helper.make_node("Add", ["a", "b"], ["c"], name="sum"),
             helper.make_node("Reshape", ["c", "s3"], ["y"], name="merge")]
    m = _model(nodes, [_vi("x", F, [2, 3, 4]), _vi("w", F, [2, 3, 4]), _vi("s1", I64, [3]),
                       _vi("s2", I64, [3]), _vi("s3", I64, [2])])
    x, w = RNG.standard_normal((2, 3, 4), np.float32), RNG.standard_normal((2, 3, 4), np.float32)
    shape = np.array
    rep = _check_runs(m, [(x, w, shape([2, 3, 4]), shape([2, 3, 4]), shape([-1, 8])),
                          (x, w, shape([24, 1, 1]), shape([1, 1, 24]), shape([24, -1]))])
    with pytest.raises(KilnError, match="sum.*must be 1 or"):
        rep.run([x, w, shape([4, 6, 1]), shape([6, 4, 1]), shape([-1, 1])])
