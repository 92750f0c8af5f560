"""prefetch_shared_copies: the two-stage pipeline of a loop that copies into shared memory
(registers hold the next step's part of the copy), and its refusals."""

from __future__ import annotations

import numpy as np
import pytest

from kiln import tir
from kiln.codegen.gpu.build import build as gpu_build
from kiln.ir.errors import LoweringError
from kiln.target import Target
from kiln.testing.tir_testing import elementwise_func
from kiln.tir import Schedule
from kiln.tir.gpu import KernelLaunch, is_barrier
from kiln.tir.stmt import Allocate, BufferStore, For, IfThenElse
from kiln.tir.transform import lower
from kiln.tir.transform.prefetch_copies import PREFETCH

OPENCL = Target("opencl")


def _row_sums(prefetch: bool) -> Schedule:
    """out[i, j] = x[i, j] + 1 for 64 x 128, each block's 32 columns walked in 4 steps of
    8 rows: x staged through shared memory per step, the copy shared by the threads."""
    sch = Schedule(elementwise_func((64, 128), "float32", lambda x: x + 1.0))
    blk = sch.get_block("out")
    i, j = sch.get_loops(blk)
    jo, ji = sch.split(j, [None, 32])
    io, ii = sch.split(i, [None, 8])
    sch.reorder(jo, ji, io, ii)
    sch.bind(jo, "blockIdx.x")
    sch.bind(ji, "threadIdx.x")
    copy = sch.cache_read(blk, 0, "shared")
    sch.compute_at(copy, io)
    a, b = sch.get_loops(copy)[-2:]
    fused = sch.fuse(a, b)
    _, tx = sch.split(fused, [None, 32])
    sch.bind(tx, "threadIdx.x")
    if prefetch:
        sch.annotate(io, PREFETCH, 1)
    return sch


def _kernel(func) -> KernelLaunch:
    out = []
    tir.post_order_visit(func.body, lambda n: out.append(n) if isinstance(n, KernelLaunch)
                         else None)
    (k,) = out
    return k


@pytest.mark.parametrize("prefetch", [False, True])
def test_pipelined_copy_runs_and_loads_the_next_step_before_the_barrier(prefetch):
    lowered = lower(_row_sums(prefetch).func, OPENCL)
    k = _kernel(lowered)
    regs = []
    tir.post_order_visit(k.body, lambda n: regs.append(n.buffer) if isinstance(
        n, Allocate) and n.buffer.name.endswith("_prefetch") else None)
    assert [(b.name, b.shape[0].value) for b in regs] == ([("x0_shared_prefetch", 8)]
                                                          if prefetch else [])
    if prefetch:
        loops = []
        tir.post_order_visit(k.body, lambda n: loops.append(n) if isinstance(n, For) and any(
            isinstance(s, IfThenElse) for s in getattr(n.body, "seq", ())) else None)
        (step,) = loops
        kinds = [type(s).__name__ if not is_barrier(s) else "barrier" for s in step.body.seq]
        # registers -> shared, next loads, barrier, compute, barrier
        assert kinds.index("IfThenElse") < kinds.index("barrier")
        stores = []
        tir.post_order_visit(step.body.seq[kinds.index("IfThenElse")], lambda n: stores.append(
            n.buffer.name) if isinstance(n, BufferStore) else None)
        assert set(stores) == {"x0_shared_prefetch"}
    x = np.random.default_rng(0).standard_normal((64, 128)).astype("float32")
    out = np.full_like(x, np.nan)
    gpu_build({"f": lowered}, OPENCL)["f"](x, out)
    np.testing.assert_allclose(out, x + 1.0)


def test_a_loop_without_leading_copies_is_refused():
    sch = Schedule(elementwise_func((64, 128), "float32", lambda x: x + 1.0))
    i, j = sch.get_loops(sch.get_block("out"))
    sch.bind(i, "blockIdx.x")
    jo, ji = sch.split(j, [None, 32])
    sch.bind(ji, "threadIdx.x")
    sch.annotate(jo, PREFETCH, 1)
    with pytest.raises(LoweringError, match="prefetch of loop .* must begin with copies"):
        lower(sch.func, OPENCL)
