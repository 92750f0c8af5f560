"""``lower``: the fixed sequence of passes from scheduled block TIR to codegen-ready TIR."""

from __future__ import annotations

from typing import Any

from ..function import PrimFunc
from .compact_buffers import compact_buffers
from .convert_blocks_to_loops import convert_blocks_to_loops
from .flatten_buffers import flatten_buffers
from .hoist_allocations import hoist_allocations
from .hoist_checks import hoist_checks
from .hoist_reduction_init import hoist_reduction_init
from .jam_tails import jam_tails
from .partition_loops import partition_loops
from .simplify import simplify
from .unroll_loops import unroll_loops
from .vectorize_loops import vectorize_loops

#: Attribute set on a lowered function so that codegen does not lower it twice.
LOWERED_ATTR = "kiln.lowered"


def is_lowered(func: PrimFunc) -> bool:
    return bool(func.attrs.get(LOWERED_ATTR, False))


def lower(func: PrimFunc, target: Any = None) -> PrimFunc:
    """Lower ``func`` for ``target`` (a Target, a target string or None for the default CPU).

    Runs, in order: hoist the init of reductions over symbolic extents (so an empty one still
    stores its identity), compact scheduled buffers (allocate caches inside the loop using them),
    convert blocks to loops, flatten buffers, hoist heap allocations out of serial loops,
    hoist run-time checks out of the loops they do not depend on, simplify, vectorize loops,
    write out small unrolled loops, and simplify again (vectorization leaves
    ``Ramp(i * 8 + 0, ...)``-style bases, unrolling constant indices); then split guarded tail
    iterations off tile loops (``partition_loops``) and simplify the guards away, and jam the
    tail tiles of independent rows where a schedule asked for it (``jam_tails``). The result
    carries the ``"kiln.lowered"`` attribute; lowering a lowered function returns it unchanged.
    """
    if is_lowered(func):
        return func
    del target  # the passes are target independent today; kept for target-specific passes
    func = hoist_reduction_init(func)
    func = compact_buffers(func)
    func = convert_blocks_to_loops(func)
    func = flatten_buffers(func)
    func = hoist_allocations(func)
    func = hoist_checks(func)
    func = simplify(func)
    func = vectorize_loops(func)
    func = unroll_loops(func)
    func = simplify(func)
    partitioned = partition_loops(func)
    if partitioned is not func:
        func = simplify(partitioned)
    jammed = jam_tails(func)
    if jammed is not func:
        func = simplify(jammed)
    return func.with_attr(LOWERED_ATTR, True)
