"""ThreadAllreduce expansion: warp shuffles on CUDA, shared-memory trees on OpenCL, checked on
the lowered TIR and, on OpenCL (PoCL), by running it."""

from __future__ import annotations

import numpy as np
import pytest

from kiln import tir
from kiln.codegen.gpu.build import build
from kiln.ir.errors import LoweringError
from kiln.target import Target
from kiln.testing.tir_testing import gpu_row_reduce_func
from kiln.tir.gpu import SHFL, SHFL_DOWN, KernelLaunch, ThreadAllreduce
from kiln.tir.transform import lower

RNG = np.random.default_rng(3)


def _calls(func, op):
    out = []
    tir.post_order_visit(func.body, lambda n: out.append(n) if isinstance(n, tir.Call)
                         and n.op == op else None)
    return out


def _kernel(func) -> KernelLaunch:
    out = []
    tir.post_order_visit(func.body, lambda n: out.append(n) if isinstance(n, KernelLaunch)
                         else None)
    return out[0]


@pytest.mark.parametrize("threads,shuffles,shared", [(32, 5 + 1, 0), (128, 10 + 1, 4 * 4)])
def test_cuda_uses_warp_shuffles(threads, shuffles, shared):
    func = lower(gpu_row_reduce_func(16, 1000, threads=threads), Target("cuda", arch="sm_90"))
    k = _kernel(func)
    assert len(_calls(k, SHFL_DOWN)) + len(_calls(k, SHFL)) == shuffles
    assert sum(b.shape[0].value * 4 for b in k.shared) == shared
    tir.post_order_visit(k, lambda n: None if not isinstance(n, ThreadAllreduce) else
                         pytest.fail("not expanded"))


def test_opencl_uses_a_shared_memory_tree():
    func = lower(gpu_row_reduce_func(16, 1000, threads=96), Target("opencl"))
    k = _kernel(func)
    assert not _calls(k, SHFL_DOWN) and [b.shape[0].value for b in k.shared] == [96]


@pytest.mark.parametrize("reducer", ["sum", "max", "min"])
@pytest.mark.parametrize("threads,rows", [(128, 1), (96, 1), (16, 4), (64, 2)])
def test_tree_reductions_run_on_opencl(reducer, threads, rows):
    n, m = 12, 777
    func = gpu_row_reduce_func(n, m, threads=threads, reducer=reducer, rows_per_block=rows)
    mod = build({"r": func}, Target("opencl"))
    x = RNG.standard_normal((n, m)).astype("float32")
    out = np.full((n,), np.nan, "float32")
    mod["r"](x, out)
    ref = {"sum": np.sum, "max": np.max, "min": np.min}[reducer](x, axis=1)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-4)


def test_groups_must_be_numbered_consecutively():
    """Rows on threadIdx.x and the reduction on threadIdx.y: a group's threads are strided."""
    from kiln import te
    from kiln.tir import Schedule

    x = te.placeholder((8, 64), "float32", name="x")
    k = te.reduce_axis((0, 64), name="k")
    out = te.compute((8,), lambda i: te.sum(x[i, k], axis=k), name="out")
    sch = Schedule(te.create_prim_func([x, out]))
    i, r = sch.get_loops(sch.get_block("out"))
    io, ii = sch.split(i, [None, 4])
    ro, ri = sch.split(r, [None, 16])
    sch.reorder(io, ii, ri, ro)
    sch.bind(io, "blockIdx.x")
    sch.bind(ii, "threadIdx.x")
    sch.bind(ri, "threadIdx.y")
    with pytest.raises(LoweringError, match="numbered consecutively.*threadIdx.x"):
        lower(sch.func, Target("opencl"))
