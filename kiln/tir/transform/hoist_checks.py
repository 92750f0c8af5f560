"""Lowering pass: run-time checks leave the loops they do not depend on.

A gather reads its index once per element of the row it picks (``out[i, j] = x[idx[i], j]``),
so the check of that index (:func:`kiln.tir.check_index`) sits in the loop over ``j``. This pass
binds such a check to a variable just before the outermost loop it does not depend on, so an
index is checked once per gathered row, not once per element (``benchmarks/index_checks.py``
measures what the checks cost).

A check leaves a loop when it uses no variable bound inside the loop (the loop's own, an inner
loop's, a let variable, a buffer allocated there), reads no buffer the loop writes, and is
evaluated by every iteration: never out of an ``if``, a ``select`` arm, the right operand of
``&&``/``||``, an assertion's body or an inner loop (a check left inside an inner loop depends
on that loop), where a guard may be what keeps its load in bounds. A check moved out of a loop
with no iterations runs once more than before; it reads in bounds all the same, since only the
variables of enclosing loops, which are in range, address its load.
"""

from __future__ import annotations

from typing import Any

from ...ir.node import structural_equal
from ..expr import And, BufferLoad, Call, Let, Or, PrimExpr, Select, Var, is_check
from ..function import PrimFunc
from ..functor import Mutator, collect_vars, post_order_visit
from ..stmt import (
    Allocate,
    AssertStmt,
    BufferStore,
    Evaluate,
    For,
    IfThenElse,
    LetStmt,
    SeqStmt,
    Stmt,
)


def has_checks(node: Any) -> bool:
    """Whether ``node`` holds a run-time check (a ``check_index`` call or an assertion)."""
    found = [False]

    def visit(n: Any) -> None:
        if isinstance(n, AssertStmt) or is_check(n):
            found[0] = True

    post_order_visit(node, visit)
    return found[0]


def _unconditional_checks(node: Any, out: list[Call]) -> None:
    """The checks ``node`` evaluates whenever it runs (see the module docstring)."""
    if is_check(node):
        out.append(node)
        return
    if isinstance(node, (IfThenElse, For)):
        if isinstance(node, IfThenElse):
            _unconditional_checks(node.condition, out)
        else:
            _unconditional_checks(node.min, out)
            _unconditional_checks(node.extent, out)
        return
    if isinstance(node, AssertStmt):
        _unconditional_checks(node.condition, out)
        return
    if isinstance(node, Select):
        _unconditional_checks(node.condition, out)
        return
    if isinstance(node, (And, Or)):
        _unconditional_checks(node.a, out)
        return
    if isinstance(node, SeqStmt):
        for s in node.seq:
            _unconditional_checks(s, out)
        return
    if isinstance(node, (LetStmt, Let)):
        _unconditional_checks(node.value, out)
        _unconditional_checks(node.body, out)
        return
    if isinstance(node, Allocate):
        _unconditional_checks(node.body, out)
        return
    if isinstance(node, BufferStore):
        _unconditional_checks(node.value, out)
        for i in node.indices:
            _unconditional_checks(i, out)
        return
    if isinstance(node, Evaluate):
        _unconditional_checks(node.value, out)
        return
    if isinstance(node, BufferLoad):
        for i in node.indices:
            _unconditional_checks(i, out)
        return
    if isinstance(node, PrimExpr):
        for name in ("a", "b", "value", "args"):
            child = getattr(node, name, None)
            if isinstance(child, tuple):
                for c in child:
                    _unconditional_checks(c, out)
            elif isinstance(child, PrimExpr):
                _unconditional_checks(child, out)


def _bound_inside(loop: For) -> tuple[set[Var], set[Var]]:
    """The variables ``loop`` binds (its own, inner loops', lets, allocated buffers) and the
    data variables of the buffers it writes."""
    bound: set[Var] = {loop.loop_var}
    written: set[Var] = set()

    def visit(n: Any) -> None:
        if isinstance(n, For):
            bound.add(n.loop_var)
        elif isinstance(n, (LetStmt, Let)):
            bound.add(n.var)
        elif isinstance(n, Allocate):
            bound.add(n.buffer.data)
        elif isinstance(n, BufferStore):
            written.add(n.buffer.data)

    post_order_visit(loop.body, visit)
    return bound, written


def _invariant(check: Call, bound: set[Var], written: set[Var]) -> bool:
    if any(v in bound for v in collect_vars(check)):
        return False
    ok = [True]

    def visit(n: Any) -> None:
        if isinstance(n, BufferLoad) and (n.buffer.data in bound or n.buffer.data in written):
            ok[0] = False

    post_order_visit(check, visit)
    return ok[0]


class _Replace(Mutator):
    def __init__(self, pairs: list[tuple[Call, Var]]):
        self.pairs = pairs

    def visit_Call(self, call: Call) -> Any:
        for check, var in self.pairs:
            if call is check or structural_equal(call, check, map_free_vars=False):
                return var
        return self.generic_visit(call)


class _Hoist(Mutator):
    def __init__(self) -> None:
        self.count = 0

    def visit_For(self, loop: For) -> Stmt:
        loop = self.generic_visit(loop)
        found: list[Call] = []
        _unconditional_checks(loop.body, found)
        if not found:
            return loop
        bound, written = _bound_inside(loop)
        pairs: list[tuple[Call, Var]] = []
        for check in found:
            if not _invariant(check, bound, written):
                continue
            if any(structural_equal(check, c, map_free_vars=False) for c, _ in pairs):
                continue
            pairs.append((check, Var(f"checked_{self.count}", check.dtype)))
            self.count += 1
        if not pairs:
            return loop
        out: Stmt = loop.replace(body=_Replace(pairs).visit(loop.body))
        for check, var in reversed(pairs):
            out = LetStmt(var, check, out)
        return out


def hoist_checks(func: PrimFunc) -> PrimFunc:
    """``func`` with every run-time check bound before the loops it does not depend on."""
    if not has_checks(func.body):
        return func
    body = _Hoist().visit(func.body)
    return func if body is func.body else func.replace(body=body)
