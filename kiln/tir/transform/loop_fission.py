"""Loop pre-pass: split a loop whose body has several statements into one loop per statement.

An NPU instruction computes one result tensor: a nest with two stores in one body
(``for i: B[i] = f(A[i]); C[i] = g(A[i])``, the two outputs of a fused kernel, a reduction's
init next to its update loop) matches no instruction as it is, but ``for i: B[i] = ...`` and
``for i: C[i] = ...`` each do. Loop fission (distribution) splits ``for i: S1; S2`` into
``for i: S1`` then ``for i: S2``. That runs every ``S1(i)`` before every ``S2(j)``; the loop ran
``S2(j)`` before ``S1(i)`` for ``j < i``, so the split is exact when no element touched by
``S2`` at one iteration is touched (with a write by either) by ``S1`` at another.

The check is on each buffer both sides use, one of them storing to it: there must be an index
dimension that is ``s * i + e`` in every access of both sides (the same constant step
``s != 0``), where the ``e`` differ from each other only by terms of the loops inside ``i`` whose
span, over their ranges, is less than ``|s|`` -- so each iteration of ``i`` touches its own slice
of the buffer. ``A[i, k]``, ``A[i * 16 + k]`` with ``k < 16`` pass; ``A[0]`` (an accumulator
shared by the iterations), ``A[i + 1]`` written and ``A[i]`` read, and ``A[i * 4 + k]`` with
``k < 8`` do not.

Refuses (leaves the loop) when: it is not serial; its body is not a sequence (an ``Allocate``
or ``let`` around the statements binds something they share); no cut between its statements
passes the check above. Statements that cannot be separated stay together in one loop; the
cuts that pass are all taken. Loops are visited innermost first, so a nest whose inner loop was
split may split at the outer loop too.
"""

from __future__ import annotations

from ...arith import Analyzer
from ...arith.expr_utils import const_int
from ..expr import BufferLoad, IntImm, PrimExpr, Range, Var
from ..function import PrimFunc
from ..functor import Mutator, collect_vars, post_order_visit, substitute
from ..stmt import BufferStore, For, ForKind, SeqStmt, Stmt, seq

# an access: (data var id, indices, is a store)
_Access = tuple[int, tuple[PrimExpr, ...], bool]


def _accesses(stmt: Stmt) -> tuple[list[_Access], list[For]]:
    """The buffer accesses of ``stmt`` and the loops inside it."""
    acc: list[_Access] = []
    loops: list[For] = []

    def visit(n: object) -> None:
        if isinstance(n, BufferStore):
            acc.append((id(n.buffer.data), n.indices, True))
        elif isinstance(n, BufferLoad):
            acc.append((id(n.buffer.data), n.indices, False))
        elif isinstance(n, For):
            loops.append(n)

    post_order_visit(stmt, visit)
    return acc, loops


def _split_index(idx: PrimExpr, v: Var, ana: Analyzer) -> tuple[int, PrimExpr] | None:
    """``(s, e)`` with ``idx == s * v + e``, ``e`` free of ``v``; None when not of that form."""
    e = ana.simplify(substitute(idx, {v: IntImm(v.dtype, 0)}))
    s = const_int(ana.simplify(substitute(idx, {v: IntImm(v.dtype, 1)}) - e))
    if s is None or const_int(ana.simplify(idx - (e + v * s))) != 0:
        return None
    return s, e


def _disjoint(accs: list[_Access], v: Var, inner: dict[int, For], ana: Analyzer) -> bool:
    """Whether every iteration of ``v`` touches its own slice of the buffer the accesses
    ``accs`` share (see the module docstring); ``inner`` maps the ids of the variables of the
    loops inside ``v`` to their loops."""
    ndim = len(accs[0][1])
    if any(len(a[1]) != ndim for a in accs):
        return False
    for d in range(ndim):
        forms = [_split_index(a[1][d], v, ana) for a in accs]
        if any(f is None for f in forms):
            continue
        steps = {f[0] for f in forms}
        if len(steps) != 1 or 0 in steps:
            continue
        (s,) = steps
        # the part of the offsets that the inner loops do not move (outer variables, constants):
        # the first offset with every inner variable at its loop's start
        ref = forms[0][1]
        base = ana.simplify(substitute(ref, lambda x: inner[id(x)].min if id(x) in inner
                                       else None))
        lo, hi, ok = None, None, True
        for _, e in forms:
            rel = ana.simplify(e - base)
            if any(id(x) not in inner for x in collect_vars(rel)):
                ok = False  # offsets differ by something other than inner loops
                break
            b = ana.const_int_bound(rel)
            lo = b.min_value if lo is None else min(lo, b.min_value)
            hi = b.max_value if hi is None else max(hi, b.max_value)
        if ok and lo is not None and hi - lo + 1 <= abs(s):
            return True
    return False


def _independent(a: list[_Access], b: list[_Access], v: Var, inner: dict[int, For],
                 ana: Analyzer) -> bool:
    """Whether statement accesses ``a`` (earlier) and ``b`` (later) may run in separate loops."""
    for buf in {x[0] for x in a} & {x[0] for x in b}:
        shared = [x for x in a + b if x[0] == buf]
        if not any(x[2] for x in shared):
            continue  # both only read it
        if not _disjoint(shared, v, inner, ana):
            return False
    return True


class _Fission(Mutator):
    def __init__(self) -> None:
        self.changed = False

    def visit_For(self, loop: For) -> Stmt:
        loop = self.generic_visit(loop)
        if loop.kind != ForKind.SERIAL or not isinstance(loop.body, SeqStmt):
            return loop
        stmts = loop.body.seq
        info = [_accesses(s) for s in stmts]
        ana = Analyzer()
        inner: dict[int, For] = {}
        for _, loops in info:
            for lp in loops:
                ana.bind(lp.loop_var, Range(lp.min, lp.extent))
                inner[id(lp.loop_var)] = lp
        n = len(stmts)
        ok = [[_independent(info[i][0], info[j][0], loop.loop_var, inner, ana) if i < j
               else True
               for j in range(n)] for i in range(n)]
        cuts = [p for p in range(1, n) if all(ok[i][j] for i in range(p) for j in range(p, n))]
        if not cuts:
            return loop
        self.changed = True
        bounds = [0, *cuts, n]
        out = []
        for k, (start, stop) in enumerate(zip(bounds, bounds[1:])):
            body = seq(*stmts[start:stop])
            if k == 0:
                out.append(loop.replace(body=body))
                continue
            fresh = Var(loop.loop_var.name, loop.loop_var.dtype)
            out.append(loop.replace(loop_var=fresh,
                                    body=substitute(body, {loop.loop_var: fresh})))
        return seq(*out)


def loop_fission(func: PrimFunc) -> PrimFunc:
    """``func`` with loops of several independent statements split into one loop per statement
    (see the module docstring); ``func`` itself when no loop can be split."""
    f = _Fission()
    body = f.visit(func.body)
    return func.with_body(body) if f.changed else func


__all__ = ["loop_fission"]
