"""Source spans: recorded by the importer, kept by passes and fusion, saved with the plan."""

import numpy as np
from onnx import TensorProto, helper

import kiln
from kiln import graph as g
from kiln import op
from kiln.frontend.onnx import from_onnx
from kiln.ir import structural_equal, structural_hash
from kiln.ir.span import SourceNode, Span
from kiln.transform import PassContext


def test_span_merge_keeps_first_occurrence_order():
    a, b, c = Span.of("a", "Conv"), Span.of("b", "Relu"), Span.of("c")
    merged = Span.merge([a, None, b, a, c])
    assert merged.nodes == (SourceNode("a", "Conv"), SourceNode("b", "Relu"), SourceNode("c"))
    assert Span.merge([None, None]) is None
    assert Span.from_json(merged.to_json()) == merged
    assert str(Span.of("x", "Add")) == "Add node 'x'"


def test_span_is_ignored_by_structural_equality():
    x = g.Var("x", g.TensorStructInfo((2,), "float32"))
    c1 = g.Call(g.Op("nn.relu"), (x,))
    c2 = c1.with_span(Span.of("r", "Relu"))
    assert structural_equal(c1, c2) and structural_hash(c1) == structural_hash(c2)


def test_block_builder_gives_calls_the_current_span():
    bb = g.BlockBuilder()
    x = g.Var("x", g.TensorStructInfo((4,), "float32"))
    with bb.function("main", [x]):
        with bb.span(Span.of("n1", "Relu")):
            y = bb.emit(op.nn.relu(x))
            with bb.span(None):  # None keeps the enclosing span
                z = bb.emit(op.negative(y))
        w = bb.emit(op.exp(z))
        bb.emit_func_output(w)
    bindings = bb.get()["main"].body.blocks[0].bindings
    assert [str(b.value.span) for b in bindings] == ["Relu node 'n1'", "Relu node 'n1'", "None"]


def _onnx_model():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])
    w = helper.make_tensor("w", TensorProto.FLOAT, [8, 4],
                           np.random.default_rng(0).standard_normal(32).astype("float32"))
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="proj"),
             helper.make_node("Relu", ["h"], ["r"], name="act"),
             helper.make_node("Exp", ["r"], ["y"], name="")]
    graph = helper.make_graph(nodes, "g", [x], [y], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_importer_spans_reach_the_plan_and_survive_save(tmp_path):
    mod, params = from_onnx(_onnx_model())
    calls = [b.value for b in mod["main"].body.blocks[0].bindings if isinstance(b.value, g.Call)]
    assert [str(c.span) for c in calls] == ["MatMul node 'proj'", "Relu node 'act'",
                                            "Exp node 'y'"]
    exe = kiln.build(mod, params=params)
    kernels = [c for c in exe.plans["main"].calls if c.is_kernel]
    assert len(kernels) == 1  # fused
    assert [n.name for n in kernels[0].span.nodes] == ["proj", "act", "y"]
    path = tmp_path / "m.kiln"
    exe.save(str(path))
    loaded = kiln.load(str(path))
    assert loaded.plans["main"].calls[-1].span == kernels[0].span


def test_spans_without_fusion_name_each_kernel():
    mod, params = from_onnx(_onnx_model())
    with PassContext(opt_level=0):
        exe = kiln.build(mod, params=params)
    spans = [str(c.span) for c in exe.plans["main"].calls if c.is_kernel]
    assert spans == ["MatMul node 'proj'", "Relu node 'act'", "Exp node 'y'"]
