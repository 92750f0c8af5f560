"""Generic visitors and mutators over TIR (expressions and statements together).

Dispatch is by class name: define ``visit_Add``, ``visit_For``, ``visit_BufferLoad``... to handle a
node; anything without a method is handled by ``generic_visit`` which walks (or, in the mutator,
rebuilds) every field. A mutator rebuilds a node only if one of its fields changed, so untouched
subtrees keep their identity. Buffers are leaves by default (override ``visit_Buffer`` to remap
them); the variables bound by loops, lets and blocks are visited like any other field.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any

from ..ir.node import Node, field_names_of
from .buffer import Buffer
from .expr import PrimExpr, Var

#: What a walk enters: every other field value (ints, strings, data types...) is a leaf.
_CONTAINERS = (Node, list, tuple, dict)


def _handler(functor: type, node_type: type) -> Callable[..., Any] | None:
    """``functor``'s ``visit_<node type name>`` function, or None, looked up once per pair:
    building the name and searching the class on every node was a large part of a walk."""
    key = (functor, node_type)
    try:
        return _HANDLERS[key]
    except KeyError:
        fn = _HANDLERS[key] = getattr(functor, "visit_" + node_type.__name__, None)
        return fn


_HANDLERS: dict[tuple[type, type], Callable[..., Any] | None] = {}


class Visitor:
    """Walks a TIR tree (PrimExpr, Stmt, PrimFunc, Buffer regions...)."""

    #: Whether the class keeps this ``visit``: leaf field values (not nodes or containers) are
    #: then skipped without a call, since this ``visit`` ignores them.
    _plain_visit: bool = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._plain_visit = cls.visit is Visitor.visit

    def visit(self, x: Any) -> None:
        if isinstance(x, Node):
            method = _handler(type(self), type(x))
            if method is not None:
                method(self, x)
            else:
                self.generic_visit(x)
        elif isinstance(x, (list, tuple)):
            for e in x:
                self.visit(e)
        elif isinstance(x, dict):
            for k, v in x.items():
                self.visit(k)
                self.visit(v)

    def generic_visit(self, n: Node) -> None:
        if isinstance(n, Buffer):
            return
        plain = self._plain_visit
        for name in field_names_of(type(n)):
            value = getattr(n, name)
            if not plain or isinstance(value, _CONTAINERS):
                self.visit(value)

    def visit_Buffer(self, b: Buffer) -> None:
        return


class Mutator:
    """Rebuilds a TIR tree bottom-up; return a new node from ``visit_X`` to replace a node."""

    #: As :attr:`Visitor._plain_visit`: this ``visit`` returns leaf values unchanged.
    _plain_visit: bool = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._plain_visit = cls.visit is Mutator.visit

    def visit(self, x: Any) -> Any:
        if isinstance(x, Node):
            method = _handler(type(self), type(x))
            if method is not None:
                return method(self, x)
            return self.generic_visit(x)
        if isinstance(x, tuple):
            new = tuple(self.visit(e) for e in x)
            return x if all(a is b for a, b in zip(new, x)) else new
        if isinstance(x, list):
            new_l = [self.visit(e) for e in x]
            return x if all(a is b for a, b in zip(new_l, x)) else new_l
        if isinstance(x, dict):
            items = [(self.visit(k), self.visit(v)) for k, v in x.items()]
            if all(a is k and b is v for (a, b), (k, v) in zip(items, x.items())):
                return x
            return dict(items)
        return x

    def generic_visit(self, n: Node) -> Any:
        if isinstance(n, Buffer):
            return n
        changes = {}
        plain = self._plain_visit
        for name in field_names_of(type(n)):
            old = getattr(n, name)
            if plain and not isinstance(old, _CONTAINERS):
                continue
            new = self.visit(old)
            if new is not old:
                changes[name] = new
        if not changes:
            return n
        if isinstance(n, PrimExpr) and "dtype" not in changes and _dtype_derived(n):
            # Let __post_init__ recompute a derived dtype (e.g. BufferLoad lanes).
            changes["dtype"] = None
        return dataclasses.replace(n, **changes)  # type: ignore[type-var]

    def visit_Buffer(self, b: Buffer) -> Buffer:
        return b


@functools.cache
def _dtype_derived_type(cls: type) -> bool:
    for f in dataclasses.fields(cls):
        if f.name == "dtype":
            return f.default is None
    return False


def _dtype_derived(n: PrimExpr) -> bool:
    """True for node types whose dtype defaults from their operands."""
    return _dtype_derived_type(type(n))


# TVM-style aliases.
StmtExprVisitor = ExprVisitor = StmtVisitor = Visitor
StmtExprMutator = ExprMutator = StmtMutator = Mutator


class _Substituter(Mutator):
    def __init__(self, vmap: Mapping[Var, PrimExpr] | Callable[[Var], PrimExpr | None]):
        self.vmap = vmap

    def visit_Var(self, v: Var) -> PrimExpr:
        if callable(self.vmap):
            r = self.vmap(v)
            return v if r is None else r
        return self.vmap.get(v, v)

    visit_SizeVar = visit_Var


def substitute(node: Any, vmap: Mapping[Var, PrimExpr] | Callable[[Var], PrimExpr | None]) -> Any:
    """Replace variables in ``node`` by expressions (a mapping or a function var -> expr|None)."""
    if isinstance(vmap, Mapping) and not vmap:
        return node
    return _Substituter(vmap).visit(node)


def post_order_visit(node: Any, fvisit: Callable[[Node], None], exprs: bool = True) -> None:
    """Call ``fvisit`` on every node of the tree, children first (buffers are not entered).
    ``exprs=False``: statements and the like only, expressions neither entered nor visited (no
    expression holds a statement): for analyses that look for ifs, loops or allocations.

    The lowering passes' analyses walk subtrees with it over and over (a third of building
    ResNet-18 before the C compiler), so the walk is one closure that calls itself on nodes
    and containers only, not a visitor's dispatch on every field value."""
    skipped = () if exprs else PrimExpr

    def walk(x: Any) -> None:
        if isinstance(x, Node):
            if isinstance(x, skipped):
                return
            if not isinstance(x, Buffer):
                for name in field_names_of(type(x)):
                    value = getattr(x, name)
                    if isinstance(value, _CONTAINERS):
                        walk(value)
            fvisit(x)
        elif isinstance(x, (list, tuple)):
            for e in x:
                if isinstance(e, _CONTAINERS):
                    walk(e)
        elif isinstance(x, dict):
            for k, v in x.items():
                walk(k)
                walk(v)

    walk(node)


def collect_vars(node: Any) -> list[Var]:
    """Every distinct Var used in ``node`` (first-use order)."""
    seen: dict[int, Var] = {}

    def f(n: Node) -> None:
        if isinstance(n, Var) and id(n) not in seen:
            seen[id(n)] = n

    post_order_visit(node, f)
    return list(seen.values())
