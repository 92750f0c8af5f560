"""Graph -> NPU executable: partitioning, DRAM layout, kernels, CPU fallback.

The graph function ``main`` (after the graph simplification passes, before legalization) is
walked in order. Each op call is *annotated* with its target: the NPU when a lowering is
registered (:mod:`kiln.schedule.npu`) and accepts the call's attributes and dtypes, else the
CPU. Neighbouring NPU calls form one *region* (one :class:`~kiln.npu.program.Program`, its
kernels separated by barriers), so data crosses between the NPU and the CPU only at region
boundaries; each CPU call becomes a one-op kiln executable for the C target, which reads its
operands from the NPU's DRAM and writes its result back (the explicit copies of heterogeneous
execution). ``strict=True`` refuses any CPU call with a :class:`NPUUnsupportedError` that names
every op without an NPU lowering and the reason.

A chain of element-wise calls, each result used only by the next, becomes one vector kernel
(the intermediate values stay on chip). Views (reshape, squeeze, expand_dims) are aliases of
their operand's DRAM, no kernel. Every tensor gets its own DRAM range (no reuse yet: the
follow-up issue's on-chip residency and memory planning).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ... import graph as g
from ...ir.errors import KilnError
from ...ir.module import IRModule
from ...schedule.npu import DramTensor, LoweringContext, NotSupported, lookup_lowering
from ...schedule.npu.ops import (
    ELEMENTWISE_OPS,
    lower_elementwise_chain,
    product_operand_dtype,
)
from ...target import Target
from ...target.npu import NPUConfig, load_config
from ...transform.legalize_ops import LegalizeOps
from ..executable import build_executable
from .executable import CpuStep, NPUExecutable, NpuStep

__all__ = ["NPUUnsupportedError", "VIEW_OPS", "build_npu", "npu_config_of"]

VIEW_OPS = ("reshape", "squeeze", "expand_dims")


class NPUUnsupportedError(KilnError):
    """``strict=True`` and some ops of the model have no NPU lowering (each is named)."""


def npu_config_of(target: Target) -> NPUConfig:
    """The hardware description a target names (``Target("npu", hw="edge")``; default:
    ``"default"``)."""
    return load_config(target.hw or "default")


@dataclass
class _Walk:
    ctx: LoweringContext
    env: dict[int, Any]
    steps: list[Any]
    unsupported: list[str]
    strict: bool


def _sinfo(var: Any) -> tuple[tuple[int, ...], str]:
    si = var.struct_info
    dims = [getattr(d, "value", d) for d in (si.shape or ())] \
        if isinstance(si, g.TensorStructInfo) else None
    if dims is None or si.shape is None or not all(isinstance(d, int) for d in dims):
        raise NPUUnsupportedError(f"{getattr(var, 'name_hint', var)}: not a tensor of static "
                                  "shape (the NPU build needs static shapes)")
    return tuple(dims), str(si.dtype)


def _operand(w: _Walk, arg: Any) -> Any:
    if isinstance(arg, g.Constant):
        return np.asarray(arg.data)
    if isinstance(arg, g.Var) and id(arg) in w.env:
        return w.env[id(arg)]
    if isinstance(arg, g.Tuple):  # concat's tensors
        return [_operand(w, f) for f in arg.fields]
    raise NotSupported(f"operand {type(arg).__name__} is not a tensor")


def _close_region(w: _Walk) -> None:
    kb = w.ctx.new_region()
    if kb.kernels:
        w.steps.append(NpuStep(kb.program(0), list(kb.kernels)))


def _cpu_step(w: _Walk, call: g.Call, args: list[Any], out: DramTensor) -> None:
    """Build ``call`` alone for the C target, its tensor operands read from DRAM."""
    _close_region(w)
    bb = g.BlockBuilder()
    params: list[Any] = []
    inputs: list[Any] = []

    def param(a: Any, v: Any) -> Any:
        if isinstance(a, g.Tuple):
            return g.Tuple([param(f, u) for f, u in zip(a.fields, v)])
        if not isinstance(v, DramTensor):
            return a
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
    w.steps.append(CpuStep(call.op.name, exe, inputs, out))


def _binding(w: _Walk, var: Any, value: Any) -> None:
    if isinstance(value, g.Var):
        w.env[id(var)] = w.env[id(value)]
        return
    if isinstance(value, g.Constant):
        w.env[id(var)] = w.ctx.constant(np.asarray(value.data))
        return
    if not (isinstance(value, g.Call) and isinstance(value.op, g.Op)):
        raise NPUUnsupportedError(f"{var.name_hint}: {type(value).__name__} bindings are not "
                                  "supported by the NPU build")
    name = value.op.name
    shape, dtype = _sinfo(var)
    args = [_operand(w, a) for a in value.args]
    if name in VIEW_OPS and isinstance(args[0], DramTensor):
        w.env[id(var)] = DramTensor(args[0].addr, shape, dtype)
        return
    out = w.ctx.alloc(shape, dtype)
    w.env[id(var)] = out
    lower = lookup_lowering(name)
    reason = "no NPU lowering"
    if lower is not None:
        try:
            lower(w.ctx, value, args, out)
            return
        except NotSupported as err:
            reason = str(err)
    if w.strict:
        w.unsupported.append(f"{name} ({var.name_hint}): {reason}")
        return
    dram_args = [a if isinstance(a, (DramTensor, list)) or isinstance(b, g.Constant) else
                 w.ctx.tensor(a) for a, b in zip(args, value.args)]
    _cpu_step(w, value, dram_args, out)


def _uses(main: g.Function) -> dict[int, int]:
    """How many times each variable is used (as a call operand, an alias or an output)."""
    counts: dict[int, int] = {}

    def visit(e: Any) -> None:
        if isinstance(e, g.Var):
            counts[id(e)] = counts.get(id(e), 0) + 1
        elif isinstance(e, g.Call):
            for a in e.args:
                visit(a)
        elif isinstance(e, g.Tuple):
            for f in e.fields:
                visit(f)

    for blk in main.body.blocks:
        for b in blk.bindings:
            visit(b.value)
    visit(main.body.body)
    return counts


def _elementwise(b: Any) -> bool:
    return isinstance(b, g.VarBinding) and isinstance(b.value, g.Call) and \
        isinstance(b.value.op, g.Op) and b.value.op.name in ELEMENTWISE_OPS


def _chain(bindings: list[Any], i: int, uses: dict[int, int]) -> int:
    """The end (exclusive) of the longest element-wise chain starting at binding ``i``: each
    result used once, by the next binding, all of one shape and dtype."""
    j = i
    while j + 1 < len(bindings) and _elementwise(bindings[j]) and \
            _elementwise(bindings[j + 1]) and uses.get(id(bindings[j].var)) == 1 and \
            any(a is bindings[j].var for a in bindings[j + 1].value.args) and \
            _sinfo(bindings[j].var) == _sinfo(bindings[j + 1].var):
        j += 1
    return j + 1


def _consumer_cast(w: _Walk, bindings: list[Any], end: int, uses: dict[int, int]
                   ) -> str | None:
    """The dtype the only consumer of binding ``end - 1`` -- the next binding, a product --
    wants it in (its cast is then fused into the producer), else None."""
    if end >= len(bindings) or uses.get(id(bindings[end - 1].var)) != 1:
        return None
    nxt = bindings[end].value
    if not (isinstance(nxt, g.Call) and isinstance(nxt.op, g.Op) and nxt.args and
            nxt.args[0] is bindings[end - 1].var):
        return None
    return product_operand_dtype(w.ctx, nxt, _sinfo(bindings[end - 1].var)[1])


def _fused(w: _Walk, chain: list[Any], cast: str | None) -> bool:
    """Lower an element-wise chain as one kernel (its result cast to ``cast`` if given);
    False when some call cannot be."""
    shape, dtype = _sinfo(chain[-1].var)
    steps = []
    prev = None
    for b in chain:
        args = [None if a is prev else _operand(w, a) for a in b.value.args]
        running = next((k for k, a in enumerate(b.value.args) if a is prev), None)
        steps.append((b.value, args, running))
        prev = b.var
    out = w.ctx.alloc(shape, cast or dtype)
    try:
        lower_elementwise_chain(w.ctx, steps, out, dtype)
    except NotSupported:
        return False
    w.env[id(chain[-1].var)] = out
    return True


def build_npu(mod: IRModule, target: Target, strict: bool = False,
              double_buffer: bool = True, fuse: bool = True) -> NPUExecutable:
    """Compile graph function ``main`` of ``mod`` (not legalized) for ``target``'s NPU
    (``fuse``: chains of element-wise ops become one kernel each)."""
    cfg = npu_config_of(target)
    main = mod["main"]
    if not isinstance(main, g.Function) or not isinstance(main.body, g.SeqExpr):
        raise KilnError("the NPU build needs a graph function 'main'")
    ctx = LoweringContext(cfg, double_buffer)
    w = _Walk(ctx, {}, [], [], strict)
    inputs = []
    for p in main.params:
        shape, dtype = _sinfo(p)
        t = ctx.alloc(shape, dtype)
        w.env[id(p)] = t
        inputs.append((p.name_hint, t))
    bindings = [b for blk in main.body.blocks for b in blk.bindings]
    for b in bindings:
        if not isinstance(b, g.VarBinding):
            raise NPUUnsupportedError(f"{type(b).__name__} bindings are not supported by the "
                                      "NPU build")
    uses = _uses(main)
    i = 0
    while i < len(bindings):
        end = _chain(bindings, i, uses) if fuse else i + 1
        cast = _consumer_cast(w, bindings, end, uses) if fuse else None
        if _elementwise(bindings[i]) and (end - i > 1 or cast) and \
                _fused(w, bindings[i:end], cast):
            i = end
            continue
        _binding(w, bindings[i].var, bindings[i].value)
        i += 1
    if w.unsupported:
        raise NPUUnsupportedError("strict NPU build: these ops have no NPU lowering: " +
                                  "; ".join(w.unsupported))
    _close_region(w)
    result = main.body.body
    outs = list(result.fields) if isinstance(result, g.Tuple) else [result]
    out_tensors = [_operand(w, o) for o in outs]
    out_tensors = [o if isinstance(o, DramTensor) else ctx.constant(o) for o in out_tensors]
    return NPUExecutable(cfg, inputs, out_tensors, isinstance(result, g.Tuple), w.steps,
                         ctx.constants, ctx.top, double_buffer)
