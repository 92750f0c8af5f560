"""The NPU's loop pre-passes, in order: a nest in the canonical form an instruction selector
matches -- loops from 0, no branches inside, one store per nest, contiguous axes merged.

The NPU's nest analysis (``kiln.schedule.npu``) calls :func:`npu_prepare` on a loop-form
PrimFunc (after ``convert_blocks_to_loops``) before matching its nests against instructions.
Order matters: loops are shifted to 0 first so the partition's change points and the collapse's
contiguity read from plain ``[0, n)`` ranges; a store's index-only ``select``/``min``/``max``
(a pad's window, an edge pad's clamp) become ``if`` branches (``select_to_branch``) for the
partition to cut at; the partition's pieces (which start mid-range)
are shifted again; ``simplify`` turns the now-constant conditions into their branch; then
invariant conditions are hoisted (``if_promotion``) so the loops under them are branch-free,
loops with several stores are split (``loop_fission``) so each nest is perfect, and perfect
contiguous nests are merged (``loop_collapse``); a last ``simplify`` folds the merged indices
(``(f / N) * N + f % N`` to ``f``). Each pass leaves what it cannot transform as it was.
"""

from __future__ import annotations

from ..function import PrimFunc
from .if_promotion import if_promotion
from .loop_collapse import loop_collapse
from .loop_fission import loop_fission
from .loop_shift import loop_shift
from .partition_loops import partition_at_branches
from .select_to_branch import select_to_branch
from .simplify import simplify


def npu_prepare(func: PrimFunc) -> PrimFunc:
    """``func`` (loop form) through the loop pre-passes, in the order of the module docstring."""
    func = select_to_branch(loop_shift(func))
    func = partition_at_branches(func)
    func = simplify(loop_shift(func))
    func = simplify(if_promotion(func))
    func = loop_fission(func)
    func = loop_collapse(func)
    return simplify(func)
