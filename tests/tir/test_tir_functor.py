"""TIR walks (kiln.tir.functor): post-order visits, visitor dispatch and mutators, checked
against a plain recursive walk over every dataclass field."""

from __future__ import annotations

import dataclasses

from kiln import tir
from kiln.ir.node import Node
from kiln.tir.functor import Mutator, Visitor, collect_vars, post_order_visit, substitute


def _reference_post_order(x, out):
    """Every node, children first, entering lists, tuples and dicts; buffers not entered."""
    if isinstance(x, tir.Buffer):
        out.append(x)
    elif dataclasses.is_dataclass(x) and isinstance(x, tir.Stmt | tir.PrimExpr | tir.PrimFunc
                                                    | tir.BufferRegion):
        for f in dataclasses.fields(x):
            _reference_post_order(getattr(x, f.name), out)
        out.append(x)
    elif isinstance(x, (list, tuple)):
        for e in x:
            _reference_post_order(e, out)
    elif isinstance(x, dict):
        for k, v in x.items():
            _reference_post_order(k, out)
            _reference_post_order(v, out)


def _tree():
    A = tir.decl_buffer((tir.const("int64", 16),), "float32", "A")
    i, j = tir.Var("i", "int64"), tir.Var("j", "int64")
    load = tir.BufferLoad(A, (i * 4 + j,))
    store = tir.BufferStore(A, load * 2.0 + 1.0, (i * 4 + j,))
    inner = tir.For(j, tir.const("int64", 0), tir.const("int64", 4), tir.ForKind.SERIAL, store)
    body = tir.For(i, tir.const("int64", 0), tir.const("int64", 4), tir.ForKind.SERIAL, inner)
    params = [tir.Var("A", "handle")]
    return tir.PrimFunc(params, dict(zip(params, [A])), body), A, i, j


def test_post_order_visit_matches_a_plain_walk():
    func, A, *_ = _tree()
    got, want = [], []
    post_order_visit(func, got.append)
    _reference_post_order(func, want)
    assert [id(n) for n in got] == [id(n) for n in want]
    assert got[-1] is func and A in got  # the buffer itself is visited, not entered
    assert not any(n is A.shape[0] for n in got)


def test_collect_vars_in_first_use_order():
    func, _, i, j = _tree()
    names = [v.name for v in collect_vars(func.body)]
    assert names[:2] == ["i", "j"] and len(names) == len(set(map(id, collect_vars(func.body))))


def test_visitor_dispatch_per_class_and_inherited_handlers():
    func, *_ = _tree()

    class CountFor(Visitor):
        def __init__(self):
            self.loops = 0

        def visit_For(self, s):
            self.loops += 1
            self.generic_visit(s)

    class CountForAndLoads(CountFor):
        def __init__(self):
            super().__init__()
            self.loads = 0

        def visit_BufferLoad(self, e):
            self.loads += 1

    a, b = CountFor(), CountForAndLoads()
    a.visit(func.body)
    b.visit(func.body)
    assert (a.loops, b.loops, b.loads) == (2, 2, 1)
    assert not hasattr(a, "loads")


def test_a_visitor_overriding_visit_still_sees_leaf_values():
    func, *_ = _tree()

    class Leaves(Visitor):
        def __init__(self):
            self.leaves = []

        def visit(self, x):
            if not isinstance(x, (Node, list, tuple, dict)):
                self.leaves.append(x)
            super().visit(x)

    v = Leaves()
    v.visit(func.body)
    assert "i" in v.leaves and 4 in v.leaves  # the var's name, an IntImm's value


def test_mutators_rebuild_only_what_changed_and_see_leaves_when_they_ask():
    func, _, i, j = _tree()
    same = Mutator().visit(func.body)
    assert same is func.body
    body = substitute(func.body, {j: tir.const("int64", 1)})
    assert body is not func.body and body.body is not func.body.body
    assert j not in collect_vars(body.body.body) and i in collect_vars(body.body.body)

    class Bump(Mutator):
        def visit(self, x):
            if isinstance(x, int) and not isinstance(x, bool) and x == 4:
                return 5
            return super().visit(x)

    bumped = Bump().visit(func.body)
    assert bumped.extent.value == 5 and func.body.extent.value == 4


def test_post_order_visit_of_statements_only():
    func, *_ = _tree()
    got, want = [], []
    post_order_visit(func, got.append, exprs=False)
    _reference_post_order(func, want)
    assert not any(isinstance(n, tir.PrimExpr) for n in got)
    assert [id(n) for n in got if isinstance(n, tir.Stmt)] == \
        [id(n) for n in want if isinstance(n, tir.Stmt)]
    assert sum(isinstance(n, tir.For) for n in got) == 2 and got[-1] is func
