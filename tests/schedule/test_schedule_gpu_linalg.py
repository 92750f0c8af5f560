"""The tiled GEMM schedules of matmul and dense (kiln/schedule/gpu/linalg.py): run on OpenCL
(PoCL) against numpy, compiled with NVRTC within the limits, shared tiles of one reduction step,
epilogues folded into the write-back, and the generic rules where the tiles do not fit."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln import graph as g
from kiln import op
from kiln.codegen.gpu.build import build as gpu_build
from kiln.codegen.gpu.nvrtc import compile_cuda
from kiln.schedule.gpu import SCHEDULE_ATTR, schedule_and_lower
from kiln.schedule.gpu.linalg import BK, TILE_THREADS, register_tile
from kiln.target import Target
from kiln.testing.op_testing import scheduled
from kiln.tir.functor import post_order_visit
from kiln.tir.gpu import KernelLaunch

OPENCL = Target("opencl")
CUDA = Target("cuda", arch="sm_90")
RNG = np.random.default_rng(3)


def _lowered(name: str, arrays: list[np.ndarray], target: Target):
    func, _ = scheduled(name, arrays, {}, schedule=False)
    return schedule_and_lower(func.with_attr("op_name", name), target)


def _launches(func) -> list[KernelLaunch]:
    out: list[KernelLaunch] = []
    post_order_visit(func.body, lambda n: out.append(n) if isinstance(n, KernelLaunch) else None)
    return out


@pytest.mark.parametrize("name,a_shape,b_shape", [
    ("matmul", (128, 96), (96, 192)),             # 8 x 4 register tiles
    ("matmul", (256, 32), (32, 128)),             # 8 x 8
    ("matmul", (2, 3, 64, 32), (2, 3, 32, 128)),
    ("matmul", (2, 64, 48), (48, 64)),            # B broadcast over the batch
    ("dense", (128, 48), (64, 48)),
    ("dense", (2, 64, 32), (128, 32)),            # leading rows on blockIdx.z
    ("dense", (4, 16, 32), (64, 32)),             # rows fused (16 fills no tile)
])
def test_tiled_gemm_matches_numpy_on_opencl(name, a_shape, b_shape):
    a = RNG.standard_normal(a_shape).astype("float32")
    b = RNG.standard_normal(b_shape).astype("float32")
    sched, lowered = _lowered(name, [a, b], OPENCL)
    assert sched.attrs[SCHEDULE_ATTR] == "op"
    (launch,) = _launches(lowered)
    assert launch.threads_per_block == TILE_THREADS * TILE_THREADS
    # the shared tiles hold one reduction step, not the whole reduction (fused rows: the
    # interval analysis of i // 16, i % 16 over a tile overestimates the rows, within 2x)
    sizes = sorted(int(np.prod([d.value for d in s.shape])) for s in launch.shared)
    n = b_shape[-1] if name == "matmul" else b_shape[0]
    sms = OPENCL.gpu.multiprocessors
    batch = int(np.prod(a_shape[:-2]))
    tile = register_tile(a_shape[-2], n, batch, sms) or register_tile(batch * a_shape[-2], n, 1,
                                                                      sms)
    bm, bn = TILE_THREADS * tile[0], TILE_THREADS * tile[1]
    if register_tile(a_shape[-2], n):
        assert sizes == sorted([bm * BK, BK * bn])
    else:
        assert sum(sizes) <= 2 * (bm + bn) * BK
    ref = a @ (b if name == "matmul" else b.T)
    out = np.full(ref.shape, np.nan, "float32")
    gpu_build({"f": lowered}, OPENCL)["f"](a, b, out)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


def test_shapes_the_tiles_do_not_divide_get_the_generic_rules():
    a = RNG.standard_normal((100, 96)).astype("float32")
    b = RNG.standard_normal((96, 64)).astype("float32")
    sched, lowered = _lowered("matmul", [a, b], OPENCL)
    assert sched.attrs[SCHEDULE_ATTR] == "rules"
    out = np.zeros((100, 64), "float32")
    gpu_build({"f": lowered}, OPENCL)["f"](a, b, out)
    np.testing.assert_allclose(out, a @ b, rtol=1e-4, atol=1e-4)


def test_fused_bias_and_relu_fold_into_the_write_back():
    bb = g.BlockBuilder()
    x = g.Var("x", g.TensorStructInfo((64, 48), "float32"))
    w = g.const(RNG.standard_normal((128, 48)).astype("float32"))
    bias = g.const(RNG.standard_normal((128,)).astype("float32"))
    with bb.function("main"):
        with bb.dataflow():
            y = bb.emit_output(op.nn.relu(op.add(op.linalg.dense(x, w), bias)))
        bb.emit_func_output(y, params=[x])
    mod = bb.get()
    exe = kiln.build(mod, OPENCL)
    funcs = exe.module.program.functions
    assert [len(f.kernels) for f in funcs.values()] == [1]  # one kernel: the epilogue inside
    xs = RNG.standard_normal((64, 48)).astype("float32")
    np.testing.assert_allclose(exe(xs), kiln.build(mod, "c")(xs), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_large_gemm_compiles_within_the_limits(dtype):
    arrays = [np.zeros((2048, 2048), dtype)] * 2
    sched, lowered = _lowered("matmul", arrays, CUDA)
    assert sched.attrs[SCHEDULE_ATTR] == "op"
    (launch,) = _launches(lowered)
    assert [x.value for x in launch.grid[:2]] == [2048 // 128, 2048 // 128]  # 8 x 8 tiles
    res = compile_cuda(gpu_build({"f": lowered}, CUDA).program.source, "sm_90").resources()
    (usage,) = res.values()
    assert usage.spill_stores == usage.spill_loads == 0
    assert usage.registers * TILE_THREADS ** 2 <= CUDA.gpu.max_registers_per_block


def test_register_tiles_keep_every_multiprocessor_busy():
    sms = CUDA.gpu.multiprocessors
    assert sms == 132
    assert register_tile(4096, 4096, 1, sms) == (8, 8)       # 1024 blocks of 128 x 128
    assert register_tile(128, 768, 8, sms) == (4, 4)         # the encoder's projections: 192
    assert register_tile(128, 3072, 8, sms) == (8, 8)        # its first FFN product: 192
    assert register_tile(128, 128, 96, sms) == (8, 4)        # attention scores, 96 heads
    assert register_tile(64, 64, 1, sms) == (4, 4)           # too small for any: the most
    assert register_tile(100, 64) is None
