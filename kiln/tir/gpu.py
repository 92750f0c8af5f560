"""GPU TIR: thread indices, the statements GPU lowering makes, and GPU intrinsics.

A loop bound with ``Schedule.bind(loop, "threadIdx.x")`` runs its iterations on the threads of
a block (``threadIdx.x/y/z``) or on the blocks of the grid (``blockIdx.x/y/z``) instead of one
after the other. Lowering (``kiln.tir.transform.gpu_kernels``) turns each bound loop into a
``LetStmt`` of the loop variable from a *thread index variable*: a ``tir.Var`` named after the
tag, which code generation spells per dialect (``threadIdx.x`` in CUDA, ``get_local_id(0)`` in
OpenCL). The spellings are TVM's and CUDA's: ``blockIdx`` counts blocks (OpenCL work-groups),
``threadIdx`` threads inside one block (OpenCL work-items of a group).

Statements only GPU lowering makes (code generation renders them per dialect):

- :class:`ThreadAllreduce`: combine one value over the threads of a block that differ only in
  some ``threadIdx`` axes (made by ``cross_thread_reduction``, expanded into warp shuffles or a
  shared-memory tree once the block's shape is known);
- :class:`KernelLaunch`: one kernel of a lowered function: its SPMD body (the code every thread
  runs), its grid and block extents (expressions of the function's symbolic dims) and the
  variables standing for the thread indices.

Intrinsics (``tir.Call`` ops) only GPU code uses: :data:`BARRIER` (all threads of a block
wait; shared and global memory written before is visible after), :data:`SHFL_DOWN` /
:data:`SHFL` (read a value of another lane of the warp: ``(value, offset_or_lane, width)``),
:data:`ATOMIC_ADD` (``atomic_add(buffer[index], value)``: add to memory other threads may
update at the same time; the old value), and the asynchronous copies of a multi-stage pipeline
(``kiln.tir.transform.async_copies``): :data:`ASYNC_COPY` (``async_copy(address_of(shared[i]),
address_of(global[j]), bytes)``: start copying ``bytes`` bytes, 4, 8 or 16, both addresses
aligned to them; CUDA ``cp.async``, OpenCL a plain copy), :data:`ASYNC_COMMIT` (close the
thread's group of copies started since the last commit) and :data:`ASYNC_WAIT` (``(n)``: wait
until at most ``n`` of the thread's committed groups are still in flight; other threads' copies
are visible only after a barrier that follows).
"""

from __future__ import annotations

from dataclasses import field
from typing import Any

from ..ir.errors import ScheduleError
from ..ir.node import node, set_field
from .buffer import Buffer
from .expr import Call, CommReducer, PrimExpr, Var, convert
from .stmt import Evaluate, Stmt

#: Intrinsic: barrier of the threads of a block (``__syncthreads()``).
BARRIER = "gpu.barrier"
#: Intrinsic: ``shfl_down(value, offset, width)``, the value of lane ``lane + offset`` within
#: segments of ``width`` lanes (CUDA ``__shfl_down_sync``).
SHFL_DOWN = "gpu.shfl_down"
#: Intrinsic: ``shfl(value, lane, width)``, the value of lane ``lane`` of the segment.
SHFL = "gpu.shfl"
#: Intrinsic: ``atomic_add(BufferLoad(buf, (i,)), value)`` adds ``value`` to ``buf[i]``
#: atomically and gives the old value (int32/uint32/int64/uint64/float32/float64).
ATOMIC_ADD = "gpu.atomic_add"
#: Intrinsic: ``async_copy(dst, src, bytes)``, start copying ``bytes`` (4, 8 or 16) bytes from
#: global address ``src`` to shared address ``dst`` (``kiln.address_of`` calls; both aligned to
#: ``bytes``) without waiting for them (CUDA ``cp.async``).
ASYNC_COPY = "gpu.async_copy"
#: Intrinsic: close this thread's group of asynchronous copies (``cp.async.commit_group``).
ASYNC_COMMIT = "gpu.async_commit"
#: Intrinsic: ``async_wait(n)``, wait until at most ``n`` (a constant) of this thread's
#: committed groups are in flight (``cp.async.wait_group n``).
ASYNC_WAIT = "gpu.async_wait"
#: Intrinsics of GPU code only (the C backend rejects them).
GPU_INTRINSICS = (BARRIER, SHFL_DOWN, SHFL, ATOMIC_ADD, ASYNC_COPY, ASYNC_COMMIT, ASYNC_WAIT)

#: Every tag a loop may be bound to.
THREAD_TAGS = tuple(f"{scope}.{d}" for scope in ("blockIdx", "threadIdx") for d in "xyz")
#: The dimension index of each axis letter.
AXES = {"x": 0, "y": 1, "z": 2}


def check_tag(tag: object, what: str = "bind") -> str:
    """``tag`` if it is a thread tag, else a ScheduleError listing the valid ones."""
    if tag not in THREAD_TAGS:
        raise ScheduleError(f"{what}: {tag!r} is not a thread tag (expected one of "
                            f"{', '.join(THREAD_TAGS)})")
    return tag  # type: ignore[return-value]


def is_block_tag(tag: str) -> bool:
    """A tag of the grid (``blockIdx.*``) rather than of the threads of a block."""
    return tag.startswith("blockIdx.")


def is_thread_tag(tag: str) -> bool:
    """A tag of the threads inside a block (``threadIdx.*``)."""
    return tag.startswith("threadIdx.")


def axis_of(tag: str) -> int:
    """0, 1 or 2 for the ``x``, ``y`` or ``z`` of a tag."""
    return AXES[tag.rsplit(".", 1)[1]]


def index_var(tag: str) -> Var:
    """A fresh int32 variable standing for the thread index ``tag`` in a kernel body."""
    return Var(tag, "int32")


def atomic_add(buffer: Buffer, indices: Any, value: Any) -> Stmt:
    """The statement ``buffer[indices] += value``, done atomically."""
    load = buffer.load(indices)
    return Evaluate(Call(buffer.dtype.element, ATOMIC_ADD, (load, convert(value))))


def barrier() -> Stmt:
    """The statement that makes every thread of a block wait for the others."""
    return Evaluate(Call("int32", BARRIER, ()))


def async_copy(dst: PrimExpr, src: PrimExpr, nbytes: int) -> Stmt:
    """Start copying ``nbytes`` bytes from global address ``src`` to shared address ``dst``
    (see :data:`ASYNC_COPY`)."""
    if nbytes not in (4, 8, 16):
        raise ValueError(f"async_copy: copies 4, 8 or 16 bytes, not {nbytes}")
    return Evaluate(Call("int32", ASYNC_COPY, (dst, src, convert(nbytes))))


def async_commit() -> Stmt:
    """Close this thread's group of asynchronous copies (see :data:`ASYNC_COMMIT`)."""
    return Evaluate(Call("int32", ASYNC_COMMIT, ()))


def async_wait(in_flight: int) -> Stmt:
    """Wait until at most ``in_flight`` committed groups are in flight (:data:`ASYNC_WAIT`)."""
    return Evaluate(Call("int32", ASYNC_WAIT, (convert(in_flight),)))


def is_barrier(stmt: object) -> bool:
    return (isinstance(stmt, Evaluate) and isinstance(stmt.value, Call)
            and stmt.value.op == BARRIER)


@node
class ThreadAllreduce(Stmt):
    """``result[0] = reducer(value over the threads that differ only in axes tags)``.

    Every thread of the block must execute it (it synchronizes them), each with its own
    ``value``; afterwards each holds the combination of its group in ``result`` (a one-element
    ``local`` buffer). ``tags`` are ``threadIdx`` tags.
    """

    reducer: CommReducer
    value: PrimExpr
    result: Buffer
    tags: tuple[str, ...]

    def __post_init__(self):
        set_field(self, "value", convert(self.value))
        set_field(self, "tags", tuple(self.tags))


@node
class KernelLaunch(Stmt):
    """One kernel of a lowered GPU function (see the module docstring).

    ``grid``/``block`` are the (x, y, z) extents; ``block`` is constant, ``grid`` may use the
    function's symbolic dims. ``env`` pairs each thread index variable used in ``body`` with its
    tag. ``shared`` lists the buffers in shared memory (allocated for the kernel's lifetime).
    """

    name: str
    grid: tuple[PrimExpr, PrimExpr, PrimExpr]
    block: tuple[PrimExpr, PrimExpr, PrimExpr]
    env: tuple[tuple[Var, str], ...]
    body: Stmt
    shared: tuple[Buffer, ...] = ()
    annotations: dict = field(default_factory=dict)

    def __post_init__(self):
        set_field(self, "grid", tuple(convert(g) for g in self.grid))
        set_field(self, "block", tuple(convert(b) for b in self.block))
        set_field(self, "env", tuple(tuple(e) for e in self.env))
        set_field(self, "shared", tuple(self.shared))

    @property
    def threads_per_block(self) -> int:
        n = 1
        for b in self.block:
            n *= int(b.value)  # type: ignore[attr-defined]
        return n
