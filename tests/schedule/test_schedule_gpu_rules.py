"""The generic GPU schedule rules: which rule takes which stage, thread counts from the target,
and the fallbacks (outermost loop per thread, one-thread kernels) that keep every PrimFunc
correct. Numerics of every op on OpenCL: KILN_TEST_TARGETS=c,opencl over tests/op."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from kiln import te, tir
from kiln.codegen.gpu.build import build
from kiln.codegen.gpu.nvrtc import compile_cuda
from kiln.ir.errors import ScheduleError
from kiln.schedule.gpu import SCHEDULE_ATTR, schedule_and_lower
from kiln.target import Target
from kiln.testing.op_testing import scheduled
from kiln.testing.tir_testing import elementwise_func
from kiln.tir.gpu import KernelLaunch

OPENCL = Target("opencl", attrs={"max_threads_per_block": 256})


def _kernels(func):
    out = []
    tir.post_order_visit(func.body, lambda n: out.append(n) if isinstance(n, KernelLaunch)
                         else None)
    return out


def _tags(func):
    return {str(n.annotations.get("kiln.thread_tag")) for n in _loops(func)
            if n.kind == tir.ForKind.THREAD_BINDING}


def _loops(func):
    out = []
    tir.post_order_visit(func.body, lambda n: out.append(n) if isinstance(n, tir.For) else None)
    return out


def _reduce(shape, axis):
    x = te.placeholder(shape, "float32", name="x")
    k = te.reduce_axis((0, shape[axis]), name="k")
    if axis == len(shape) - 1:
        out = te.compute(shape[:-1], lambda *i: te.sum(x[(*i, k)], axis=k), name="out")
    else:
        out = te.compute(shape[1:], lambda *i: te.sum(x[(k, *i)], axis=k), name="out")
    return te.create_prim_func([x, out])


def test_elementwise_nests_fuse_over_blocks_threads_and_float4():
    sched, lowered = schedule_and_lower(elementwise_func((64, 256), "float32",
                                                         lambda a: a * 2.0), OPENCL)
    assert sched.attrs[SCHEDULE_ATTR] == "rules" and _tags(sched) == {"blockIdx.x",
                                                                       "threadIdx.x"}
    assert any(lp.kind == tir.ForKind.VECTORIZED for lp in _loops(sched))
    (k,) = _kernels(lowered)
    assert k.block[0].value == 256 and k.grid[0].value == 64 * 256 // (256 * 4)


def test_thread_count_follows_the_target():
    small = Target("opencl", attrs={"max_threads_per_block": 64})
    _, lowered = schedule_and_lower(elementwise_func((1000,), "float32", lambda a: a + 1.0),
                                    small)
    (k,) = _kernels(lowered)
    assert k.block[0].value == 64


def test_row_reduction_gets_a_cross_thread_reduction():
    sched, lowered = schedule_and_lower(_reduce((16, 700), 1), OPENCL)
    assert _tags(sched) == {"blockIdx.x", "threadIdx.x"}
    (k,) = _kernels(lowered)
    assert k.grid[0].value == 16 and k.shared  # the shared-memory tree of the reduction


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_16_bit_row_reductions_sum_in_float32_on_opencl(dtype):
    """A float16/bfloat16 matmul no tile divides (17 x 1000 x 19: the generic rules' row
    reduction over a block of threads) within one rounding of the float64 product plus the
    float32 summation bound; its partial sums were 16-bit before (1.8x the bound, float16)."""
    npdt = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}[dtype]
    rng = np.random.default_rng(7)
    a = rng.uniform(0, 1, (17, 1000)).astype(npdt)
    b = rng.uniform(0, 1, (1000, 19)).astype(npdt)
    func, _ = scheduled("matmul", [a, b], {}, schedule=False)
    sched, lowered = schedule_and_lower(func.with_attr("op_name", "matmul"), OPENCL)
    assert sched.attrs[SCHEDULE_ATTR] == "rules" and _kernels(lowered)[0].shared
    out = np.zeros((17, 19), npdt)
    build({"f": lowered}, OPENCL)["f"](a, b, out)
    exact = a.astype(np.float64) @ b.astype(np.float64)  # positive: |products| sum to it
    unit = {"float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}[dtype]
    err = np.abs(out.astype(np.float64) - exact)
    assert np.all(err <= unit * exact + 1000 * 2.0 ** -24 * exact), (err / exact).max()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_16_bit_column_reductions_sum_in_float32_on_opencl(dtype):
    """One thread per output: a float32 register, stored rounded once."""
    npdt = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}[dtype]
    _, lowered = schedule_and_lower(_sum_func((700, 48), 0, dtype), OPENCL)
    (kern,) = _kernels(lowered)
    assert not kern.shared
    data = np.random.default_rng(8).uniform(0, 1, (700, 48)).astype(npdt)
    got = np.zeros(48, npdt)
    build({"f": lowered}, OPENCL)["f"](data, got)
    exact = data.astype(np.float64).sum(axis=0)
    unit = {"float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}[dtype]
    err = np.abs(got.astype(np.float64) - exact)
    assert np.all(err <= unit * exact + 700 * 2.0 ** -24 * exact), (err / exact).max()


def _sum_func(shape, axis, dtype):
    """``x.sum(axis)`` of a 2-D ``x``."""
    x = te.placeholder(shape, dtype, name="x")
    k = te.reduce_axis((0, shape[axis]), name="k")
    out = te.compute((shape[1 - axis],), lambda i: te.sum(
        x[i, k] if axis else x[k, i], axis=k), name="out")
    return te.create_prim_func([x, out])


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_16_bit_reductions_compile_with_nvrtc(arch):
    """The float32 accumulators of 16-bit row (warp shuffles of float32) and column
    reductions in CUDA: NVRTC compiles them, in registers."""
    target = Target("cuda", arch=arch)
    funcs = {}
    for dtype in ("float16", "bfloat16"):
        for axis, shape in ((1, (16, 700)), (0, (700, 48))):
            funcs[f"{dtype}_{axis}"] = schedule_and_lower(_sum_func(shape, axis, dtype),
                                                          target)[1]
    usage = compile_cuda(build(funcs, target).program.source, arch).resources()
    assert len(usage) == 4
    assert all(r.spill_stores == r.stack_bytes == 0 for r in usage.values()), usage


def test_column_reduction_gets_one_thread_per_output():
    sched, lowered = schedule_and_lower(_reduce((700, 48), 0), OPENCL)
    (k,) = _kernels(lowered)
    assert not k.shared and k.block[0].value == 64  # 48 outputs -> one warp-sized block


def test_sequential_stage_runs_one_iteration_per_thread_or_one_thread():
    """A running sum along the rows: the row loop is data parallel, the inner one not."""
    x = te.placeholder((6, 50), "float32", name="x")
    k = te.reduce_axis((0, 50), name="k")
    cum = te.compute((6, 50), lambda i, j: te.sum(x[i, k], axis=k, where=k <= j), name="cum")
    sched, lowered = schedule_and_lower(te.create_prim_func([x, cum]), OPENCL)
    assert sched.attrs[SCHEDULE_ATTR] == "rules"
    mod = build({"f": lowered}, OPENCL)
    xs = np.random.default_rng(0).standard_normal((6, 50)).astype("float32")
    out = np.zeros_like(xs)
    mod["f"](xs, out)
    np.testing.assert_allclose(out, np.cumsum(xs, 1), rtol=1e-5, atol=1e-5)


def test_registered_op_schedule_comes_first_and_a_failing_one_falls_back(monkeypatch):
    from kiln.op.registry import get_op_def
    from kiln.testing.op_testing import scheduled

    x = np.zeros((8, 8), "float32")
    func, _ = scheduled("relu", [x], {}, schedule=False)
    func = func.with_attr("op_name", "relu")
    opdef = get_op_def("relu")
    monkeypatch.setattr(opdef, "schedules", dict(opdef.schedules))

    def by_hand(sch, target):
        i, j = sch.get_loops(sch.get_child_blocks(sch.get_block("root"))[0])
        sch.bind(i, "blockIdx.x")
        sch.bind(j, "threadIdx.x")

    opdef.schedules["gpu"] = by_hand  # (the registry refuses a second entry: set it here)
    sched, _ = schedule_and_lower(func, OPENCL)
    assert sched.attrs[SCHEDULE_ATTR] == "op"

    def broken(sch, target):
        raise ScheduleError("not for this shape")

    opdef.schedules["gpu"] = broken
    sched, _ = schedule_and_lower(func, OPENCL)
    assert sched.attrs[SCHEDULE_ATTR] == "rules"
