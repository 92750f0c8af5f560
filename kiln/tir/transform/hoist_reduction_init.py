"""Lowering pass: give a reduction whose domain may be empty at run time an init of its own.

A block's ``init`` is lowered to a store guarded by "first reduction iteration", inside the
reduction loops. When a reduction extent is symbolic and is 0 at run time (a ``sum`` over an
empty dimension, the count of a NonZero over an empty input), those loops run zero times, the
init never runs and the output keeps whatever the memory held -- a silent wrong answer. For
every block still holding an ``init`` whose reduction domain has a non-constant extent, this
pass applies ``decompose_reduction`` at the outermost loop bound to a reduction variable, so
the identity is stored before the loops whatever their trip count. (Static empty reductions
are handled when the PrimFunc is made: ``te.create_prim_func`` stores the identity.) A block
the primitive cannot decompose (a spatial loop nested inside a reduction loop) is left as is.
"""

from __future__ import annotations

from ...ir.errors import ScheduleError
from ..expr import IntImm, IterType
from ..function import PrimFunc
from ..functor import post_order_visit
from ..schedule import Schedule
from ..schedule.analysis import reduction_loops_of
from ..schedule.state import TreeIndex
from ..stmt import BlockRealize


def _symbolic_reductions(func: PrimFunc) -> list[str]:
    """Names of the blocks with an init and a reduction variable of symbolic extent."""
    names: list[str] = []

    def check(n: object) -> None:
        if isinstance(n, BlockRealize) and n.block.init is not None and any(
                iv.iter_type == IterType.COMM_REDUCE and not isinstance(iv.dom.extent, IntImm)
                for iv in n.block.iter_vars):
            names.append(n.block.name_hint)

    post_order_visit(func.body, check)
    return names


def hoist_reduction_init(func: PrimFunc) -> PrimFunc:
    """Return ``func`` (block form) with the init of reductions over symbolic extents moved
    before their reduction loops (see the module docstring)."""
    if not isinstance(func.body, BlockRealize):
        return func
    names = _symbolic_reductions(func)
    if not names:
        return func

    sch = Schedule(func)
    for name in names:
        index = TreeIndex(sch.func)
        sref = index.blocks[name]
        red = reduction_loops_of(sref, index.loops_above(sref))
        if not red:
            continue
        block = sch.get_block(name)
        loop = next(lp for lp in sch.get_loops(block)
                    if sch.get(lp).loop_var is red[0].loop.loop_var)
        try:
            sch.decompose_reduction(block, loop)
        except ScheduleError:
            continue
    return sch.func
