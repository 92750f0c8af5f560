"""Integer simplifier and bound analysis used by schedules and lowering passes.

``Analyzer`` is the entry point: ``bind`` variable ranges, then ``simplify`` index expressions,
``can_prove`` conditions and ask ``const_int_bound``; ``constraint_scope(cond)`` assumes a
condition inside a ``with`` block. ``simplify(expr)`` is a context-free shortcut.
"""

from .analyzer import Analyzer, simplify
from .const_int_bound import NEG_INF, POS_INF, ConstIntBound

__all__ = ["Analyzer", "ConstIntBound", "NEG_INF", "POS_INF", "simplify"]
