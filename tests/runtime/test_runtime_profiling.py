"""exe.profile(): per kernel its source ONNX nodes, shapes and share of the time; Chrome traces."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import onnx
import pytest

import kiln
from kiln.frontend.onnx import from_onnx

DEMO = pathlib.Path(__file__).parents[2] / "examples" / "models" / "demo_resnet.onnx"


@pytest.fixture(scope="module")
def demo():
    model = onnx.load(str(DEMO))
    mod, params = from_onnx(model)
    return model, kiln.build(mod, params=params)


def test_rows_name_the_onnx_nodes_and_shapes(demo, tmp_path):
    model, exe = demo
    x = np.random.default_rng(0).standard_normal((2, 3, 32, 32), dtype=np.float32)
    prof = exe.profile(image=x, repeat=3, trace=str(tmp_path / "t.json"))
    kernels = [c.func for c in exe.plans["main"].calls if c.is_kernel]
    assert sorted(r.kernel for r in prof.rows) == sorted(set(kernels))
    assert sum(r.calls for r in prof.rows) == len(kernels) == len(prof.calls)
    assert [r.seconds for r in prof.rows] == sorted((r.seconds for r in prof.rows), reverse=True)
    assert abs(sum(r.share for r in prof.rows) - 1) < 1e-6
    # every ONNX node of the model is behind some kernel (BatchNorm folds into its conv's
    # kernel, Flatten into the classifier's), under its own name and op type
    onnx_nodes = {(n.name, n.op_type) for n in model.graph.node}
    seen = {(n.name, n.op_type) for r in prof.rows if r.span for n in r.span.nodes}
    assert seen <= onnx_nodes
    assert {n for n in onnx_nodes if n[1] in ("Conv", "Gemm", "GlobalAveragePool")} <= seen
    stem = next(r for r in prof.rows if r.span and ("stem.conv", "Conv") in
                {(n.name, n.op_type) for n in r.span.nodes})
    # (the kernel's own tensors: NCHW8c blocks after the layout pass, batch 2 in front)
    assert stem.shapes[0].startswith("2x") and "-> 2x" in stem.shapes[0]
    assert "Conv node 'stem.conv'" in stem.nodes
    fc = next(r for r in prof.rows if r.span and "fc" in {n.name for n in r.span.nodes})
    assert fc.shapes[0].endswith("-> 2x10")
    table = str(prof)
    assert table.splitlines()[0].split()[:4] == ["kernel", "calls", "ms", "share"]
    assert "Conv node 'stem.conv'" in table and "%" in table and table.endswith(
        table.splitlines()[-1]) and table.splitlines()[-1].startswith("total")
    # the trace: one event per kernel call per run, back to back, plus one per run
    trace = json.loads((tmp_path / "t.json").read_text())
    calls = [e for e in trace["traceEvents"] if e.get("cat") == "kernel"]
    runs = [e for e in trace["traceEvents"] if e.get("cat") == "run"]
    assert len(calls) == 3 * len(kernels) and len(runs) == 3
    assert [e["name"] for e in calls[:len(kernels)]] == kernels
    assert all(b["ts"] >= a["ts"] + a["dur"] - 1e-3 for a, b in zip(calls, calls[1:]))
    assert any("Conv stem.conv" in e["args"].get("nodes", []) for e in calls)


def test_symbolic_shapes_are_shown_for_the_run(demo):
    _, exe = demo
    x = np.zeros((5, 3, 32, 32), np.float32)
    prof = exe.profile(x, repeat=1)
    assert any(s.startswith("5x3x32x32") for r in prof.rows for s in r.shapes)


def test_profile_errors(demo, tmp_path):
    _, exe = demo
    x = np.zeros((1, 3, 32, 32), np.float32)
    with pytest.raises(kiln.KilnError, match="repeat"):
        exe.profile(x, repeat=0)
    with pytest.raises(kiln.KilnError, match="cannot write the trace"):
        exe.profile(x, repeat=1, trace=str(tmp_path / "missing" / "t.json"))
