"""The tiled GEMM schedules of matmul and dense (kiln/schedule/gpu/linalg.py): run on OpenCL
(PoCL) against numpy, compiled with NVRTC within the limits, shared tiles of one reduction step
copied cooperatively, float32 accumulation of 16-bit products, the knobs, epilogues folded into
the write-back, and the generic rules where the tiles do not fit."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import kiln
from kiln.codegen.gpu.build import build as gpu_build
from kiln.codegen.gpu.nvrtc import compile_cuda
from kiln.schedule.gpu import SCHEDULE_ATTR, schedule_and_lower
from kiln.schedule.gpu.linalg import (
    BK,
    STAGES,
    TILE_THREADS,
    register_tile,
    schedule_matmul,
)
from kiln.schedule.knobs import active_schedule
from kiln.target import Target
from kiln.testing import models
from kiln.testing.gpu_testing import kernel_launches
from kiln.testing.op_testing import scheduled
from kiln.tir import Schedule
from kiln.tir.functor import post_order_visit
from kiln.tir.gpu import KernelLaunch
from kiln.tir.stmt import Allocate, BufferStore, For

OPENCL = Target("opencl")
CUDA = Target("cuda", arch="sm_90")
RNG = np.random.default_rng(3)


def _lowered(name: str, arrays: list[np.ndarray], target: Target, knobs=None):
    func, _ = scheduled(name, arrays, {}, schedule=False)
    return schedule_and_lower(func.with_attr("op_name", name), target, knobs)


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
    (launch,) = kernel_launches(lowered)
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


@pytest.mark.parametrize("name,a_shape,b_shape", [
    ("matmul", (100, 96), (96, 64)),
    ("matmul", (3, 97, 61), (61, 53)),      # primes, batch
    ("matmul", (2, 128, 67), (2, 67, 64)),  # a prime reduction under dividing M and N
    ("dense", (5, 31, 17), (13, 17)),
])
def test_shapes_the_tiles_do_not_divide_get_the_generic_rules(name, a_shape, b_shape):
    a = RNG.standard_normal(a_shape).astype("float32")
    b = RNG.standard_normal(b_shape).astype("float32")
    sched, lowered = _lowered(name, [a, b], OPENCL)
    assert sched.attrs[SCHEDULE_ATTR] == "rules"
    ref = a @ (b if name == "matmul" else b.T)
    out = np.full(ref.shape, np.nan, "float32")
    gpu_build({"f": lowered}, OPENCL)["f"](a, b, out)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


def test_fused_bias_and_relu_fold_into_the_write_back():
    mod = models.dense_bias_relu((64, 48), RNG.standard_normal((128, 48)).astype("float32"),
                                 RNG.standard_normal((128,)).astype("float32"))
    exe = kiln.build(mod, OPENCL)
    funcs = exe.module.program.functions
    assert [len(f.kernels) for f in funcs.values()] == [1]  # one kernel: the epilogue inside
    xs = RNG.standard_normal((64, 48)).astype("float32")
    np.testing.assert_allclose(exe(xs), kiln.build(mod, "c")(xs), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_large_gemm_compiles_within_the_limits(dtype):
    arrays = [np.zeros((2048, 2048), dtype)] * 2
    # the tiled GEMM (float16 goes to the tensor cores by default: tests/.../test_mma_*)
    sched, lowered = _lowered("matmul", arrays, CUDA, {"gpu_gemm_mma": False})
    assert sched.attrs[SCHEDULE_ATTR] == "op"
    (launch,) = kernel_launches(lowered)
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


def _shared_copies(launch: KernelLaunch) -> dict[str, int]:
    """Per shared buffer: the elements one thread stores into it per reduction step (the
    extents of the loops inside the step loop around the store, times its lanes)."""
    shared = {b.data for b in launch.shared}
    out: dict[str, int] = {}

    def walk(s, loops):
        if isinstance(s, For):
            walk(s.body, [*loops, s])
        elif isinstance(s, BufferStore):
            if s.buffer.data in shared:
                n = int(np.prod([lp.extent.value for lp in loops[1:]])) * s.value.dtype.lanes
                out[s.buffer.name] = out.get(s.buffer.name, 0) + n
        else:
            for child in _children(s):
                walk(child, loops)

    walk(launch.body, [])
    return out


def _children(s):
    for name in ("body", "then_case", "else_case"):
        c = getattr(s, name, None)
        if c is not None:
            yield c
    yield from getattr(s, "seq", ())


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_each_tile_element_is_loaded_once_per_block(dtype):
    """The threads share the copy of a tile: each stores tile / threads elements per step
    (before, each thread copied every row or column it reads: 16x the loads)."""
    a = RNG.standard_normal((256, 64)).astype(dtype)
    b = RNG.standard_normal((64, 128)).astype(dtype)
    _, lowered = _lowered("matmul", [a, b], OPENCL, {"gpu_gemm_mma": False})
    (launch,) = kernel_launches(lowered)
    threads = launch.threads_per_block
    per_thread = _shared_copies(launch)
    sizes = {s.name: int(np.prod([d.value for d in s.shape])) for s in launch.shared}
    assert set(per_thread) == set(sizes)
    assert all(per_thread[n] * threads == sizes[n] for n in sizes), (per_thread, sizes)
    out = np.full((256, 128), np.nan, dtype)
    gpu_build({"f": lowered}, OPENCL)["f"](a, b, out)
    ref = a.astype("float64") @ b.astype("float64")
    tol = 1e-4 if dtype == "float32" else 2e-3
    np.testing.assert_allclose(out, ref, rtol=tol, atol=tol * np.abs(ref).max())


@pytest.mark.parametrize("shape", [(2, 3, 128, 1024, 64), (1, 1, 64, 2048, 128)])
def test_half_gemm_accumulates_in_float32(shape):
    """float16 products summed in float32 registers and rounded once (as torch/cuBLAS): the
    error is float16's rounding of the result, where float16 sums of 1024-2048 products
    were off by several units in the last place (2.7e-2 on the H100 at 4096)."""
    *batch, m, k, n = shape
    a = RNG.uniform(-1, 1, (*batch, m, k)).astype("float16")
    b = RNG.uniform(-1, 1, (k, n)).astype("float16")
    sched, lowered = _lowered("matmul", [a, b], OPENCL)
    assert sched.attrs[SCHEDULE_ATTR] == "op"
    (launch,) = kernel_launches(lowered)
    accs = []
    post_order_visit(launch.body, lambda x: accs.append(x.buffer) if isinstance(
        x, Allocate) and x.buffer.scope == "local" else None)
    assert [str(buf.dtype) for buf in accs if buf.name == "matmul_local"] == ["float32"]
    out = np.zeros((*batch, m, n), "float16")
    gpu_build({"f": lowered}, OPENCL)["f"](a, b, out)
    exact = a.astype("float64") @ b.astype("float64")
    rounded = exact.astype("float16").astype("float64")
    err = np.abs(out.astype("float64") - exact)
    # float32 sums of k products: within one float16 rounding of the exact result (plus
    # float32's own error, far below it)
    assert np.all(err <= np.abs(rounded - exact) + 2 ** -10 * np.abs(exact) + 1e-3)
    assert np.mean(out.astype("float64") == rounded) > 0.95


def test_knobs_name_every_tile_decision_and_take_other_values():
    a = RNG.standard_normal((2, 128, 96)).astype("float32")
    b = RNG.standard_normal((96, 64)).astype("float32")
    func, _ = scheduled("matmul", [a, b], {}, schedule=False)
    sch = Schedule(func.with_attr("op_name", "matmul"))
    with active_schedule(sch):
        schedule_matmul(sch, OPENCL)
    assert sch.knob_decisions() == {"gpu_gemm_threads": TILE_THREADS,
                                    "gpu_gemm_register_tile": register_tile(
                                        128, 64, 2, OPENCL.gpu.multiprocessors),
                                    "gpu_gemm_bk": BK, "gpu_gemm_stages": STAGES}
    knobs = {"gpu_gemm_threads": 8, "gpu_gemm_register_tile": (4, 8), "gpu_gemm_bk": 32,
             "gpu_gemm_stages": 1}
    sched, lowered = _lowered("matmul", [a, b], OPENCL, knobs)
    assert sched.attrs[SCHEDULE_ATTR] == "op"
    (launch,) = kernel_launches(lowered)
    assert launch.threads_per_block == 64
    assert _prefetch_registers(launch) == []  # one stage: no registers between the steps
    assert sorted(int(np.prod([d.value for d in s.shape])) for s in launch.shared) == [
        32 * 32, 32 * 64]
    out = np.zeros((2, 128, 64), "float32")
    gpu_build({"f": lowered}, OPENCL)["f"](a, b, out)
    np.testing.assert_allclose(out, a @ b, rtol=1e-4, atol=1e-4)
    # a tile the product does not fill: the generic rules take it
    sched, _ = _lowered("matmul", [a, b], OPENCL, {"gpu_gemm_register_tile": (8, 8)})
    assert sched.attrs[SCHEDULE_ATTR] == "rules"


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_gemm_compiles_for_ampere_and_hopper_within_the_limits(arch, dtype):
    target = Target("cuda", arch=arch)
    np_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype
    arrays = [np.zeros((4096, 4096), np_dtype)] * 2
    func, _ = scheduled("matmul", arrays, {}, schedule=False)
    sched, lowered = schedule_and_lower(func.with_attr("op_name", "matmul"), target)
    assert sched.attrs[SCHEDULE_ATTR] == "op"
    (launch,) = kernel_launches(lowered)
    source = gpu_build({"f": lowered}, target).program.source
    (usage,) = compile_cuda(source, arch).resources().values()
    assert usage.spill_stores == usage.spill_loads == 0
    assert usage.registers * launch.threads_per_block <= target.gpu.max_registers_per_block
    assert usage.shared_bytes <= target.gpu.shared_memory_per_block
    if dtype != "float32":
        assert "float matmul_local[" in source  # the float32 accumulator


def _prefetch_registers(launch: KernelLaunch) -> list[tuple[str, int]]:
    out = []
    post_order_visit(launch.body, lambda x: out.append(
        (x.buffer.name, int(x.buffer.shape[0].value))) if isinstance(
        x, Allocate) and x.buffer.name.endswith("_prefetch") else None)
    return out


@pytest.mark.parametrize("name,a_shape,b_shape", [
    ("matmul", (3, 128, 80), (3, 80, 64)),   # batch, K of 5 steps
    ("dense", (256, 48), (128, 48)),        # 3 steps
])
def test_two_stages_load_the_next_tiles_into_registers_during_the_step(name, a_shape, b_shape):
    """Two stages (the default): each thread holds its part of the next step's tiles in
    registers (tile / threads elements per operand), stored into shared memory at the next
    step; results as numpy's."""
    a = RNG.standard_normal(a_shape).astype("float32")
    b = RNG.standard_normal(b_shape).astype("float32")
    _, lowered = _lowered(name, [a, b], OPENCL)
    (launch,) = kernel_launches(lowered)
    sizes = {s.name: int(np.prod([d.value for d in s.shape])) for s in launch.shared}
    assert sorted(_prefetch_registers(launch)) == sorted(
        (f"{n}_prefetch", size // launch.threads_per_block) for n, size in sizes.items())
    ref = a @ (b if name == "matmul" else b.T)
    out = np.full(ref.shape, np.nan, "float32")
    gpu_build({"f": lowered}, OPENCL)["f"](a, b, out)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)
