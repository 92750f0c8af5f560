"""The generic NPU lowering of last resort (``KILN_NPU_GENERIC=1``): an element-wise op's TE
compute analysed node by node onto vector instructions -- silu and gelu against torch, the
same instruction stream on both routes -- and the nodes without a vector form left on the CPU
with the reason."""

import numpy as np
import pytest
import torch

import kiln
from kiln import op, te
from kiln.codegen.npu import LOWERING_KEY
from kiln.codegen.npu.executable import NpuStep
from kiln.graph.op_registry import get_op_def
from kiln.schedule.npu import NotSupported
from kiln.schedule.npu.generic import select_steps
from kiln.testing.op_testing import graph_module
from kiln.transform import PassContext


@pytest.fixture
def generic(monkeypatch):
    monkeypatch.setenv("KILN_NPU_GENERIC", "1")


def _build(fn, shapes, hw, route="tir", dtype="float32"):
    with PassContext(config={LOWERING_KEY: route}):
        return kiln.build(graph_module(fn, shapes, dtype), target=kiln.Target("npu", hw=hw))


CASES = [("silu", lambda a: op.silu(a), torch.nn.functional.silu),
         ("gelu", lambda a: op.gelu(a), torch.nn.functional.gelu)]


@pytest.mark.parametrize("hw", ["default", "edge"])
@pytest.mark.parametrize("name,fn,ref", CASES)
def test_generic_ops_match_torch_on_both_routes(generic, hw, name, fn, ref):
    x = np.random.default_rng(3).standard_normal((37, 129)).astype("float32") * 3
    tir, emit = _build(fn, [x.shape], hw), _build(fn, [x.shape], hw, "emit")
    assert tir.cpu_ops == [] and [k.op for k in tir.kernels] == [name]
    streams = [[s.program.streams for s in e.steps if isinstance(s, NpuStep)]
               for e in (tir, emit)]
    assert streams[0] == streams[1]
    y = tir(x)
    np.testing.assert_allclose(y, ref(torch.from_numpy(x)).numpy(), rtol=1e-5, atol=2e-6)
    assert np.asarray(emit(x)).tobytes() == np.asarray(y).tobytes()


def test_off_by_default_and_reasons(monkeypatch):
    """Off: the op stays on the CPU for want of a lowering, as before. On: a node without a
    vector form keeps it there, the reason naming the node."""
    monkeypatch.delenv("KILN_NPU_GENERIC", raising=False)
    exe = _build(lambda a: op.silu(a), [(4, 8)], "edge")
    assert exe.cpu_ops == ["silu"]
    monkeypatch.setenv("KILN_NPU_GENERIC", "1")
    exe = _build(lambda a: op.gelu(a, approximate="tanh"), [(4, 8)], "edge")
    assert exe.cpu_ops == ["gelu"]
    exe = _build(lambda a: op.silu(a), [(4, 8)], "edge", dtype="float16")
    assert exe.cpu_ops == ["silu"]  # computed in float32 inside: a cast within the tree


def _steps(name, shapes, attrs=None):
    phs = [te.placeholder(s, "float32", name=f"x{k}") for k, s in enumerate(shapes)]
    d = get_op_def(name)
    res = d.compute(*phs, attrs) if attrs is not None else d.compute(*phs)
    return select_steps(res.op.body, {p.buffer: k for k, p in enumerate(phs)}, "float32")


def test_selection_of_nodes():
    steps, cdt = _steps("silu", [(4,)])
    assert cdt == "float32"
    assert [s.opcode for s in steps] == ["vmul", "vexp", "vadd", "vdiv"]
    assert steps[-1].srcs == (("in", 0), ("out",))  # x / (1 + e^-x)
    from kiln.op.elementwise import GeluAttrs
    steps, _ = _steps("gelu", [(4,)], GeluAttrs())
    assert [s.opcode for s in steps] == ["vmul", "verf", "vadd", "vmul", "vmul"]
    with pytest.raises(NotSupported, match="tanh: no vector instruction"):
        _steps("gelu", [(4,)], GeluAttrs(approximate="tanh"))
