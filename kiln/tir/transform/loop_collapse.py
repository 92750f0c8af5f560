"""Loop pre-pass: merge perfectly nested loops that walk contiguous memory into one loop.

An element-wise nest over a ``(64, 49)`` tensor is two loops, but in memory it is one run of
3136 elements: matched as it is, the NPU's selector would issue 64 vector instructions of 49
lanes (a ragged last chunk each) instead of one stream of 3136. This pass merges
``for i in [0, N0): for j in [0, N1): S`` into ``for f in [0, N0 * N1): S[i = f / N1,
j = f % N1]`` when that is what every access does anyway: each buffer access's flat index
(``flat_index``: row-major for a multi-dimensional buffer, its strides where given) is
``c * (i * N1 + j) + e`` for a constant ``c`` (0 for an access that neither loop moves, a
broadcast scalar) and ``e`` free of ``i`` and ``j``. After ``simplify`` a flat buffer's index is
``c * f + e``; a multi-dimensional one keeps ``[f / N1, f % N1]``, whose flat index is the same.
Nests merge pairwise from the inside out, so three contiguous loops become one.

Refuses (leaves the nest) when: either loop is not serial, does not start at 0 (run
``loop_shift`` first) or has a non-constant extent; the two variables differ in type; the
outer loop's body is not exactly the inner loop (a perfect nest); some access is not
contiguous across the two loops (``B[i]``, a per-row bias, walks ``i`` but not ``j``;
``A[j * N0 + i]``, a transposed read); a loop variable is used other than in a buffer index
(a condition, a value, an inner loop's bounds), where the merged form would need a division
the selector cannot match.
"""

from __future__ import annotations

from ...arith import Analyzer
from ...arith.expr_utils import const_int
from ..expr import BufferLoad, IntImm, PrimExpr, Var, floordiv, floormod
from ..function import PrimFunc
from ..functor import Mutator, collect_vars, substitute
from ..stmt import BufferStore, For, ForKind, Stmt
from .flatten_buffers import flat_index


class _StripIndices(Mutator):
    """Records every buffer access's flat index and replaces its indices by zeros, so what is
    left shows the other uses of variables."""

    def __init__(self) -> None:
        self.flat: list[PrimExpr] = []

    def visit_BufferLoad(self, n: BufferLoad) -> PrimExpr:
        indices = tuple(self.visit(i) for i in n.indices)
        self.flat.append(flat_index(n.buffer, n.indices))
        return n.replace(indices=tuple(IntImm(i.dtype, 0) for i in indices))

    def visit_BufferStore(self, n: BufferStore) -> Stmt:
        for i in n.indices:
            self.visit(i)
        self.flat.append(flat_index(n.buffer, n.indices))
        return n.replace(value=self.visit(n.value),
                         indices=tuple(IntImm(i.dtype, 0) for i in n.indices))


def _contiguous(flat: PrimExpr, i: Var, j: Var, inner: int, ana: Analyzer) -> bool:
    """Whether ``flat == c * (i * inner + j) + e`` with ``c`` constant, ``e`` free of both."""
    def at(a: int, b: int) -> PrimExpr:
        return ana.simplify(substitute(flat, {i: IntImm(i.dtype, a), j: IntImm(j.dtype, b)}))

    base = at(0, 0)
    ci = const_int(ana.simplify(at(1, 0) - base))
    cj = const_int(ana.simplify(at(0, 1) - base))
    if ci is None or cj is None or ci != cj * inner:
        return False
    return const_int(ana.simplify(flat - (base + i * ci + j * cj))) == 0


class _Collapser(Mutator):
    def __init__(self) -> None:
        self.ana = Analyzer()
        self.changed = False

    def visit_For(self, loop: For) -> Stmt:
        loop = self.generic_visit(loop)
        inner = loop.body
        if not isinstance(inner, For):
            return loop
        loops = (loop, inner)
        if any(x.kind != ForKind.SERIAL or const_int(x.min) != 0 or const_int(x.extent) is None
               for x in loops):
            return loop
        i, j = loop.loop_var, inner.loop_var
        if i.dtype != j.dtype:
            return loop
        n0, n1 = const_int(loop.extent), const_int(inner.extent)
        strip = _StripIndices()
        rest = strip.visit(inner.body)
        if any(x is i or x is j for x in collect_vars(rest)):
            return loop
        if not all(_contiguous(f, i, j, n1, self.ana) for f in strip.flat):
            return loop
        self.changed = True
        dt = i.dtype
        fused = Var(f"{i.name}_{j.name}", dt)
        body = substitute(inner.body, {i: floordiv(fused, IntImm(dt, n1)),
                                       j: floormod(fused, IntImm(dt, n1))})
        return loop.replace(loop_var=fused, extent=IntImm(dt, n0 * n1), body=body)


def loop_collapse(func: PrimFunc) -> PrimFunc:
    """``func`` with perfect nests of contiguous loops merged into one loop each (see the module
    docstring); ``func`` itself when none can be. Run ``simplify`` afterwards."""
    c = _Collapser()
    body = c.visit(func.body)
    return func.with_body(body) if c.changed else func
