"""NPU copy kernels (kiln/schedule/npu/movement.py): transpose, strided_slice and concat as
DMAs through an L0 slot, run on the simulator and checked bit for bit against numpy (a copy is
exact), on both shipped hardware descriptions; the transposing blocks' bank-spread pitch; the
cycles against the kernels' bounds."""

import math

import numpy as np
import pytest

import kiln
from kiln import op
from kiln.npu.simulator import stream_cycles
from kiln.schedule.npu.emit import DramTensor, DramView
from kiln.schedule.npu.movement import copy_dims, plan_copy_candidates
from kiln.target.npu import load_config
from kiln.testing.op_testing import graph_module

HW = ["default", "edge"]


def _build(fn, shapes, hw, dtype="float32"):
    return kiln.build(graph_module(fn, shapes, dtype), target=kiln.Target("npu", hw=hw))


def _data(rng, shape, dtype):
    if dtype.startswith("float"):
        return rng.standard_normal(shape).astype(dtype)
    return rng.integers(-100, 100, shape).astype(dtype)


def _copies(exe):
    return [k for k in exe.kernels if k.op in ("transpose", "strided_slice", "concat")]


@pytest.mark.parametrize("hw", HW)
@pytest.mark.parametrize("shape,axes,dtype", [
    ((131, 67), None, "float32"),            # a 2-D transpose, odd extents (tails)
    ((3, 37, 29), (0, 2, 1), "float16"),     # batched, the innermost axis moves
    ((2, 5, 97), (2, 0, 1), "int8"),
    ((4, 6, 5, 33), (0, 2, 1, 3), "int32"),  # the innermost axis stays
    ((5, 1, 43), (2, 1, 0), "float32"),      # an extent-1 dim
])
def test_transposes_are_exact(hw, shape, axes, dtype):
    rng = np.random.default_rng(sum(shape))
    x = _data(rng, shape, dtype)
    exe = _build(lambda v: op.transpose(v, axes=axes), [shape], hw, dtype)
    assert exe.cpu_ops == []
    np.testing.assert_array_equal(exe(x), np.transpose(x, axes))
    (k,) = _copies(exe)
    moves = (axes or tuple(range(len(shape) - 1, -1, -1)))[-1] != len(shape) - 1
    assert ("transposed into L0" in k.tiling) is moves, k.tiling
    cycles = exe.last_reports[0].phase_cycles()[k.label]
    assert 0 < k.roofline <= cycles


@pytest.mark.parametrize("hw", HW)
def test_slices_and_concat_are_exact(hw):
    rng = np.random.default_rng(5)
    x = _data(rng, (3, 40, 50), "float32")
    exe = _build(lambda v: op.strided_slice(v, begin=(2, 49), end=(39, 0), strides=(3, -2),
                                            axes=(1, 2)), [x.shape], hw)
    np.testing.assert_array_equal(exe(x), x[:, 2:39:3, 49:0:-2])
    y = _data(rng, (3, 7, 50), "float32")
    exe = _build(lambda u, v: op.concat([u, v], axis=1), [x.shape, y.shape], hw)
    np.testing.assert_array_equal(exe(x, y), np.concatenate([x, y], 1))
    assert len(_copies(exe)) == 2 and all(k.tiling.startswith("DMA copy") for k in _copies(exe))


def test_copy_dims_merge_and_reorder():
    # (128, 12, 64) -> (12, 64, 128): the source's rows of 768 become the result's columns
    src = (64, 1, 768)  # strides of the view read in the result's order
    assert copy_dims((12, 64, 128), (8192, 128, 1), src) == \
        ([1, 768, 128], [0, 128, 1], [0, 1, 768], True)
    # keeping the innermost axis: nothing to reorder, contiguous runs merge
    assert copy_dims((12, 128, 64), (8192, 64, 1), (64, 768, 1)) == \
        ([12, 128, 64], [8192, 64, 1], [64, 768, 1], False)
    assert copy_dims((2, 1, 3, 4), (12, 12, 4, 1), (12, 12, 4, 1)) == \
        ([1, 1, 24], [0, 0, 1], [0, 0, 1], False)


def test_transposed_blocks_spread_over_the_banks():
    """BERT's K^T ((128, 768) float32 -> (768, 128)): the load writes the slot with a pitch
    whose scattered elements the DMA streams as fast as a contiguous row -- every element on
    its own bank line, lines on distinct banks (the power-of-two pitch of the tile's width
    would put a whole beat on one bank)."""
    cfg = load_config("default")
    x = DramTensor(0, (128, 768), "float32")
    out = DramTensor(1 << 20, (768, 128), "float32")
    plans = plan_copy_candidates(cfg, 2, out, DramView(x, 0, (768, 128), (1, 768)))
    p = plans[0]
    assert p.transposed and p.pitch >= p.tile[2]
    spec = cfg.memory(p.mem)
    n = math.prod(p.tile)
    fast = stream_cycles(n, 4, 1, cfg.dma_onchip_bandwidth, spec)
    assert stream_cycles(n, 4, p.pitch, cfg.dma_onchip_bandwidth, spec) == fast
    assert stream_cycles(n, 4, p.tile[2], cfg.dma_onchip_bandwidth, spec) > fast
    # slots a bank group apart: the two engines never share a group's port
    assert p.slot_stride >= spec.size // spec.bank_groups
    assert [q.estimate for q in plans] == sorted(q.estimate for q in plans)


def test_transpose_moving_the_innermost_axis_is_near_its_bound():
    """A transpose through DRAM reads source rows (whole bursts), not columns (a burst per
    element, 16x the traffic of float32): its cycles within 20% of the DRAM bound."""
    rng = np.random.default_rng(7)
    x = _data(rng, (128, 768), "float32")
    exe = _build(lambda v: op.transpose(v), [x.shape], "default")
    np.testing.assert_array_equal(exe(x), x.T)
    (k,) = _copies(exe)
    cycles = exe.last_reports[0].phase_cycles()[k.label]
    assert k.roofline == pytest.approx(2 * x.nbytes / 64)
    assert k.roofline <= cycles <= 1.2 * k.roofline
