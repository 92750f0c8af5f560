"""ONNX sequences and optionals (``kiln.op.sequence``): SequenceConstruct/Insert/Erase/At/Length/
Empty, SplitToSequence, ConcatFromSequence, SequenceMap (unrolled at a known length),
Optional/OptionalHasElement/OptionalGetElement, sequence and optional graph inputs and outputs,
checked against onnxruntime on random inputs, mixed with ordinary tensor ops.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.frontend.onnx import from_onnx
from kiln.ir import KilnError
from kiln.ir.errors import ArgumentError

OPSET = 18
F = TensorProto.FLOAT


def _seq_type(elem: int = F, shape=None):
    return helper.make_sequence_type_proto(helper.make_tensor_type_proto(elem, shape))


def _model(nodes, inputs, outputs, initializers=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


def _kiln(model, feeds):
    mod, params = from_onnx(model)
    out = kiln.build(mod, params=params)(**feeds)
    return list(out) if isinstance(out, tuple) else [out]


def _assert_same(got, want, what=""):
    if want is None:
        assert got is None, what
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), what
        for k, (a, b) in enumerate(zip(got, want)):
            _assert_same(a, b, f"{what}[{k}]")
    else:
        want = np.asarray(want)
        assert isinstance(got, np.ndarray) and got.dtype == want.dtype, what
        assert got.shape == want.shape, what
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=what)


def _check_ort(model, feeds):
    got = _kiln(model, feeds)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, feeds)
    assert len(got) == len(want)
    for o, a, b in zip(model.graph.output, got, want):
        _assert_same(a, b, o.name)
    return got


def test_sequences_mixed_with_tensor_ops():
    """Split at a run-time split, take, insert, erase, concatenate and feed a MatMul; the
    sequence itself and its length are outputs too."""
    rng = np.random.default_rng(0)
    n = helper.make_node
    w = numpy_helper.from_array(rng.standard_normal((6, 3)).astype("float32"), "w")
    nodes = [
        n("SplitToSequence", ["x", "split"], ["s"], axis=1),
        n("SequenceAt", ["s", "one"], ["piece"]),
        n("Relu", ["piece"], ["r"]),
        n("SequenceInsert", ["s", "r", "zero"], ["s2"]),      # r first
        n("SequenceErase", ["s2"], ["s3"]),                  # drop the last piece
        n("SequenceLength", ["s3"], ["len"]),
        n("ConcatFromSequence", ["s3"], ["cat"], axis=1),
        n("Slice", ["cat", "zero1", "six", "one1"], ["cat6"]),
        n("MatMul", ["cat6", "w"], ["y"]),
        n("Tanh", ["y"], ["out"]),
    ]
    consts = [numpy_helper.from_array(np.array(v, np.int64), name) for name, v in
              (("one", 1), ("zero", 0), ("zero1", [0]), ("six", [6]), ("one1", [1]))]
    model = _model(nodes,
                   [helper.make_tensor_value_info("x", F, (4, 9)),
                    helper.make_tensor_value_info("split", TensorProto.INT64, (3,))],
                   [helper.make_tensor_value_info("out", F, None),
                    helper.make_tensor_value_info("len", TensorProto.INT64, None),
                    helper.make_value_info("s3", _seq_type())],
                   [w, *consts])
    for split in ([2, 3, 4], [4, 4, 1]):
        feeds = {"x": rng.standard_normal((4, 9)).astype("float32"),
                 "split": np.array(split, np.int64)}
        got = _check_ort(model, feeds)
        assert int(got[1]) == 3 and len(got[2]) == 3
    # a split that does not add up is the step's error, naming the node
    mod, params = from_onnx(model)
    exe = kiln.build(mod, params=params)
    with pytest.raises(ArgumentError, match="add up"):
        exe(x=feeds["x"], split=np.array([1, 1, 1], np.int64))


def test_sequence_graph_input_and_output():
    rng = np.random.default_rng(1)
    n = helper.make_node
    nodes = [n("SequenceInsert", ["seq", "t", "pos"], ["s1"]),
             n("SequenceAt", ["s1", "pos"], ["back"]),
             n("Mul", ["back", "t"], ["sq"]),
             n("ConcatFromSequence", ["s1"], ["stacked"], axis=0, new_axis=1),
             n("SequenceEmpty", [], ["e"], dtype=F),
             n("SequenceInsert", ["e", "sq"], ["single"])]
    model = _model(nodes,
                   [helper.make_value_info("seq", _seq_type(F, (2, 3))),
                    helper.make_tensor_value_info("t", F, (2, 3)),
                    helper.make_tensor_value_info("pos", TensorProto.INT64, ())],
                   [helper.make_value_info("s1", _seq_type()),
                    helper.make_tensor_value_info("stacked", F, None),
                    helper.make_value_info("single", _seq_type())])
    for length, pos in ((3, 1), (1, -1), (4, 4)):
        feeds = {"seq": [rng.standard_normal((2, 3)).astype("float32") for _ in range(length)],
                 "t": rng.standard_normal((2, 3)).astype("float32"),
                 "pos": np.array(pos, np.int64)}
        _check_ort(model, feeds)
    mod, params = from_onnx(model)
    exe = kiln.build(mod, params=params)
    t = np.zeros((2, 3), np.float32)
    with pytest.raises(ArgumentError, match="position 5 is out of range"):
        exe(seq=[t, t], t=t, pos=np.array(5, np.int64))
    with pytest.raises(ArgumentError, match="expected a sequence"):
        exe(seq=t, t=t, pos=np.array(0, np.int64))
    with pytest.raises(ArgumentError, match="expected dtype float32"):
        exe(seq=[t.astype("float64")], t=t, pos=np.array(0, np.int64))


def test_split_to_sequence_forms():
    """No split (pieces of 1, keepdims or not), a scalar split (last piece shorter), an empty
    tensor's sequence concatenated back."""
    rng = np.random.default_rng(2)
    n = helper.make_node
    nodes = [n("SplitToSequence", ["x"], ["a"], axis=0, keepdims=0),
             n("SplitToSequence", ["x"], ["b"], axis=-1),
             n("SplitToSequence", ["x", "two"], ["c"], axis=1),
             n("ConcatFromSequence", ["c"], ["cc"], axis=1),
             n("ConcatFromSequence", ["a"], ["aa"], axis=-1, new_axis=1)]
    two = numpy_helper.from_array(np.array(2, np.int64), "two")
    model = _model(nodes, [helper.make_tensor_value_info("x", F, (3, 5))],
                   [helper.make_value_info(v, _seq_type()) for v in "abc"]
                   + [helper.make_tensor_value_info(v, F, None) for v in ("cc", "aa")], [two])
    got = _check_ort(model, {"x": rng.standard_normal((3, 5)).astype("float32")})
    assert [p.shape for p in got[2]] == [(3, 2), (3, 2), (3, 1)]


def test_sequence_construct_and_map_unrolled():
    """SequenceMap over sequences of known length (SequenceConstruct, SplitToSequence without
    split) is unrolled; its outputs go on through tensor ops."""
    rng = np.random.default_rng(3)
    n = helper.make_node
    body = helper.make_graph(
        [n("Mul", ["a", "b"], ["ab"]), n("Add", ["ab", "bias"], ["o"]),
         n("Shape", ["a"], ["shp"])],
        "body",
        [helper.make_tensor_value_info("a", F, None), helper.make_tensor_value_info("b", F, None),
         helper.make_tensor_value_info("bias", F, None)],
        [helper.make_tensor_value_info("o", F, None),
         helper.make_tensor_value_info("shp", TensorProto.INT64, None)])
    nodes = [n("SequenceConstruct", ["x", "y", "x"], ["s"]),
             n("SplitToSequence", ["z"], ["t"], axis=0),
             n("SequenceMap", ["s", "t", "bias"], ["m", "shapes"], body=body),
             n("ConcatFromSequence", ["m"], ["cat"], axis=0),
             n("Sigmoid", ["cat"], ["out"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", F, (1, 4)),
                           helper.make_tensor_value_info("y", F, (1, 4)),
                           helper.make_tensor_value_info("z", F, (3, 4)),
                           helper.make_tensor_value_info("bias", F, (4,))],
                   [helper.make_tensor_value_info("out", F, None),
                    helper.make_value_info("shapes", _seq_type(TensorProto.INT64))])
    feeds = {k: rng.standard_normal(s).astype("float32")
             for k, s in (("x", (1, 4)), ("y", (1, 4)), ("z", (3, 4)), ("bias", (4,)))}
    _check_ort(model, feeds)


def test_optionals():
    """Optional of a tensor and of a sequence, has/get element, an empty optional output, an
    optional graph input given or left empty (None)."""
    rng = np.random.default_rng(4)
    n = helper.make_node
    opt_t = helper.make_optional_type_proto(helper.make_tensor_type_proto(F, (3,)))
    nodes = [n("Optional", ["x"], ["ox"]),
             n("OptionalHasElement", ["ox"], ["has_x"]),
             n("OptionalGetElement", ["ox"], ["gx"]),
             n("Add", ["gx", "gx"], ["twice"]),
             n("OptionalHasElement", ["maybe"], ["has_maybe"]),
             n("Optional", [], ["nothing"],
               type=helper.make_sequence_type_proto(helper.make_tensor_type_proto(F, None))),
             n("SequenceConstruct", ["x", "x"], ["s"]),
             n("Optional", ["s"], ["os"]),
             n("OptionalGetElement", ["os"], ["gs"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", F, (3,)),
                           helper.make_value_info("maybe", opt_t)],
                   [helper.make_tensor_value_info("has_x", TensorProto.BOOL, ()),
                    helper.make_tensor_value_info("twice", F, None),
                    helper.make_tensor_value_info("has_maybe", TensorProto.BOOL, ()),
                    helper.make_value_info("nothing", helper.make_optional_type_proto(
                        _seq_type())),
                    helper.make_value_info("gs", _seq_type())])
    x = rng.standard_normal(3).astype("float32")
    for maybe in (None, rng.standard_normal(3).astype("float32")):
        got = _check_ort(model, {"x": x, "maybe": maybe})
        assert bool(got[2]) is (maybe is not None)
        assert got[3] is None


def test_optional_get_element_of_empty_is_an_error():
    n = helper.make_node
    opt_t = helper.make_optional_type_proto(helper.make_tensor_type_proto(F, (2,)))
    model = _model([n("OptionalGetElement", ["maybe"], ["v"]), n("Neg", ["v"], ["y"])],
                   [helper.make_value_info("maybe", opt_t)],
                   [helper.make_tensor_value_info("y", F, None)])
    mod, params = from_onnx(model)
    exe = kiln.build(mod, params=params)
    np.testing.assert_array_equal(exe(maybe=np.array([1, -2], np.float32)), [-1, 2])
    with pytest.raises(ArgumentError, match="holds no value"):
        exe(maybe=None)


def test_sequence_map_over_run_time_length_runs_as_a_loop():
    """A sequence graph input has a run-time length: SequenceMap becomes its defining Loop
    (carrying the output sequences), run by the executor; vs onnxruntime."""
    n = helper.make_node
    body = helper.make_graph([n("Neg", ["a"], ["o"])], "body",
                             [helper.make_tensor_value_info("a", F, None)],
                             [helper.make_tensor_value_info("o", F, None)])
    model = _model([n("SequenceMap", ["seq"], ["m"], body=body, name="negate")],
                   [helper.make_value_info("seq", _seq_type(F, (2,)))],
                   [helper.make_value_info("m", _seq_type())])
    rng = np.random.default_rng(8)
    for length in (2, 5):
        _check_ort(model, {"seq": [rng.standard_normal(2).astype("float32")
                                   for _ in range(length)]})


def test_sequence_errors_at_import():
    n = helper.make_node
    model = _model([n("SequenceAt", ["x", "i"], ["y"])],
                   [helper.make_tensor_value_info("x", F, (2,)),
                    helper.make_tensor_value_info("i", TensorProto.INT64, ())],
                   [helper.make_tensor_value_info("y", F, None)])
    with pytest.raises(KilnError, match="SequenceAt node .y.: input 0"):
        from_onnx(model)
    # the elements' rank is needed to plan the ops after SequenceAt
    model = _model([n("SequenceAt", ["s", "i"], ["y"]), n("Relu", ["y"], ["r"])],
                   [helper.make_value_info("s", _seq_type(F, None)),
                    helper.make_tensor_value_info("i", TensorProto.INT64, ())],
                   [helper.make_tensor_value_info("r", F, None)])
    with pytest.raises(KilnError, match="SequenceAt node 'y'.*rank of the sequence's elements"):
        from_onnx(model)


def _sequence_loop_model(run_time_trip: bool):
    """A Loop carrying a sequence (appended to each iteration) and an optional sequence (the
    body reads its value and returns a new optional, as ONNX's loop16 test does); its trip
    count an initializer (unrolled at import) or a graph input (run by the executor)."""
    n = helper.make_node
    seq_t = _seq_type(F, None)
    body = helper.make_graph(
        [n("Cast", ["i"], ["fi"], to=F), n("Add", ["x", "fi"], ["xi"]),
         n("SequenceInsert", ["acc_in", "xi"], ["acc_out"]),
         n("OptionalGetElement", ["opt_in"], ["plain"]),
         n("SequenceInsert", ["plain", "xi", "zero"], ["front"]),
         n("Optional", ["front"], ["opt_out"]),
         n("Identity", ["c_in"], ["c_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
         helper.make_value_info("acc_in", seq_t),
         helper.make_value_info("opt_in", helper.make_optional_type_proto(seq_t))],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
         helper.make_value_info("acc_out", seq_t),
         helper.make_value_info("opt_out", helper.make_optional_type_proto(seq_t))])
    consts = [numpy_helper.from_array(np.array(v, dtype), name) for name, v, dtype in
              (("m", 3, np.int64), ("c", True, np.bool_), ("zero", 0, np.int64))
              if not (run_time_trip and name == "m")]
    nodes = [n("SequenceEmpty", [], ["empty"]), n("Optional", ["empty"], ["opt"]),
             n("Loop", ["m", "c", "empty", "opt"], ["acc", "opt_final"], body=body,
               name="appending"),
             n("OptionalGetElement", ["opt_final"], ["fronts"]),
             n("ConcatFromSequence", ["acc"], ["cat"], axis=0)]
    inputs = [helper.make_tensor_value_info("x", F, (2,))]
    if run_time_trip:
        inputs.append(helper.make_tensor_value_info("m", TensorProto.INT64, []))
    return _model(nodes, inputs, [helper.make_value_info("fronts", seq_t),
                                  helper.make_tensor_value_info("cat", F, None)], consts)


def test_loop_carrying_a_sequence_is_unrolled():
    """A known trip count: the body's sequence ops are imported once per iteration."""
    rng = np.random.default_rng(6)
    _check_ort(_sequence_loop_model(False), {"x": rng.standard_normal(2).astype("float32")})


def test_run_time_loop_carries_sequences_and_optionals():
    """A trip count known only at run time: the body function takes and returns the carried
    sequence and optional (their element StructInfo widened until stable), and the executor
    re-binds them every iteration."""
    rng = np.random.default_rng(7)
    model = _sequence_loop_model(True)
    mod, params = from_onnx(model)
    assert any(name.endswith("_body") for name in mod.functions), "the Loop was unrolled"
    exe = kiln.build(mod, params=params)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for trip in (1, 4, 2):
        feeds = {"x": rng.standard_normal(2).astype("float32"), "m": np.array(trip, np.int64)}
        got = list(exe(**feeds))
        for o, a, b in zip(model.graph.output, got, sess.run(None, feeds)):
            _assert_same(a, b, f"{o.name} (trip {trip})")
        assert len(got[0]) == trip
