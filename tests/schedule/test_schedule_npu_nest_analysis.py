"""The nest analysis of the NPU's element-wise kernels (strides per axis, broadcasts as stride 0,
alignment, opcodes) and the unit shares read back from a built executable (MACs per unit,
element operations per unit, scalar fallbacks with their reasons), against counts written
from the shapes."""

import numpy as np
import pytest

import kiln
from kiln import graph as g
from kiln import op
from kiln.codegen.npu import DEPTHWISE_KEY
from kiln.ir.errors import KilnError
from kiln.schedule.npu import LoweringContext
from kiln.schedule.npu.emit import DramView
from kiln.schedule.npu.nest_analysis import (
    analyse_elementwise,
    scalar_kernel_elements,
    unit_shares,
)
from kiln.target.npu import load_config
from kiln.testing.op_testing import graph_module
from kiln.transform import PassContext


def test_broadcast_strides_and_dropped_dims():
    """Dims of extent 1 dropped, a broadcast operand's strides 0 where it repeats, the
    opcodes kept and a final vcast added when the nest computes in another dtype."""
    cfg = load_config("default")
    ctx = LoweringContext(cfg)
    out = ctx.alloc((1, 8, 5, 7), "float16")
    a = ctx.alloc((1, 8, 5, 7), "float32")
    b = ctx.alloc((8, 1, 1), "float32")
    nest = analyse_elementwise(cfg, out, [a, b], "float32", ("vadd", "vrelu"))
    assert nest.dims == (8, 5, 7)
    assert nest.out.strides == (35, 7, 1) and nest.inputs[0].strides == (35, 7, 1)
    assert nest.inputs[1].strides == (1, 0, 0)
    assert nest.opcodes == ("vadd", "vrelu", "vcast")
    assert nest.elements == 8 * 5 * 7
    assert nest.mergeable(1) and not nest.mergeable(0)  # b breaks the channel/row merge


def test_alignment_of_a_view():
    """A view starting mid-burst reports its offset modulo the burst and the bank width."""
    cfg = load_config("default")
    ctx = LoweringContext(cfg)
    base = ctx.alloc((4, 64), "float32")
    burst = cfg.memory("dram").burst
    assert base.addr % burst == 0
    view = DramView(base, 3, (4, 60), (64, 1))
    nest = analyse_elementwise(cfg, view, [view], "float32", ("vneg",))
    assert nest.out.burst_offset == 12 % burst
    assert nest.out.bank_offset == 12 % min(cfg.memory(m).bank_width
                                            for m in ("input", "weight", "acc"))
    assert not nest.mergeable(0)  # rows of 60 with a pitch of 64


def test_operand_of_higher_rank_is_named():
    cfg = load_config("edge")
    ctx = LoweringContext(cfg)
    with pytest.raises(KilnError, match="operand 1 has 3 dims"):
        analyse_elementwise(cfg, ctx.alloc((4, 4), "float32"),
                            [ctx.alloc((4, 4), "float32"), ctx.alloc((2, 4, 4), "float32")],
                            "float32")


def test_scalar_tiling_parsed():
    assert scalar_kernel_elements("scalar unit (log: no vector instruction): 96 elements, "
                                  "6 instructions each") == ("log: no vector instruction", 96)
    assert scalar_kernel_elements("scalar unit (take: no indirect DMA): 4 rows of 8 bytes") \
        == ("take: no indirect DMA", 0)
    assert scalar_kernel_elements("block (1, 1, 7) of (1, 1, 7)") is None


@pytest.mark.parametrize("hw", ["default", "edge"])
def test_unit_shares_of_a_mixed_model(hw):
    """A depthwise convolution (its MACs on the vector unit: the route forced, as the cost
    model picks the banded tensor form on "edge" since the in-place bands), a log (the scalar
    unit), a dense layer (the tensor unit): each count written from the shapes."""
    rng = np.random.default_rng(0)
    c, h = 8, 6
    wd = rng.standard_normal((c, 1, 3, 3)).astype("float32")
    wf = rng.standard_normal((10, c * h * h)).astype("float32")

    def fn(x):
        y = op.nn.conv2d(x, g.const(wd), padding=(1, 1), groups=c)
        y = op.log(op.add(op.abs(y), g.const(np.float32(1.0))))
        return op.dense(op.reshape(y, (1, c * h * h)), g.const(wf))

    with PassContext(config={DEPTHWISE_KEY: "vector"}):
        exe = kiln.build(graph_module(fn, [(1, c, h, h)]), target=kiln.Target("npu", hw=hw))
    x = rng.standard_normal((1, c, h, h)).astype("float32")
    y = exe(x)
    import torch
    ref = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(wd), padding=1,
                                     groups=c).numpy()
    ref = np.log(np.abs(ref) + 1).reshape(1, -1) @ wf.T
    np.testing.assert_allclose(y, ref, rtol=2e-2, atol=2e-2)  # float16 products
    s = unit_shares(exe)
    n = c * h * h
    assert s.vector_macs == n * 9  # one vmul/vmac element per output and tap
    assert s.tensor_macs == n * 10  # the dense layer: the mma instructions' valid extents
    assert s.cpu_macs == 0 and s.cpu_ops == 0 and not s.cpu
    assert s.scalar_ops == n
    assert [r for _, r in s.fallbacks] == ["log: no vector instruction"]
    assert s.vector_ops >= 2 * n  # the abs and the add at least
    assert s.tensor_mac_share == s.tensor_macs / (s.tensor_macs + n * 9)
    assert "scalar fallbacks: 1 (1 x log: no vector instruction)" in s.summary()
