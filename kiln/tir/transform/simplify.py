"""Lowering pass: simplify every expression with ``kiln.arith.Analyzer``.

Flattening and block substitution leave index arithmetic such as ``(io * 8 + ii) * 1 + 0``;
folding it keeps the generated C readable and lets the vectorizer recognise contiguous accesses.
Loop variables are bound to their ranges while their body is simplified, so range facts
(``0 <= i < 8``) fold comparisons and floordiv/floormod. Besides expressions, the pass

- drops loops of extent 0 and replaces loops of extent 1 by their body with the loop variable
  substituted by the loop's start (except a loop bound to a GPU thread index: its body runs on
  one thread of the block, the others skip it);
- folds ``IfThenElse`` whose condition is provably true or false;
- expands let-bound variables (GPU lowering binds a fused thread index's divisions once) in the
  indices of ``local`` buffers: a register array indexed by ``v * 8 + j - (start of the
  thread's tile)`` is then indexed by constants once the loops are unrolled, which is what lets
  the GPU compiler keep it in registers (it cannot see through the let and the casts).
"""

from __future__ import annotations

from ...arith import Analyzer
from ...ir.node import Node, field_names_of
from ..buffer import Buffer
from ..expr import BufferLoad, Call, IntImm, PrimExpr, Range, Var
from ..function import PrimFunc
from ..functor import Mutator, post_order_visit, substitute
from ..stmt import BufferStore, Evaluate, For, ForKind, IfThenElse, LetStmt, SeqStmt, Stmt, seq


def _no_op() -> Stmt:
    return Evaluate(IntImm("int32", 0))


def _is_no_op(s: Stmt) -> bool:
    return isinstance(s, Evaluate) and isinstance(s.value, IntImm)


_WALKED = (Node, list, tuple, dict)


def _is_vector_free(x: object, memo: dict[int, tuple[object, bool]]) -> bool:
    """Whether no expression in ``x`` (buffers not entered) has several lanes. ``memo``
    (id -> (node, answer), the node kept so its id stays its own) holds every subtree's answer:
    a vector expression's parts are asked again one by one, which walked each part once per
    enclosing expression."""
    if isinstance(x, Node):
        if isinstance(x, Buffer):
            return True
        hit = memo.get(id(x))
        if hit is not None:
            return hit[1]
        ok = not (isinstance(x, PrimExpr) and x.dtype.lanes != 1)
        if ok:
            for name in field_names_of(type(x)):
                value = getattr(x, name)
                if isinstance(value, _WALKED) and not _is_vector_free(value, memo):
                    ok = False
                    break
        memo[id(x)] = (x, ok)
        return ok
    if isinstance(x, (list, tuple)):
        return all(_is_vector_free(e, memo) for e in x if isinstance(e, _WALKED))
    if isinstance(x, dict):
        return all(_is_vector_free(k, memo) and _is_vector_free(v, memo)
                   for k, v in x.items())
    return True


def _reads_memory(e: PrimExpr) -> bool:
    found = []
    post_order_visit(e, lambda n: found.append(n) if isinstance(n, (BufferLoad, Call)) else None)
    return bool(found)


class _ExpandLets(Mutator):
    """Substitutes let-bound values into the indices of ``local`` buffers (module docstring)."""

    def __init__(self, lets: dict[Var, PrimExpr]) -> None:
        self.lets = lets

    def visit_BufferLoad(self, load: BufferLoad) -> PrimExpr:
        if load.buffer.scope != "local":
            return self.generic_visit(load)
        return BufferLoad(load.buffer, tuple(substitute(i, self.lets) for i in load.indices))


class _Simplifier(Mutator):
    def __init__(self, analyzer) -> None:
        self.analyzer = analyzer
        self.vector_free: dict[int, tuple[object, bool]] = {}
        #: the values of the let-bound variables in scope, themselves expanded
        self.lets: dict[Var, PrimExpr] = {}

    # ---- expressions: hand whole scalar expressions to the analyzer -------------------------
    def visit_expr(self, e: PrimExpr) -> PrimExpr:
        if self.lets:
            e = _ExpandLets(self.lets).visit(e)
        if _is_vector_free(e, self.vector_free):
            return self.analyzer.simplify(e)
        # Vector expressions (written by hand before vectorization): simplify the parts.
        return Mutator.generic_visit(self, e)

    def visit(self, x):
        if isinstance(x, PrimExpr):
            return self.visit_expr(x)
        return super().visit(x)

    # ---- statements ------------------------------------------------------------------------
    def visit_For(self, loop: For) -> Stmt:
        lo = self.visit(loop.min)
        ext = self.visit(loop.extent)
        if isinstance(ext, IntImm) and ext.value <= 0:
            return _no_op()
        if isinstance(ext, IntImm) and ext.value == 1 and loop.kind != ForKind.THREAD_BINDING:
            return self.visit(substitute(loop.body, {loop.loop_var: lo}))
        self.analyzer.bind(loop.loop_var, Range(lo, ext))
        body = self.visit(loop.body)
        if _is_no_op(body):
            return body
        if lo is loop.min and ext is loop.extent and body is loop.body:
            return loop
        return For(loop.loop_var, lo, ext, loop.kind, body, loop.annotations)

    def visit_BufferStore(self, store: BufferStore) -> Stmt:
        if store.buffer.scope != "local" or not self.lets:
            return self.generic_visit(store)
        indices = tuple(self.visit(substitute(i, self.lets)) for i in store.indices)
        return BufferStore(store.buffer, self.visit(store.value), indices)

    def visit_LetStmt(self, let: LetStmt) -> Stmt:
        value = self.visit(let.value)
        if value.dtype.lanes == 1 and not _reads_memory(value):
            # index arithmetic only: a value loaded from memory could change before the use
            self.lets[let.var] = substitute(value, self.lets)
        try:
            body = self.visit(let.body)
        finally:
            self.lets.pop(let.var, None)
        if value is let.value and body is let.body:
            return let
        return LetStmt(let.var, value, body)

    def visit_IfThenElse(self, node: IfThenElse) -> Stmt:
        cond = self.visit(node.condition)
        if isinstance(cond, IntImm):
            chosen = node.then_case if cond.value else node.else_case
            return _no_op() if chosen is None else self.visit(chosen)
        then_case = self.visit(node.then_case)
        else_case = None if node.else_case is None else self.visit(node.else_case)
        if else_case is not None and _is_no_op(else_case):
            else_case = None
        if (cond is node.condition and then_case is node.then_case
                and else_case is node.else_case):
            return node
        return IfThenElse(cond, then_case, else_case)

    def visit_SeqStmt(self, s: SeqStmt) -> Stmt:
        items = [self.visit(x) for x in s.seq]
        kept = [x for x in items if not _is_no_op(x)]
        if len(kept) == len(s.seq) and all(a is b for a, b in zip(kept, s.seq)):
            return s
        return seq(*kept) if kept else _no_op()


def simplify_stmt(stmt: Stmt, analyzer=None) -> Stmt:
    """Simplify ``stmt`` (see the module docstring); ``analyzer`` may carry known facts."""
    if analyzer is None:
        analyzer = Analyzer()
    return _Simplifier(analyzer).visit(stmt)


def simplify(func: PrimFunc) -> PrimFunc:
    """Return ``func`` with simplified expressions and trivial loops/branches removed."""
    analyzer = Analyzer()
    # Shape variables are sizes: non-negative.
    for buf in func.buffer_map.values():
        for dim in buf.shape:
            if type(dim).__name__ in ("Var", "SizeVar"):
                analyzer.bind(dim, Range(IntImm(dim.dtype, 0), IntImm(dim.dtype,
                                                                      dim.dtype.max_value())))
    body = _Simplifier(analyzer).visit(func.body)
    return func if body is func.body else func.with_body(body)
