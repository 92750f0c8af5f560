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

import os
from collections.abc import Mapping, Sequence
from typing import Any

from . import build_cache, progress
from . import graph as g
from . import transform as _transform  # noqa: F401 - declares every pass (get_pass by name)
from .codegen.executable import build_executable
from .codegen.npu import NPUExecutable, build_npu, npu_config_of
from .ir.errors import KilnError, TargetError
from .ir.fingerprint import NotFingerprintable
from .ir.module import IRModule
from .runtime.executable import Executable
from .runtime.plan import MUTATIONS_ATTR
from .runtime.state import state_array
from .schedule.apply import schedule_prim_func
from .schedule.knobs import graph_knobs
from .target import Target
from .tir.function import PrimFunc
from .transform.alter_op_layout import AlterOpLayout
from .transform.bind_params import BindParams, bind_params  # noqa: F401 - re-exported
from .transform.fuse_ops import FuseOps
from .transform.fuse_tir import FuseTIR
from .transform.legalize_ops import LegalizeOps
from .transform.npu import partition_for_npu
from .transform.pass_infra import Pass, PassContext, Sequential, get_pass, list_passes
from .transform.split_args import SplitArgs, max_kernel_args
from .tune.database import TuningDatabase, open_database

__all__ = ["BUILDABLE_KINDS", "build", "check_buildable", "default_pipeline", "lower_graph",
           "npu_pipeline", "schedule_prim_func"]

#: Target kinds ``kiln.build`` generates code for (every kind ``Target`` knows, now): a kind
#: without a code generator is refused here -- the one place to add a kind once its code
#: generator exists -- instead of silently producing CPU code.
BUILDABLE_KINDS = ("c", "cuda", "opencl", "npu")


def check_buildable(target: Target) -> None:
    """Raise TargetError when ``kiln.build`` cannot generate code for ``target`` yet."""
    if target.kind not in BUILDABLE_KINDS:
        raise TargetError(f"kiln.build: target {target.kind!r} is not supported yet (kiln "
                          f"generates code for: {', '.join(BUILDABLE_KINDS)}); nothing was "
                          "built")

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
        passes += [AlterOpLayout(target=Target.create(target)) if p.info.name == "AlterOpLayout"
                   else p for p in _declared(LAYOUT_PASSES)]
    max_args = max_kernel_args(target) if target is not None else None
    if max_args is not None:  # a GPU kernel's parameters are bounded: split big concats
        passes.append(SplitArgs(max_args))
    passes.append(LegalizeOps())
    if level >= 2:
        passes += [FuseOps(max_args=max_args) if p.info.name == "FuseOps" and max_args
                   else p for p in _declared(FUSION_PASSES)]
    return Sequential(passes, name=f"kiln.build.opt{level}")


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


def build(mod: IRModule, target: Target | str | None = "c",
          params: Mapping[str, Any] | None = None, pipeline: Pass | None = None,
          strict: bool = False, tuning_db: str | os.PathLike | TuningDatabase | None = None,
          cache: bool | None = None) -> Executable | NPUExecutable:
    """Compile every function of ``mod``; the result runs graph function ``main`` when called.

    ``pipeline`` replaces the default pass pipeline (:func:`default_pipeline` of the current
    PassContext's opt level), e.g. ``Sequential([LegalizeOps(), FuseOps(), FuseTIR()])``.
    ``target="cuda"`` (``Target("cuda", arch="sm_90")``) or ``"opencl"`` builds GPU kernels
    (:mod:`kiln.schedule.gpu`, :mod:`kiln.codegen.gpu`) run by the GPU executor.
    Progress (stages, kernels done of total) is logged under the ``"kiln"`` logger
    (``kiln.progress``).

    ``target="npu"`` (``Target("npu", hw="edge")`` for another hardware description) compiles
    for the NPU and returns a :class:`~kiln.codegen.npu.NPUExecutable` that runs on its
    simulator; ops without an NPU lowering run on the CPU, unless ``strict=True``, which
    raises a KilnError naming them (:mod:`kiln.codegen.npu.compile`).

    ``tuning_db`` (a path or :class:`kiln.tune.TuningDatabase`, written by ``kiln tune``)
    gives each CPU kernel the knobs of its best record there, and each graph knob (a
    convolution's layout blocks; on the NPU, each product's tiling: :mod:`kiln.tune.npu_tuning`)
    its best record's decision; what has no record gets the default.

    A CPU build is stored in the executable cache (:mod:`kiln.build_cache`) under a key of the
    module, params, target, pass configuration and kiln's version; building the same again
    loads it (well under a second instead of seconds). ``cache=False`` (or
    ``KILN_EXECUTABLE_CACHE=0``) builds without it; builds with a ``tuning_db`` are not cached
    (the database's records change what they compile to).
    """
    with progress.scope():
        key = None if tuning_db is not None else _cache_key(mod, target, params, pipeline,
                                                            cache)
        if key is not None:
            stage = progress.Stage("executable cache")
            exe = build_cache.lookup(key)
            if exe is not None:
                stage.finish("loaded")
                return exe
            stage.finish("not stored yet: building")
        built = _build(mod, target, params, pipeline, strict, tuning_db)
        if key is not None and isinstance(built, Executable):
            build_cache.store(key, built)
        return built


def _cache_key(mod: Any, target: Target | str | None, params: Mapping[str, Any] | None,
               pipeline: Pass | None, option: bool | None) -> str | None:
    """The executable cache's key of this build, or None when it is not cached (turned off, a
    custom pipeline, pass instruments, a non-CPU target, IR without stable content)."""
    if not build_cache.enabled(option) or pipeline is not None or not isinstance(mod, IRModule):
        return None
    ctx = PassContext.current()
    if ctx.instruments:
        return None
    try:
        tgt = Target.create(target)
        if tgt.kind != "c":
            return None
        return build_cache.build_key(mod, tgt, params, ctx)
    except NotFingerprintable as err:
        progress.LOGGER.debug("kiln.build: not cached: %s", err)
        return None
    except KilnError:
        return None  # a bad target or params: the build reports it


def npu_pipeline(opt_level: int | None = None, target: Target | str | None = None
                 ) -> Sequential:
    """The graph passes before NPU lowering: inference simplification and graph cleanup (the
    NPU lowers graph ops, not legalized PrimFuncs; no CPU layout choices), then -- given the
    NPU ``target`` -- the partitioning passes for its hardware description (AnnotateTarget,
    MergeCompilerRegions, PartitionGraph, AnnotateMemoryScope: :mod:`kiln.transform.npu`)."""
    level = PassContext.current().opt_level if opt_level is None else opt_level
    names = (INFERENCE_PASSES if level >= 2 else ()) + (SIMPLIFY_PASSES if level >= 1 else ())
    passes = _declared(names)
    if target is not None:
        passes.append(partition_for_npu(npu_config_of(Target.create(target))))
    return Sequential(passes, name=f"kiln.build.npu.opt{level}")


def _build(mod: IRModule, target: Target | str | None, params: Mapping[str, Any] | None,
           pipeline: Pass | None, strict: bool = False,
           tuning_db: str | os.PathLike | TuningDatabase | None = None
           ) -> Executable | NPUExecutable:
    if not isinstance(mod, IRModule):
        raise KilnError(f"kiln.build expects an IRModule, got {type(mod).__name__}")
    if pipeline is not None and not isinstance(pipeline, Pass):
        raise KilnError(f"kiln.build: pipeline must be a Pass (e.g. a Sequential), got "
                        f"{type(pipeline).__name__}")
    tgt = Target.create(target)
    check_buildable(tgt)
    state = _state_params(mod, params)
    if params:
        mod = BindParams("main", {k: v for k, v in params.items() if k not in state})(mod)
    if state and tgt.kind == "npu":
        raise KilnError("kiln.build: the NPU target does not keep state between calls (the "
                        f"model updates {', '.join(state)} in place)")
    if tuning_db is not None and tgt.kind not in ("c", "npu"):
        raise KilnError(f"kiln.build: tuning_db= applies to the CPU ('c') and NPU targets, not "
                        f"{tgt.kind!r}")
    if tgt.kind == "npu":
        # the NPU's tunable decisions are graph knobs: its products' tilings
        # (kiln.tune.npu_tuning), answered by the database's best records
        if tuning_db is None:
            return build_npu((pipeline or npu_pipeline(target=tgt))(mod), tgt, strict=strict)
        db = open_database(tuning_db)
        with graph_knobs(lambda key: db.graph_knobs_for(key, tgt)):
            return build_npu((pipeline or npu_pipeline(target=tgt))(mod), tgt, strict=strict)
    if strict:
        raise KilnError("kiln.build: strict= applies to NPU targets only")
    if tuning_db is None:
        mod = lower_graph(mod, tgt, pipeline)
        exe = build_executable(mod, tgt)
    else:
        db = open_database(tuning_db)
        with graph_knobs(lambda key: db.graph_knobs_for(key, tgt)):
            mod = lower_graph(mod, tgt, pipeline)
        exe = build_executable(mod, tgt, knobs=db.knobs_for)
    if state:
        plan = exe.plans["main"]
        for i, name in enumerate(plan.input_names):
            if name in state:
                plan.state[i] = state_array(state[name], plan.inputs[i], name)
    return exe


def lower_graph(mod: IRModule, target: Target | str | None = "c", pipeline: Pass | None = None
                ) -> IRModule:
    """The graph half of :func:`build` (parameters bound already): the pass pipeline, then
    legalization of what is left; the result's graph functions call PrimFuncs only (what the
    tuner extracts its tasks from, :mod:`kiln.tune.tasks`)."""
    stage = progress.Stage("graph passes")
    mod = (pipeline or default_pipeline(target=Target.create(target)))(mod)
    mod = _finish_graph(mod)
    stage.finish(f"{sum(isinstance(f, PrimFunc) for _, f in mod.items())} kernels")
    return mod


def _state_params(mod: IRModule, params: Mapping[str, Any] | None) -> dict[str, Any]:
    """The values in ``params`` of main's parameters that its calls update in place
    (``kiln.mutations``, e.g. a torch module's buffers): they stay parameters, fed from the
    executable's state, instead of being bound as constants."""
    main = mod["main"] if "main" in mod else None
    if not params or not isinstance(main, g.Function):
        return {}
    updated = {m["param"] for m in main.attrs.get(MUTATIONS_ATTR) or ()}
    return {k: v for k, v in params.items() if k in updated}
