"""The schedulable tree of a PrimFunc: an index of its blocks and loops, and tree rewriting.

IR is immutable, so every primitive builds a new function. What stays stable across versions is
the *identity key* of each schedulable node: a block is known by its name (unique within the
function) and a loop by its loop variable (unique within the function). :class:`TreeIndex` maps
those keys to the nodes of one version of the tree together with their ancestry and program
order; :func:`rewrite` rebuilds a statement tree with some nodes replaced, inserted before, or
removed (loops left empty by a removal disappear with it).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from ...ir.errors import ScheduleError
from ..buffer import Buffer
from ..expr import Var
from ..function import PrimFunc
from ..functor import substitute
from ..stmt import (
    Allocate,
    AssertStmt,
    Block,
    BlockRealize,
    For,
    IfThenElse,
    LetStmt,
    SeqStmt,
    Stmt,
)

# A key naming a schedulable node independently of the version of the tree.
Key = tuple[str, str] | tuple[str, Var]


@dataclass(eq=False)
class SRef:
    """A For or BlockRealize of one version of the tree, with its place in it."""

    node: Stmt
    parent: SRef | None
    order: int
    end: int = 0
    children: list[SRef] = field(default_factory=list)

    @property
    def is_block(self) -> bool:
        return isinstance(self.node, BlockRealize)

    @property
    def block(self) -> Block:
        assert isinstance(self.node, BlockRealize)
        return self.node.block

    @property
    def loop(self) -> For:
        assert isinstance(self.node, For)
        return self.node

    @property
    def key(self) -> Key:
        if isinstance(self.node, BlockRealize):
            return ("block", self.node.block.name_hint)
        assert isinstance(self.node, For)
        return ("loop", self.node.loop_var)

    def describe(self) -> str:
        if isinstance(self.node, BlockRealize):
            return f"block {self.node.block.name_hint!r}"
        return f"loop {self.loop.loop_var.name!r}"

    def is_ancestor_of(self, other: SRef) -> bool:
        """True when ``other`` lies strictly inside this node's subtree."""
        return self.order < other.order <= self.end


class TreeIndex:
    """Blocks by name, loops by loop variable, with parents and pre-order positions."""

    def __init__(self, func: PrimFunc):
        self.func = func
        self.blocks: dict[str, SRef] = {}
        self.loops: dict[Var, SRef] = {}
        self.block_list: list[SRef] = []
        # Names no new block may take (the schedule reserves every name it ever handed out).
        self.reserved_names: set[str] = set()
        self._counter = 0
        body = func.body
        if not isinstance(body, BlockRealize):
            raise ScheduleError(
                "the function is not in block form: its body must be the BlockRealize of a root "
                f"block (got {type(body).__name__}); schedule it before lowering"
            )
        self.root = self._add(body, None)

    # -- construction ----------------------------------------------------------------------
    def _add(self, node: Stmt, parent: SRef | None) -> SRef:
        sref = SRef(node, parent, self._counter)
        self._counter += 1
        if parent is not None:
            parent.children.append(sref)
        if isinstance(node, BlockRealize):
            name = node.block.name_hint
            if name in self.blocks:  # pragma: no cover - prepared functions have unique names
                raise ScheduleError(f"two blocks are named {name!r}")
            self.blocks[name] = sref
            self.block_list.append(sref)
            if node.block.init is not None:
                self._walk(node.block.init, sref)
            self._walk(node.block.body, sref)
        else:
            assert isinstance(node, For)
            if node.loop_var in self.loops:  # pragma: no cover - prepared functions are unique
                raise ScheduleError(f"loop variable {node.loop_var.name!r} is bound twice")
            self.loops[node.loop_var] = sref
            self._walk(node.body, sref)
        sref.end = self._counter - 1
        return sref

    def _walk(self, stmt: Stmt | None, parent: SRef) -> None:
        if stmt is None:
            return
        if isinstance(stmt, (For, BlockRealize)):
            self._add(stmt, parent)
        elif isinstance(stmt, SeqStmt):
            for s in stmt.seq:
                self._walk(s, parent)
        elif isinstance(stmt, IfThenElse):
            self._walk(stmt.then_case, parent)
            self._walk(stmt.else_case, parent)
        elif isinstance(stmt, (LetStmt, Allocate, AssertStmt)):
            self._walk(stmt.body, parent)

    def taken_names(self) -> set[str]:
        """Block names in use or reserved (a new block must pick another)."""
        return set(self.blocks) | self.reserved_names

    # -- lookups -----------------------------------------------------------------------------
    def lookup(self, key: Key) -> SRef | None:
        kind, ident = key
        if kind == "block":
            return self.blocks.get(ident)  # type: ignore[arg-type]
        return self.loops.get(ident)  # type: ignore[arg-type]

    def scope_of(self, sref: SRef) -> SRef:
        """The nearest enclosing block (the root block for top-level stages)."""
        p = sref.parent
        while p is not None and not p.is_block:
            p = p.parent
        if p is None:
            raise ScheduleError("the root block has no enclosing scope")
        return p

    def loops_above(self, sref: SRef) -> list[SRef]:
        """Loops between the enclosing block and ``sref``, outermost first."""
        out: list[SRef] = []
        p = sref.parent
        while p is not None and not p.is_block:
            out.append(p)
            p = p.parent
        return out[::-1]

    def ancestors(self, sref: SRef) -> list[SRef]:
        """Every For/BlockRealize above ``sref``, outermost (the root) first."""
        out: list[SRef] = []
        p = sref.parent
        while p is not None:
            out.append(p)
            p = p.parent
        return out[::-1]

    def lowest_common_ancestor(self, srefs: list[SRef]) -> SRef:
        """The deepest loop (or block) strictly above every one of ``srefs``."""
        chains = [self.ancestors(s) for s in srefs]
        common = chains[0][0]
        for nodes in zip(*chains):
            if any(n is not nodes[0] for n in nodes):
                break
            common = nodes[0]
        return common

    def blocks_under(self, sref: SRef) -> list[SRef]:
        """Blocks strictly inside ``sref`` (any depth), in program order."""
        return [b for b in self.block_list if sref.is_ancestor_of(b)]

    def child_blocks(self, sref: SRef) -> list[SRef]:
        """Blocks inside ``sref`` that are not nested inside another block below it."""
        out: list[SRef] = []

        def visit(s: SRef) -> None:
            for c in s.children:
                if c.is_block:
                    out.append(c)
                else:
                    visit(c)

        visit(sref)
        return out

    def child_containing(self, parent: SRef, target: SRef) -> SRef:
        """The direct child of ``parent`` whose subtree holds (or is) ``target``."""
        for c in parent.children:
            if c is target or c.is_ancestor_of(target):
                return c
        raise ScheduleError(  # pragma: no cover - callers check ancestry first
            f"{target.describe()} is not inside {parent.describe()}"
        )

    def writers(self, buffer: Buffer, scope: SRef) -> list[SRef]:
        return [b for b in self.child_blocks_deep(scope) if _touches(b.block.writes, buffer)]

    def readers(self, buffer: Buffer, scope: SRef) -> list[SRef]:
        return [b for b in self.child_blocks_deep(scope) if _touches(b.block.reads, buffer)]

    def child_blocks_deep(self, scope: SRef) -> list[SRef]:
        """Blocks of ``scope`` (those whose nearest enclosing block is ``scope``)."""
        return self.child_blocks(scope)


def _touches(regions, buffer: Buffer) -> bool:
    return any(r.buffer is buffer for r in regions)


# ---------------------------------------------------------------------------------------------
# rewriting
# ---------------------------------------------------------------------------------------------
def rewrite(stmt: Stmt | None, repl: dict[int, Stmt | None]) -> Stmt | None:
    """Rebuild ``stmt`` with the statements whose ``id`` is in ``repl`` replaced.

    A replacement of ``None`` removes the statement; a loop, branch or block whose body becomes
    empty is removed too. A ``SeqStmt`` replacement is spliced into an enclosing sequence, which
    is how statements are inserted before or after an existing one. Untouched subtrees keep
    their identity.
    """
    if stmt is None:
        return None
    if id(stmt) in repl:
        return repl[id(stmt)]
    if isinstance(stmt, SeqStmt):
        items: list[Stmt] = []
        changed = False
        for s in stmt.seq:
            r = rewrite(s, repl)
            changed |= r is not s
            if r is None:
                continue
            items.extend(r.seq if isinstance(r, SeqStmt) else (r,))
        if not changed:
            return stmt
        if not items:
            return None
        return items[0] if len(items) == 1 else SeqStmt(tuple(items))
    if isinstance(stmt, (For, LetStmt, Allocate, AssertStmt)):
        body = rewrite(stmt.body, repl)
        if body is stmt.body:
            return stmt
        return None if body is None else stmt.replace(body=body)
    if isinstance(stmt, IfThenElse):
        then = rewrite(stmt.then_case, repl)
        other = rewrite(stmt.else_case, repl)
        if then is stmt.then_case and other is stmt.else_case:
            return stmt
        if then is None:
            return None
        return stmt.replace(then_case=then, else_case=other)
    if isinstance(stmt, BlockRealize):
        block = rewrite(stmt.block, repl)
        if block is stmt.block:
            return stmt
        return None if block is None else stmt.replace(block=block)
    if isinstance(stmt, Block):
        body = rewrite(stmt.body, repl)
        init = rewrite(stmt.init, repl)
        if body is stmt.body and init is stmt.init:
            return stmt
        if body is None:
            return None
        return stmt.replace(body=body, init=init)
    return stmt


def rewrite_func(func: PrimFunc, repl: dict[int, Stmt | None]) -> PrimFunc:
    body = rewrite(func.body, repl)
    if body is None:
        raise ScheduleError("the transformation would leave the function without a body")
    return func if body is func.body else func.replace(body=body)


def insert_before(target: Stmt, new: Stmt) -> Stmt:
    """The replacement that puts ``new`` right before ``target``."""
    return SeqStmt((new, target))


def insert_after(target: Stmt, new: Stmt) -> Stmt:
    return SeqStmt((target, new))


def update_root_allocs(
    func: PrimFunc, add: tuple[Buffer, ...] = (), remove: tuple[Buffer, ...] = ()
) -> PrimFunc:
    """Add/remove buffers from the root block's ``alloc_buffers``."""
    realize = func.body
    assert isinstance(realize, BlockRealize)
    root = realize.block
    allocs = tuple(b for b in root.alloc_buffers if not any(b is r for r in remove)) + add
    if len(allocs) == len(root.alloc_buffers) and all(
        a is b for a, b in zip(allocs, root.alloc_buffers)
    ):
        return func
    return func.replace(body=realize.replace(block=root.replace(alloc_buffers=allocs)))


# ---------------------------------------------------------------------------------------------
# names
# ---------------------------------------------------------------------------------------------
def unique_name(base: str, taken: set[str]) -> str:
    """``base``, or ``base_1``, ``base_2``... whichever is free (and reserve it)."""
    name, k = base, 1
    while name in taken:
        name = f"{base}_{k}"
        k += 1
    taken.add(name)
    return name


def buffer_names(func: PrimFunc) -> set[str]:
    names = {b.name for b in func.buffer_map.values()}
    realize = func.body
    for sref_block in _all_blocks(realize):
        names.update(b.name for b in sref_block.alloc_buffers)
    return names


def _all_blocks(stmt: Stmt | None) -> Iterator[Block]:
    if stmt is None:
        return
    if isinstance(stmt, BlockRealize):
        yield stmt.block
        yield from _all_blocks(stmt.block.init)
        yield from _all_blocks(stmt.block.body)
    elif isinstance(stmt, For):
        yield from _all_blocks(stmt.body)
    elif isinstance(stmt, SeqStmt):
        for s in stmt.seq:
            yield from _all_blocks(s)
    elif isinstance(stmt, IfThenElse):
        yield from _all_blocks(stmt.then_case)
        yield from _all_blocks(stmt.else_case)
    elif isinstance(stmt, (LetStmt, Allocate, AssertStmt)):
        yield from _all_blocks(stmt.body)


def make_unique(func: PrimFunc) -> PrimFunc:
    """Rename duplicate block names and re-create loop variables bound more than once.

    Both are identity keys of the schedule; a function built by hand may reuse a name or a loop
    variable for two stages. The first occurrence keeps its name/variable.
    """
    names: set[str] = set()
    seen_vars: set[Var] = set()

    def visit(stmt: Stmt | None) -> Stmt | None:
        if stmt is None:
            return None
        if isinstance(stmt, BlockRealize):
            block = stmt.block
            name = block.name_hint
            new_name = name if name not in names else unique_name(name, names)
            names.add(new_name)
            init, body = visit(block.init), visit(block.body)
            if new_name == name and init is block.init and body is block.body:
                return stmt
            return stmt.replace(block=block.replace(name_hint=new_name, init=init, body=body))
        if isinstance(stmt, For):
            if stmt.loop_var in seen_vars:
                v = Var(stmt.loop_var.name, stmt.loop_var.dtype)
                seen_vars.add(v)
                body = visit(substitute(stmt.body, {stmt.loop_var: v}))
                return stmt.replace(loop_var=v, body=body)
            seen_vars.add(stmt.loop_var)
            body = visit(stmt.body)
            return stmt if body is stmt.body else stmt.replace(body=body)
        if isinstance(stmt, SeqStmt):
            seq = tuple(visit(s) for s in stmt.seq)
            return stmt if all(a is b for a, b in zip(seq, stmt.seq)) else SeqStmt(seq)
        if isinstance(stmt, IfThenElse):
            t, e = visit(stmt.then_case), visit(stmt.else_case)
            if t is stmt.then_case and e is stmt.else_case:
                return stmt
            return stmt.replace(then_case=t, else_case=e)
        if isinstance(stmt, (LetStmt, Allocate, AssertStmt)):
            body = visit(stmt.body)
            return stmt if body is stmt.body else stmt.replace(body=body)
        return stmt

    body = visit(func.body)
    return func if body is func.body else func.replace(body=body)
