"""What the NPU partitioning passes share: the attribute names they record their decisions
under, and reading the bindings of ``main``.

The passes run in order -- :class:`~.annotate_target.AnnotateTarget`,
:class:`~.merge_compiler_regions.MergeCompilerRegions`,
:class:`~.partition_graph.PartitionGraph`, :class:`~.annotate_memory_scope.AnnotateMemoryScope`
-- each reading what the previous one recorded on graph function ``main`` (function
attributes, which ``kiln show`` prints with the function):

- ``"npu.target"``: binding name -> ``"npu"`` or ``"cpu: <why the NPU cannot run it>"``,
  for every op call of ``main``, and ``"npu.hw"``: the hardware description it was decided
  for;
- ``"npu.region"``: binding name -> region number, for the calls merged into NPU regions.

Partitioned region functions carry ``"Codegen": "npu"`` and ``"global_symbol"``, and after
AnnotateMemoryScope ``"npu.memory_scope"``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ... import graph as g
from ...ir.errors import KilnError
from ...ir.module import IRModule
from ...ir.node import Node

__all__ = ["CODEGEN", "HW_ATTR", "MEMORY_SCOPE_ATTR", "REGION_ATTR", "TARGET_ATTR", "free_vars",
           "main_bindings", "main_function", "npu_functions", "substitute",
           "with_unique_names"]

TARGET_ATTR = "npu.target"
HW_ATTR = "npu.hw"
REGION_ATTR = "npu.region"
MEMORY_SCOPE_ATTR = "npu.memory_scope"
#: The ``"Codegen"`` attribute of a function PartitionGraph made for the NPU.
CODEGEN = "npu"


def main_function(mod: IRModule, pass_name: str) -> g.Function:
    """Graph function ``main`` of ``mod`` (what the NPU build compiles), checked."""
    main = mod["main"] if "main" in mod else None
    if not isinstance(main, g.Function) or not isinstance(main.body, g.SeqExpr):
        raise KilnError(f"{pass_name}: the module has no graph function 'main'")
    return main


def main_bindings(main: g.Function) -> list[g.Binding]:
    """Every binding of ``main``, in order (blocks flattened)."""
    return [b for blk in main.body.blocks for b in blk.bindings]


def free_vars(expr: Any) -> list[g.Var]:
    """The variables a binding value reads, in order (each once): an A-normal-form value's
    operands, and every variable used inside a nested expression (an ``If``'s branches), so
    that reordering bindings never moves a definition past a use."""
    out: dict[int, g.Var] = {}

    def visit(e: Any) -> None:
        if isinstance(e, g.Var):
            out.setdefault(id(e), e)
        elif isinstance(e, tuple | list):
            for x in e:
                visit(x)
        elif isinstance(e, Node) and not isinstance(e, g.Constant | g.Op | g.GlobalVar):
            for f in dataclasses.fields(e):
                if f.name not in _NOT_OPERANDS:
                    visit(getattr(e, f.name))

    visit(expr)
    return list(out.values())


#: Node fields that hold no operand (types, source locations, op attributes).
_NOT_OPERANDS = ("struct_info", "sinfo_args", "span", "attrs", "ret_struct_info")


def substitute(expr: Any, vmap: dict[int, g.Var]) -> Any:
    """An A-normal-form binding value with its variables replaced through ``vmap`` (by
    ``id``); a changed call is re-inferred when normalized."""
    if isinstance(expr, g.Var):
        return vmap.get(id(expr), expr)
    if isinstance(expr, g.Call):
        args = tuple(substitute(a, vmap) for a in expr.args)
        return expr if all(a is b for a, b in zip(args, expr.args)) else expr.replace(args=args)
    if isinstance(expr, g.Tuple):
        fields = tuple(substitute(f, vmap) for f in expr.fields)
        return expr if all(a is b for a, b in zip(fields, expr.fields)) else g.Tuple(fields)
    if isinstance(expr, g.TupleGetItem):
        tv = substitute(expr.tuple_value, vmap)
        return expr if tv is expr.tuple_value else g.TupleGetItem(tv, expr.index)
    return expr


def with_unique_names(mod: IRModule, main: g.Function) -> g.Function:
    """``main`` with every bound variable named once (the passes key their records by name;
    passes that re-emit bindings may reuse a name): a repeated name gets a numeric suffix."""
    names = {p.name_hint for p in main.params}
    seen: set[str] = set()
    dup = False
    for b in main_bindings(main):
        dup = dup or b.var.name_hint in seen or b.var.name_hint in names
        seen.add(b.var.name_hint)
    if not dup:
        return main
    taken = names | seen
    bb = g.BlockBuilder(mod)
    vmap: dict[int, g.Var] = {}
    used: set[str] = set(names)
    blocks = []
    for blk in main.body.blocks:
        new = []
        for b in blk.bindings:
            value = substitute(b.value, vmap)
            if value is not b.value:
                value = bb.normalize(value)
            var = b.var
            if var.name_hint in used:
                k = 1
                while f"{var.name_hint}_{k}" in taken or f"{var.name_hint}_{k}" in used:
                    k += 1
                var = var.replace(name=f"{var.name_hint}_{k}")
                vmap[id(b.var)] = var
            used.add(var.name_hint)
            new.append(b.replace(var=var, value=value))
        blocks.append(blk.replace(bindings=tuple(new)))
    body = substitute(main.body.body, vmap)
    return main.replace(body=g.SeqExpr(tuple(blocks), body))


def npu_functions(mod: IRModule) -> list[str]:
    """The names of the functions PartitionGraph made for the NPU, sorted."""
    return sorted(name for name, f in mod.items()
                  if isinstance(f, g.Function) and f.attrs.get("Codegen") == CODEGEN)
