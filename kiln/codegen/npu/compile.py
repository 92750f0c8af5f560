"""Graph -> NPU executable: the partitioned module's regions become NPU programs, the calls
left in ``main`` CPU steps.

The module is partitioned by the graph passes of :mod:`kiln.transform.npu` (AnnotateTarget,
MergeCompilerRegions, PartitionGraph, AnnotateMemoryScope; :func:`build_npu` runs them when
the pipeline did not). ``main`` is then walked in order:

- a call of a region function (``"Codegen": "npu"``) is lowered into one
  :class:`~kiln.npu.program.Program` (its kernels separated by barriers;
  :func:`kiln.schedule.npu.region.lower_region`), its parameters bound to the DRAM tensors of
  the call's operands;
- any other op call becomes a one-op kiln executable for the C target, which reads its
  operands from the NPU's DRAM and writes its result back (the explicit copies of
  heterogeneous execution); ``strict=True`` refuses them with an :class:`NPUUnsupportedError`
  naming every such op and the reason AnnotateTarget recorded;
- views (reshape, squeeze, expand_dims) are aliases of their operand's DRAM, no kernel.

The lowerings give every tensor its own DRAM range; :func:`.dram_plan.plan_dram` then lets
tensors that are never live together share bytes (``reuse_dram=True``, the default).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ... import graph as g
from ...ir.errors import InternalError, KilnError
from ...ir.module import IRModule
from ...npu import Machine, Simulator
from ...npu.program import Program
from ...schedule.npu import DramTensor, LoweringContext, NotSupported
from ...schedule.npu.emit import DRAM_ALIGN, KernelInfo
from ...schedule.npu.epilogue import EPILOGUE_HOME_KEY, HOMES
from ...schedule.npu.lowering import (
    DEFAULT_ROUTE,
    DEPTHWISE_KEY,
    LOWERING_KEY,
    PLAN_RESIDENCY_KEY,
)
from ...schedule.npu.region import (
    FUSE_EPILOGUE_KEY,
    VIEW_OPS,
    is_view,
    lower_region,
    operand_value,
    region_outputs,
    static_tensor,
)
from ...schedule.npu.residency import RESIDENCY_KEY, plan_residency, rebound
from ...schedule.npu.sub_batch import SUB_BATCH_KEY, SubBatchPlan
from ...target import Target
from ...target.npu import NPUConfig, load_config
from ...transform.legalize_ops import LegalizeOps
from ...transform.npu import (
    CODEGEN,
    HW_ATTR,
    REGION_ATTR,
    TARGET_ATTR,
    partition_for_npu,
)
from ...transform.npu.common import main_bindings, main_function
from ...transform.pass_infra import PassContext, register_config
from ..executable import build_executable
from .bank_plan import BankPlan, plan_banks
from .dram_plan import plan_dram
from .executable import CpuStep, NPUExecutable, NpuStep
from .prefetch import PREFETCH_KEY, prefetch_program

__all__ = ["CHOOSE_ACC_SLOTS_KEY", "DEPTHWISE_KEY", "LOWERING_KEY", "NPUUnsupportedError",
           "VIEW_OPS", "build_npu", "is_partitioned", "kernel_replay", "model_replay",
           "npu_config_of"]

# PassContext option LOWERING_KEY: how products reach NPU instructions -- "tir" (the default:
# a TE PrimFunc scheduled into NPU scopes and tensorized, then generated,
# kiln.schedule.npu.tir_gemm; dense, matmul and pointwise conv2d, the rest emitted per op) or
# "emit" (per-op instruction emission for every op). The same bits and cycles.
register_config(RESIDENCY_KEY, bool, True,
                "NPU build: keep intermediate tensors in L1 across kernels where they fit "
                "(kiln.codegen.npu.residency); False: every tensor through DRAM")
register_config(SUB_BATCH_KEY, bool, True,
                "NPU build: run the front layers of a batched region per sub-batch where the "
                "cost model says their intermediates then fit in L1 "
                "(kiln.schedule.npu.sub_batch); False: every layer at the full batch")
register_config(PLAN_RESIDENCY_KEY, bool, True,
                "NPU build: the tiling planner counts a strided convolution's input as staged "
                "from L1 where on-chip residency will keep it there (an intermediate of the "
                "program that fits: kiln.schedule.npu.ops.onchip_input), in the K steps of "
                "its plan from DRAM; False: every operand costs DRAM traffic, as if residency "
                "were off")
register_config(PREFETCH_KEY, bool, True,
                "NPU build: move each kernel's first loads of constants and other bytes the "
                "kernel before does not write above the barrier between them "
                "(kiln.codegen.npu.prefetch); False: every kernel loads after its barrier")
register_config(LOWERING_KEY, str, DEFAULT_ROUTE,
                "NPU build: 'tir' (products lowered through scheduled, tensorized TIR; the "
                "default) or 'emit' (per-op instruction emission for every op)")
register_config(DEPTHWISE_KEY, str, "auto",
                "NPU build: where depthwise convolutions run -- 'auto' (per layer, the faster "
                "by the cost model), 'tensor' (the cheaper of the tensor unit's forms), "
                "'diagonal' (block-diagonal grouped products), 'banded' (banded products over "
                "the rows) or 'vector' (the vector unit's taps); forced only where it can run")


#: PassContext option: choose each product's output-slot count by replay (off by default).
CHOOSE_ACC_SLOTS_KEY = "npu.choose_acc_slots"
register_config(CHOOSE_ACC_SLOTS_KEY, bool, False,
                "NPU build: emit each product whose output tiles could take a third "
                "accumulator slot with three and with two, keep the count whose replay with "
                "bank placement is faster, and build the model again without the choices "
                "to keep them only where the whole model replays faster "
                "(kiln.schedule.npu.feedback.choose_acc_slots). Off by default: measured "
                "0 to 0.05% fewer cycles (ResNet-18, MobileNetV2, BERT on default and edge) "
                "for up to twice the build time")


register_config(EPILOGUE_HOME_KEY, str, "weight",
                "NPU build: where a fused epilogue keeps its operand (residual chunks, "
                "per-channel constants) and cast buffers -- 'acc' (the accumulators, above "
                "the output slots), 'input' or 'weight' (that L0 buffer, above the product's "
                "operand slots, where the chunks are as large there), or 'auto' (per product, "
                "the home whose kernel replays fastest after its bank placement)")


# PassContext option FUSE_EPILOGUE_KEY: a product's element-wise consumers (bias, batch norm,
# relu, a residual add, the cast for the next product) run on its accumulator tiles.
register_config(FUSE_EPILOGUE_KEY, bool, True,
                "NPU build: run a product's element-wise epilogue on its accumulator tiles "
                "(its result never goes to DRAM); False: a vector kernel after it")


class NPUUnsupportedError(KilnError):
    """``strict=True`` and some ops of the model have no NPU lowering (each is named)."""


def npu_config_of(target: Target) -> NPUConfig:
    """The hardware description a target names (``Target("npu", hw="edge")``; default:
    ``"default"``)."""
    return load_config(target.hw or "default")


def is_partitioned(mod: IRModule) -> bool:
    """Whether ``mod``'s ``main`` went through PartitionGraph (annotated, regions outlined)."""
    main = mod["main"] if "main" in mod else None
    return isinstance(main, g.Function) and TARGET_ATTR in main.attrs and \
        REGION_ATTR not in main.attrs


def _tensor(var: Any) -> tuple[tuple[int, ...], str]:
    try:
        return static_tensor(var)
    except NotSupported as err:
        raise NPUUnsupportedError(str(err)) from None


def _operand(env: dict[int, Any], arg: Any) -> Any:
    try:
        return operand_value(env, arg)
    except NotSupported as err:
        raise NPUUnsupportedError(str(err)) from None


def _cpu_step(ctx: LoweringContext, call: g.Call, args: list[Any], out: DramTensor
              ) -> CpuStep:
    """Build ``call`` alone for the C target, its tensor operands read from DRAM."""
    bb = g.BlockBuilder()
    params: list[Any] = []
    inputs: list[Any] = []

    def param(a: Any, v: Any) -> Any:
        if isinstance(a, g.Tuple):  # concat's tensors
            return g.Tuple([param(f, u) for f, u in zip(a.fields, v)])
        if isinstance(a, g.Constant):
            return a
        v = ctx.tensor(v)
        dtype = str(a.struct_info.dtype)  # DRAM may hold it narrower (a fused cast)
        p = g.Var(f"arg{len(params)}", g.TensorStructInfo(v.shape, dtype))
        params.append(p)
        inputs.append((v, dtype))
        return p

    new_args = [param(a, v) for a, v in zip(call.args, args)]
    with bb.function("main", params):
        with bb.dataflow():
            res = bb.emit_output(call.replace(args=tuple(new_args)))
        bb.emit_func_output(res)
    exe = build_executable(LegalizeOps()(bb.get()), Target("c"))
    return CpuStep(call.op.name, exe, inputs, out)


def _region_step(ctx: LoweringContext, mod: IRModule, call: g.Call, env: dict[int, Any],
                 fuse: bool, fuse_epilogue: bool = True, sub_batch: bool = False
                 ) -> tuple[NpuStep, list[DramTensor], SubBatchPlan | None]:
    name = call.op.name
    func = mod[name]
    penv = {id(p): _operand(env, a) for p, a in zip(func.params, call.args)}
    try:
        res = lower_region(ctx, func, penv, fuse, fuse_epilogue, sub_batch)
    except NotSupported as err:  # AnnotateTarget ran the same lowerings and accepted them
        raise InternalError(f"NPU region {name}: {err}") from err
    outs = region_outputs(func, res, ctx)
    kb = ctx.new_region()
    return NpuStep(kb.program(0), list(kb.kernels), name), outs, res.sub_batch


def _strict_errors(main: g.Function) -> list[str]:
    marks = main.attrs.get(TARGET_ATTR, {})
    out = []
    for b in main_bindings(main):
        mark = marks.get(b.var.name_hint, "")
        if mark.startswith("cpu") and not is_view(b.value):
            out.append(f"{b.value.op.name} ({b.var.name_hint}): {mark.split(': ', 1)[-1]}")
    return out


def kernel_replay(cfg: NPUConfig) -> Callable[[Program], tuple[float, float]]:
    """``LoweringContext.replay``: one kernel's program replayed timing-only after its bank
    placement (:func:`.bank_plan.plan_banks`), its cycles and conflict cycles; the DRAM of
    one scratch machine grows with the build."""
    scratch = Machine(cfg, DRAM_ALIGN)

    def replay(program: Program) -> tuple[float, float]:
        scratch.grow_dram(program.dram_bytes)
        _, plan = plan_banks(program, scratch)
        return plan.cycles_after, plan.conflicts_after
    return replay


def _slot_choices_left(kernels: list[KernelInfo], plan: BankPlan) -> list[str]:
    """:attr:`BankPlan.left` lines of the product kernels that kept more accumulator slots
    than the double buffering's two with bank conflicts left in them: fewer slots
    (:func:`~kiln.schedule.npu.feedback.choose_acc_slots`) replayed slower, or as fast with
    no fewer conflicts."""
    out = []
    for k in kernels:
        left = plan.phases_after.get(k.label, 0.0)
        if k.acc_choice is None or left <= 0 or k.acc_choice[0] <= k.acc_choice[2]:
            continue
        kept, c_kept, fewer, c_fewer = k.acc_choice
        out.append(f"{k.label}: {left:.0f} conflict cycles left in the kernel: {kept} "
                   f"output slots kept ({c_kept:.0f} cycles, its replay with bank placement) "
                   f"over {fewer} ({c_fewer:.0f} cycles): with fewer slots, hence fewer "
                   "groups to share, the kernel's replay was slower or left no fewer "
                   "conflicts")
    return out


def build_npu(mod: IRModule, target: Target, strict: bool = False,
              double_buffer: bool = True, fuse: bool = True, reuse_dram: bool = True,
              bank_plan: bool = True, residency: bool | None = None,
              fuse_epilogue: bool | None = None, prefetch: bool | None = None,
              sub_batch: bool | None = None) -> NPUExecutable:
    """Compile graph function ``main`` of ``mod`` (not legalized; partitioned for ``target``'s
    hardware description, else partitioned here) for ``target``'s NPU (``fuse``: chains of
    element-wise ops become one kernel each; ``fuse_epilogue``: a product's element-wise
    consumers run on its accumulator tiles, :mod:`kiln.schedule.npu.epilogue` -- None: the
    PassContext option ``"npu.fuse_epilogue"``, on by default; ``reuse_dram``: tensors never
    live together share DRAM, :mod:`.dram_plan`; ``bank_plan``: each program's colliding
    on-chip buffers are moved to other bank groups, :mod:`.bank_plan`; ``residency``:
    intermediates stay in L1 where they fit, :mod:`kiln.schedule.npu.residency` -- None: the
    PassContext option ``"npu.residency"``, on by default; ``prefetch``: each kernel's first
    loads that are safe to run during the kernel before move above the barrier between them,
    :mod:`.prefetch` -- None: the PassContext option ``"npu.prefetch"``, on by default;
    ``sub_batch``: the front layers of a batched region run per sub-batch where the cost
    model says their intermediates then fit in L1, :mod:`kiln.schedule.npu.sub_batch` --
    None: the PassContext option ``"npu.sub_batch"``, on by default)."""
    cfg = npu_config_of(target)
    main_function(mod, "the NPU build")
    if not is_partitioned(mod):
        mod = partition_for_npu(cfg, double_buffer)(mod)
    args = (mod, target, strict, double_buffer, fuse, reuse_dram, bank_plan, residency,
            fuse_epilogue, prefetch, sub_batch)
    choose = bool(PassContext.current().get_config(CHOOSE_ACC_SLOTS_KEY))
    exe = _build(*args, choose_slots=choose)
    fewer = [k for k in exe.kernels if k.acc_choice and k.acc_choice[0] < k.acc_choice[2]]
    if not fewer:
        return exe
    # each product's slot count was chosen by its own kernel's replay, which does not see
    # the kernels around it (the prefetch across their barrier, the tensors kept in L1):
    # the choices are kept only where the whole model replays faster with them, or as fast
    # with fewer conflicts (MobileNetV2 at 112 on default: 233423 cycles without them,
    # 234438 with, though every chosen kernel replayed faster on its own)
    plain = _build(*args, choose_slots=False)
    with_c, without = model_replay(exe), model_replay(plain)
    why = (f"{len(fewer)} product(s) chose fewer output slots by their own replays: the "
           f"model replays {with_c[0]:.0f} cycles ({with_c[1]:.0f} in conflicts) with the "
           f"choices, {without[0]:.0f} ({without[1]:.0f}) without")
    keep, other = (exe, plain) if with_c < without else (plain, exe)
    keep.slot_choices = f"{why}: {'kept' if keep is exe else 'dropped'}"
    if keep is plain and keep.bank_plans:
        keep.bank_plans[0].left.append(f"output slot choices dropped: {why}")
    return keep


def model_replay(exe: NPUExecutable) -> tuple[float, float]:
    """The cycles and bank-conflict cycles of ``exe``'s NPU programs, replayed timing-only."""
    machine = Machine(exe.config, exe.dram_bytes)
    reports = [Simulator(exe.config, machine, timing_only=True).run(step.program)
               for step in exe.steps if isinstance(step, NpuStep)]
    return sum(r.cycles for r in reports), sum(r.total_conflict_cycles for r in reports)


def _build(mod: IRModule, target: Target, strict: bool, double_buffer: bool, fuse: bool,
           reuse_dram: bool, bank_plan: bool, residency: bool | None,
           fuse_epilogue: bool | None, prefetch: bool | None, sub_batch: bool | None,
           choose_slots: bool) -> NPUExecutable:
    """:func:`build_npu` of a partitioned module (``choose_slots``: the products' output slot
    counts chosen by their replays, ``feedback.choose_acc_slots``)."""
    cfg = npu_config_of(target)
    main = mod["main"]
    if main.attrs.get(HW_ATTR) != cfg.name:
        raise KilnError(f"the NPU build for {cfg.name!r}: the module was partitioned for "
                        f"{main.attrs.get(HW_ATTR)!r}")
    if strict and _strict_errors(main):
        raise NPUUnsupportedError("strict NPU build: these ops have no NPU lowering: " +
                                  "; ".join(_strict_errors(main)))
    ctx = LoweringContext(cfg, double_buffer, PassContext.current().get_config(LOWERING_KEY),
                          PassContext.current().get_config(DEPTHWISE_KEY))
    home = PassContext.current().get_config(EPILOGUE_HOME_KEY)
    if home not in (*HOMES, "auto"):
        raise KilnError(f"PassContext option {EPILOGUE_HOME_KEY!r}: {home!r}, expected one of "
                        f"{', '.join(HOMES)} or 'auto'")
    ctx.epilogue_home = home
    if home == "auto" and bank_plan and cfg.memory("acc").bank_groups > 1:
        ctx.home_replay = kernel_replay(cfg)
    if fuse_epilogue is None:
        fuse_epilogue = bool(PassContext.current().get_config(FUSE_EPILOGUE_KEY))
    if sub_batch is None:
        sub_batch = bool(PassContext.current().get_config(SUB_BATCH_KEY))
    sub_batches: list[SubBatchPlan | None] = []
    if residency is None:
        residency = PassContext.current().get_config(RESIDENCY_KEY)
    ctx.plan_residency = bool(residency) and \
        bool(PassContext.current().get_config(PLAN_RESIDENCY_KEY))
    if choose_slots and bank_plan and cfg.memory("acc").bank_groups > 1:
        ctx.replay = kernel_replay(cfg)
    env: dict[int, Any] = {}
    steps: list[Any] = []
    inputs = []
    for p in main.params:
        t = ctx.pin(ctx.alloc(*_tensor(p)))
        env[id(p)] = t
        inputs.append((p.name_hint, t))
    for b in main_bindings(main):
        var, value = b.var, b.value
        if not isinstance(b, g.VarBinding):
            raise NPUUnsupportedError(f"{type(b).__name__} bindings are not supported by the "
                                      "NPU build")
        if isinstance(value, g.Var):
            env[id(var)] = env[id(value)]
        elif isinstance(value, g.Constant):
            env[id(var)] = ctx.constant(np.asarray(value.data))
        elif isinstance(value, g.TupleGetItem) and \
                isinstance(env.get(id(value.tuple_value)), list):
            env[id(var)] = env[id(value.tuple_value)][value.index]
        elif isinstance(value, g.Call) and isinstance(value.op, g.GlobalVar) and \
                getattr(mod[value.op.name], "attrs", {}).get("Codegen") == CODEGEN:
            step, outs, sliced = _region_step(ctx, mod, value, env, fuse, fuse_epilogue,
                                              sub_batch)
            steps.append(step)
            sub_batches.append(sliced)
            env[id(var)] = outs if isinstance(mod[value.op.name].body.body, g.Tuple) \
                else outs[0]
        elif is_view(value) and isinstance(env.get(id(value.args[0])), DramTensor):
            env[id(var)] = DramTensor(env[id(value.args[0])].addr, *_tensor(var))
        elif isinstance(value, g.Call) and isinstance(value.op, g.Op):
            out = ctx.pin(ctx.alloc(*_tensor(var)))  # a CPU step's result stays in DRAM
            steps.append(_cpu_step(ctx, value, [_operand(env, a) for a in value.args], out))
            env[id(var)] = out
        else:
            raise NPUUnsupportedError(f"{var.name_hint}: {type(value).__name__} bindings are "
                                      "not supported by the NPU build")
    result = main.body.body
    outs = list(result.fields) if isinstance(result, g.Tuple) else [result]
    out_tensors = [ctx.tensor(_operand(env, o)) for o in outs]
    resident = None
    if residency:
        pinned = [*(t for _, t in inputs), *out_tensors, *(t for t, _ in ctx.constants)]
        for step in steps:
            if isinstance(step, CpuStep):
                pinned += [*(t for t, _ in step.inputs), step.out]
        npu_steps = [s for s in steps if isinstance(s, NpuStep)]
        resident = plan_residency(cfg, [s.program for s in npu_steps], pinned, ctx.allocations)
        for p, step in enumerate(npu_steps):  # the rooflines without the L1 tensors' DRAM
            step.kernels = [rebound(k, resident.kernel_bytes.get((p, n), (0, 0)), cfg)
                            for n, k in enumerate(step.kernels)]
    constants, dram_bytes = ctx.constants, ctx.top
    if reuse_dram:
        relocate, plan = plan_dram(steps, inputs, out_tensors, ctx.constants,
                                   ctx.allocations, ctx.top)
        inputs = [(n, relocate(t)) for n, t in inputs]
        out_tensors = [relocate(t) for t in out_tensors]
        constants = [(relocate(t), a) for t, a in ctx.constants]
        dram_bytes = plan.dram_bytes
    exe = NPUExecutable(cfg, inputs, out_tensors, isinstance(result, g.Tuple), steps,
                        constants, dram_bytes, double_buffer)
    exe.unshared_dram_bytes = ctx.top
    exe.residency = resident
    exe.sub_batches = sub_batches
    if prefetch is None:
        prefetch = bool(PassContext.current().get_config(PREFETCH_KEY))
    scratch = Machine(cfg, dram_bytes)  # the timing replays' own (their scalar code stores)
    for step in steps:  # after the DRAM plan: the replays see the final addresses
        if not isinstance(step, NpuStep):
            continue
        if bank_plan:  # the L1 tensors are carried between phases: never moved or over
            step.program, banks = plan_banks(step.program, scratch)
            banks.left += _slot_choices_left(step.kernels, banks)
            exe.bank_plans.append(banks)
        if prefetch:  # last: what it moves is placed clear of the kernel before's buffers
            step.program, fetched = prefetch_program(step.program, scratch)
            exe.prefetch_plans.append(fetched)
    exe.tir = ctx.tir
    return exe
