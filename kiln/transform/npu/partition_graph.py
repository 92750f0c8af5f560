"""PartitionGraph: each NPU region of ``main`` becomes a graph function for the NPU; ``main``
calls it, and keeps the rest for the CPU (TVM's pass of that name, after
MergeCompilerRegions).

A region function (``npu_region<k>``, attributes ``"Codegen": "npu"`` and
``"global_symbol"``) takes the region's inputs -- the variables its calls read that are defined
outside it -- and returns the values used outside it (one value, or a tuple unpacked in main by
``TupleGetItem`` bindings that keep the original variables). Constants stay inside the region.
``main``'s bindings are put in a topological order of the condensed graph (a region is one node;
ties keep the original order), which exists because MergeCompilerRegions never merges across a
dependency cycle. A view-only region is not outlined (its views are DRAM aliases in main).
``"npu.target"`` is kept on main, now for the calls left there (``strict=True`` reports them).
"""

from __future__ import annotations

import heapq
from typing import Any

from ... import graph as g
from ...ir.errors import KilnError
from ...ir.module import IRModule
from ...schedule.npu.region import is_view
from ..pass_infra import PassContext, module_pass
from .common import (
    CODEGEN,
    REGION_ATTR,
    TARGET_ATTR,
    free_vars,
    main_bindings,
    main_function,
    substitute,
)

__all__ = ["PartitionGraph"]


def _order(bindings: list[g.Binding], region_of: list[int | None]) -> list[Any]:
    """Nodes of the condensed graph in a topological order: a binding index, or ``("r", k)``
    for region ``k``; among ready nodes the one whose first binding comes first."""
    node_of = [("r", r) if r is not None else i for i, r in enumerate(region_of)]
    first: dict[Any, int] = {}
    for i, n in enumerate(node_of):
        first.setdefault(n, i)
    defined = {id(b.var): i for i, b in enumerate(bindings)}
    preds: dict[Any, set[Any]] = {n: set() for n in first}
    for i, b in enumerate(bindings):
        for v in free_vars(b.value):
            j = defined.get(id(v))
            if j is not None and node_of[j] != node_of[i]:
                preds[node_of[i]].add(node_of[j])
    succs: dict[Any, list[Any]] = {n: [] for n in first}
    for n, ps in preds.items():
        for p in ps:
            succs[p].append(n)
    waiting = {n: len(ps) for n, ps in preds.items()}
    ready = [(first[n], n) for n, k in waiting.items() if k == 0]
    heapq.heapify(ready)
    out = []
    while ready:
        _, n = heapq.heappop(ready)
        out.append(n)
        for s in succs[n]:
            waiting[s] -= 1
            if waiting[s] == 0:
                heapq.heappush(ready, (first[s], s))
    if len(out) != len(first):
        raise KilnError("PartitionGraph: the NPU regions form a dependency cycle (regions "
                        "must come from MergeCompilerRegions)")
    return out


def _region_function(bb: g.BlockBuilder, name: str, members: list[g.VarBinding],
                     outputs: list[g.Var]) -> list[g.Var]:
    """Emit region function ``name``: its parameters are the variables the members read from
    outside, its result the ``outputs``. Returns the outside variables, in parameter order."""
    inside = {id(b.var) for b in members}
    ext: dict[int, g.Var] = {}
    for b in members:
        for v in free_vars(b.value):
            if id(v) not in inside:
                ext.setdefault(id(v), v)
    vmap = {k: g.Var(v.name_hint, v.struct_info) for k, v in ext.items()}
    keep = {id(v) for v in outputs}
    with bb.function(name, list(vmap.values()),
                     attrs={"Codegen": CODEGEN, "global_symbol": name}):
        with bb.dataflow():
            for b in members:
                value = substitute(b.value, vmap)
                emit = bb.emit_output if id(b.var) in keep else bb.emit
                vmap[id(b.var)] = emit(value, name_hint=b.var.name_hint)
        res = [vmap[id(v)] for v in outputs]
        bb.emit_func_output(res[0] if len(res) == 1 else res)
    return list(ext.values())


@module_pass(opt_level=0)
class PartitionGraph:
    """Outline each NPU region of main into a graph function with attr Codegen="npu".

    Reads main's ``"npu.region"`` attribute (run :class:`MergeCompilerRegions` first).
    """

    def transform_module(self, mod: IRModule, ctx: PassContext) -> IRModule:
        main = main_function(mod, "PartitionGraph")
        regions = main.attrs.get(REGION_ATTR)
        if regions is None:
            raise KilnError("PartitionGraph: main has no 'npu.region' attribute (run "
                            "AnnotateTarget and MergeCompilerRegions first)")
        bindings = main_bindings(main)
        region_of = [regions.get(b.var.name_hint) for b in bindings]
        for r in set(region_of) - {None}:  # a view-only region needs no NPU program
            if all(is_view(b.value) for b, q in zip(bindings, region_of) if q == r):
                region_of = [None if q == r else q for q in region_of]
        used_by: dict[int, set[Any]] = {}
        for i, b in enumerate(bindings):
            for v in free_vars(b.value):
                used_by.setdefault(id(v), set()).add(region_of[i] if region_of[i] is not None
                                                     else ("main", i))
        result_vars = {id(v) for v in free_vars(main.body.body)}

        def outputs_of(r: int) -> list[g.Var]:
            return [b.var for b, q in zip(bindings, region_of) if q == r and
                    (id(b.var) in result_vars or used_by.get(id(b.var), set()) - {r})]

        for r in set(region_of) - {None}:  # a region whose results are never used: dead code
            if not outputs_of(r):
                region_of = [None if q == r else q for q in region_of]
        dataflow = all(isinstance(blk, g.DataflowBlock) for blk in main.body.blocks)
        if not dataflow and any(isinstance(b.var, g.DataflowVar) for b in bindings):
            raise KilnError("PartitionGraph: main mixes dataflow and other binding blocks "
                            "(reordering them into one block would change their meaning)")
        bb = g.BlockBuilder(mod.without("main"))
        calls: dict[int, tuple[str, list[g.Var], list[g.Var]]] = {}
        for k, r in enumerate(dict.fromkeys(q for q in region_of if q is not None)):
            members = [b for b, q in zip(bindings, region_of) if q == r]
            outputs = outputs_of(r)
            name = bb.get_unique_name(f"npu_region{k}")
            inputs = _region_function(bb, name, members, outputs)
            calls[r] = (name, inputs, outputs)
        attrs = {k: v for k, v in main.attrs.items() if k != REGION_ATTR}
        marks = attrs.get(TARGET_ATTR)
        if marks is not None:
            outlined = {b.var.name_hint for b, q in zip(bindings, region_of) if q is not None}
            attrs[TARGET_ATTR] = {n: m for n, m in marks.items() if n not in outlined}
        with bb.function("main", list(main.params), attrs=attrs):
            if dataflow:
                with bb.dataflow():
                    self._emit_main(bb, bindings, region_of, calls)
            else:
                self._emit_main(bb, bindings, region_of, calls)
            bb.emit_func_output(main.body.body)
        return bb.get()

    @staticmethod
    def _emit_main(bb: g.BlockBuilder, bindings: list[g.Binding],
                   region_of: list[int | None], calls: dict[int, Any]) -> None:
        for node in _order(bindings, region_of):
            if not isinstance(node, tuple):
                bb.emit_normalized(bindings[node])
                continue
            name, inputs, outputs = calls[node[1]]
            call = bb.normalize(g.Call(g.GlobalVar(name), tuple(inputs)))
            if len(outputs) == 1:
                bb.emit_normalized(g.VarBinding(outputs[0], call))
                continue
            res = bb.emit(call, name_hint=f"{name}_out")
            for i, v in enumerate(outputs):
                bb.emit_normalized(g.VarBinding(v, bb.normalize(g.TupleGetItem(res, i))))
