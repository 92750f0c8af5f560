"""float16/bfloat16 GEMMs on tensor cores (kiln/schedule/gpu/linalg.py schedule_mma_gemm,
kiln/tir/tensor_intrin/gpu.py): the schedule run on OpenCL (PoCL: each thread computes its part
of every mma in float32) against numpy, every knob value, epilogues, the fallback to the tiled
GEMM, and the CUDA kernels compiled by NVRTC: mma.sync instructions, accumulators in registers,
padded shared rows; the cp.async pipelines (knob gpu_mma_async_stages) on PoCL for every stage
count and in NVRTC's PTX. The same kernels run on an H100 in
tests/runtime/test_runtime_gpu_cuda.py."""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest

import kiln
from kiln.arith.analyzer import simplify as simplify_expr
from kiln.build import lower_graph
from kiln.codegen.executable import build_executable
from kiln.codegen.gpu.build import build as gpu_build
from kiln.codegen.gpu.nvrtc import compile_arch, compile_cuda
from kiln.schedule.gpu import SCHEDULE_ATTR, schedule_and_lower
from kiln.schedule.gpu.linalg import (
    MMA_BK_CHOICES,
    MMA_TILES,
    MMA_WARPS,
    mma_column_chunks,
    mma_column_order,
    mma_row_order,
    mma_tile,
)
from kiln.target import Target
from kiln.testing import models
from kiln.testing.gpu_testing import kernel_launches, mma_calls
from kiln.testing.op_testing import scheduled
from kiln.tir.expr import Call, const
from kiln.tir.functor import post_order_visit
from kiln.tir.gpu import ASYNC_COPY
from kiln.tir.tensor_intrin.gpu import MMA_SYNC, MMA_TILE, WGMMA
from kiln.tir.transform.permute_layout import permuted_index

OPENCL = Target("opencl")
RNG = np.random.default_rng(11)
NP = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


def _lowered(name, arrays, target, knobs=None):
    func, _ = scheduled(name, arrays, {}, schedule=False)
    return schedule_and_lower(func.with_attr("op_name", name), target, knobs)


def _check(out, a, b, dtype):
    """float32 sums rounded once to ``dtype``: within one rounding of the exact product."""
    exact = np.matmul(a.astype("float64"), b.astype("float64"))
    eps = 2.0 ** (-10 if dtype == "float16" else -7)
    err = np.abs(out.astype("float64") - exact)
    assert np.all(err <= eps * np.abs(exact) + 1e-3 * np.abs(exact).max()), err.max()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("a_shape,b_shape", [
    ((128, 64), (64, 64)),
    ((256, 96), (96, 128)),           # 3 reduction steps of 32
    ((2, 3, 128, 32), (2, 3, 32, 64)),  # batch on blockIdx.z
    ((2, 128, 48), (48, 64)),          # B broadcast over the batch, k = 48 (bk 16)
])
def test_mma_gemm_matches_numpy_on_opencl(dtype, a_shape, b_shape):
    a = RNG.uniform(-1, 1, a_shape).astype(NP[dtype])
    b = RNG.uniform(-1, 1, b_shape).astype(NP[dtype])
    knobs = {"gpu_mma_bk": 16} if a_shape[-1] == 48 else None
    sched, lowered = _lowered("matmul", [a, b], OPENCL, knobs)
    assert sched.attrs[SCHEDULE_ATTR] == "op"
    assert mma_calls(lowered) > 0
    out = np.full(np.broadcast_shapes(a_shape[:-2], b_shape[:-2]) + (a_shape[-2], b_shape[-1]),
                  np.nan, NP[dtype])
    gpu_build({"f": lowered}, OPENCL)["f"](a, b, out)
    _check(out, a, b, dtype)


@pytest.mark.parametrize("warps,tiles,bk", [
    *[(w, (2, 4), 32) for w in MMA_WARPS],
    *[((1, 1), t, 32) for t in MMA_TILES],
    *[((2, 2), (1, 1), k) for k in MMA_BK_CHOICES],
])
def test_every_mma_knob_value_computes_the_product(warps, tiles, bk):
    a = RNG.uniform(-1, 1, (128, 128)).astype(np.float16)
    b = RNG.uniform(-1, 1, (128, 128)).astype(np.float16)
    knobs = {"gpu_mma_warps": warps, "gpu_mma_tiles": tiles, "gpu_mma_bk": bk,
             "gpu_mma_stages": 2 if bk == 64 else 1}
    sched, lowered = _lowered("matmul", [a, b], OPENCL, knobs)
    assert sched.attrs[SCHEDULE_ATTR] == "op"
    (launch,) = kernel_launches(lowered)
    assert launch.threads_per_block == warps[0] * warps[1] * 32
    assert mma_calls(lowered) == 1  # in the unrolled loops over the warp's tiles
    out = np.zeros((128, 128), np.float16)
    gpu_build({"f": lowered}, OPENCL)["f"](a, b, out)
    _check(out, a, b, "float16")


def test_shared_rows_are_padded_against_bank_conflicts():
    """The per-mma route (knob gpu_mma_fragments off): A's rows (bk 32) 34 elements apart,
    B's 65 (64 columns; 130 for 128 columns with NI = 8: 4-byte aligned): the lanes' fragment
    loads fall on distinct banks (kiln.tir.transform.compact_buffers.STORAGE_ALIGN)."""
    a = np.zeros((128, 64), np.float16)
    b = np.zeros((64, 64), np.float16)
    _, lowered = _lowered("matmul", [a, b], OPENCL, {"gpu_mma_tiles": (4, 4), "gpu_mma_bk": 32,
                                                       "gpu_mma_fragments": False})
    (launch,) = kernel_launches(lowered)
    sizes = {s.name: int(s.shape[0].value) for s in launch.shared}
    assert sizes == {"in0_shared": 127 * 34 + 32, "in1_shared": 31 * 65 + 64}
    _, lowered = _lowered("matmul", [a, np.zeros((64, 128), np.float16)], OPENCL,
                          {"gpu_mma_tiles": (4, 8), "gpu_mma_bk": 32, "gpu_mma_fragments": False})
    (launch,) = kernel_launches(lowered)
    sizes = {s.name: int(s.shape[0].value) for s in launch.shared}
    assert sizes == {"in0_shared": 127 * 34 + 32, "in1_shared": 31 * 130 + 128}
    # a batched product's tiles carry a batch dimension of 1: the rows are padded under it
    # (the padding used to go to the batch stride, leaving the rows on the same banks)
    _, lowered = _lowered("matmul", [np.zeros((2, 128, 64), np.float16),
                                     np.zeros((2, 64, 64), np.float16)], OPENCL,
                          {"gpu_mma_tiles": (4, 4), "gpu_mma_bk": 32,
                           "gpu_mma_fragments": False})
    (launch,) = kernel_launches(lowered)
    sizes = {s.name: int(s.shape[0].value) for s in launch.shared}
    assert sizes == {"in0_shared": 127 * 34 + 32, "in1_shared": 31 * 65 + 64}


def test_shapes_the_tiles_do_not_fit_take_the_tiled_gemm():
    a = np.zeros((64, 64), np.float16)
    b = np.zeros((64, 128), np.float16)
    # a 128 x 128 block tile does not divide 64 rows: the SIMT tiled GEMM takes the product
    sched, lowered = _lowered("matmul", [a, b], OPENCL, {"gpu_mma_tiles": (4, 8)})
    assert sched.attrs[SCHEDULE_ATTR] == "op" and mma_calls(lowered) == 0
    (launch,) = kernel_launches(lowered)
    assert launch.threads_per_block == 16 * 16  # the tiled GEMM's 16 x 16 threads
    _, lowered = _lowered("matmul", [a, b], OPENCL, {"gpu_gemm_mma": False})
    assert mma_calls(lowered) == 0
    _, lowered = _lowered("matmul", [a, b], OPENCL)
    assert mma_calls(lowered) == 1  # the default picks a tile that divides


def test_mma_tiles_prefer_large_tiles_that_keep_every_multiprocessor_busy():
    assert mma_tile(4096, 4096, 1, (2, 2), 132) == (4, 4)   # 2048 blocks of 128 x 64
    assert mma_tile(128, 768, 8, (2, 2), 132) == (2, 4)     # 192 blocks of 64 x 64
    assert mma_tile(128, 128, 1, (2, 2), 132) == (1, 1)     # none fills: the most blocks
    assert mma_tile(80, 64, 1, (2, 2), 132) is None          # 80 rows: no multiple of 32


def test_float32_gemms_stay_off_the_tensor_cores():
    a = np.zeros((128, 64), np.float32)
    b = np.zeros((64, 64), np.float32)
    _, lowered = _lowered("matmul", [a, b], OPENCL)
    assert mma_calls(lowered) == 0


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_dense_with_bias_and_relu_on_tensor_cores_matches_the_cpu(dtype):
    mod = models.dense_bias_relu((4, 64, 64), RNG.uniform(-1, 1, (128, 64)).astype(NP[dtype]),
                                 RNG.uniform(-1, 1, (128,)).astype(NP[dtype]))
    exe = kiln.build(mod, OPENCL)
    (func,) = exe.module.program.functions.values()
    assert len(func.kernels) == 1  # bias and relu folded into the write-back
    xs = RNG.uniform(-1, 1, (4, 64, 64)).astype(NP[dtype])
    got = np.asarray(exe(xs)).astype("float64")
    ref = np.asarray(kiln.build(mod, "c")(xs)).astype("float64")
    tol = 2.0 ** (-9 if dtype == "float16" else -6)
    np.testing.assert_allclose(got, ref, rtol=tol, atol=tol * np.abs(ref).max())


@pytest.mark.parametrize("arch,dtype", list(itertools.product(["sm_80", "sm_90"],
                                                               ["float16", "bfloat16"])))
def test_mma_gemm_compiles_to_mma_sync_with_register_accumulators(arch, dtype):
    target = Target("cuda", arch=arch)
    arrays = [np.zeros((4096, 4096), NP[dtype])] * 2
    sched, lowered = _lowered("matmul", arrays, target)
    assert sched.attrs[SCHEDULE_ATTR] == "op"
    (launch,) = kernel_launches(lowered)
    source = gpu_build({"f": lowered}, target).program.source
    binary = compile_cuda(source, arch)
    short = "f16" if dtype == "float16" else "bf16"
    ptx = binary.ptx.decode(errors="replace")
    assert f"mma.sync.aligned.m16n8k16.row.col.f32.{short}.{short}.f32" in ptx
    (usage,) = binary.resources().values()
    # the float32 accumulators stay in registers (constant indices once unrolled)
    assert usage.stack_bytes == 0 and "ld.local" not in ptx
    assert usage.spill_stores == usage.spill_loads == 0
    assert usage.registers * launch.threads_per_block <= target.gpu.max_registers_per_block
    assert usage.shared_bytes <= target.gpu.shared_memory_per_block


# ---- cp.async pipelines (knob gpu_mma_async_stages; kiln.tir.transform.async_copies) --------

def _async_copies(lowered) -> int:
    found = []
    post_order_visit(lowered.body, lambda n: found.append(n) if isinstance(n, Call)
                     and n.op == ASYNC_COPY else None)
    return len(found)


@pytest.mark.parametrize("stages", [2, 3, 4])
@pytest.mark.parametrize("a_shape,b_shape,bk", [
    ((256, 128), (128, 256), 32),       # 4 steps: every stage rotates
    ((128, 96), (96, 64), 16),          # 6 steps of 16
    ((2, 3, 64, 64), (2, 3, 64, 64), 32),  # batch on blockIdx.z (rows padded under it)
    ((2, 64, 48), (48, 64), 16),        # B broadcast over the batch
    ((64, 32), (32, 64), 16),           # 2 steps: fewer than 3 or 4 stages
])
def test_async_pipeline_matches_numpy_on_opencl(stages, a_shape, b_shape, bk):
    """PoCL runs the copies as plain ones at the place of the cp.async: a wrong stage, a
    missing wait's barrier or a copy into the stage still being read changes the numbers."""
    a = RNG.uniform(-1, 1, a_shape).astype(np.float16)
    b = RNG.uniform(-1, 1, b_shape).astype(np.float16)
    knobs = {"gpu_mma_bk": bk, "gpu_mma_async_stages": stages}
    sched, lowered = _lowered("matmul", [a, b], OPENCL, knobs)
    assert sched.attrs[SCHEDULE_ATTR] == "op"
    assert mma_calls(lowered) > 0
    # A and B: one copy statement per step of the prologue (stages - 1, at most the steps),
    # one in the loop unless the prologue issued every step (then its guard simplifies away)
    steps = a_shape[-1] // bk
    assert _async_copies(lowered) == 2 * (min(stages - 1, steps) + (steps > stages - 1))
    (launch,) = kernel_launches(lowered)
    for buf in launch.shared:  # rows 8 mod 16 elements apart: 16-byte chunks, aligned
        assert int(buf.shape[0].value) % (stages * 8) == 0
    out = np.full(np.broadcast_shapes(a_shape[:-2], b_shape[:-2]) + (a_shape[-2], b_shape[-1]),
                  np.nan, np.float16)
    gpu_build({"f": lowered}, OPENCL)["f"](a, b, out)
    _check(out, a, b, "float16")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_dense_with_bias_on_an_async_pipeline_matches_the_cpu(dtype):
    mod = models.dense_bias_relu((4, 64, 64), RNG.uniform(-1, 1, (128, 64)).astype(NP[dtype]),
                                 RNG.uniform(-1, 1, (128,)).astype(NP[dtype]))
    knobs = {"gpu_mma_async_stages": 3}
    exe = build_executable(lower_graph(mod, OPENCL), OPENCL, knobs=lambda f, t: knobs)
    xs = RNG.uniform(-1, 1, (4, 64, 64)).astype(NP[dtype])
    got = np.asarray(exe(xs)).astype("float64")
    ref = np.asarray(kiln.build(mod, "c")(xs)).astype("float64")
    tol = 2.0 ** (-9 if dtype == "float16" else -6)
    np.testing.assert_allclose(got, ref, rtol=tol, atol=tol * np.abs(ref).max())


def test_async_pipelines_beyond_the_shared_memory_are_refused():
    """4 stages of 128 x 64 and 64 x 256 tiles: 208 KB, over sm_80's 163 KB (the tiled GEMM
    takes the product) but within sm_90's 227 KB."""
    arrays = [np.zeros((256, 512), np.float16), np.zeros((512, 512), np.float16)]
    knobs = {"gpu_mma_warps": (2, 4), "gpu_mma_tiles": (4, 8), "gpu_mma_bk": 64,
             "gpu_mma_async_stages": 4}
    _, lowered = _lowered("matmul", arrays, Target("cuda", arch="sm_80"), knobs)
    assert mma_calls(lowered) == 0 and _async_copies(lowered) == 0
    _, lowered = _lowered("matmul", arrays, Target("cuda", arch="sm_90"), knobs)
    assert mma_calls(lowered) == 1 and _async_copies(lowered) == 8


@pytest.mark.parametrize("arch,stages", [("sm_80", 3), ("sm_90", 3), ("sm_90", 4)])
def test_async_pipeline_compiles_to_cp_async_without_spills(arch, stages):
    target = Target("cuda", arch=arch)
    arrays = [np.zeros((4096, 4096), np.float16)] * 2
    knobs = {"gpu_mma_tiles": (4, 8), "gpu_mma_bk": 32, "gpu_mma_async_stages": stages}
    _, lowered = _lowered("matmul", arrays, target, knobs)
    (launch,) = kernel_launches(lowered)
    program = gpu_build({"f": lowered}, target).program
    binary = compile_cuda(program.source, arch)
    ptx = binary.ptx.decode(errors="replace")
    assert "cp.async.cg.shared.global" in ptx and "cp.async.commit_group" in ptx
    assert f"cp.async.wait_group {stages - 2}" in ptx
    assert "mma.sync.aligned.m16n8k16" in ptx
    (usage,) = binary.resources().values()
    assert usage.stack_bytes == 0 and "ld.local" not in ptx
    assert usage.spill_stores == usage.spill_loads == 0
    assert usage.registers * launch.threads_per_block <= target.gpu.max_registers_per_block
    (kernel,) = program.functions["f"].kernels
    shared = usage.shared_bytes + kernel.dynamic_shared_bytes
    assert shared >= stages * 2 * (127 * 40 + 32 + 31 * 136 + 128)
    assert shared <= target.gpu.shared_memory_per_block_optin


# ---- ldmatrix and the mma row order of A's tile (knob gpu_mma_ldmatrix) ---------------------

def _mma_row_strides(lowered) -> set[int]:
    """The A row strides the lowered mma calls pass: their sixth argument, the difference of
    two ``kiln.elem_offset`` calls (A[1, 0] and A[0, 0]), as the difference of their indices."""
    out = set()

    def visit(n):
        if isinstance(n, Call) and n.op == MMA_SYNC:
            second, first = (c.args[0].indices[0] for c in (n.args[5].a, n.args[5].b))
            out.add(int(simplify_expr(second - first).value))

    post_order_visit(lowered.body, visit)
    return out


@pytest.mark.parametrize("warps,tiles,bk,stages", [
    ((2, 2), (4, 4), 32, 0),
    ((1, 1), (1, 1), 16, 0),     # MI = 1: the row order is (m, h, g) = (h, g)
    ((4, 2), (2, 4), 64, 0),
    ((2, 2), (4, 8), 32, 3),     # with the cp.async pipeline (and B's chunk layout)
    ((2, 4), (2, 2), 16, 2),
])
def test_ldmatrix_row_order_computes_the_product_on_opencl(warps, tiles, bk, stages):
    """PoCL's mma reads each lane's own rows through the permuted tile with the permuted row
    stride (8 padded rows): a layout the copies and the fragment reads disagree on, or a
    wrong stride, changes the numbers."""
    a = RNG.uniform(-1, 1, (256, 128)).astype(np.float16)
    b = RNG.uniform(-1, 1, (128, 128)).astype(np.float16)
    knobs = {"gpu_mma_warps": warps, "gpu_mma_tiles": tiles, "gpu_mma_bk": bk,
             "gpu_mma_ldmatrix": True, "gpu_mma_async_stages": stages,
             "gpu_mma_b_chunks": True, "gpu_mma_fragments": False}
    sched, lowered = _lowered("matmul", [a, b], OPENCL, knobs)
    assert sched.attrs[SCHEDULE_ATTR] == "op" and mma_calls(lowered) == 1
    assert _mma_row_strides(lowered) == {8 * (bk + 8)}  # rows 8 mod 16 elements, h 8 rows on
    out = np.full((256, 128), np.nan, np.float16)
    gpu_build({"f": lowered}, OPENCL)["f"](a, b, out)
    _check(out, a, b, "float16")


def test_async_pipelines_order_the_rows_of_a_as_well():
    """16-byte rows 8 mod 16 apart need the mma row order for conflict-free fragment loads."""
    a = np.zeros((256, 64), np.float16)
    b = np.zeros((64, 128), np.float16)
    per_mma = {"gpu_mma_bk": 32, "gpu_mma_fragments": False}
    _, lowered = _lowered("matmul", [a, b], OPENCL, {**per_mma, "gpu_mma_async_stages": 2})
    assert _mma_row_strides(lowered) == {8 * 40}
    _, lowered = _lowered("matmul", [a, b], OPENCL, per_mma)
    assert _mma_row_strides(lowered) == {34}  # the per-mma route alone: unpermuted, 2 mod 4


@pytest.mark.parametrize("arch,knobs", [
    ("sm_80", {}),
    ("sm_90", {"gpu_mma_tiles": (4, 8), "gpu_mma_bk": 32}),
    ("sm_90", {"gpu_mma_tiles": (4, 8), "gpu_mma_bk": 64, "gpu_mma_async_stages": 3}),
])
def test_ldmatrix_compiles_without_spills(arch, knobs):
    target = Target("cuda", arch=arch)
    arrays = [np.zeros((4096, 4096), np.float16)] * 2
    _, lowered = _lowered("matmul", arrays, target, {**knobs, "gpu_mma_ldmatrix": True,
                                                      "gpu_mma_fragments": False})
    (launch,) = kernel_launches(lowered)
    binary = compile_cuda(gpu_build({"f": lowered}, target).program.source, arch)
    ptx = binary.ptx.decode(errors="replace")
    assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in ptx
    assert "mma.sync.aligned.m16n8k16" in ptx
    (usage,) = binary.resources().values()
    assert usage.stack_bytes == 0 and usage.spill_stores == usage.spill_loads == 0
    assert usage.registers * launch.threads_per_block <= target.gpu.max_registers_per_block


@pytest.mark.parametrize("warps,mi,ni", [((2, 2), 4, 8), ((1, 4), 2, 8), ((4, 1), 1, 8)])
def test_permuted_layouts_match_the_cuda_fragment_addressing(warps, mi, ni):
    """What PoCL cannot check: the CUDA helpers find other lanes' operands from their own
    address. A: ldmatrix's lane group g' row of mma m is (g' - g) tile rows from lane group
    g's, its second row (h = 1) 8 rows on. B: lane t' 's column of mma j is (t' - t) * L + e
    columns from lane t's, L = 8 with the chunk layout (NI = 8, async pipelines)."""
    wy, wx = warps

    def at(layout, x):
        _, radices, order = layout
        return int(simplify_expr(permuted_index(const("int64", x), radices, order)).value)

    rows = mma_row_order(wy, mi)
    for w, m, g, g2, h in itertools.product(range(wy), range(mi), range(8), range(8), range(2)):
        own = at(rows, w * 16 * mi + g * 2 * mi + 2 * m)
        assert at(rows, w * 16 * mi + g2 * 2 * mi + 2 * m + h) - own == (g2 - g) + 8 * h
    cols = mma_column_chunks(wx, ni)
    for w, j, t, t2, e in itertools.product(range(wx), range(ni), range(4), range(4), range(2)):
        own = at(cols, w * 8 * ni + t * 2 * ni + 2 * j)
        assert at(cols, w * 8 * ni + t2 * 2 * ni + 2 * j + e) - own == (t2 - t) * 8 + e


@pytest.mark.parametrize("tiles,stages,chunks,lane_cols", [
    ((2, 8), 2, True, 8), ((2, 8), 2, False, 16), ((2, 8), 0, True, 16), ((2, 4), 2, True, 8)])
def test_the_mma_calls_pass_the_layouts_lane_stride(tiles, stages, chunks, lane_cols):
    """The L the CUDA helper steps between lanes' B columns: 8 in the chunk layout (knob
    gpu_mma_b_chunks, async pipelines, NI = 8), 2 NI otherwise (the addressing above is checked
    against it)."""
    a = np.zeros((64, 64), np.float16)
    b = np.zeros((64, 256), np.float16)
    knobs = {"gpu_mma_warps": (1, 1), "gpu_mma_tiles": tiles, "gpu_mma_bk": 32,
             "gpu_mma_async_stages": stages, "gpu_mma_b_chunks": chunks,
             "gpu_mma_fragments": False}
    _, lowered = _lowered("matmul", [a, b], OPENCL, knobs)
    found = set()
    post_order_visit(lowered.body, lambda n: found.add(int(n.args[7].value)) if isinstance(
        n, Call) and n.op == MMA_SYNC else None)
    assert found == {lane_cols}


# ---- the warp-tile intrinsic (knob gpu_mma_fragments, the default) -------------------------

def _tile_calls(lowered) -> list[Call]:
    calls: list[Call] = []
    post_order_visit(lowered.body, lambda n: calls.append(n) if isinstance(n, Call)
                     and n.op == MMA_TILE else None)
    return calls


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("warps,tiles,bk,stages,shape", [
    ((2, 2), (4, 8), 32, 3, (256, 128, 256)),
    ((2, 2), (4, 4), 64, 0, (256, 128, 128)),     # register prefetch, no cp.async
    ((1, 1), (1, 1), 16, 2, (64, 48, 64)),        # NI odd: CUDA's ldmatrix.x2.trans
    ((2, 4), (2, 2), 16, 4, (2, 128, 64, 128)),   # batched, four stages
    ((4, 2), (2, 8), 32, 2, (128, 96, 128)),
])
def test_fragment_tiles_compute_the_product_on_opencl(dtype, warps, tiles, bk, stages, shape):
    """PoCL runs the warp-tile intrinsic's thread view through the same permuted tiles (A's
    rows in mma order, B's columns in (block, lane, pair) order) the CUDA helper's ldmatrix
    addressing assumes: a copy and a fragment read that disagree change the numbers."""
    *batch, m, k, n = shape
    a = RNG.uniform(-1, 1, (*batch, m, k)).astype(NP[dtype])
    b = RNG.uniform(-1, 1, (*batch, k, n)).astype(NP[dtype])
    knobs = {"gpu_mma_warps": warps, "gpu_mma_tiles": tiles, "gpu_mma_bk": bk,
             "gpu_mma_async_stages": stages, "gpu_mma_fragments": True}
    sched, lowered = _lowered("matmul", [a, b], OPENCL, knobs)
    calls = _tile_calls(lowered)
    assert sched.attrs[SCHEDULE_ATTR] == "op" and len(calls) == 1
    assert [int(x.value) for x in calls[0].args[-2:]] == list(tiles)
    out = np.full((*batch, m, n), np.nan, NP[dtype])
    gpu_build({"f": lowered}, OPENCL)["f"](a, b, out)
    _check(out, a, b, dtype)


@pytest.mark.parametrize("warps,mi,ni", [((2, 2), 4, 8), ((1, 4), 2, 8), ((4, 1), 1, 3)])
def test_fragment_layouts_match_the_cuda_ldmatrix_addressing(warps, mi, ni):
    """What PoCL cannot check: the CUDA helper (kiln_mma_tile_*) finds the other lanes' rows
    and columns from its own address. A: the thread's logical row i is 8 i tile rows after its
    first, lane group g' 's row of mma m is 16 m + (g' - g) rows on. B: the thread's logical
    column 2 n + e is 8 n + e after its first, lane t's first is 2 t after the warp's."""
    wy, wx = warps

    def at(layout, x):
        _, radices, order = layout
        return int(simplify_expr(permuted_index(const("int64", x), radices, order)).value)

    rows = mma_row_order(wy, mi)
    for w, g, i in itertools.product(range(wy), range(8), range(2 * mi)):
        first = at(rows, w * 16 * mi + g * 2 * mi)
        assert first == w * 16 * mi + g
        assert at(rows, w * 16 * mi + g * 2 * mi + i) - first == 8 * i
    cols = mma_column_order(wx, ni)
    for w, t, j in itertools.product(range(wx), range(4), range(2 * ni)):
        first = at(cols, w * 8 * ni + t * 2 * ni)
        assert first == w * 8 * ni + 2 * t
        assert at(cols, w * 8 * ni + t * 2 * ni + j) - first == 8 * (j // 2) + j % 2


@pytest.mark.parametrize("arch,step", [("sm_90", (64, 3)), ("sm_80", (64, 3)), ("sm_89", (32, 3))])
def test_default_gemm_takes_the_warp_tile_route_and_fits_the_target(arch, step):
    """By default a 4096^3 float16 product takes 64 x 64 warp tiles (4 x 8 mma), 64-deep steps
    in three cp.async stages where the target's shared memory holds them (sm_89's 99 KB: 32
    deep), fragments by ldmatrix (.trans for B), and compiles without spills."""
    target = Target("cuda", arch=arch)
    arrays = [np.zeros((4096, 4096), np.float16)] * 2
    _, lowered = _lowered("matmul", arrays, target)
    (call,) = _tile_calls(lowered)
    assert [int(x.value) for x in call.args[-2:]] == [4, 8]
    (launch,) = kernel_launches(lowered)
    bk, stages = step
    sizes = {s.name: int(s.shape[0].value) for s in launch.shared}
    assert sizes["in0_shared"] % stages == 0 and sizes["in0_shared"] // stages >= 127 * (
        bk + 8) + bk
    binary = compile_cuda(gpu_build({"f": lowered}, target).program.source, arch)
    ptx = binary.ptx.decode(errors="replace")
    assert "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in ptx
    assert ptx.count("mma.sync.aligned.m16n8k16") == 32 * bk // 16
    assert "cp.async.cg.shared.global" in ptx and "cp.async.ca.shared.global" in ptx
    (usage,) = binary.resources().values()
    assert usage.stack_bytes == 0 and usage.spill_stores == usage.spill_loads == 0
    assert usage.registers * launch.threads_per_block <= target.gpu.max_registers_per_block


def _wgmma_calls(lowered) -> list[Call]:
    calls: list[Call] = []
    post_order_visit(lowered.body, lambda n: calls.append(n) if isinstance(n, Call)
                     and n.op == WGMMA else None)
    return calls


@pytest.mark.parametrize("dtype,shape,wgmma_shape,bk,stages", [
    ("float16", (256, 128, 256), (2, 1, 16), 64, 3),     # the default tile, 128 x 128
    ("bfloat16", (2, 64, 64, 128), (1, 1, 8), 16, 4),    # batched, 64 x 64, four stages
])
def test_wgmma_route_computes_the_product_on_opencl(dtype, shape, wgmma_shape, bk, stages):
    """PoCL runs the wgmma intrinsic's thread view: each thread's outputs read from the shared
    tiles through the descriptors' address arithmetic (kiln.tir.tensor_intrin.wgmma), from the
    warpgroup's start found the way the CUDA helper finds it -- a layout, an LBO/SBO or a
    thread placement that disagreed would change the numbers. (About 20 s each on PoCL; the
    other shapes of WGMMA_SHAPES: ``benchmarks/gpu_mma_knobs.py --pocl``.)"""
    *batch, m, k, n = shape
    a = RNG.uniform(-1, 1, (*batch, m, k)).astype(NP[dtype])
    b = RNG.uniform(-1, 1, (*batch, k, n)).astype(NP[dtype])
    knobs = {"gpu_mma_wgmma": True, "gpu_wgmma_shape": wgmma_shape, "gpu_mma_bk": bk,
             "gpu_mma_async_stages": stages}
    sched, lowered = _lowered("matmul", [a, b], OPENCL, knobs)
    (call,) = _wgmma_calls(lowered)
    assert [int(x.value) for x in call.args[7:9]] == list(wgmma_shape[1:])
    (launch,) = kernel_launches(lowered)
    assert launch.threads_per_block == 128 * wgmma_shape[0]
    out = np.full((*batch, m, n), np.nan, NP[dtype])
    gpu_build({"f": lowered}, OPENCL)["f"](a, b, out)
    _check(out, a, b, dtype)


def test_wgmma_dense_reads_its_weight_k_major_on_opencl():
    """``dense`` (x @ W.T) reads B as W[n, k]: K-major (imm-trans-b 0), stored like A and
    copied 16 bytes at a time; x's leading axes fused into rows, a block's 128 rows spanning
    two batch entries (the layouts flatten the whole tile)."""
    x = RNG.uniform(-1, 1, (2, 64, 128)).astype(np.float16)
    w = RNG.uniform(-1, 1, (128, 128)).astype(np.float16)
    _, lowered = _lowered("dense", [x, w], OPENCL, {"gpu_mma_wgmma": True})
    (call,) = _wgmma_calls(lowered)
    assert int(call.args[12].value) == 0  # B's major: K
    out = np.full((2, 64, 128), np.nan, np.float16)
    gpu_build({"f": lowered}, OPENCL)["f"](x, w, out)
    _check(out, x, np.swapaxes(w, 0, 1), "float16")


@pytest.mark.parametrize("target,why", [
    (Target("cuda", arch="sm_80"), "sm_90 (sm_90a) instruction"),
    (Target("opencl"), "not a multiple"),
])
def test_wgmma_refusals_fall_back_to_the_mma_route(target, why, caplog):
    """sm_80 has no wgmma; a 48-column product fits no block tile: both take the mma.sync
    warp tiles, and the log says why."""
    n = 48 if target.kind == "opencl" else 128
    arrays = [np.zeros((128, 64), np.float16), np.zeros((64, n), np.float16)]
    with caplog.at_level("WARNING"):
        _, lowered = _lowered("matmul", arrays, target, {"gpu_mma_wgmma": True})
    assert not _wgmma_calls(lowered) and mma_calls(lowered) > 0
    assert why in caplog.text and "not on wgmma" in caplog.text


@pytest.mark.parametrize("op,knobs", [
    ("matmul", {}),
    ("matmul", {"gpu_wgmma_shape": (2, 1, 32), "gpu_mma_async_stages": 3}),
    ("dense", {}),
])
def test_wgmma_compiles_for_sm90a_without_spills(op, knobs):
    """4096^3 float16 on Target("cuda", arch="sm_90") with the knob on: NVRTC compiles it for
    sm_90a; the PTX holds wgmma.mma_async (4 per 64-deep step and product; B transposed for
    matmul's B[k, n], not for dense's W[n, k]), the fence, commit and a wait that leaves the
    step's group in flight but at the last step (the 4-stage pipeline's overlap: the step
    before's products waited for, the copies two steps ahead, ``cp.async.wait_group 1``),
    and the proxy fence
    before the barriers; ptxas reports no spills, serializes no wgmma (its warning C7514)
    and the shared tiles fit the target's opt-in shared memory. Without the knob the route is
    off."""
    target = Target("cuda", arch="sm_90")
    arrays = [np.zeros((4096, 4096), np.float16)] * 2
    _, lowered = _lowered(op, arrays, target, {"gpu_mma_wgmma": True, **knobs})
    (call,) = _wgmma_calls(lowered)
    (launch,) = kernel_launches(lowered)
    shared = sum(int(s.shape[0].value) * 2 for s in launch.shared)
    assert shared <= target.gpu.shared_memory_per_block_optin
    source = gpu_build({"f": lowered}, target).program.source
    assert compile_arch(source, "sm_90") == "sm_90a"
    binary = compile_cuda(source, "sm_90")  # compile_arch: sm_90a
    ptx = binary.ptx.decode(errors="replace")
    n = 8 * int(call.args[8].value)
    # (nvcc may unroll the step loop: a multiple of a step's products)
    products = ptx.count(f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.f16.f16")
    assert products > 0 and products % (4 * int(call.args[7].value)) == 0
    assert ptx.count(f"p, 1, 1, 0, {int(op == 'matmul')}; }}") == products
    assert len(call.args) == 17  # pending: every step but the last leaves its products
    assert "k_0 < 63" in source.replace("(", "").replace(")", "")
    stages = knobs.get("gpu_mma_async_stages", 4)  # the copies S - 2 steps ahead
    for instruction in ("wgmma.fence.sync.aligned", "wgmma.commit_group.sync.aligned",
                        "wgmma.wait_group.sync.aligned 1", "wgmma.wait_group.sync.aligned 0",
                        "fence.proxy.async.shared::cta", "cp.async.cg.shared.global",
                        f"cp.async.wait_group {stages - 3}"):
        assert instruction in ptx
    (usage,) = binary.resources().values()
    assert usage.stack_bytes == 0 and usage.spill_stores == usage.spill_loads == 0
    assert "serialized" not in binary.log and "C7514" not in binary.log
    _, default = _lowered(op, arrays, target)
    assert not _wgmma_calls(default)


@pytest.mark.parametrize("knobs,tile_rows", [
    ({"gpu_mma_warps": (2, 2), "gpu_mma_tiles": (1, 1)}, 32),           # mma.sync warp tiles
    ({"gpu_mma_wgmma": True, "gpu_wgmma_shape": (1, 1, 8), "gpu_mma_bk": 32,
      "gpu_mma_async_stages": 3}, 64),                                    # wgmma, pipelined
])
def test_grouped_blocks_compute_the_product_on_opencl(knobs, tile_rows):
    """The tensor-core routes' blocks in groups of row tiles (knob gpu_mma_group_rows,
    bind_blocks): 8 row tiles in groups of 4 -- ``blockIdx.x`` the row tile in its group,
    ``y`` the column tile, ``z`` the group -- compute the product PoCL checks against numpy
    (the 4096^3 default, grouped by 8, ran on the H100 bit-identical to cuBLAS); with 1 the
    tiles keep the row-major grid."""
    m, k, n = 8 * tile_rows, 64, 64
    a = RNG.uniform(-1, 1, (m, k)).astype(np.float16)
    b = RNG.uniform(-1, 1, (k, n)).astype(np.float16)
    grids = {}
    for group in (4, 1):
        _, lowered = _lowered("matmul", [a, b], OPENCL, {**knobs, "gpu_mma_group_rows": group})
        assert mma_calls(lowered) > 0 or _wgmma_calls(lowered)
        (launch,) = kernel_launches(lowered)
        grids[group] = tuple(int(x.value) for x in launch.grid)
        out = np.full((m, n), np.nan, np.float16)
        gpu_build({"f": lowered}, OPENCL)["f"](a, b, out)
        _check(out, a, b, "float16")
    columns = n // (tile_rows if "gpu_mma_wgmma" in knobs else 16)
    assert grids[1] == (columns, 8, 1)  # row-major: columns on x, the 8 row tiles on y
    assert grids[4] == (4, columns, 2)  # the row tile in its group, the column, the group
