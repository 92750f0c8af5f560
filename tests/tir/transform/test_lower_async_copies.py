"""pipeline_async_copies: the multi-stage pipeline of asynchronous global->shared copies of a
loop annotated ASYNC_STAGES (stages of each shared tile, one wait and one barrier per step), run
on OpenCL (PoCL: the copies are plain ones there, so the stage rotation and the barrier
placement are what the numbers check), its CUDA spelling, and its refusals."""

from __future__ import annotations

import numpy as np
import pytest

from kiln import tir
from kiln.codegen.gpu.build import build as gpu_build
from kiln.ir.errors import LoweringError
from kiln.target import Target
from kiln.testing.tir_testing import elementwise_func
from kiln.tir import Schedule
from kiln.tir.expr import Call
from kiln.tir.gpu import ASYNC_COMMIT, ASYNC_COPY, ASYNC_WAIT, KernelLaunch, is_barrier
from kiln.tir.stmt import Evaluate, For, IfThenElse
from kiln.tir.transform import lower
from kiln.tir.transform.async_copies import ASYNC_STAGES, PIPELINED

OPENCL = Target("opencl")
CUDA = Target("cuda", arch="sm_80")
RNG = np.random.default_rng(5)


def _steps(stages: int, lanes: int = 4, rows: int = 64) -> Schedule:
    """out[i, j] = x[i, j] + 1 for ``rows`` x 128 float32, each block's 32 columns walked in
    steps of 8 rows: x staged through shared memory per step, the copy shared by the 32
    threads in vectors of ``lanes`` (4: 16 bytes), the step loop pipelined over ``stages``."""
    sch = Schedule(elementwise_func((rows, 128), "float32", lambda x: x + 1.0))
    blk = sch.get_block("out")
    i, j = sch.get_loops(blk)
    jo, ji = sch.split(j, [None, 32])
    io, ii = sch.split(i, [None, 8])
    sch.reorder(jo, ji, io, ii)
    sch.bind(jo, "blockIdx.x")
    sch.bind(ji, "threadIdx.x")
    copy = sch.cache_read(blk, 0, "shared")
    sch.compute_at(copy, io, cooperative=True)
    a, b = sch.get_loops(copy)[-2:]
    fused = sch.fuse(a, b)
    _, tx, vec = sch.split(fused, [None, 32, lanes])
    sch.bind(tx, "threadIdx.x")
    if lanes > 1:
        sch.vectorize(vec)
    if stages:
        sch.annotate(io, ASYNC_STAGES, stages)
    return sch


def _kernel(func) -> KernelLaunch:
    out = []
    tir.post_order_visit(func.body, lambda n: out.append(n) if isinstance(n, KernelLaunch)
                         else None)
    (k,) = out
    return k


def _calls(stmt, op) -> int:
    found = []
    tir.post_order_visit(stmt, lambda n: found.append(n) if isinstance(n, Call) and n.op == op
                         else None)
    return len(found)


def _kind(s) -> str:
    if is_barrier(s):
        return "barrier"
    if isinstance(s, Evaluate) and isinstance(s.value, Call):
        return s.value.op
    return type(s).__name__


@pytest.mark.parametrize("stages", [2, 3, 4])
def test_pipeline_shape_stages_and_numerics(stages):
    lowered = lower(_steps(stages).func, OPENCL)
    k = _kernel(lowered)
    (shared,) = k.shared
    assert shared.shape[0].value == stages * 8 * 32  # one 8 x 32 tile per stage
    loops = []
    tir.post_order_visit(k.body, lambda n: loops.append(n) if isinstance(n, For)
                         and n.annotations.get(PIPELINED) else None)
    (step,) = loops
    kinds = [_kind(s) for s in step.body.seq]
    # wait for this step's tile, one barrier, the copy stages - 1 steps ahead, commit, compute
    assert kinds[:5] == [ASYNC_WAIT, "barrier", "IfThenElse", ASYNC_COMMIT, "For"]
    assert kinds.count("barrier") == 1  # thread_sync added none
    assert step.body.seq[0].value.args[0].value == stages - 2
    # the prologue's stages - 1 groups and the loop's: one 16-byte copy statement each
    assert _calls(k.body, ASYNC_COMMIT) == stages
    assert _calls(k.body, ASYNC_COPY) == stages
    x = RNG.standard_normal((64, 128)).astype("float32")
    out = np.full_like(x, np.nan)
    gpu_build({"f": lowered}, OPENCL)["f"](x, out)
    np.testing.assert_array_equal(out, x + 1.0)


def test_fewer_steps_than_stages():
    """16 rows: 2 steps under 4 stages (the prologue issues both, then empty groups)."""
    lowered = lower(_steps(4, rows=16).func, OPENCL)
    x = RNG.standard_normal((16, 128)).astype("float32")
    out = np.full_like(x, np.nan)
    gpu_build({"f": lowered}, OPENCL)["f"](x, out)
    np.testing.assert_array_equal(out, x + 1.0)


@pytest.mark.parametrize("lanes,async_copies", [(4, 3), (2, 3), (1, 0)])
def test_chunks_of_4_8_16_bytes_and_scalar_copies_that_stay_synchronous(lanes, async_copies):
    """16- and 8-byte vectors become one async copy each; a scalar copy (4 bytes, no vector
    loop) stays a plain copy into its stage -- still rotated, still right."""
    lowered = lower(_steps(3, lanes).func, OPENCL)
    assert _calls(lowered.body, ASYNC_COPY) == async_copies
    source = gpu_build({"f": lowered}, OPENCL).program.source
    assert ("/* a synchronous copy: its innermost loop is not vectorized */" in source) == (
        lanes == 1)
    x = RNG.standard_normal((64, 128)).astype("float32")
    out = np.full_like(x, np.nan)
    gpu_build({"f": lowered}, OPENCL)["f"](x, out)
    np.testing.assert_array_equal(out, x + 1.0)


def test_cuda_spelling():
    source = gpu_build({"f": lower(_steps(3).func, CUDA)}, CUDA).program.source
    assert "cp.async.cg.shared.global [%0], [%1], 16;" in source
    assert source.count('asm volatile("cp.async.commit_group;"') == 3
    assert 'asm volatile("cp.async.wait_group 1;"' in source
    assert "__cvta_generic_to_shared" in source
    source = gpu_build({"f": lower(_steps(2, 2).func, CUDA)}, CUDA).program.source
    assert "cp.async.ca.shared.global [%0], [%1], 8;" in source
    assert 'asm volatile("cp.async.wait_group 0;"' in source


def test_bad_stage_counts_and_loops_are_refused():
    with pytest.raises(LoweringError, match="5 stages"):
        lower(_steps(5).func, OPENCL)
    sch = Schedule(elementwise_func((64, 128), "float32", lambda x: x + 1.0))
    i, j = sch.get_loops(sch.get_block("out"))
    sch.bind(i, "blockIdx.x")
    jo, ji = sch.split(j, [None, 32])
    sch.bind(ji, "threadIdx.x")
    sch.annotate(jo, ASYNC_STAGES, 2)
    with pytest.raises(LoweringError, match="async copies of loop .* must begin with copies"):
        lower(sch.func, OPENCL)


def test_the_copies_run_ahead_of_the_barrier_that_publishes_them():
    """The stage a step's copies write is the previous step's: the copy of step k + S - 1 comes
    after the barrier of step k (which every thread passes only once done with step k - 1)."""
    lowered = lower(_steps(3).func, OPENCL)
    loops = []
    tir.post_order_visit(lowered.body, lambda n: loops.append(n) if isinstance(n, For)
                         and n.annotations.get(PIPELINED) else None)
    (step,) = loops
    guard = step.body.seq[2]
    assert isinstance(guard, IfThenElse)
    assert _calls(guard, ASYNC_COPY) == 1
    assert "% 3" in str(guard) or "floormod" in str(guard)
