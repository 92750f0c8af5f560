"""``kiln.build``: graph IRModule -> Executable.

The pipeline: bind parameters, run the graph passes chosen by the opt level of
``PassContext.current()`` (or the caller's own ``pipeline``), apply each PrimFunc's schedule
(the declaring op's default schedule for the target; for a fused PrimFunc the anchor op's
schedule plus the fused producers and epilogues), lower and generate native code for all
PrimFuncs in one library, and make an execution plan for every graph function.

Default pipeline by opt level (passes not declared yet are skipped, so passes that land later
join without changes here; each pass is also gated by its own declared opt level):

- 0: LegalizeOps (op calls -> ``call_tir``) and lowering only;
- >= 1: graph simplification before legalization: CanonicalizeOps, SimplifyExpr, FoldConstant,
  EliminateCommonSubexpr, DeadCodeElimination;
- >= 2: SimplifyInference first (batch norm & co. become plain arithmetic), and after
  legalization AnnotateTIROpPattern, FuseOps, FuseTIR (operator fusion).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from . import graph as g
from . import transform as _transform  # noqa: F401 - declares every pass (get_pass by name)
from .codegen import graph_entry
from .codegen.graph_plan import build_plan
from .graph.functor import post_order_visit
from .ir.errors import KilnError, ScheduleError, error_context
from .ir.module import IRModule
from .ir.span import Span, describe
from .op.registry import get_op_def
from .op.schedule_helpers import inline_is_cheap
from .runtime import memory_plan
from .runtime.executable import Executable
from .target import Target
from .tir.function import PrimFunc
from .tir.transform.lower import lower
from .transform.bind_params import BindParams, bind_params  # noqa: F401 - re-exported
from .transform.fuse_tir import FuseTIR
from .transform.legalize_ops import LegalizeOps
from .transform.pass_infra import Pass, PassContext, Sequential, get_pass, list_passes

__all__ = ["build", "default_pipeline", "schedule_prim_func"]

#: Graph simplification before legalization (opt level >= 1), in order.
SIMPLIFY_PASSES = ("CanonicalizeOps", "SimplifyExpr", "FoldConstant", "EliminateCommonSubexpr",
                   "DeadCodeElimination")
#: Before the simplification at opt level >= 2.
INFERENCE_PASSES = ("SimplifyInference",)
#: After LegalizeOps at opt level >= 2.
FUSION_PASSES = ("AnnotateTIROpPattern", "FuseOps", "FuseTIR")
#: Layout choices at opt level >= 2, after simplification (AlterOpLayout gets the target;
#: FoldConstant/DCE then clean up the transformed constant weights). Measured on ResNet-18
#: (1x3x224x224): 12.9x onnxruntime's latency without them, 1.6x with NCHW8c convolutions, and
#: no model got slower, so they belong to the default level.
LAYOUT_PASSES = ("CombineParallelConv2D", "CombineParallelDense", "ConvertLayout",
                 "AlterOpLayout", "FoldConstant", "DeadCodeElimination")


def _declared(names: Sequence[str]) -> list[Pass]:
    known = {name for name, _, _ in list_passes()}
    return [get_pass(n) for n in names if n in known]


def default_pipeline(opt_level: int | None = None, target: Target | str | None = None
                     ) -> Sequential:
    """The build's pass pipeline for ``opt_level`` (default: the current PassContext's)."""
    level = PassContext.current().opt_level if opt_level is None else opt_level
    passes: list[Pass] = []
    if level >= 2:
        passes += _declared(INFERENCE_PASSES)
    if level >= 1:
        passes += _declared(SIMPLIFY_PASSES)
    if level >= 2:
        from .transform.alter_op_layout import AlterOpLayout

        passes += [AlterOpLayout(target=Target.create(target)) if p.info.name == "AlterOpLayout"
                   else p for p in _declared(LAYOUT_PASSES)]
    passes.append(LegalizeOps())
    if level >= 2:
        passes += _declared(FUSION_PASSES)
    return Sequential(passes, name=f"kiln.build.opt{level}")


# ---------------------------------------------------------------------------------------------
# schedules
# ---------------------------------------------------------------------------------------------
def schedule_prim_func(func: PrimFunc, target: Target) -> PrimFunc:
    """Apply the default schedule of the op that produced ``func`` (if it declares one).

    A fused PrimFunc (made by FuseTIR) gets :func:`schedule_fused_prim_func`.
    """
    from .tir.schedule import Schedule

    if func.attrs.get("scheduled"):
        return func
    if func.attrs.get("fused_ops"):
        return schedule_fused_prim_func(func, target)
    op_name = func.attrs.get("op_name")
    if op_name is None:
        return func
    sched = get_op_def(op_name).schedules.get(target.kind)
    if sched is None:
        return func
    sch = Schedule(func)
    sched(sch, target)
    return sch.func.with_attr("scheduled", True)


def _writes_output(sch: Any, block: Any) -> bool:
    outs = {id(b) for b in sch.func.buffer_map.values()}
    return any(id(w.buffer) in outs for w in sch.get(block).writes)


def _is_reduction(sch: Any, block: Any) -> bool:
    from .tir.expr import IterType

    return any(iv.iter_type == IterType.COMM_REDUCE for iv in sch.get(block).iter_vars)


def _others(sch: Any, anchor_blocks: set[str]) -> list[Any]:
    root = sch.get_block("root")
    return [b for b in sch.get_child_blocks(root) if sch.get(b).name_hint not in anchor_blocks]


def _inline_members(sch: Any, anchor_blocks: set[str]) -> None:
    """Inline every element-wise member stage that writes an intermediate into its consumers
    (producers of a reduction anchor, the inner links of an epilogue chain)."""
    for b in _others(sch, anchor_blocks):
        if _writes_output(sch, b) or _is_reduction(sch, b) or not inline_is_cheap(sch, b):
            continue
        try:
            sch.compute_inline(b)
        except ScheduleError:
            pass


def _loop_signature(sch: Any, block: Any) -> tuple[tuple[int, Any], ...]:
    """Identity of a block's loop nest: which loop variables, of which kinds."""
    return tuple((id(sch.get(lp).loop_var), sch.get(lp).kind) for lp in sch.get_loops(block))


def _block_or_none(sch: Any, name: str) -> Any:
    try:
        return sch.get_block(name)
    except ScheduleError:
        return None  # inlined by the anchor's schedule


def _attach_epilogue(sch: Any, target: Any, block: Any, anchor_blocks: set[str]) -> None:
    """Schedule an epilogue block the anchor's schedule left alone: compute it under the
    outermost loop of the anchor block it reads (one chunk of anchor results, still in cache),
    else give it its own injective loop nest."""
    from .op.schedule_helpers import schedule_injective

    producers = [p for p in sch.get_producers(block) if sch.get(p).name_hint in anchor_blocks]
    if producers:
        outer = sch.get_loops(producers[-1])
        if outer:
            try:
                sch.reverse_compute_at(block, outer[0])
            except ScheduleError:
                pass
            else:
                _vectorize_innermost(sch, target, block, skip=1)
                return
    schedule_injective(sch, target, block)


def _vectorize_innermost(sch: Any, target: Any, block: Any, skip: int = 0) -> None:
    """Vectorize the block's innermost loop when a vector length divides it; the outer
    ``skip`` loops (shared with the anchor) are left alone."""
    from .op.linalg import loop_extent, vector_factor

    loops = sch.get_loops(block)[skip:]
    if not loops:
        return
    inner = loops[-1]
    dtype = sch.get(block).writes[0].buffer.dtype
    factor = vector_factor(target, dtype, loop_extent(sch, inner))
    if factor is None:
        return
    if factor == loop_extent(sch, inner):
        sch.vectorize(inner)
    else:
        _, vi = sch.split(inner, factors=[None, factor])
        sch.vectorize(vi)


def schedule_fused_prim_func(func: PrimFunc, target: Target) -> PrimFunc:
    """Schedule a fused PrimFunc (made by FuseTIR).

    1. Inline the element-wise member stages that write intermediates into their consumers, so
       producers of a reduction anchor vanish into it and an epilogue chain becomes one block.
    2. Fold an epilogue into an anchor stage that is a plain element-wise store (e.g. the
       division of an average pool) with ``reverse_compute_inline``.
    3. Apply the anchor op's schedule: its blocks kept their names through FuseTIR, and op
       schedules handle the fused blocks they find next to their own (the CPU schedules of
       dense, matmul, conv2d and pooling compute them under their parallel loop).
    4. An epilogue the anchor's schedule left untouched is computed under the anchor's
       outermost loop, or failing that gets its own injective loop nest.

    If the anchor's schedule cannot handle the fused function (a ScheduleError), the function
    gets the generic injective/reduction schedule instead: slower, never wrong.
    """
    from .op.schedule_helpers import schedule_default
    from .tir.schedule import Schedule

    anchor_blocks = set(func.attrs.get("kiln.anchor_blocks", ()))
    op_name = func.attrs.get("op_name")
    sched = get_op_def(op_name).schedules.get(target.kind) if op_name else None
    sch = Schedule(func)
    _inline_members(sch, anchor_blocks)
    for b in _others(sch, anchor_blocks):
        try:
            sch.reverse_compute_inline(b)
        except ScheduleError:
            pass
    epilogues = {sch.get(b).name_hint: _loop_signature(sch, b)
                 for b in _others(sch, anchor_blocks)}
    try:
        if sched is not None:
            sched(sch, target)
        for name, before in epilogues.items():
            b = _block_or_none(sch, name)
            if b is not None and _loop_signature(sch, b) == before:
                _attach_epilogue(sch, target, b, anchor_blocks)
    except ScheduleError:
        sch = Schedule(func)
        schedule_default(sch, target)
    return sch.func.with_attr("scheduled", True)


# ---------------------------------------------------------------------------------------------
# build
# ---------------------------------------------------------------------------------------------
def _finish_graph(mod: IRModule) -> IRModule:
    """Make sure only ``call_tir`` is left: legalize remaining op calls (a no-op when a
    pipeline already did) and turn Primitive functions a custom pipeline left into PrimFuncs."""
    mod = LegalizeOps()(mod)
    if any(isinstance(f, g.Function) and f.attrs.get("Primitive") for _, f in mod.items()):
        mod = FuseTIR()(mod)
    return mod


def kernel_spans(mod: IRModule) -> dict[str, Span]:
    """The model nodes behind each PrimFunc of ``mod``: the merged spans of the ``call_tir``
    calls of it in the graph functions."""
    found: dict[str, list[Span | None]] = {}

    def visit(e: Any) -> None:
        if isinstance(e, g.Call) and isinstance(e.op, g.Op) and e.op.name == "call_tir":
            found.setdefault(e.args[0].name_hint, []).append(e.span)

    for _, f in mod.items():
        if isinstance(f, g.Function):
            post_order_visit(f, visit)
    return {name: span for name, ss in found.items() if (span := Span.merge(ss)) is not None}


def build(mod: IRModule, target: Target | str | None = "c",
          params: Mapping[str, Any] | None = None, pipeline: Pass | None = None) -> Executable:
    """Compile every function of ``mod``; the result runs graph function ``main`` when called.

    ``pipeline`` replaces the default pass pipeline (:func:`default_pipeline` of the current
    PassContext's opt level), e.g. ``Sequential([LegalizeOps(), FuseOps(), FuseTIR()])``.
    """
    from .codegen import c as codegen_c

    if not isinstance(mod, IRModule):
        raise KilnError(f"kiln.build expects an IRModule, got {type(mod).__name__}")
    if pipeline is not None and not isinstance(pipeline, Pass):
        raise KilnError(f"kiln.build: pipeline must be a Pass (e.g. a Sequential), got "
                        f"{type(pipeline).__name__}")
    tgt = Target.create(target)
    if params:
        mod = BindParams("main", params)(mod)
    mod = (pipeline or default_pipeline(target=tgt))(mod)
    mod = _finish_graph(mod)
    spans = kernel_spans(mod)
    prim_funcs = {}
    for name, f in mod.items():
        if isinstance(f, PrimFunc):
            # an error scheduling or lowering a kernel names the model nodes it computes
            with error_context(describe(spans.get(name), f"kernel {name}")):
                prim_funcs[name] = lower(schedule_prim_func(f, tgt), tgt)
    plans = {}
    for name, f in mod.items():
        if isinstance(f, g.Function) and not f.attrs.get("Primitive"):
            with error_context(f"graph function {name}", prefix=False):
                plans[name] = build_plan(f, name)
            memory_plan.check_run_memory(plans[name])
    if not plans:
        raise KilnError("kiln.build: the module has no graph function to run")
    extra = graph_entry.emit_entries(plans, prim_funcs)
    module = codegen_c.build(prim_funcs, tgt, extra_source=extra)
    predicted = graph_entry.predict_unchecked_symbols(prim_funcs)
    if any(module.functions[n].unchecked_symbol != sym for n, sym in predicted.items()):
        raise KilnError("kiln.build: internal error: kernel symbols differ from the whole-model "
                        "entry's prediction")
    for plan in plans.values():
        for call, dims in zip(plan.calls, plan.entry_sym_dims or ()):
            func = prim_funcs[call.func]
            names = [func.buffer_map[func.params[arg]].shape[axis].name for arg, axis in dims]
            if names != list(module.functions[call.func].sym_vars):
                raise KilnError(f"kiln.build: internal error: kernel {call.func!r} takes its "
                                f"symbolic dims as {module.functions[call.func].sym_vars}, the "
                                f"whole-model entry passes {names}")
    return Executable(module, plans)
