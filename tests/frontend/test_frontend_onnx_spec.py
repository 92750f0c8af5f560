"""Malformed nodes are rejected before their converter runs (``kiln.frontend.onnx.spec``), and
whatever goes wrong while a node converts names the node.

Each case is a model an exporter or an attacker could write -- the failures of issue 22: a list
where an int belongs, an unknown attribute, a required input given as '', an axis outside the
rank (Concat/Gather axis 100, a rank-0 input, Softmax at opset 11), a count that would make a
converter loop for hours (Split num_outputs 2^31 - 1, TfIdfVectorizer max_skip_count 2^62),
Attention with zero heads, non-UTF-8 text, a Constant whose dims disagree with its data, an
initializer that shadows an input with another shape. Every one is a KilnError naming the node
(or the graph input) and none shows Python's own wording.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import kiln
from kiln.codegen import executable
from kiln.frontend.onnx import from_onnx, lookup_converter
from kiln.frontend.onnx.registry import _CONVERTERS
from kiln.frontend.onnx.spec import MAX_SIZE
from kiln.ir import InternalError, KilnError, MemoryLimitError, ModelFormatError
from kiln.runtime.executor import Executor
from kiln.testing.onnx_graphs import onnx_model, value_info

F, I64 = TensorProto.FLOAT, TensorProto.INT64
PYTHON_WORDING = re.compile(r"NoneType|object has no attribute|not subscriptable|index out of")


def _node(op_type, inputs, outputs=("y",), **attrs):
    return helper.make_node(op_type, list(inputs), list(outputs), name="n", **attrs)


def _expect(model, pattern):
    with pytest.raises(KilnError) as info:
        from_onnx(model)
    text = str(info.value)
    assert re.search(pattern, text), text
    assert not PYTHON_WORDING.search(text), text
    return info.value


def _one(node, inputs, opset=18, inits=()):
    return onnx_model([node], inputs, [value_info(o, None) for o in node.output], inits, opset)


CASES = [
    # (node, inputs, opset, expected message)
    (_node("Gather", ["x", "i"], axis=[0, 1]), [value_info("x", [3, 4]), value_info("i", [2], I64)],
     18, r"Gather node 'n': attribute 'axis' must be an int, got a list of ints"),
    (_node("Relu", ["x"], alpha=1.0), [value_info("x", [3])], 18,
     r"Relu node 'n': unknown attribute 'alpha'"),
    (_node("Reshape", ["x", ""]), [value_info("x", [3])], 18,
     r"Reshape node 'n': input 1 \(shape\) is required but given as ''"),
    (_node("Concat", ["x", "x"], axis=100), [value_info("x", [3, 4])], 18,
     r"Concat node 'n': attribute 'axis' = 100 is out of range for the rank 2 input"),
    (_node("Gather", ["x", "i"], axis=100), [value_info("x", [3, 4]), value_info("i", [2], I64)],
     18, r"Gather node 'n': attribute 'axis' = 100 is out of range"),
    (_node("Softmax", ["x"], axis=1), [value_info("x", [])], 18,
     r"Softmax node 'n': attribute 'axis' = 1 is out of range for the rank 0 input"),
    (_node("Softmax", ["x"], axis=5), [value_info("x", [2, 3])], 11,
     r"Softmax node 'n': attribute 'axis' = 5 is out of range for the rank 2 input"),
    (_node("Split", ["x"], ["a", "b"], axis=0, num_outputs=2**31 - 1), [value_info("x", [4, 3])],
     18, r"Split node 'n': attribute 'num_outputs' = 2147483647: each value must be in \[1, "),
    (_node("TfIdfVectorizer", ["x"], max_gram_length=2, min_gram_length=1, max_skip_count=2**62,
           mode="TF", ngram_counts=[0, 2], ngram_indexes=[0, 1, 2], pool_int64s=[1, 2, 1, 2]),
     [value_info("x", [2, 6], I64)], 9,
     rf"TfIdfVectorizer node 'n': attribute 'max_skip_count' = {2**62}: each value must be in "
     rf"\[0, {MAX_SIZE}\] \(kiln's limit\)"),
    (_node("Attention", ["q", "k", "v"], q_num_heads=0, kv_num_heads=2),
     [value_info("q", [1, 4, 8]), value_info("k", [1, 4, 8]), value_info("v", [1, 4, 8])], 23,
     r"Attention node 'n': attribute 'q_num_heads' = 0: each value must be in \[1, "),
    (_node("Einsum", ["x"], equation=b"i\xff->i"), [value_info("x", [3])], 18,
     r"Einsum node 'n': attribute 'equation' is not UTF-8 text"),
    (_node("MaxPool", ["x"], kernel_shape=[10**6, 10**6]), [value_info("x", [1, 1, 4, 4])], 18,
     r"MaxPool node 'n'.*window does not fit"),
    (_node("Conv", ["x", "w"], kernel_shape=[3, 3], strides=[0, 1]),
     [value_info("x", [1, 1, 4, 4]), value_info("w", [1, 1, 3, 3])], 18,
     r"Conv node 'n': attribute 'strides' = \[0, 1\]: each value must be in \[1, "),
]


@pytest.mark.parametrize("case", range(len(CASES)), ids=[c[-1][:40] for c in CASES])
def test_a_malformed_node_is_a_kiln_error_naming_it(case):
    node, inputs, opset, pattern = CASES[case]
    _expect(_one(node, inputs, opset), pattern)


def test_an_even_split_may_end_with_an_empty_part():
    """num_outputs=4 of a length-6 axis: parts of 2, the last empty -- what onnxruntime and
    onnx.reference compute (kiln refused it; fuzz seed 3025449)."""
    node = helper.make_node("Split", ["x"], ["a", "b", "c", "d"], axis=1, num_outputs=4)
    graph = helper.make_graph([node], "g", [value_info("x", [2, 6])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
                               for n in "abcd"])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    mod, params = from_onnx(model)
    got = kiln.build(mod, params=params)(x=x)
    want = ReferenceEvaluator(model).run(None, {"x": x})
    assert [g.shape for g in got] == [w.shape for w in want] == [(2, 2)] * 3 + [(2, 0)]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_split_sizes_and_counts_must_fit_the_axis():
    _expect(_one(_node("Split", ["x"], ["a", "b"], axis=0, num_outputs=3),
                 [value_info("x", [4, 3])]), r"Split node 'n': num_outputs is 3 but the node has 2")
    _expect(_one(_node("Split", ["x"], ["a", "b", "c", "d", "e"], axis=0, num_outputs=5),
                 [value_info("x", [6, 3])]), r"cannot be split into 5 parts of 2 \(the last "
            r"would be negative\)")
    node = _node("Split", ["x", "s"], ["a", "b"], axis=0)
    sizes = numpy_helper.from_array(np.array([5, -1], np.int64), "s")
    _expect(_one(node, [value_info("x", [4, 3])], inits=[sizes]),
            r"split sizes \[5, -1\] must be 2 non-negative sizes adding up to the axis length 4")


def test_constant_whose_dims_disagree_with_its_data():
    value = numpy_helper.from_array(np.arange(6, dtype=np.float32), "v")
    value.dims[:] = [4, 4]
    model = onnx_model([_node("Constant", [], ["c"], value=value)], [], [value_info("c", None)])
    _expect(model, r"Constant node 'n': attribute 'value'")


def test_initializer_shadowing_an_input_with_another_shape():
    model = onnx_model([_node("Relu", ["x"])], [value_info("x", [3, 4])], [value_info("y", None)],
                       [numpy_helper.from_array(np.zeros(2, np.float32), "x")])
    _expect(model, r"graph input 'x' is declared with shape \(3, 4\) but its initializer has "
                   r"shape \(2,\)")


def test_an_internal_error_in_a_converter_names_the_node(monkeypatch):
    """A bug inside a converter (here a planted AttributeError) becomes an InternalError that
    names the node, with the original exception chained."""
    entries = _CONVERTERS[("", "Relu")]

    def broken(ctx, node):
        return None.struct_info  # type: ignore[attr-defined]

    monkeypatch.setitem(_CONVERTERS, ("", "Relu"), [(1, broken)])
    err = _expect(_one(_node("Relu", ["x"]), [value_info("x", [3])]),
                  r"Relu node 'n': internal error in kiln \(AttributeError at kiln/")
    assert isinstance(err, InternalError) and isinstance(err.__cause__, AttributeError)
    monkeypatch.setitem(_CONVERTERS, ("", "Relu"), entries)
    assert lookup_converter("Relu", 18) is entries[0][1]


def test_an_internal_error_in_the_build_names_the_node(monkeypatch):
    """A bug while scheduling a kernel (planted) is an InternalError naming the ONNX node the
    kernel computes (its Span), the original chained."""
    mod, params = from_onnx(_one(_node("Relu", ["x"]), [value_info("x", [3])]))

    def broken(func, target):
        raise ValueError("planted")

    monkeypatch.setattr(executable, "schedule_prim_func", broken)
    with pytest.raises(InternalError, match=r"Relu node 'n': internal error in kiln "
                                            r"\(ValueError at kiln/") as info:
        kiln.build(mod, params=params)
    assert isinstance(info.value.__cause__, ValueError)


def test_an_internal_error_while_running_is_an_internal_error(monkeypatch):
    """Anything but a KilnError escaping a run becomes an InternalError naming the function;
    running out of memory a MemoryLimitError."""
    mod, params = from_onnx(_one(_node("Relu", ["x"]), [value_info("x", [3])]))
    exe = kiln.build(mod, params=params)
    x = np.ones(3, np.float32)
    np.testing.assert_array_equal(exe(x), x)

    def fail(exc):
        def run(*args, **kwargs):
            raise exc
        return run

    monkeypatch.setattr(Executor, "_run_fast", fail(TypeError("planted")))
    with pytest.raises(InternalError, match=r"running main: internal error in kiln \(TypeError") \
            as info:
        exe(x)
    assert isinstance(info.value.__cause__, TypeError)
    monkeypatch.setattr(Executor, "_run_fast", fail(MemoryError()))
    with pytest.raises(MemoryLimitError, match="main: out of memory while running"):
        exe(x)


# ---- found by benchmarks/fuzz.py ------------------------------------------------------------
def test_a_name_that_is_not_utf8_is_a_model_format_error():
    model = onnx_model([_node("Relu", ["x"])], [value_info("x", [3])], [value_info("y", None)])
    data = model.SerializeToString().replace(b"\x1a\x01n", b"\x1a\x01\xff")  # node name "n"
    with pytest.raises(ModelFormatError, match=r"node #0 is not UTF-8 text: b'\\xff'"):
        from_onnx(data)


def test_a_model_without_a_default_opset_import():
    model = onnx_model([_node("Relu", ["x"])], [value_info("x", [3])], [value_info("y", None)])
    del model.opset_import[:]
    with pytest.raises(ModelFormatError, match="imports no opset of the default domain"):
        from_onnx(model)
    from_onnx(model, opset=18)  # unless the caller names it


@pytest.mark.parametrize("node,inputs,opset,pattern", [
    (_node("Equal", ["a", "b"]), [value_info("a", [3]), value_info("b", [3], I64)], 18,
     r"Equal node 'n': inputs 0 and 1 must have one type \(T\), got tensor\(float\) and "
     r"tensor\(int64\)"),
    (_node("Conv", ["x", "w"]), [value_info("x", [1, 1, 5]), value_info("w", [1, 1, 3, 3])], 18,
     r"Conv node 'n': the weight \(rank 4\) must have the rank of the input \(rank 3\)"),
    (_node("RNN", ["x", "w", "r"], hidden_size=3),
     [value_info("x", [2, 1, 4]), value_info("w", [1, 2, 4]), value_info("r", [1, 2, 2])], 18,
     r"RNN node 'n': W \[1, 2, 4\] and R \[1, 2, 2\] do not fit 1 direction\(s\) of 1 gates of "
     r"hidden_size 3"),
    (_node("ReduceMean", ["x", "a"]), [value_info("x", [2, 3]), value_info("a", [5], I64)], 18,
     r"ReduceMean node 'n': axes has 5 entries, more than the input's rank 2"),
    (_node("GatherElements", ["x", "i"], axis=0),
     [value_info("x", [2, 3]), value_info("i", [2, 5], I64)], 18,
     r"GatherElements node 'n': gather_elements: indices \(2, 5\) is longer than data \(2, 3\) "
     r"in dimension 1"),
])
def test_types_and_shapes_a_converter_relies_on(node, inputs, opset, pattern):
    _expect(_one(node, inputs, opset), pattern)


def test_rnn_infers_hidden_size_from_its_weights():
    model = _one(_node("RNN", ["x", "w", "r"], ["y", "h"]),
                 [value_info("x", [2, 1, 4]), value_info("w", [1, 3, 4]),
                  value_info("r", [1, 3, 3])])
    mod, _ = from_onnx(model)
    assert "(1, 1, 3)" in str(mod)  # Y_h: (num_directions, batch, hidden_size 3)


def test_range_and_constant_of_shape_constants():
    start = numpy_helper.from_array(np.array([0, 1], np.int64), "s")
    limit = numpy_helper.from_array(np.array(5, np.int64), "l")
    one = numpy_helper.from_array(np.array(1, np.int64), "d")
    _expect(onnx_model([_node("Range", ["s", "l", "d"])], [], [value_info("y", None)],
                       [start, limit, one]),
            r"Range node 'n': start, limit and delta must be scalars")
    huge = numpy_helper.from_array(np.array(2**40, np.int64), "l")
    zero = numpy_helper.from_array(np.array(0, np.int64), "s")
    mod, _ = from_onnx(onnx_model([_node("Range", ["s", "l", "d"])], [],
                                  [value_info("y", None)], [zero, huge, one]))
    assert "dynamic_arange" in str(mod)  # 2^40 values are not made at import
    shape = numpy_helper.from_array(np.array([2**20, 2**20], np.int64), "sh")
    mod, _ = from_onnx(onnx_model([_node("ConstantOfShape", ["sh"])], [],
                                  [value_info("y", None)], [shape]))
    assert "broadcast_to" in str(mod)
