"""``lower``: the fixed sequence of passes from scheduled block TIR to codegen-ready TIR."""

from __future__ import annotations

from typing import Any

from ...target import Target
from ..function import PrimFunc
from .async_copies import pipeline_async_copies
from .compact_buffers import compact_buffers
from .convert_blocks_to_loops import convert_blocks_to_loops
from .cross_thread_reduction import lower_cross_thread_reduction
from .flatten_buffers import flatten_buffers
from .gpu_kernels import extract_kernels
from .hoist_allocations import hoist_allocations
from .hoist_checks import hoist_checks
from .hoist_reduction_init import hoist_reduction_init
from .jam_tails import jam_tails
from .partition_loops import partition_loops
from .permute_layout import permute_layouts
from .prefetch_copies import prefetch_shared_copies
from .simplify import simplify
from .thread_allreduce import lower_thread_allreduce
from .thread_sync import insert_thread_sync
from .unroll_loops import unroll_loops
from .vectorize_loops import vectorize_loops

#: Attribute set on a lowered function so that codegen does not lower it twice.
LOWERED_ATTR = "kiln.lowered"


def is_lowered(func: PrimFunc) -> bool:
    return bool(func.attrs.get(LOWERED_ATTR, False))


def lower(func: PrimFunc, target: Any = None) -> PrimFunc:
    """Lower ``func`` for ``target`` (a Target, a target string or None for the default CPU).

    Runs, in order: hoist the init of reductions over symbolic extents (so an empty one still
    stores its identity), compact scheduled buffers (allocate caches inside the loop using them)
    and permute the axes of those a schedule asked for (``permute_layout``),
    convert blocks to loops, flatten buffers, hoist heap allocations out of serial loops,
    hoist run-time checks out of the loops they do not depend on, simplify, vectorize loops,
    write out small unrolled loops, and simplify again (vectorization leaves
    ``Ramp(i * 8 + 0, ...)``-style bases, unrolling constant indices); then split guarded tail
    iterations off tile loops (``partition_loops``) and simplify the guards away, and jam the
    tail tiles of independent rows where a schedule asked for it (``jam_tails``). The result
    carries the ``"kiln.lowered"`` attribute; lowering a lowered function returns it unchanged.

    For a GPU target (CUDA, OpenCL) the same passes run with GPU passes around them: first
    reductions bound to ``threadIdx`` become per-thread accumulation plus a cross-thread
    reduction (``cross_thread_reduction``), loops annotated for it load the next step's shared
    tiles into registers during the current step (``prefetch_copies``) or copy them a few steps
    ahead asynchronously into rotating shared stages (``async_copies``); heap and check
    hoisting and the CPU's tail
    partitioning and jamming are left out, vector expressions keep every intrinsic (evaluated
    lane by lane);
    last the body is split into kernels with their launch shapes and allocations placed by
    scope (``gpu_kernels``), cross-thread reductions are expanded for the block's shape
    (``thread_allreduce``) and barriers inserted (``thread_sync``).
    """
    if is_lowered(func):
        return func
    if isinstance(target, str):
        target = Target.create(target)
    gpu = getattr(target, "is_gpu", False)
    if gpu:
        func = lower_cross_thread_reduction(func)
    func = hoist_reduction_init(func)
    func = compact_buffers(func)
    func = permute_layouts(func)
    func = convert_blocks_to_loops(func, let_bindings=gpu)
    func = flatten_buffers(func)
    if not gpu:  # (a check hoisted out of a kernel's grid loops would land on the host)
        func = hoist_allocations(func)
        func = hoist_checks(func)
    func = simplify(func)
    if gpu:
        func = prefetch_shared_copies(func)
        func = pipeline_async_copies(func)
    func = vectorize_loops(func, lanewise_calls=gpu)
    func = unroll_loops(func)
    func = simplify(func)
    if gpu:
        func = extract_kernels(func, target)
        func = lower_thread_allreduce(func, target)
        func = insert_thread_sync(func)
        func = simplify(func)
        return func.with_attr(LOWERED_ATTR, True)
    partitioned = partition_loops(func)
    if partitioned is not func:
        func = simplify(partitioned)
    jammed = jam_tails(func)
    if jammed is not func:
        func = simplify(jammed)
    return func.with_attr(LOWERED_ATTR, True)
