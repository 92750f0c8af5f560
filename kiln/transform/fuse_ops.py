"""FuseOps: group ``call_tir`` bindings into fused graph functions (TVM's operator fusion).

FuseOps runs after LegalizeOps and works on ``call_tir`` bindings, using each callee
PrimFunc's ``op_pattern`` (the declaring op's, or derived from the body by
:func:`kiln.transform.annotate_tir_op_pattern.analyze_op_pattern` when missing). Working on
``call_tir`` rather than op calls means any PrimFunc takes part, hand-written ones included, and
the fused group is exactly what FuseTIR turns into one kernel.

Inside every dataflow block the bindings form a graph: one node per binding, an edge from a
binding to each binding that uses its variable, labelled with the consumer's pattern (a
BROADCAST consumer reading an argument of its own output shape reads it element-wise, so that
edge counts as ELEMWISE). A node whose value is not a fusable ``call_tir`` (a single tensor
output, tensor arguments, a buffer-only callee) is OPAQUE and never fuses. A variable visible
after the block (a non-Dataflow ``Var``) is used outside, so its node has no post-dominator.

Grouping follows TVM's dominator-tree rules. Each node's immediate post-dominator is computed
(the least common ancestor of its consumers in the post-dominator tree, with the strongest edge
pattern met on the way). Then, in topological order, a node is fused into its post-dominator's
group (all nodes on every path between them join that group) when:

1. phase 0 — an OUT_EWISE_FUSABLE group (conv2d, dense, matmul, pooling) absorbs the chain that
   follows it when the edge to its post-dominator is ELEMWISE and every node on the way is at
   most BROADCAST: ``conv2d -> add(bias) -> relu -> add(residual)`` is one group, a following
   transpose (INJECTIVE) is not;
2. phase 0 and 1 — an ELEMWISE/BROADCAST node joins a post-dominator that it reaches through
   INJECTIVE or COMM_REDUCE edges, when every node in between is at most INJECTIVE (the
   post-dominator itself may already belong to an OUT_EWISE_FUSABLE or reduction group): a
   reduction absorbs its element-wise inputs, an element-wise side input joins the residual add
   of a conv group;
3. phase 1 — an INJECTIVE node joins a post-dominator reached only through INJECTIVE nodes,
   or a reduction right after them (deferred so that conv epilogues are complete first).
   Unlike TVM, a reduction takes injective inputs (a transpose or reshape feeding a sum): its
   schedule inlines them, which saves writing and re-reading the whole intermediate;
4. COMM_REDUCE and OPAQUE nodes never fuse into their consumers.

A fusion is skipped when the group would exceed ``max_depth`` nodes (config
``transform.fuse_ops.max_depth``), when its kernel would take more than ``max_args`` tensors
(``transform.fuse_ops.max_args``; a GPU kernel's parameter space is bounded, see
``kiln.transform.split_args``) or would make the grouped graph cyclic (a path leaving the
group and coming back; the dominator rule rules it out, the check makes it explicit).

Every group of two or more bindings becomes a graph function with attr ``"Primitive": True``
(named ``fused_<ops>``, cut at 64 characters; structurally equal groups share one function),
whose parameters are the group's inputs (variables and constants) in order of first use and
whose result is every member value used outside the group (one value, or a tuple). The block
calls it in place of the members; a tuple result is unpacked with ``TupleGetItem`` bindings to
the original variables. Only top-level dataflow blocks of graph functions are fused; Primitive
functions are left alone.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any

from .. import tir
from ..graph import expr as gx
from ..graph.block_builder import BlockBuilder
from ..graph.functor import ExprVisitor
from ..graph.struct_info import TensorStructInfo, shapes_equal
from ..ir.errors import InternalError
from ..ir.module import IRModule
from ..ir.span import Span
from ..op.registry import OpPattern
from ..tir.function import PrimFunc
from .annotate_tir_op_pattern import pattern_of
from .pass_infra import PassContext, module_pass, register_config

__all__ = ["FuseOps", "MAX_ARGS_KEY", "MAX_DEPTH_KEY", "partition_block"]

MAX_DEPTH_KEY = "transform.fuse_ops.max_depth"
register_config(MAX_DEPTH_KEY, int, 256,
                "FuseOps: the most bindings (operators) one fused group may hold")
MAX_ARGS_KEY = "transform.fuse_ops.max_args"
register_config(MAX_ARGS_KEY, int, 0,
                "FuseOps: the most tensors (inputs and outputs) one fused kernel may take; 0 "
                "for no limit (the build sets it for GPU targets: kiln.transform.split_args)")


# ---------------------------------------------------------------------------------------------
# the dataflow graph of one block
# ---------------------------------------------------------------------------------------------
@dataclass
class _Node:
    index: int
    binding: gx.Binding
    pattern: OpPattern
    label: str  # short op name for the fused function's name
    extern: bool  # value visible after the block
    inputs: list[int] = field(default_factory=list)
    outputs: list[tuple[int, OpPattern]] = field(default_factory=list)  # (consumer, edge)
    #: the tensors the call reads (ids of its Var/Constant arguments)
    reads: set[int] = field(default_factory=set)


def _fusable_call(value: gx.Expr, mod: IRModule) -> PrimFunc | None:
    """The callee of a call_tir that can join a group, else None."""
    if not (isinstance(value, gx.Call) and isinstance(value.op, gx.Op)
            and value.op.name == "call_tir"):
        return None
    gv, args = value.args[0], value.args[1]
    func = mod.functions.get(gv.name) if isinstance(gv, gx.GlobalVar) else None
    if not isinstance(func, PrimFunc) or not isinstance(args, gx.Tuple):
        return None
    if not isinstance(value.struct_info, TensorStructInfo) or value.struct_info.shape is None:
        return None
    if any(p not in func.buffer_map for p in func.params):
        return None  # scalar parameters
    if len(func.params) != len(args.fields) + 1:
        return None
    arg_dims: set[int] = set()
    for a in args.fields:
        if not isinstance(a, (gx.Var, gx.Constant)):
            return None
        if not isinstance(a.struct_info, TensorStructInfo) or a.struct_info.shape is None:
            return None
        arg_dims.update(id(v) for d in a.struct_info.shape for v in tir.collect_vars(d))
    if any(id(v) not in arg_dims for d in value.struct_info.shape for v in tir.collect_vars(d)):
        return None  # output dims bound at run time (a match_cast): only its own call has them
    return func


def _label(func: PrimFunc, gv_name: str) -> str:
    name = func.attrs.get("op_name") or gv_name
    return str(name).split(".")[-1]


class _Uses(ExprVisitor):
    def __init__(self):
        self.vars: list[gx.Var] = []

    def visit_Var(self, v: gx.Var) -> None:
        self.vars.append(v)


def _used_vars(e: gx.Expr) -> list[gx.Var]:
    u = _Uses()
    u.visit_expr(e)
    return u.vars


def _build_graph(block: gx.DataflowBlock, mod: IRModule) -> list[_Node]:
    nodes: list[_Node] = []
    index: dict[gx.Var, int] = {}
    for i, b in enumerate(block.bindings):
        func = _fusable_call(b.value, mod) if isinstance(b, gx.VarBinding) else None
        if func is not None:
            pattern = pattern_of(func)
            if pattern == OpPattern.TUPLE:
                pattern = OpPattern.OPAQUE
            label = _label(func, b.value.args[0].name)
        else:
            pattern, label = OpPattern.OPAQUE, "opaque"
        node = _Node(i, b, pattern, label, extern=not isinstance(b.var, gx.DataflowVar))
        if func is not None:
            node.reads = {id(a) for a in b.value.args[1].fields}
        out_shape = b.var.struct_info.shape if func is not None else None
        seen: set[int] = set()
        for v in _used_vars(b.value):
            j = index.get(v)
            if j is None or j in seen:
                continue
            seen.add(j)
            edge = pattern
            if pattern == OpPattern.BROADCAST and isinstance(v.struct_info, TensorStructInfo) \
                    and shapes_equal(v.struct_info.shape, out_shape):
                edge = OpPattern.ELEMWISE
            nodes[j].outputs.append((i, edge))
            node.inputs.append(j)
        nodes.append(node)
        index[b.var] = i
    return nodes


# ---------------------------------------------------------------------------------------------
# post-dominator tree
# ---------------------------------------------------------------------------------------------
class _PostDom:
    """Immediate post-dominator of every node and the strongest edge pattern on the way."""

    def __init__(self, nodes: list[_Node]):
        n = len(nodes)
        self.parent: list[int | None] = [None] * n
        self.depth = [1] * n
        self.pattern = [OpPattern.OPAQUE] * n
        for i in reversed(range(n)):
            node = nodes[i]
            if node.extern or not node.outputs:
                continue
            pat = OpPattern.ELEMWISE
            parent: int | None = None
            for k, (c, edge) in enumerate(node.outputs):
                pat = max(pat, edge)
                if k == 0:
                    parent = c
                else:
                    parent, pat = self._lca(parent, c, pat)
                if parent is None:
                    break
            if parent is not None:
                self.parent[i] = parent
                self.depth[i] = self.depth[parent] + 1
                self.pattern[i] = pat

    def _lca(self, a: int | None, b: int | None, pat: OpPattern
             ) -> tuple[int | None, OpPattern]:
        while a != b:
            if a is None or b is None:
                return None, pat
            if self.depth[a] < self.depth[b]:
                pat, b = max(pat, self.pattern[b]), self.parent[b]
            elif self.depth[b] < self.depth[a]:
                pat, a = max(pat, self.pattern[a]), self.parent[a]
            else:
                pat = max(pat, self.pattern[a], self.pattern[b])
                a, b = self.parent[a], self.parent[b]
        return a, pat


# ---------------------------------------------------------------------------------------------
# grouping
# ---------------------------------------------------------------------------------------------
class _Partitioner:
    def __init__(self, nodes: list[_Node], max_depth: int, max_args: int = 0):
        self.nodes = nodes
        self.max_depth = max_depth
        self.max_args = max_args
        n = len(nodes)
        self.root = list(range(n))  # union-find parent
        self.size = [1] * n
        self.gpattern = [node.pattern for node in nodes]
        self.members_of: dict[int, list[int]] = {i: [i] for i in range(n)}  # root -> nodes

    def find(self, i: int) -> int:
        while self.root[i] != i:
            self.root[i] = self.root[self.root[i]]
            i = self.root[i]
        return i

    def _path_nodes(self, src: int, sink: int, fcond: Any) -> list[int] | None:
        """Nodes on every path from ``src`` (exclusive) to ``sink`` (inclusive), or None when
        one fails ``fcond(group_pattern, is_sink)``."""
        visited: dict[int, None] = {}
        stack = [c for c, _ in self.nodes[src].outputs]
        while stack:
            k = stack.pop()
            if k in visited:
                continue
            visited[k] = None
            if not fcond(self.gpattern[self.find(k)], k == sink):
                return None
            if k != sink:
                if self.nodes[k].extern or not self.nodes[k].outputs:
                    return None  # leaves the block without passing the sink
                stack.extend(c for c, _ in self.nodes[k].outputs)
        return list(visited)

    def _num_args(self, members: set[int]) -> int:
        """Tensors the fused kernel of ``members`` takes: what they read from outside the
        group, and its outputs (results used outside it)."""
        produced = {id(self.nodes[i].binding.var) for i in members}
        reads = {r for i in members for r in self.nodes[i].reads} - produced
        outputs = sum(1 for i in members if self.nodes[i].extern or any(
            c not in members for c, _ in self.nodes[i].outputs))
        return len(reads) + max(outputs, 1)

    def _members(self, roots: set[int]) -> set[int]:
        return {i for r in roots for i in self.members_of[r]}

    def _acyclic(self, members: set[int]) -> bool:
        """No path leaves ``members`` and comes back into it."""
        outside = [c for i in members for c, _ in self.nodes[i].outputs if c not in members]
        seen: set[int] = set()
        while outside:
            k = outside.pop()
            if k in seen:
                continue
            seen.add(k)
            for c, _ in self.nodes[k].outputs:
                if c in members:
                    return False
                outside.append(c)
        return True

    def try_fuse(self, src: int, sink: int, fcond: Any) -> bool:
        path = self._path_nodes(src, sink, fcond)
        if path is None:
            return False
        roots = {self.find(k) for k in (src, *path)}
        if sum(self.size[r] for r in roots) > self.max_depth:
            return False
        members = self._members(roots)
        if not self._acyclic(members):
            return False
        if self.max_args and self._num_args(members) > self.max_args:
            return False
        target = self.find(sink)
        for r in roots:
            if r == target:
                continue
            self.root[r] = target
            self.size[target] += self.size[r]
            self.members_of[target].extend(self.members_of.pop(r))
            if self.gpattern[r] == OpPattern.OUT_EWISE_FUSABLE:
                self.gpattern[target] = max(self.gpattern[target], self.gpattern[r])
        return True

    def run(self) -> list[list[int]]:
        dom = _PostDom(self.nodes)
        for phase in (0, 1):
            for i, node in enumerate(self.nodes):
                parent = dom.parent[i]
                if node.pattern == OpPattern.OPAQUE or parent is None:
                    continue
                if self.find(i) == self.find(parent):
                    continue
                gp, edge = self.gpattern[self.find(i)], dom.pattern[i]
                if gp == OpPattern.OUT_EWISE_FUSABLE:
                    if phase == 0 and edge == OpPattern.ELEMWISE:
                        self.try_fuse(i, parent, lambda k, sink: k <= OpPattern.BROADCAST)
                elif gp <= OpPattern.BROADCAST:
                    if edge <= OpPattern.INJECTIVE or edge == OpPattern.COMM_REDUCE:
                        self.try_fuse(i, parent, _into_injective_or_anchor)
                elif gp == OpPattern.INJECTIVE:
                    if phase == 1:
                        self.try_fuse(i, parent, _into_injective_or_reduction)
        return sorted((sorted(m) for m in self.members_of.values()), key=lambda g: g[-1])


def _into_injective_or_reduction(kind: OpPattern, is_sink: bool) -> bool:
    return kind <= OpPattern.INJECTIVE or (is_sink and kind == OpPattern.COMM_REDUCE)


def _into_injective_or_anchor(kind: OpPattern, is_sink: bool) -> bool:
    if not is_sink:
        return kind <= OpPattern.INJECTIVE
    return kind <= OpPattern.OUT_EWISE_FUSABLE


#: Fused function names longer than this are cut (they become kernel symbols, which some
#: OpenCL drivers cannot link when very long: a 119-op group of adds).
MAX_NAME = 64


def group_name(labels: list[str]) -> str:
    """``fused_<op>_<op>...`` of a group's member labels, cut after :data:`MAX_NAME` characters
    with the number of operators left out (``fused_add_add_..._and_112_more``)."""
    name = "fused_" + "_".join(labels)
    if len(name) <= MAX_NAME:
        return name
    kept, size = [], len("fused")
    for label in labels:
        if size + 1 + len(label) > MAX_NAME - 16:
            break
        kept.append(label)
        size += 1 + len(label)
    return "fused_" + "_".join(kept) + f"_and_{len(labels) - len(kept)}_more"


def partition_block(block: gx.DataflowBlock, mod: IRModule, max_depth: int = 256,
                    max_args: int = 0) -> list[list[int]]:
    """Binding indices of each group of ``block`` (singletons included), ordered by their last
    binding. Exposed for tests and tools."""
    nodes = _build_graph(block, mod)
    return _Partitioner(nodes, max_depth, max_args).run()


# ---------------------------------------------------------------------------------------------
# rewriting
# ---------------------------------------------------------------------------------------------
def _make_group_function(nodes: list[_Node], members: list[int], used_outside: set[int]
                         ) -> tuple[gx.Function, list[gx.Expr], list[int]]:
    """The Primitive function of a group, the call's arguments and the output node indices."""
    member_vars = {nodes[i].binding.var: i for i in members}
    inputs: list[gx.Expr] = []
    seen: set[int] = set()
    for i in members:
        for a in nodes[i].binding.value.args[1].fields:
            if (isinstance(a, gx.Var) and a in member_vars) or id(a) in seen:
                continue
            seen.add(id(a))
            inputs.append(a)
    outputs = [i for i in members if i in used_outside]
    params = [gx.Var(a.name_hint if isinstance(a, gx.Var) else f"p{k}", a.struct_info)
              for k, a in enumerate(inputs)]
    remap: dict[int, gx.Expr] = {id(a): p for a, p in zip(inputs, params)}
    bb = BlockBuilder()
    with bb.function("fused", params, attrs={"Primitive": True}):
        with bb.dataflow():
            outs = []
            for i in members:
                b = nodes[i].binding
                call = b.value
                args = [remap.get(id(a), a) for a in call.args[1].fields]
                new = gx.call_tir(call.args[0], args, call.sinfo_args[0]).with_span(call.span)
                hint = b.var.name_hint
                if i in outputs:
                    v = bb.emit_output(new, hint)
                    outs.append(v)
                else:
                    v = bb.emit(new, hint)
                remap[id(b.var)] = v
        bb.emit_func_output(outs[0] if len(outs) == 1 else outs)
    return bb.get()["fused"], inputs, outputs


class _BlockFuser:
    def __init__(self, bb: BlockBuilder, mod: IRModule, max_depth: int, max_args: int = 0):
        self.bb, self.mod, self.max_depth, self.max_args = bb, mod, max_depth, max_args

    def fuse(self, block: gx.DataflowBlock) -> gx.DataflowBlock:
        nodes = _build_graph(block, self.mod)
        groups = _Partitioner(nodes, self.max_depth, self.max_args).run()
        if all(len(g) == 1 for g in groups):
            return block
        group_of = {i: gi for gi, g in enumerate(groups) for i in g}
        # units: one per group; dependencies between units; emit in topological order keyed by
        # each group's last binding (keeps the original order wherever it is already valid)
        deps: list[set[int]] = [set() for _ in groups]
        users: list[set[int]] = [set() for _ in groups]
        for gi, g in enumerate(groups):
            for i in g:
                for j in nodes[i].inputs:
                    gj = group_of[j]
                    if gj != gi:
                        deps[gi].add(gj)
                        users[gj].add(gi)
        ready = [(g[-1], gi) for gi, g in enumerate(groups) if not deps[gi]]
        heapq.heapify(ready)
        bindings: list[gx.Binding] = []
        done = 0
        while ready:
            _, gi = heapq.heappop(ready)
            done += 1
            bindings.extend(self._emit_group(nodes, groups[gi], group_of))
            for u in users[gi]:
                deps[u].discard(gi)
                if not deps[u]:
                    heapq.heappush(ready, (groups[u][-1], u))
        if done != len(groups):
            raise InternalError("FuseOps: the grouped dataflow graph has a cycle")
        return gx.DataflowBlock(tuple(bindings))

    def _emit_group(self, nodes: list[_Node], members: list[int], group_of: dict[int, int]
                    ) -> list[gx.Binding]:
        if len(members) == 1:
            return [nodes[members[0]].binding]
        gi = group_of[members[0]]
        used_outside = {i for i in members
                        if nodes[i].extern or any(group_of[c] != gi for c, _ in nodes[i].outputs)}
        func, args, outputs = _make_group_function(nodes, members, used_outside)
        gv = self.bb.add_func(func, group_name([nodes[i].label for i in members]))
        span = Span.merge(nodes[i].binding.value.span for i in members)
        call = self.bb.normalize(gx.Call(gv, tuple(args), span=span))
        if len(outputs) == 1:
            var = nodes[outputs[0]].binding.var
            return [gx.VarBinding(var, call)]
        tup_cls = gx.DataflowVar
        tup = tup_cls(f"{nodes[outputs[0]].binding.var.name_hint}_tuple", call.struct_info)
        out = [gx.VarBinding(tup, call)]
        for k, i in enumerate(outputs):
            out.append(gx.VarBinding(nodes[i].binding.var, self.bb.normalize(
                gx.TupleGetItem(tup, k))))
        return out


def fuse_function(func: gx.Function, bb: BlockBuilder, mod: IRModule, max_depth: int,
                  max_args: int = 0) -> gx.Function:
    """``func`` with its top-level dataflow blocks fused (functions are added to ``bb``)."""
    body = func.body
    if not isinstance(body, gx.SeqExpr):
        return func
    fuser = _BlockFuser(bb, mod, max_depth, max_args)
    blocks = [fuser.fuse(b) if isinstance(b, gx.DataflowBlock) else b for b in body.blocks]
    if all(a is b for a, b in zip(blocks, body.blocks)):
        return func
    return gx.Function(func.params, gx.SeqExpr(tuple(blocks), body.body), func.ret_struct_info,
                       func.attrs)


@module_pass(opt_level=2)
class FuseOps:
    """Group call_tir bindings into Primitive functions by TVM's dominator-based fusion rules
    (``max_args``: the most tensors a fused kernel may take, else the PassContext's config)."""

    def __init__(self, max_depth: int | None = None, max_args: int | None = None):
        self.max_depth = max_depth
        self.max_args = max_args

    def transform_module(self, mod: IRModule, ctx: PassContext) -> IRModule:
        max_depth = self.max_depth if self.max_depth is not None else ctx.get_config(
            MAX_DEPTH_KEY)
        max_depth = max(1, int(max_depth))
        max_args = self.max_args if self.max_args is not None else ctx.get_config(MAX_ARGS_KEY)
        max_args = max(0, int(max_args or 0))
        bb = BlockBuilder(mod)
        for name, func in mod.items():
            if isinstance(func, gx.Function) and not func.attrs.get("Primitive"):
                new = fuse_function(func, bb, mod, max_depth, max_args)
                if new is not func:
                    bb.update_func(name, new)
        return bb.get()
