"""MergeCompilerRegions: group the NPU-annotated calls of ``main`` into regions, each to become
one NPU program, so that data crosses between the NPU and the CPU as rarely as possible.

The bindings are visited in order. A supported call joins a region when that is legal --
preferably the region of one of its operands, else the region most recently extended (two
independent NPU calls with only CPU work beside them still share one program) -- and starts a
new region otherwise. A view (reshape, squeeze, expand_dims) joins a region but never starts
one: alone it needs no NPU program.

The cycle problem: outlining a region makes it one node of the data-flow graph, run at once.
Joining call ``n`` to region ``R`` is illegal when an operand of ``n`` outside ``R`` depends
on ``R`` (through a CPU call, or through another region that depends on ``R``): ``R`` would
then have to run both before and after that operand. Each binding records the regions it
depends on; a region records the regions its members depend on, so the dependence is
followed transitively through regions as they grow. The condensed graph (regions and the
remaining bindings) therefore stays acyclic, which PartitionGraph relies on to order ``main``.
"""

from __future__ import annotations

from ... import graph as g
from ...ir.errors import KilnError
from ...ir.module import IRModule
from ...schedule.npu.region import is_view
from ..pass_infra import PassContext, module_pass
from .common import REGION_ATTR, TARGET_ATTR, free_vars, main_bindings, main_function

__all__ = ["MergeCompilerRegions", "merge_regions"]


class _Regions:
    """Regions by number, with what each depends on (directly, as region numbers)."""

    def __init__(self) -> None:
        self.deps: list[set[int]] = []

    def new(self) -> int:
        self.deps.append(set())
        return len(self.deps) - 1

    def closure(self, regions: set[int]) -> set[int]:
        """``regions`` and every region they depend on, transitively."""
        out, todo = set(regions), list(regions)
        while todo:
            for d in self.deps[todo.pop()]:
                if d not in out:
                    out.add(d)
                    todo.append(d)
        return out


def merge_regions(bindings: list[g.Binding], marks: dict[str, str]) -> dict[str, int]:
    """Binding name -> region number for the bindings marked ``"npu"`` that join a region."""
    regions = _Regions()
    where: dict[int, int | None] = {}  # id(var) -> region of its binding (None: main)
    depends: dict[int, set[int]] = {}  # id(var) -> regions its value depends on (directly)
    out: dict[str, int] = {}
    last: int | None = None
    for b in bindings:
        ins = [v for v in free_vars(b.value) if id(v) in where]  # function params: no deps
        in_deps = set().union(*(depends[id(v)] for v in ins)) if ins else set()
        region = None
        if marks.get(b.var.name_hint) == "npu":
            candidates = [where[id(v)] for v in reversed(ins)] + [last]
            for r in dict.fromkeys(c for c in candidates if c is not None):
                if all(where[id(v)] == r or r not in regions.closure(depends[id(v)])
                       for v in ins):
                    region = r
                    break
            if region is None and not is_view(b.value):
                region = regions.new()
        if region is not None:
            regions.deps[region] |= in_deps - {region}
            out[b.var.name_hint] = region
            last = region
        where[id(b.var)] = region
        depends[id(b.var)] = in_deps | ({region} if region is not None else set())
    return out


@module_pass(opt_level=0)
class MergeCompilerRegions:
    """Merge neighbouring NPU-annotated calls of main into regions without dependency cycles.

    Reads main's ``"npu.target"`` attribute (run :class:`AnnotateTarget` first) and records
    ``"npu.region"`` (binding name -> region number).
    """

    def transform_module(self, mod: IRModule, ctx: PassContext) -> IRModule:
        main = main_function(mod, "MergeCompilerRegions")
        marks = main.attrs.get(TARGET_ATTR)
        if marks is None:
            raise KilnError("MergeCompilerRegions: main has no 'npu.target' marks (run "
                            "AnnotateTarget first)")
        regions = merge_regions(main_bindings(main), marks)
        return mod.with_function("main", main.with_attr(REGION_ATTR, regions))
