"""The engine of CombineParallelDense and CombineParallelConv2D.

Several calls of one op that read the same input with weights that differ only in their
number of output units (``dense(x, W1)``, ``dense(x, W2)``, ...) are *parallel branches*: one
call on the weights concatenated along the output axis computes all of them, and a ``split``
of its result along the output-channel axis gives each branch back. One large kernel uses the
machine better than several small ones and reads the input once.

Element-wise followers are carried into the combined call when every branch has the same one:
a unary element-wise op with equal attributes (``relu``), or a broadcasting op without
attributes whose other operand is a constant, either per output unit (a bias, concatenated like
the weights) or the same broadcast value in every branch. A branch value is only absorbed when
it is a DataflowVar with a single use (the follower), so nothing else sees the intermediate.

Constant weights (and per-unit constants) are concatenated at compile time; other weights get
a ``concat`` op. The rewritten block keeps its bindings in their order except that each
combined group sits where its first member was, or later when a weight is computed after that
(a stable topological order). A group is skipped when one of its weights depends on one of its
members.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..graph import expr as gx
from ..graph.functor import ExprMutator, ExprVisitor
from ..graph.struct_info import TensorStructInfo, sinfo_equal
from ..ir.module import IRModule
from ..op import concat, split
from ..op.registry import OpPattern, get_op_def

__all__ = ["BranchInfo", "ParallelCombiner"]


@dataclass(frozen=True)
class BranchInfo:
    """What the combiner needs to know about one candidate call (from the pass's analyzer).

    ``key``: calls with equal keys are combinable (it includes the input variable);
    ``weight_axis``: the weight's output-unit axis; ``out_axis``: the result's output axis;
    ``units``: the number of output units of this call.
    """

    key: Any
    weight_axis: int
    out_axis: int
    units: int


Analyzer = Callable[[gx.Call], "BranchInfo | None"]


@dataclass
class _Follower:
    """One element-wise step applied to every branch (see the module docstring)."""

    template: gx.Call  # the first branch's call
    position: int  # where the branch value is among the arguments
    constants: list[np.ndarray | None] = field(default_factory=list)  # per branch; None: unary
    shared: bool = False  # one broadcast constant for all branches


@dataclass
class _Group:
    members: list[int]  # binding indices of the calls
    infos: list[BranchInfo]
    followers: list[_Follower]
    absorbed: set[int]  # binding indices replaced by the group
    outputs: list[gx.Var]  # the original variable of each branch's last value


class _UseCounter(ExprVisitor):
    def __init__(self):
        self.count: dict[gx.Var, int] = {}

    def visit_Var(self, v: gx.Var) -> None:
        self.count[v] = self.count.get(v, 0) + 1


def _used_vars(e: gx.Expr) -> list[gx.Var]:
    found: list[gx.Var] = []

    class _V(ExprVisitor):
        def visit_Var(self, v: gx.Var) -> None:
            found.append(v)

    _V().visit(e)
    return found


def _op_call(e: Any, name: str | None = None) -> bool:
    return (isinstance(e, gx.Call) and isinstance(e.op, gx.Op) and e.op.name != "call_tir"
            and (name is None or e.op.name == name))


def _ndim(e: gx.Expr) -> int:
    s = e.struct_info
    return s.ndim if isinstance(s, TensorStructInfo) else -1


class ParallelCombiner(ExprMutator):
    """Combines parallel calls of the op ``analyze`` accepts in every dataflow block."""

    def __init__(self, mod: IRModule, func: gx.Function, analyze: Analyzer, min_branches: int):
        super().__init__(mod)
        self.analyze = analyze
        self.min_branches = min_branches
        counter = _UseCounter()
        counter.visit(func)
        self.uses = counter.count
        self.constants: dict[gx.Var, gx.Constant] = {}

    def _constant(self, e: gx.Expr) -> gx.Constant | None:
        if isinstance(e, gx.Constant):
            return e
        return self.constants.get(e) if isinstance(e, gx.Var) else None

    # ---- finding groups -----------------------------------------------------------------------
    def _find_groups(self, bindings: tuple[gx.Binding, ...]) -> list[_Group]:
        for b in bindings:
            if isinstance(b, gx.VarBinding) and isinstance(b.value, gx.Constant):
                self.constants[b.var] = b.value
        candidates: dict[Any, list[tuple[int, BranchInfo]]] = {}
        for i, b in enumerate(bindings):
            if isinstance(b, gx.VarBinding) and _op_call(b.value):
                info = self.analyze(b.value)
                if info is not None:
                    candidates.setdefault(info.key, []).append((i, info))
        index = {b.var: i for i, b in enumerate(bindings)}
        user: dict[gx.Var, int] = {}
        for i, b in enumerate(bindings):
            for v in _used_vars(b.value):
                user.setdefault(v, i)
        groups, taken = [], set()
        for members in candidates.values():
            members = [(i, info) for i, info in members if i not in taken]
            if len(members) < self.min_branches:
                continue
            group = self._grow(bindings, members, user)
            if not self._independent(bindings, group, index):
                continue
            taken |= group.absorbed
            groups.append(group)
        return groups

    def _grow(self, bindings: tuple[gx.Binding, ...], members: list[tuple[int, BranchInfo]],
              user: dict[gx.Var, int]) -> _Group:
        """The group of ``members`` with the element-wise followers all branches share."""
        idx = [i for i, _ in members]
        infos = [info for _, info in members]
        group = _Group(idx, infos, [], set(idx), [bindings[i].var for i in idx])
        while True:
            tails = group.outputs
            if not all(isinstance(t, gx.DataflowVar) and self.uses.get(t, 0) == 1
                       and t in user for t in tails):
                break
            steps = [bindings[user[t]] for t in tails]
            follower = self._follower(steps, tails, infos)
            if follower is None:
                break
            group.followers.append(follower)
            group.absorbed |= {user[t] for t in tails}
            group.outputs = [s.var for s in steps]
        return group

    def _follower(self, steps: list[gx.Binding], tails: list[gx.Var],
                  infos: list[BranchInfo]) -> _Follower | None:
        if not all(isinstance(s, gx.VarBinding) and _op_call(s.value) for s in steps):
            return None
        calls = [s.value for s in steps]
        first = calls[0]
        name = first.op.name
        if any(c.op.name != name or c.attrs != first.attrs or len(c.args) != len(first.args)
               for c in calls):
            return None
        if any(not sinfo_equal(c.struct_info, t.struct_info) for c, t in zip(calls, tails)):
            return None  # the follower must not broadcast the branch value to a new shape
        positions = {c.args.index(t) if t in c.args else -1 for c, t in zip(calls, tails)}
        if len(positions) != 1 or -1 in positions:
            return None
        pos = positions.pop()
        pattern = get_op_def(name).pattern
        if pattern == OpPattern.ELEMWISE and len(first.args) == 1:
            return _Follower(first, pos, [None] * len(calls))
        if pattern != OpPattern.BROADCAST or first.attrs is not None or len(first.args) != 2:
            return None
        consts = [self._constant(c.args[1 - pos]) for c in calls]
        if any(c is None for c in consts):
            return None
        arrays = [np.asarray(c.data) for c in consts]
        out_ndim = _ndim(tails[0])
        per_unit = all(self._per_unit(a, info, out_ndim) for a, info in zip(arrays, infos))
        if per_unit:
            return _Follower(first, pos, arrays)
        shared = all(a.size == 1 and a.shape == arrays[0].shape and a.dtype == arrays[0].dtype
                     and np.array_equal(a, arrays[0], equal_nan=a.dtype.kind == "f")
                     for a in arrays)
        if shared and arrays[0].ndim <= out_ndim:
            return _Follower(first, pos, arrays, shared=True)
        return None

    @staticmethod
    def _per_unit(a: np.ndarray, info: BranchInfo, out_ndim: int) -> bool:
        """``a`` holds one value per output unit, broadcast along every other axis."""
        axis = info.out_axis - (out_ndim - a.ndim)
        if axis < 0 or a.ndim > out_ndim:
            return False
        return all(d == (info.units if k == axis else 1) for k, d in enumerate(a.shape))

    def _independent(self, bindings: tuple[gx.Binding, ...], group: _Group,
                     index: dict[gx.Var, int]) -> bool:
        """No weight of the group depends on a value the group replaces."""
        tainted: set[gx.Var] = set()
        for i, b in enumerate(bindings):
            if i in group.absorbed or any(v in tainted for v in _used_vars(b.value)):
                tainted.add(b.var)
        for i in group.members:
            for a in bindings[i].value.args[1:]:
                if any(v in tainted for v in _used_vars(a)):
                    return False
        return True

    # ---- rewriting -------------------------------------------------------------------------------
    def visit_DataflowBlock(self, b: gx.DataflowBlock) -> gx.BindingBlock:
        groups = self._find_groups(b.bindings)
        if not groups:
            return super().visit_DataflowBlock(b)
        self.builder.begin_dataflow_block()
        for item in self._order(b.bindings, groups):
            if isinstance(item, _Group):
                self._emit_group(b.bindings, item)
            else:
                self.visit_binding(item)
        return self.builder.end_block()

    def _order(self, bindings: tuple[gx.Binding, ...], groups: list[_Group]) -> list[Any]:
        """Bindings not absorbed and the groups, in a stable topological order."""
        owner: dict[int, int] = {}
        for g_idx, grp in enumerate(groups):
            for i in grp.absorbed:
                owner[i] = g_idx
        nodes: list[tuple[int, Any, set[gx.Var], list[gx.Var]]] = []  # key, item, uses, defs
        for i, b in enumerate(bindings):
            if i not in owner:
                nodes.append((i, b, set(_used_vars(b.value)), [b.var]))
        for grp in groups:
            uses = set()
            for i in grp.members:
                uses |= set(_used_vars(bindings[i].value))
            for i in grp.absorbed - set(grp.members):
                uses |= {v for v in _used_vars(bindings[i].value)}
            defs = [bindings[i].var for i in grp.absorbed]
            uses -= set(defs)
            nodes.append((min(grp.members), grp, uses, grp.outputs))
        producer = {v: n for n, (_, _, _, defs) in enumerate(nodes) for v in defs}
        deps = [{producer[v] for v in uses if v in producer} for _, _, uses, _ in nodes]
        users: dict[int, list[int]] = {}
        for n, ds in enumerate(deps):
            for d in ds:
                users.setdefault(d, []).append(n)
        waiting = [len(ds) for ds in deps]
        ready = [(nodes[n][0], n) for n in range(len(nodes)) if not waiting[n]]
        heapq.heapify(ready)
        out = []
        while ready:
            _, n = heapq.heappop(ready)
            out.append(nodes[n][1])
            for u in users.get(n, ()):
                waiting[u] -= 1
                if not waiting[u]:
                    heapq.heappush(ready, (nodes[u][0], u))
        return out

    def _emit_group(self, bindings: tuple[gx.Binding, ...], grp: _Group) -> None:
        calls = [bindings[i].value for i in grp.members]
        first, info = calls[0], grp.infos[0]
        weights = [c.args[1] for c in calls]
        consts = [self._constant(w) for w in weights]
        if all(c is not None for c in consts):
            weight: gx.Expr = gx.Constant(np.concatenate([c.data for c in consts],
                                                         axis=info.weight_axis))
        else:
            weight = self.builder.emit(concat([self.visit_expr(w) for w in weights],
                                              axis=info.weight_axis), "combined_weight")
        args = (self.visit_expr(first.args[0]), weight, *first.args[2:])
        value = self.builder.emit(first.replace(args=args), "combined")
        out_ndim = _ndim(value)
        for f in grp.followers:
            if f.constants[0] is None:
                value = self.builder.emit(f.template.replace(args=(value,)), "combined")
                continue
            if f.shared:
                const = gx.Constant(f.constants[0])
            else:
                axis = info.out_axis - (out_ndim - f.constants[0].ndim)
                const = gx.Constant(np.concatenate(f.constants, axis=axis))
            new_args = [const, const]
            new_args[f.position] = value
            value = self.builder.emit(f.template.replace(args=tuple(new_args)), "combined")
        points = np.cumsum([i.units for i in grp.infos])[:-1]
        parts = self.builder.emit(split(value, tuple(int(p) for p in points),
                                        axis=info.out_axis), "combined_split")
        for k, old in enumerate(grp.outputs):
            item = self.builder.normalize(gx.TupleGetItem(parts, k))
            var = old
            if not sinfo_equal(old.struct_info, item.struct_info):
                var = old.replace(struct_info=item.struct_info)
                self.var_remap[old] = var
            self.builder.emit_normalized(gx.VarBinding(var, item))
