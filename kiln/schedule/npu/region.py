"""Lowering one NPU region -- the bindings of a graph function that ``PartitionGraph`` marked
for the NPU -- into kernels.

The region's bindings are lowered in order into the context's current kernel builder: each op
call by its registered lowering (:mod:`.lowering`), a view (reshape, squeeze, expand_dims) as an
alias of its operand's DRAM (no kernel), and a chain of element-wise calls -- each result used
only by the next -- as one vector kernel whose intermediate values stay in the accumulator
block (they never reach DRAM). When the only consumer of an element-wise result is a product
that wants float16 operands, the producer's kernel writes it cast (no separate cast kernel).

Used by the NPU code generator (:mod:`kiln.codegen.npu.compile`) and by the memory-scope
annotation (:mod:`kiln.transform.npu.annotate_memory_scope`), which lowers the region into a
scratch context to see where each tensor lives.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ... import graph as g
from .emit import DramTensor
from .lowering import LoweringContext, NotSupported, lookup_lowering
from .ops import ELEMENTWISE_OPS, lower_elementwise_chain, product_operand_dtype

__all__ = ["VIEW_OPS", "RegionLowering", "is_view", "lower_region",
           "operand_value", "region_outputs", "static_tensor"]

#: Ops that are aliases of their operand's DRAM (same bytes, another shape).
VIEW_OPS = ("reshape", "squeeze", "expand_dims")


def is_view(value: Any) -> bool:
    """A view call (reshape, squeeze, expand_dims) of a variable: a DRAM alias on the NPU."""
    return isinstance(value, g.Call) and isinstance(value.op, g.Op) and \
        value.op.name in VIEW_OPS and bool(value.args) and isinstance(value.args[0], g.Var)


def static_tensor(expr: Any) -> tuple[tuple[int, ...], str]:
    """``expr``'s static shape and dtype; NotSupported when it is not a tensor of static
    shape (the NPU's DRAM layout is fixed at compile time)."""
    si = expr.struct_info
    dims = [getattr(d, "value", d) for d in (si.shape or ())] \
        if isinstance(si, g.TensorStructInfo) and si.shape is not None else None
    if dims is None or not all(isinstance(d, int) for d in dims):
        raise NotSupported(f"{getattr(expr, 'name_hint', type(expr).__name__)}: not a tensor "
                           "of static shape (the NPU build needs static shapes)")
    return tuple(int(d) for d in dims), str(si.dtype)


@dataclass
class RegionLowering:
    """What lowering a region produced besides its kernels: where each variable's value is
    (``env``: a DRAM tensor or a numpy constant) and the variables kept on chip inside a fused
    element-wise kernel (``on_chip``: name -> the name of the chain's result, which shares
    their block)."""

    env: dict[int, Any]
    on_chip: dict[str, str] = field(default_factory=dict)


def operand_value(env: dict[int, Any], arg: Any) -> Any:
    """A call operand as a lowering takes it: a constant as a numpy array, a variable as what
    ``env`` holds for it (by ``id``); NotSupported for anything else."""
    if isinstance(arg, g.Constant):
        return np.asarray(arg.data)
    if isinstance(arg, g.Var) and id(arg) in env:
        return env[id(arg)]
    if isinstance(arg, g.Tuple):  # concat's tensors
        return [operand_value(env, f) for f in arg.fields]
    raise NotSupported(f"operand {type(arg).__name__} is not a tensor")


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
            static_tensor(bindings[j].var) == static_tensor(bindings[j + 1].var):
        j += 1
    return j + 1


def _consumer_cast(ctx: LoweringContext, bindings: list[Any], end: int,
                   uses: dict[int, int]) -> str | None:
    """The dtype the only consumer of binding ``end - 1`` -- the next binding, a product --
    wants it in (its cast is then fused into the producer), else None."""
    if end >= len(bindings) or uses.get(id(bindings[end - 1].var)) != 1:
        return None
    nxt = bindings[end].value
    if not (isinstance(nxt, g.Call) and isinstance(nxt.op, g.Op) and nxt.args and
            nxt.args[0] is bindings[end - 1].var):
        return None
    return product_operand_dtype(ctx, nxt, static_tensor(bindings[end - 1].var)[1])


def _fused(ctx: LoweringContext, res: RegionLowering, chain: list[Any], cast: str | None
           ) -> bool:
    """Lower an element-wise chain as one kernel (its result cast to ``cast`` if given);
    False when some call cannot be."""
    shape, dtype = static_tensor(chain[-1].var)
    steps = []
    prev = None
    for b in chain:
        args = [None if a is prev else operand_value(res.env, a) for a in b.value.args]
        running = next((k for k, a in enumerate(b.value.args) if a is prev), None)
        steps.append((b.value, args, running))
        prev = b.var
    out = ctx.alloc(shape, cast or dtype)
    try:
        lower_elementwise_chain(ctx, steps, out, dtype)
    except NotSupported:
        return False
    res.env[id(chain[-1].var)] = out
    res.on_chip.update((b.var.name_hint, chain[-1].var.name_hint) for b in chain[:-1])
    return True


def _lower_binding(ctx: LoweringContext, res: RegionLowering, var: Any, value: Any) -> None:
    if isinstance(value, g.Var):
        res.env[id(var)] = res.env[id(value)]
        return
    if isinstance(value, g.Constant):
        res.env[id(var)] = ctx.constant(np.asarray(value.data))
        return
    if not (isinstance(value, g.Call) and isinstance(value.op, g.Op)):
        raise NotSupported(f"{var.name_hint}: {type(value).__name__} bindings are not "
                           "supported on the NPU")
    shape, dtype = static_tensor(var)
    args = [operand_value(res.env, a) for a in value.args]
    if is_view(value) and isinstance(args[0], DramTensor):
        res.env[id(var)] = DramTensor(args[0].addr, shape, dtype)
        return
    lower = lookup_lowering(value.op.name)
    if lower is None:
        raise NotSupported(f"{value.op.name}: no NPU lowering")
    out = ctx.alloc(shape, dtype)
    lower(ctx, value, args, out)
    res.env[id(var)] = out


def lower_region(ctx: LoweringContext, func: g.Function, env: dict[int, Any],
                 fuse: bool = True) -> RegionLowering:
    """Lower the bindings of region function ``func`` into ``ctx``'s current kernel builder;
    ``env`` maps each parameter (by ``id``) to its DRAM tensor or constant. Raises
    NotSupported naming the first call no lowering accepts (``fuse``: element-wise chains
    become one kernel each)."""
    res = RegionLowering(dict(env))
    bindings = [b for blk in func.body.blocks for b in blk.bindings]
    for b in bindings:
        if not isinstance(b, g.VarBinding):
            raise NotSupported(f"{type(b).__name__} bindings are not supported on the NPU")
    uses = g.binding_uses(func)
    i = 0
    while i < len(bindings):
        end = _chain(bindings, i, uses) if fuse else i + 1
        cast = _consumer_cast(ctx, bindings, end, uses) if fuse else None
        if _elementwise(bindings[i]) and (end - i > 1 or cast) and \
                _fused(ctx, res, bindings[i:end], cast):
            i = end
            continue
        _lower_binding(ctx, res, bindings[i].var, bindings[i].value)
        i += 1
    return res


def region_outputs(func: g.Function, res: RegionLowering, ctx: LoweringContext
                   ) -> list[DramTensor]:
    """The DRAM tensors of ``func``'s result (a constant result is uploaded)."""
    body = func.body.body
    outs = list(body.fields) if isinstance(body, g.Tuple) else [body]
    return [ctx.tensor(operand_value(res.env, o)) for o in outs]
