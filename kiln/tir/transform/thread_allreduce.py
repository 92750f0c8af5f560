"""GPU lowering pass: expand each ``ThreadAllreduce`` of a kernel once its block shape is known.

``cross_thread_reduction`` leaves, in every thread, ``red[0] = thread_allreduce(OP, acc[0],
over=tags)``: combine ``acc[0]`` over the threads of the block that differ only in the
``threadIdx`` axes ``tags``. The axes must come first in the threads' numbering
(``x``, then ``x`` and ``y``...; axes of extent 1 do not count), so that a group is ``G``
consecutive threads of the flattened thread index ``t``, ``t - t % G`` its first one. Then:

- CUDA, a warp of 32 threads, a block of whole warps and ``G`` a power of two up to 32: a
  butterfly of ``__shfl_down_sync`` inside segments of ``G`` lanes, the result broadcast from
  the segment's first lane (no shared memory, no barrier);
- CUDA, ``G`` a multiple of 32 (up to 1024): each warp reduces with shuffles, its first lane
  writes the warp's value to shared memory, and every warp of the group then reduces those
  values with shuffles again;
- otherwise (OpenCL; groups of other sizes): a tree in shared memory, one element per thread,
  halving the active threads per step (a first step folds a group that is not a power of two
  onto the largest power of two below it).

The barriers the shared-memory steps need are not written here: ``thread_sync`` inserts them
(each step reads what other threads wrote in the step before).
"""

from __future__ import annotations

from typing import Any

from ...ir.errors import LoweringError
from ..buffer import Buffer
from ..expr import BufferLoad, Call, PrimExpr, const, eq, lt
from ..function import PrimFunc
from ..functor import Mutator, substitute
from ..gpu import SHFL, SHFL_DOWN, KernelLaunch, ThreadAllreduce, axis_of, index_var
from ..stmt import Allocate, BufferStore, IfThenElse, Stmt, seq
from .gpu_kernels import byte_size

I32 = "int32"


def _dims(kernel: KernelLaunch) -> list[int]:
    return [int(b.value) for b in kernel.block]  # type: ignore[attr-defined]



def combine(reducer: Any, x: PrimExpr, y: PrimExpr) -> PrimExpr:
    """``x`` and ``y`` combined by ``reducer`` (a CommReducer: its result with ``x``/``y``
    substituted for ``lhs``/``rhs``)."""
    return substitute(reducer.result, {reducer.lhs: x, reducer.rhs: y})

class _Expand(Mutator):
    def __init__(self, kernel: KernelLaunch, target: Any):
        self.kernel = kernel
        self.target = target
        self.dims = _dims(kernel)
        self.env = {tag: v for v, tag in kernel.env}
        self.shared: list[Buffer] = []
        self.count = 0

    def thread(self, axis: int) -> PrimExpr:
        tag = f"threadIdx.{'xyz'[axis]}"
        if tag not in self.env:
            self.env[tag] = index_var(tag)
        return self.env[tag]

    def flat_tid(self) -> PrimExpr:
        tid: PrimExpr | None = None
        stride = 1
        for axis in range(3):
            if self.dims[axis] == 1:
                continue
            term = self.thread(axis) if stride == 1 else self.thread(axis) * const(I32, stride)
            tid = term if tid is None else tid + term
            stride *= self.dims[axis]
        return tid if tid is not None else const(I32, 0)

    def visit_ThreadAllreduce(self, node: ThreadAllreduce) -> Stmt:
        axes = sorted({axis_of(t) for t in node.tags})
        dims = self.dims
        for a in range(max(axes)):
            if a not in axes and dims[a] != 1:
                raise LoweringError(
                    f"kernel {self.kernel.name}: a reduction over {', '.join(node.tags)} needs "
                    f"the threads of each group numbered consecutively, but threadIdx."
                    f"{'xyz'[a]} (extent {dims[a]}) comes first")
        group = 1
        for a in axes:
            group *= dims[a]
        total = dims[0] * dims[1] * dims[2]
        self.count += 1
        zero = (const("int64", 0),)
        if group == 1:
            return BufferStore(node.result, node.value, zero)
        limits = self.target.gpu
        warp = limits.warp_size
        pow2 = group & (group - 1) == 0
        if self.target.kind == "cuda" and warp == 32 and total % warp == 0:
            if pow2 and group <= warp:
                return self._warp(node, group)
            if group % warp == 0 and group // warp <= warp:
                return self._two_level(node, group, total)
        return self._tree(node, group, total)

    # ---- warp shuffles ------------------------------------------------------------------------
    def _local(self, dtype: Any, hint: str) -> Buffer:
        return Buffer(f"{hint}{self.count}", (const("int64", 1),), dtype, scope="local")

    def _shared(self, dtype: Any, size: int) -> Buffer:
        buf = Buffer(f"red_buf{self.count}", (const("int64", size),), dtype, scope="shared")
        self.shared.append(buf)
        return buf

    def _butterfly(self, node: ThreadAllreduce, v: Buffer, width: int) -> list[Stmt]:
        zero = (const("int64", 0),)
        out: list[Stmt] = []
        off = width // 2
        while off >= 1:
            cur = BufferLoad(v, zero)
            other = Call(v.dtype, SHFL_DOWN, (cur, const(I32, off), const(I32, width)))
            out.append(BufferStore(v, combine(node.reducer, cur, other), zero))
            off //= 2
        return out

    def _broadcast(self, node: ThreadAllreduce, v: Buffer, width: int) -> Stmt:
        zero = (const("int64", 0),)
        first = Call(v.dtype, SHFL, (BufferLoad(v, zero), const(I32, 0), const(I32, width)))
        return BufferStore(node.result, first, zero)

    def _warp(self, node: ThreadAllreduce, group: int) -> Stmt:
        zero = (const("int64", 0),)
        v = self._local(node.result.dtype, "red_v")
        body = [BufferStore(v, node.value, zero), *self._butterfly(node, v, group),
                self._broadcast(node, v, group)]
        return Allocate(v, seq(*body))

    def _two_level(self, node: ThreadAllreduce, group: int, total: int) -> Stmt:
        zero = (const("int64", 0),)
        warp = 32
        v = self._local(node.result.dtype, "red_v")
        buf = self._shared(node.result.dtype, total // warp)
        tid = self.flat_tid()
        lane = tid % const(I32, warp)
        slot = (tid // const(I32, warp)).astype("int64")
        first_warp = ((tid - tid % const(I32, group)) // const(I32, warp)).astype("int64")
        n_warps = group // warp
        body = [BufferStore(v, node.value, zero), *self._butterfly(node, v, warp),
                IfThenElse(eq(lane, const(I32, 0)), BufferStore(buf, BufferLoad(v, zero),
                                                                (slot,))),
                IfThenElse(lt(lane, const(I32, n_warps)),
                           BufferStore(v, BufferLoad(buf, (first_warp + lane.astype("int64"),)),
                                       zero),
                           BufferStore(v, node.reducer.identity, zero)),
                *self._butterfly(node, v, warp),
                self._broadcast(node, v, warp)]
        return Allocate(v, seq(*body))

    # ---- shared-memory tree -------------------------------------------------------------------
    def _tree(self, node: ThreadAllreduce, group: int, total: int) -> Stmt:
        buf = self._shared(node.result.dtype, total)
        tid = self.flat_tid()
        r = tid % const(I32, group) if group != total else tid
        base = (tid - r).astype("int64")
        at = tid.astype("int64")

        def step(width: int) -> Stmt:
            here = BufferLoad(buf, (at,))
            there = BufferLoad(buf, (at + const("int64", width),))
            return IfThenElse(lt(r, const(I32, width)),
                              BufferStore(buf, combine(node.reducer, here, there), (at,)))

        body: list[Stmt] = [BufferStore(buf, node.value, (at,))]
        p2 = 1
        while p2 * 2 <= group:
            p2 *= 2
        if p2 != group:
            rest = group - p2
            here = BufferLoad(buf, (at,))
            there = BufferLoad(buf, (at + const("int64", p2),))
            body.append(IfThenElse(lt(r, const(I32, rest)),
                                   BufferStore(buf, combine(node.reducer, here, there), (at,))))
        off = p2 // 2
        while off >= 1:
            body.append(step(off))
            off //= 2
        body.append(BufferStore(node.result, BufferLoad(buf, (base,)),
                                (const("int64", 0),)))
        return seq(*body)


def lower_thread_allreduce(func: PrimFunc, target: Any) -> PrimFunc:
    """Return ``func`` (after ``extract_kernels``) with every ThreadAllreduce expanded."""

    class _Kernels(Mutator):
        def visit_KernelLaunch(self, k: KernelLaunch) -> Stmt:
            ex = _Expand(k, target)
            body = ex.visit(k.body)
            if body is k.body:
                return k
            shared = k.shared + tuple(ex.shared)
            total = sum(byte_size(b) or 0 for b in shared)
            limit = target.gpu.shared_memory_per_block_optin
            if total > limit:
                raise LoweringError(f"kernel {k.name}: {total} bytes of shared memory (with the "
                                    f"reduction's) exceed the target's {limit}")
            env = tuple(sorted(((v, t) for t, v in ex.env.items()), key=lambda e: e[1]))
            return k.replace(body=body, shared=shared, env=env)

    body = _Kernels().visit(func.body)
    return func if body is func.body else func.with_body(body)

