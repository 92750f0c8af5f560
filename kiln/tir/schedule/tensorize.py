"""tensorize: replace a block by a tensor intrinsic after checking it computes the same thing.

The block (usually made by ``blockize``) must have a body of the intrinsic's shape: a perfect
loop nest around one block. Matching walks both side by side:

- loops pair up in order; extents must be equal (a free variable of the desc, e.g. ``K``,
  binds to the block's extent); loops start at 0;
- the inner block has no ``init`` (blockize moves it to the outer block, which keeps it) and
  no predicate (iteration variables may be grouped differently: what is compared is the
  statement each loop iteration runs);
- the bodies, with iteration variables replaced by their bindings and the desc's loop variables
  by the block's, are equal node by node (same operations, dtypes, constants), except buffer
  accesses: an N-D desc buffer binds to the *trailing* N dimensions of a real buffer at a
  loop-invariant offset (``C[vi_o * 6 + i, vj_o * 16 + j]`` matches ``C[i, j]`` at offset
  ``(vi_o * 6, vj_o * 16)``), the same offset for every access, and the real buffer's strides
  must agree with the desc's (a desc stride variable binds to the real stride); a desc buffer
  declared in a storage scope other than ``"global"`` (an accelerator's scratchpad) matches
  only buffers of that scope.

The block's body becomes the impl's body with each impl buffer access moved to the matched
region and the bound variables substituted; the block keeps its iteration variables, regions
and ``init``, and records the intrinsic in the annotation ``"kiln.tensor_intrin"``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ...ir.errors import ScheduleError
from ...ir.node import Node
from ..buffer import Buffer
from ..expr import BufferLoad, FloatImm, IntImm, PrimExpr, StringImm, Var, const
from ..function import PrimFunc
from ..functor import Mutator, collect_vars, substitute
from ..stmt import AssertStmt, BlockRealize, BufferStore, For, Stmt
from ..tensor_intrin import TensorIntrin, elem_offset, get, root_body
from .analysis import analyzer_at, as_int, bind_loop, is_true
from .state import SRef, TreeIndex, rewrite_func


class _Mismatch(Exception):
    pass


def _nest(stmt: Stmt) -> tuple[list[For], Stmt]:
    loops = []
    while isinstance(stmt, For):
        loops.append(stmt)
        stmt = stmt.body
    return loops, stmt


def _stride(buf: Buffer, dim: int) -> PrimExpr:
    """Element stride of dimension ``dim`` (declared, else compact row-major)."""
    if buf.strides:
        return buf.strides[dim]
    s: PrimExpr = const("int64", 1)
    for extent in buf.shape[dim + 1:]:
        s = s * extent
    return s


@dataclasses.dataclass
class _Binding:
    buffer: Buffer
    offsets: tuple[PrimExpr, ...]


class _Matcher:
    def __init__(self, desc: PrimFunc, inner_vars: set[Var], ana: Any):
        self.desc_bufs = set(desc.buffers)
        self.free: set[Var] = set()
        for b in desc.buffers:
            for e in (*b.shape, *b.strides):
                self.free.update(collect_vars(e))
        self.inner_vars = inner_vars
        self.ana = ana
        self.vars: dict[Var, PrimExpr] = {}
        self.bufs: dict[Buffer, _Binding] = {}
        # desc stride variable -> (desc buffer, dimension); constant desc strides to re-check
        self.stride_vars: dict[Var, tuple[Buffer, int]] = {}
        self.fixed_strides: list[tuple[Buffer, int, PrimExpr]] = []

    # -- free variables ------------------------------------------------------------------------
    def bind_var(self, d: Var, value: PrimExpr, what: str) -> None:
        old = self.vars.get(d)
        if old is None:
            if any(v in self.inner_vars for v in collect_vars(value)):
                raise _Mismatch(f"{what}: {d.name} would bind to {value}, which varies inside "
                                "the tensorized loops")
            self.vars[d] = value
        elif not self.ana.can_prove(old.equal(value)):
            raise _Mismatch(f"{what}: {d.name} is bound to {old} and to {value}")

    def match_value(self, t: PrimExpr, d: PrimExpr, what: str) -> None:
        """``t`` equals the desc expression ``d`` (binding free desc variables)."""
        if isinstance(d, Var) and d in self.free:
            self.bind_var(d, t, what)
            return
        if set(collect_vars(d)) & self.free:
            self.expr(t, d, what)
            return
        if not self.ana.can_prove(t.equal(d) if t.dtype == d.dtype else
                                  t.equal(d.astype(t.dtype))):
            raise _Mismatch(f"{what}: {t} where the intrinsic has {d}")

    # -- buffers -------------------------------------------------------------------------------
    def access(self, tbuf: Buffer, tidx: tuple, dbuf: Buffer, didx: tuple, what: str) -> None:
        if dbuf not in self.desc_bufs:
            raise _Mismatch(f"{what}: the intrinsic accesses {dbuf.name!r}, not a parameter")
        if tbuf.dtype != dbuf.dtype:
            raise _Mismatch(f"{what}: buffer {tbuf.name!r} is {tbuf.dtype}, the intrinsic's "
                            f"{dbuf.name!r} is {dbuf.dtype}")
        if dbuf.scope != "global" and tbuf.scope != dbuf.scope:
            raise _Mismatch(f"{what}: buffer {tbuf.name!r} is in scope {tbuf.scope!r}, the "
                            f"intrinsic's {dbuf.name!r} in {dbuf.scope!r}")
        lead = tbuf.ndim - dbuf.ndim
        if lead < 0:
            raise _Mismatch(f"{what}: buffer {tbuf.name!r} has {tbuf.ndim} dimensions, fewer "
                            f"than the intrinsic's {dbuf.name!r} ({dbuf.ndim})")
        offsets = list(tidx[:lead])
        for t, d in zip(tidx[lead:], didx):
            offsets.append(self.ana.simplify(t - (d if d.dtype == t.dtype else d.astype(t.dtype))))
        for k, off in enumerate(offsets):
            moving = [v.name for v in collect_vars(off) if v in self.inner_vars]
            if moving:
                raise _Mismatch(
                    f"{what}: {tbuf.name}{list(tidx)} is not the intrinsic's "
                    f"{dbuf.name}{list(didx)} at a fixed offset (dimension {k} of the offset "
                    f"depends on loop(s) {moving})"
                )
        known = self.bufs.get(dbuf)
        if known is None:
            if any(b.buffer is tbuf for b in self.bufs.values()):
                raise _Mismatch(f"{what}: buffer {tbuf.name!r} plays two intrinsic buffers")
            self._strides(tbuf, dbuf, what)
            self.bufs[dbuf] = _Binding(tbuf, tuple(offsets))
            return
        if known.buffer is not tbuf:
            raise _Mismatch(f"{what}: the intrinsic's {dbuf.name!r} is bound to "
                            f"{known.buffer.name!r} and to {tbuf.name!r}")
        for a, b in zip(known.offsets, offsets):
            if not self.ana.can_prove(a.equal(b)):
                raise _Mismatch(f"{what}: {tbuf.name!r} is accessed at two offsets ({a} vs {b})")

    def _strides(self, tbuf: Buffer, dbuf: Buffer, what: str) -> None:
        lead = tbuf.ndim - dbuf.ndim
        for k in range(dbuf.ndim):
            ts = self.ana.simplify(_stride(tbuf, lead + k))
            ds = _stride(dbuf, k)
            if isinstance(ds, Var) and ds in self.free:
                self.stride_vars.setdefault(ds, (dbuf, k))
            elif not (set(collect_vars(ds)) & self.free):
                self.fixed_strides.append((dbuf, k, ds))
            try:
                self.match_value(ts, ds, what)
            except _Mismatch:
                raise _Mismatch(
                    f"{what}: dimension {lead + k} of {tbuf.name!r} has stride {ts}, the "
                    f"intrinsic's {dbuf.name!r} needs {ds}"
                ) from None

    # -- structure -----------------------------------------------------------------------------
    def stmt(self, t: Stmt, d: Stmt) -> None:
        if type(t) is not type(d):
            raise _Mismatch(f"found a {type(t).__name__} where the intrinsic has a "
                            f"{type(d).__name__}")
        if isinstance(t, BufferStore):
            what = f"store to {t.buffer.name!r}"
            self.access(t.buffer, t.indices, d.buffer, d.indices, what)
            self.expr(t.value, d.value, what)
            return
        self.generic(t, d, type(t).__name__)

    def expr(self, t: Any, d: Any, what: str) -> None:
        if isinstance(d, Var) and d in self.free:
            self.bind_var(d, t, what)
            return
        if type(t) is not type(d):
            raise _Mismatch(f"{what}: found {type(t).__name__} {t} where the intrinsic has "
                            f"{type(d).__name__} {d}")
        if isinstance(t, PrimExpr) and t.dtype != d.dtype:
            raise _Mismatch(f"{what}: {t} has dtype {t.dtype}, the intrinsic's {d} has {d.dtype}")
        if isinstance(t, Var):
            if t is not d:
                raise _Mismatch(f"{what}: variable {t.name} where the intrinsic has {d.name}")
        elif isinstance(t, (IntImm, FloatImm, StringImm)):
            if t.value != d.value:
                raise _Mismatch(f"{what}: constant {t.value} where the intrinsic has {d.value}")
        elif isinstance(t, BufferLoad):
            self.access(t.buffer, t.indices, d.buffer, d.indices, what)
        else:
            self.generic(t, d, what)

    def generic(self, t: Node, d: Node, what: str) -> None:
        for f in dataclasses.fields(t):
            a, b = getattr(t, f.name), getattr(d, f.name)
            if isinstance(a, tuple):
                if len(a) != len(b):
                    raise _Mismatch(f"{what}: {f.name} has {len(a)} entries, the intrinsic "
                                    f"{len(b)}")
                for x, y in zip(a, b):
                    self.expr(x, y, what) if isinstance(x, Node) else self._plain(x, y, what)
            elif isinstance(a, Stmt):
                self.stmt(a, b)
            elif isinstance(a, Node):
                self.expr(a, b, what)
            else:
                self._plain(a, b, what)

    @staticmethod
    def _plain(a: Any, b: Any, what: str) -> None:
        if a != b:
            raise _Mismatch(f"{what}: {a!r} where the intrinsic has {b!r}")


def _match(index: TreeIndex, sref: SRef, intrin: TensorIntrin) -> _Matcher:
    block = sref.block
    tloops, tinner = _nest(block.body)
    dloops, dinner = _nest(intrin.desc_nest)
    ana = analyzer_at(index, sref)
    if not isinstance(tinner, BlockRealize):
        raise _Mismatch(f"its body is not a loop nest around one block (found "
                        f"{type(tinner).__name__}); blockize a loop first")
    if len(tloops) != len(dloops):
        raise _Mismatch(f"it has {len(tloops)} loops around block {tinner.block.name_hint!r}, "
                        f"the intrinsic {len(dloops)}")
    m = _Matcher(intrin.desc, {lp.loop_var for lp in tloops}, ana)
    loop_map: dict[Var, PrimExpr] = {}
    for k, (tl, dl) in enumerate(zip(tloops, dloops)):
        bind_loop(ana, tl)
        what = f"loop {k} ({tl.loop_var.name!r})"
        if as_int(ana.simplify(tl.min)) != 0:
            raise _Mismatch(f"{what} starts at {tl.min}, not 0")
        m.match_value(ana.simplify(tl.extent), substitute(dl.extent, loop_map), f"{what} extent")
        loop_map[dl.loop_var] = tl.loop_var if tl.loop_var.dtype == dl.loop_var.dtype else (
            tl.loop_var.astype(dl.loop_var.dtype))
    tb, db = tinner.block, dinner.block
    name = tb.name_hint
    if not is_true(tinner.predicate):
        raise _Mismatch(f"block {name!r} has the predicate {tinner.predicate} (a split that "
                        "does not divide); the intrinsic computes whole tiles")
    if tb.init is not None:
        raise _Mismatch(f"block {name!r} has an init; tensorize the block made by blockize "
                        "(which keeps the init) or decompose the reduction first")
    tbody = substitute(tb.body, {iv.var: v for iv, v in zip(tb.iter_vars, tinner.iter_values)})
    dvals = {iv.var: substitute(v, loop_map) for iv, v in zip(db.iter_vars, dinner.iter_values)}
    dbody = substitute(db.body, dvals)
    tbody = _simplify_indices(tbody, ana)
    dbody = _simplify_indices(dbody, ana)
    m.stmt(tbody, dbody)
    missing = [b.name for b in intrin.desc.buffers if b not in m.bufs]
    if missing:
        raise _Mismatch(f"the intrinsic's buffers {missing} are not accessed by block {name!r}")
    return m


class _SimplifyIndices(Mutator):
    def __init__(self, ana: Any):
        self.ana = ana

    def visit_BufferLoad(self, e: BufferLoad) -> PrimExpr:
        return e.replace(indices=tuple(self.ana.simplify(i) for i in e.indices))

    def visit_BufferStore(self, s: BufferStore) -> Stmt:
        return s.replace(indices=tuple(self.ana.simplify(i) for i in s.indices),
                         value=self.visit(s.value))


def _simplify_indices(stmt: Stmt, ana: Any) -> Stmt:
    return _SimplifyIndices(ana).visit(stmt)


class _Instantiate(Mutator):
    """The impl body with impl buffers moved onto the matched regions of real buffers."""

    def __init__(self, bufs: dict[Buffer, _Binding], vmap: dict[Var, PrimExpr], ana: Any):
        self.bufs = bufs
        self.vmap = vmap
        self.ana = ana

    def _indices(self, b: _Binding, idx: tuple) -> tuple:
        lead = len(b.offsets) - len(idx)
        moved = [self.ana.simplify(off + (i if i.dtype == off.dtype else i.astype(off.dtype)))
                 for off, i in zip(b.offsets[lead:], (self.visit(i) for i in idx))]
        return tuple(b.offsets[:lead]) + tuple(moved)

    def visit_BufferLoad(self, e: BufferLoad) -> PrimExpr:
        b = self.bufs.get(e.buffer)
        if b is None:
            return e.replace(indices=tuple(self.visit(i) for i in e.indices))
        return BufferLoad(b.buffer, self._indices(b, e.indices))

    def visit_BufferStore(self, s: BufferStore) -> Stmt:
        b = self.bufs.get(s.buffer)
        value = self.visit(s.value)
        if b is None:
            return s.replace(value=value, indices=tuple(self.visit(i) for i in s.indices))
        return BufferStore(b.buffer, value, self._indices(b, s.indices))

    def visit_Var(self, v: Var) -> PrimExpr:
        return self.vmap.get(v, v)


def instantiate(intrin: TensorIntrin, m: _Matcher) -> Stmt:
    """The impl's body bound to what ``m`` matched."""
    bufs: dict[Buffer, _Binding] = {}
    vmap: dict[Var, PrimExpr] = dict(m.vars)
    for dbuf, ibuf in zip(intrin.desc.buffers, intrin.impl.buffers):
        bufs[ibuf] = m.bufs[dbuf]
        for de, ie in zip((*dbuf.shape, *dbuf.strides), (*ibuf.shape, *ibuf.strides)):
            if isinstance(ie, Var) and isinstance(de, Var) and de in m.vars:
                vmap[ie] = m.vars[de]
    for v, e in list(vmap.items()):
        if e.dtype != v.dtype:
            vmap[v] = e.astype(v.dtype)
    # Strides as differences of element offsets: right even when a later pass reshapes the
    # buffer (compact_buffers shrinks caches to the region used), and constant strides the
    # intrinsic relies on (VNNI pairs) re-checked at run time for the same reason.
    checks: list[tuple[PrimExpr, str]] = []
    for var, (dbuf, k) in m.stride_vars.items():
        vmap[var] = _stride_expr(m.bufs[dbuf], dbuf.ndim, k)
    for dbuf, k, c in m.fixed_strides:
        b = m.bufs[dbuf]
        lead = b.buffer.ndim - dbuf.ndim
        if lead + k == b.buffer.ndim - 1 and not b.buffer.strides:
            continue  # the last dimension of a compact buffer stays contiguous
        stride = _stride_expr(b, dbuf.ndim, k)
        checks.append((stride.equal(c.astype("int64") if c.dtype != stride.dtype else c),
                       f"tensorize {intrin.name}: dimension {lead + k} of {b.buffer.name} must "
                       f"have stride {c}"))
    impl_free: set[Var] = set()
    for b in intrin.impl.buffers:
        for e in (*b.shape, *b.strides):
            impl_free.update(collect_vars(e))
    body = root_body(intrin.impl)
    unbound = sorted(v.name for v in collect_vars(body) if v in impl_free and v not in vmap)
    if unbound:
        raise ScheduleError(f"tensorize: intrinsic {intrin.name!r} uses {unbound}, which "
                            "matching its desc does not determine")
    out = _Instantiate(bufs, vmap, m.ana).visit(body)
    for cond, msg in reversed(checks):
        out = AssertStmt(cond, msg, out)
    return out


def _stride_expr(b: _Binding, ndim: int, k: int) -> PrimExpr:
    """Stride of the real buffer's dimension matched to desc dimension ``k`` (of ``ndim``)."""
    lead = b.buffer.ndim - ndim
    nxt = list(b.offsets)
    nxt[lead + k] = nxt[lead + k] + 1
    return elem_offset(b.buffer, *nxt) - elem_offset(b.buffer, *b.offsets)


def tensorize(index: TreeIndex, sref: SRef, intrin_name: str) -> PrimFunc:
    """Replace block ``sref``'s body by the intrinsic ``intrin_name``."""
    if not isinstance(intrin_name, str):
        raise ScheduleError(f"tensorize: the intrinsic must be named by a string, got "
                            f"{intrin_name!r}")
    intrin = get(intrin_name)
    if sref is index.root:
        raise ScheduleError("tensorize: cannot tensorize the root block")
    realize = sref.node
    assert isinstance(realize, BlockRealize)
    block = realize.block
    try:
        m = _match(index, sref, intrin)
    except _Mismatch as e:
        raise ScheduleError(
            f"tensorize: block {block.name_hint!r} does not match tensor intrinsic "
            f"{intrin_name!r}: {e}"
        ) from None
    body = instantiate(intrin, m)
    ann = dict(block.annotations)
    ann["kiln.tensor_intrin"] = intrin_name
    new = realize.replace(block=block.replace(body=body, annotations=ann))
    return rewrite_func(index.func, {id(realize): new})
