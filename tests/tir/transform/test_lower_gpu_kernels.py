"""extract_kernels: kernels, launch shapes, SPMD form, allocation placement, limits."""

from __future__ import annotations

import pytest

from kiln import te, tir
from kiln.ir.errors import LoweringError
from kiln.target import Target
from kiln.testing.tir_testing import elementwise_func, gpu_tiled_matmul_func
from kiln.tir import Schedule
from kiln.tir import stmt as S
from kiln.tir.gpu import KernelLaunch
from kiln.tir.transform import lower

OPENCL = Target("opencl", attrs={"max_threads_per_block": 256})
CUDA = Target("cuda", arch="sm_90")


def _kernels(func) -> list[KernelLaunch]:
    out = []
    tir.post_order_visit(func.body, lambda n: out.append(n) if isinstance(n, KernelLaunch)
                         else None)
    return out


def _bound(shape, split, tags=("blockIdx.x", "threadIdx.x"), name="out"):
    sch = Schedule(elementwise_func(shape, "float32", lambda x: x + 1.0, name=name))
    loops = sch.get_loops(sch.get_block(name))
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    a, b = sch.split(fused, [None, split])
    sch.bind(a, tags[0])
    sch.bind(b, tags[1])
    return sch


def test_launch_shape_and_guard_of_a_partial_block():
    (k,) = _kernels(lower(_bound((10, 10), 32).func, OPENCL))
    assert [e.value for e in k.grid] == [4, 1, 1] and [e.value for e in k.block] == [32, 1, 1]
    assert sorted(tag for _, tag in k.env) == ["blockIdx.x", "threadIdx.x"]
    text = str(k)
    assert "if i0_i1_fused_0 * 32 + i0_i1_fused_1 < 100" in text  # the split's predicate
    assert "for" not in text.split("env(")[-1]  # no loop left: SPMD


def test_symbolic_grid_and_thread_guard():
    n = tir.Var("n", "int64")
    a = te.placeholder((n,), "float32", name="a")
    b = te.compute((n,), lambda i: a[i] * 2.0, name="b")
    sch = Schedule(te.create_prim_func([a, b]))
    (i,) = sch.get_loops(sch.get_block("b"))
    io, ii = sch.split(i, [None, 64])
    sch.bind(io, "blockIdx.x")
    sch.bind(ii, "threadIdx.x")
    (k,) = _kernels(lower(sch.func, OPENCL))
    assert "n" in str(k.grid[0]) and k.block[0].value == 64


def test_threads_of_different_extents_share_the_block_with_guards():
    sch = Schedule(elementwise_func((8, 48), "float32", lambda x: x * 3.0))
    i, j = sch.get_loops(sch.get_block("out"))
    sch.bind(i, "blockIdx.x")
    sch.bind(j, "threadIdx.x")
    func = sch.func
    (k,) = _kernels(lower(func, OPENCL))
    assert k.block[0].value == 48


def test_unbound_stages_become_single_thread_kernels():
    func = elementwise_func((4, 4), "float32", lambda x: x - 1.0)
    (k,) = _kernels(lower(func, OPENCL))
    assert k.threads_per_block == 1 and [g.value for g in k.grid] == [1, 1, 1]


def test_shared_buffers_and_their_placement():
    func = lower(gpu_tiled_matmul_func(32, 32, 32), CUDA)
    (k,) = _kernels(func)
    assert sorted(b.name for b in k.shared) == ["A_shared", "B_shared"]
    assert all(b.scope == "shared" and b.shape[0].value == 256 for b in k.shared)
    allocs = []
    tir.post_order_visit(k.body, lambda n: allocs.append(n) if isinstance(n, S.Allocate)
                         else None)
    assert not allocs  # shared memory is declared with the kernel, not in its body


def test_limits_are_checked():
    with pytest.raises(LoweringError, match="512 threads per block exceed .* 256"):
        lower(_bound((1024,), 512).func, OPENCL)
    sch = Schedule(elementwise_func((8, 8), "float32", lambda x: x + 1.0))
    i, j = sch.get_loops(sch.get_block("out"))
    sch.bind(j, "blockIdx.x")
    with pytest.raises(LoweringError, match="below a loop or branch that is not bound"):
        lower(sch.func, OPENCL)
    sch.bind(i, "threadIdx.x")
    with pytest.raises(LoweringError, match="blockIdx loops must be the outermost"):
        lower(sch.func, OPENCL)
    n = tir.Var("n", "int64")
    a = te.placeholder((n,), "float32", name="a")
    b = te.compute((n,), lambda i: a[i] * 2.0, name="b")
    sch = Schedule(te.create_prim_func([a, b]))
    (i,) = sch.get_loops(sch.get_block("b"))
    sch.bind(i, "threadIdx.x")
    with pytest.raises(LoweringError, match="symbolic extent n; thread extents must be"):
        lower(sch.func, OPENCL)


def test_shared_memory_limit():
    small = Target("opencl", attrs={"shared_memory_per_block": 1024,
                                    "shared_memory_per_block_optin": 1024})
    with pytest.raises(LoweringError, match="2048 bytes of shared memory exceed"):
        lower(gpu_tiled_matmul_func(32, 32, 32), small)


def test_per_thread_buffer_outside_the_thread_loops_is_refused():
    x = te.placeholder((4, 64), "float32", name="x")
    y = te.compute((4, 64), lambda i, j: x[i, j] * 2.0, name="y")
    z = te.compute((4, 64), lambda i, j: y[i, j] + 1.0, name="z")
    sch = Schedule(te.create_prim_func([x, z]))
    i, j = sch.get_loops(sch.get_block("z"))
    sch.bind(i, "blockIdx.x")
    sch.bind(j, "threadIdx.x")
    sch.compute_at(sch.get_block("y"), i)
    (yj,) = sch.get_loops(sch.get_block("y"))[1:]
    sch.bind(yj, "threadIdx.x")
    func = sch.func
    # y's region is the whole row, used by every thread: it must be shared memory
    with pytest.raises(LoweringError, match="outside the threadIdx loops.*'shared' scope"):
        lower(func, OPENCL)


def test_a_shared_copy_bound_to_more_threads_than_its_outer_loop_is_refused():
    """bind refuses such a copy (tests/tir/schedule/test_schedule_bind.py); TIR written by
    hand reaches lowering, which refuses it too: its iterations beyond the outer loop's threads
    would run on no thread."""
    sch = Schedule(elementwise_func((64, 32), "float32", lambda x: x + 1.0))
    blk = sch.get_block("out")
    i, j = sch.get_loops(blk)
    sch.bind(i, "blockIdx.x")
    sch.bind(j, "threadIdx.x")
    copy = sch.cache_read(blk, 0, "shared")
    sch.compute_at(copy, j)
    (ax,) = sch.get_loops(copy)[-1:]
    sch.bind(ax, "threadIdx.x")
    assert _kernels(lower(sch.func, OPENCL))[0].threads_per_block == 32  # allowed: 32 <= 32
    inner = sch.get(ax).loop_var

    class _Longer(tir.Mutator):
        def visit_For(self, n):
            n = self.generic_visit(n)
            return n.replace(extent=tir.const(n.extent.dtype, 64)) if n.loop_var is inner else n

    with pytest.raises(LoweringError, match="64 iterations inside loop .* with 32"):
        lower(sch.func.with_body(_Longer().visit(sch.func.body)), OPENCL)
