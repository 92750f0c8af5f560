"""The NPU kernel builder's pieces: split stores cover their block exactly, and a GEMM whose
operand tile stays the same on a core's steps loads it once per slot, with the same result."""

import numpy as np
import pytest

import kiln
from kiln import graph as g
from kiln import op
from kiln.codegen.npu import build_npu
from kiln.schedule.npu.emit import MEM_ID, block, itemsize, store_piece_bytes, store_pieces
from kiln.target.npu import load_config
from kiln.testing.op_testing import graph_module

HW = ["default", "edge"]


def _addresses(shape, blk):
    """Byte address of every element of a 3-D block, in iteration order."""
    isz = itemsize(blk.dtype)
    idx = np.indices(shape).reshape(3, -1).T
    return blk.addr + (idx @ np.array(blk.strides)) * isz


@pytest.mark.parametrize("hw", HW)
@pytest.mark.parametrize("shape,dst_strides,src_strides", [
    ((1, 64, 392), (0, 3136, 1), (0, 1, 64)),      # a conv's output tile: channels x pixels
    ((1, 300, 200), (0, 512, 1), (0, 200, 1)),     # a dense tile: rows x columns
    ((3, 5, 7000), (40000, 7000, 1), (35000, 7000, 1)),  # rows longer than a piece
    ((2, 3, 4), (12, 4, 1), (12, 4, 1)),           # small: one piece
])
def test_store_pieces_cover_the_block_once_and_stay_small(hw, shape, dst_strides, src_strides):
    cfg = load_config(hw)
    dst = block("dram", 4096, "float32", dst_strides)
    src = block("acc", 128, "float32", src_strides)
    pieces = store_pieces(cfg, shape, dst, src)
    limit = store_piece_bytes(cfg)
    pairs = set()
    for shp, d, s in pieces:
        nbytes = int(np.prod(shp)) * 4
        assert nbytes <= max(limit, shp[-1] * 4)
        pairs |= set(zip(_addresses(shp, d).tolist(), _addresses(shp, s).tolist()))
    whole = set(zip(_addresses(shape, dst).tolist(), _addresses(shape, src).tolist()))
    assert pairs == whole
    assert sum(int(np.prod(p[0])) for p in pieces) == int(np.prod(shape))
    assert len(pieces) == 1 or int(np.prod(shape)) * 4 > limit


def _loads_into(exe, mem):
    n = 0
    for step in exe.steps:
        for stream in getattr(getattr(step, "program", None), "streams", []):
            n += sum(i.op == "dma.load" and i.args["dst"].mem == MEM_ID[mem] for i in stream)
    return n


@pytest.mark.parametrize("hw", HW)
def test_a_weight_tile_that_stays_is_loaded_once_per_slot(hw):
    """dense with many rows and a small weight: every output tile multiplies the same B tile,
    so each core's two slots load it once each instead of once per step."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((24, 40)).astype("float32")
    x = rng.standard_normal((4000, 40)).astype("float32")
    exe = build_npu(graph_module(lambda v: op.dense(v, g.const(w)), [x.shape]),
                    kiln.Target("npu", hw=hw))
    got = exe(x)
    ref = x.astype(np.float64) @ w.T.astype(np.float64)
    assert float(np.max(np.abs(got - ref)) / np.max(np.abs(ref))) <= 1e-2
    cfg = load_config(hw)
    gemm = [k for k in exe.kernels if k.op == "dense"][0]
    assert "N24 x K40 of" in gemm.tiling  # one B tile
    assert _loads_into(exe, "weight") <= 2 * cfg.cores
    assert _loads_into(exe, "input") > 2 * cfg.cores  # A tiles still stream
