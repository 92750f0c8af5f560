"""Lowering one NPU region -- the bindings of a graph function that ``PartitionGraph`` marked
for the NPU -- into kernels.

The region's bindings are lowered in order into the context's current kernel builder: each op
call by its registered lowering (:mod:`.lowering`), a view (reshape, squeeze, expand_dims) as an
alias of its operand's DRAM (no kernel), and a chain of element-wise calls -- each result used
only by the next -- as one vector kernel whose intermediate values stay in the accumulator
block (they never reach DRAM). When the only consumer of an element-wise result is a product
that wants float16 operands, the producer's kernel writes it cast (no separate cast kernel).
A product whose only consumer is such a chain runs it as its epilogue, on each output tile
in the accumulators (:mod:`.epilogue`): the product's result never reaches DRAM, and a chain
result that a product reads too is stored cast beside it.

Used by the NPU code generator (:mod:`kiln.codegen.npu.compile`) and by the memory-scope
annotation (:mod:`kiln.transform.npu.annotate_memory_scope`), which lowers the region into a
scratch context to see where each tensor lives.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ... import graph as g
from ...npu.isa import Instr
from ...target.npu.config import DRAM
from .emit import MEM_ID, DramTensor, dram_itemsize
from .epilogue import AUTO_HOMES, Epilogue
from .feedback import choose_epilogue_home
from .lowering import LoweringContext, NotSupported, lookup_lowering
from .ops import (
    ELEMENTWISE_OPS,
    GEMM_OPS,
    call_depthwise_route,
    elementwise_steps,
    is_depthwise,
    lower_elementwise_chain,
    product_operand_dtype,
)
from .sub_batch import SubBatchPlan, plan_sub_batches, relocate_dram, slice_function
from .vector import VecStep

__all__ = ["FUSE_EPILOGUE_KEY", "VIEW_OPS", "RegionLowering", "is_view", "lower_region",
           "operand_value", "region_outputs", "static_tensor"]

#: PassContext option (registered by :mod:`kiln.codegen.npu.compile`): a product's
#: element-wise epilogue runs on its accumulator tiles (:mod:`.epilogue`); default on.
FUSE_EPILOGUE_KEY = "npu.fuse_epilogue"

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
    #: a variable's copy in a product's operand dtype, stored by the fused epilogue that
    #: computed it (id -> DRAM tensor): the product reads it instead of casting again
    casts: dict[int, DramTensor] = field(default_factory=dict)
    #: the front of the region run per sub-batch (:mod:`.sub_batch`), None: not sliced
    sub_batch: SubBatchPlan | None = None


@dataclass
class _Boundary:
    """The rest of a region around the bindings of a sub-batch (:func:`_lower_sliced`): a
    value the slice returns is consumed by later bindings, which decide -- as in the unsliced
    region -- whether the slice stores it cast for a product. ``orig``: the slice's variable
    (id) -> the region's; ``after``: the region's bindings after the slice; ``outputs``: ids
    of the region's result variables."""

    orig: dict[int, Any]
    after: list[Any]
    outputs: set[int]

    def consumers(self, var: Any) -> list[Any]:
        """The later bindings that read the region's value of slice variable ``var``."""
        v = self.orig.get(id(var))
        return [] if v is None else _consumers(self.after, v)


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
                   uses: dict[int, int], boundary: _Boundary | None = None) -> str | None:
    """The dtype the only consumer of binding ``end - 1`` -- the next binding, a product --
    wants it in (its cast is then fused into the producer), else None (``boundary``: the
    bindings are a sub-batch's, whose last one's next binding is the region's first after
    it)."""
    if uses.get(id(bindings[end - 1].var)) != 1:
        return None
    var = bindings[end - 1].var
    if end < len(bindings):
        nxt = bindings[end].value
    elif boundary is not None and boundary.after and id(var) in boundary.orig:
        var, nxt = boundary.orig[id(var)], boundary.after[0].value
    else:
        return None
    if not (isinstance(nxt, g.Call) and isinstance(nxt.op, g.Op) and nxt.args and
            nxt.args[0] is var):
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


def _call_args(ctx: LoweringContext, res: RegionLowering, value: Any) -> list[Any]:
    """The operands of op call ``value``; a product's activation as the copy in its operand
    dtype that a fused epilogue stored, where there is one (no cast kernel then)."""
    args = [operand_value(res.env, a) for a in value.args]
    copy = res.casts.get(id(value.args[0])) if value.args else None
    if copy is not None and product_operand_dtype(ctx, value, args[0].dtype) == copy.dtype:
        args[0] = copy
    return args


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
    args = _call_args(ctx, res, value)
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
                 fuse: bool = True, fuse_epilogue: bool = True, sub_batch: bool = False,
                 boundary: _Boundary | None = None) -> RegionLowering:
    """Lower the bindings of region function ``func`` into ``ctx``'s current kernel builder;
    ``env`` maps each parameter (by ``id``) to its DRAM tensor or constant. Raises
    NotSupported naming the first call no lowering accepts (``fuse``: element-wise chains
    become one kernel each; ``fuse_epilogue``: a chain that is a product's only consumer
    runs on the product's accumulator tiles, :mod:`.epilogue`; ``sub_batch``: the front of
    a batched region runs per sub-batch where the cost model says it pays,
    :mod:`.sub_batch`; ``boundary``: ``func`` is such a sub-batch, and these are the
    region's bindings after it)."""
    res = RegionLowering(dict(env))
    bindings = [b for blk in func.body.blocks for b in blk.bindings]
    for b in bindings:
        if not isinstance(b, g.VarBinding):
            raise NotSupported(f"{type(b).__name__} bindings are not supported on the NPU")
    uses = g.binding_uses(func)
    if boundary is not None:  # the slice's result tuple stands for the region's later uses
        for sv, ov in boundary.orig.items():
            uses[sv] = uses.get(sv, 0) - 1 + len(_consumers(boundary.after, ov)) + \
                (id(ov) in boundary.outputs)
    i = 0
    if sub_batch and fuse:
        plan = plan_sub_batches(ctx, func)
        if plan is not None and _lower_sliced(ctx, res, func, plan, fuse_epilogue):
            res.sub_batch = plan
            i = plan.end
    lowered: set[int] = set()  # the chains lowered as a product's epilogue, ahead
    while i < len(bindings):
        if i in lowered:
            i += 1
            continue
        if fuse and fuse_epilogue:
            chain = _product_epilogue(ctx, res, bindings, i, uses, boundary)
            if chain is not None:
                lowered.update(chain)
                i += 1
                continue
        end = _chain(bindings, i, uses) if fuse else i + 1
        cast = _consumer_cast(ctx, bindings, end, uses, boundary) if fuse else None
        if _elementwise(bindings[i]) and (end - i > 1 or cast) and \
                _fused(ctx, res, bindings[i:end], cast):
            i = end
            continue
        _lower_binding(ctx, res, bindings[i].var, bindings[i].value)
        i += 1
    return res


def _lower_sliced(ctx: LoweringContext, res: RegionLowering, func: g.Function,
                  plan: SubBatchPlan, fuse_epilogue: bool) -> bool:
    """Lower bindings ``[0, plan.end)`` of ``func`` once per sub-batch (:mod:`.sub_batch`):
    each slice's parameters are views ``plan.size`` images into the region's tensors, and
    the values it returns are stored into their place in full-batch tensors (allocated with
    the first slice; the slice's own allocation of each is dropped once its blocks point
    there). ``res.env`` (and ``res.casts``) then hold the full-batch tensors. False, with
    nothing emitted, where a slice cannot be lowered so (an operand that is no DRAM tensor,
    a result that is no allocation of its own, scalar-unit code that addresses DRAM by
    register, slices that differ) -- the region then lowers unsliced."""
    sub, originals, leaving = slice_function(func, plan.end, plan.size)
    fields = list(sub.body.body.fields)
    bindings = [b for blk in func.body.blocks for b in blk.bindings]
    body = func.body.body
    outputs = {id(v) for v in (body.fields if isinstance(body, g.Tuple) else [body])}
    boundary = _Boundary({id(sv): ov for sv, ov in zip(fields, leaving)}, bindings[plan.end:],
                         outputs)
    mark = ctx.checkpoint()
    whole: dict[tuple[int, bool], DramTensor] = {}  # (region var, cast copy) -> full tensor
    shared, ctx.shared_constants = ctx.shared_constants, {}  # weights uploaded once
    try:
        for s in range(plan.slices):
            penv = {}
            for q, p in zip(sub.params, originals):
                t = res.env.get(id(p))
                if type(t) is not DramTensor:
                    raise NotSupported(f"{q.name_hint} is no DRAM tensor")
                penv[id(q)] = DramTensor(t.addr + s * _slice_bytes(t, plan),
                                         (plan.size, *t.shape[1:]), t.dtype)
            starts = [len(st) for st in ctx.kb.streams]
            nalloc = len(ctx.allocations)
            sub_res = lower_region(ctx, sub, penv, True, fuse_epilogue, boundary=boundary)
            if any(ins.op.startswith("s.") for st, n in zip(ctx.kb.streams, starts)
                   for ins in st[n:]):
                raise NotSupported("scalar-unit code in a sub-batch")
            mine = ctx.allocations[nalloc:]
            for sv, ov in zip(fields, leaving):
                for cast, t in ((False, sub_res.env.get(id(sv))),
                                (True, sub_res.casts.get(id(sv)))):
                    if t is None:
                        if (id(ov), cast) in whole:
                            raise NotSupported("sub-batches lowered differently")
                        continue
                    if type(t) is not DramTensor or not any(a is t for a in mine):
                        raise NotSupported(f"{ov.name_hint} is no tensor of its slice")
                    if (id(ov), cast) not in whole:
                        if s:
                            raise NotSupported("sub-batches lowered differently")
                        whole[(id(ov), cast)] = ctx.alloc((plan.batch, *t.shape[1:]), t.dtype)
                    full = whole[(id(ov), cast)]
                    if full.dtype != t.dtype:
                        raise NotSupported("sub-batches lowered differently")
                    relocate_dram(ctx.kb.streams, starts, t, full.addr + s * _nbytes(t))
                    ctx.allocations.remove(t)
                    mine = [a for a in mine if a is not t]
            res.on_chip.update(sub_res.on_chip)
    except NotSupported:
        ctx.rollback(mark)
        ctx.shared_constants = shared
        res.on_chip.clear()
        return False
    ctx.shared_constants = shared
    for (v, cast), t in whole.items():
        (res.casts if cast else res.env)[v] = t
    return True


def _nbytes(t: DramTensor) -> int:
    return int(np.prod(t.shape, dtype=np.int64)) * dram_itemsize(t.dtype)


def _slice_bytes(t: DramTensor, plan: SubBatchPlan) -> int:
    """The bytes of ``plan.size`` images of batch-leading tensor ``t``."""
    return _nbytes(t) // plan.batch * plan.size


def _is_product(ctx: LoweringContext, value: Any) -> bool:
    """A call the tensor unit computes (dense, matmul, a conv2d -- a depthwise one where
    :func:`~.ops.call_depthwise_route` puts it there)."""
    if not (isinstance(value, g.Call) and isinstance(value.op, g.Op) and
            value.op.name in GEMM_OPS and len(value.args) >= 2):
        return False
    if value.op.name == "nn.conv2d" and value.attrs.groups != 1:
        dims = [tuple(getattr(d, "value", d) for d in (a.struct_info.shape or ()))
                for a in value.args[:2]]
        if is_depthwise(value.attrs.groups, dims[0], dims[1]):
            return call_depthwise_route(ctx, value).route != "vector"
    return True


def _consumers(bindings: list[Any], var: Any) -> list[Any]:
    return [b for b in bindings if isinstance(b.value, g.Call) and
            any(a is var for a in b.value.args)]


def _product_epilogue(ctx: LoweringContext, res: RegionLowering, bindings: list[Any], i: int,
                      uses: dict[int, int], boundary: _Boundary | None = None
                      ) -> range | None:
    """Lower product binding ``i`` with the element-wise chain that is its only consumer as
    its epilogue (:mod:`.epilogue`); returns the chain's bindings (lowered here, ahead of
    the bindings between: none of them reads the product, and the chain's operands must be
    computed already), or None (nothing emitted) when binding ``i`` is no such product or
    the pair cannot be fused."""
    b = bindings[i]
    if not _is_product(ctx, b.value) or uses.get(id(b.var)) != 1:
        return None
    j = next((k for k in range(i + 1, len(bindings)) if isinstance(bindings[k].value, g.Call)
              and any(a is b.var for a in bindings[k].value.args)), None)
    if j is None or not _elementwise(bindings[j]):
        return None
    first = bindings[j].value
    if sum(a is b.var for a in first.args) != 1:
        return None
    try:
        shape, dtype = static_tensor(b.var)
        if static_tensor(bindings[j].var) != (shape, dtype):
            return None
        end = _chain(bindings, j, uses)
    except NotSupported:
        return None
    chain = bindings[j:end]
    last = chain[-1].var
    # where the chain's value goes: as it is, cast for a product that is its only
    # consumer, or both when a product wants it cast and something else as it is
    cast = _consumer_cast(ctx, bindings, end, uses, boundary)
    copy = None
    if cast is None and uses.get(id(last), 0) > 1:
        consumers = _consumers(bindings[end:], last)
        here = [last] * len(consumers)
        if boundary is not None and id(last) in boundary.orig:  # read after the sub-batch
            outside = boundary.consumers(last)
            consumers += outside
            here += [boundary.orig[id(last)]] * len(outside)
        wants = [product_operand_dtype(ctx, c.value, dtype)
                 if c.value.args[0] is v and sum(a is v for a in c.value.args) == 1
                 else None for c, v in zip(consumers, here)]
        if len(consumers) == uses[id(last)] and wants[0] and len(set(wants)) == 1:
            cast = wants[0]  # read by products only (a downsampling block's input)
        else:
            copy = next((w for w in wants if w), None)
    mark = _Mark(ctx)
    try:
        inputs: list[Any] = []
        steps: list[VecStep] = []
        prev = b.var
        for c in chain:
            args = [None if a is prev else operand_value(res.env, a) for a in c.value.args]
            running = next(k for k, a in enumerate(c.value.args) if a is prev)
            steps += elementwise_steps(ctx, c.value, args, dtype, running, inputs)
            prev = c.var
        if any(len(x.shape) > len(shape) or any(
                n not in (1, m) for n, m in zip(x.shape[::-1], shape[::-1])) for x in inputs):
            raise NotSupported("an operand does not broadcast to the result")
        results = [ctx.alloc(shape, cast)] if cast else [ctx.alloc(shape, dtype)]
        if copy:
            results.append(ctx.alloc(shape, copy))
        if cast or copy:
            if not ctx.config.supports_vector_dtype(cast or copy):
                raise NotSupported(f"the vector unit lacks {cast or copy}")
        out = ctx.alloc(shape, dtype)
        names = "+".join(c.value.op.name for c in chain)
        ep = Epilogue(out, steps, inputs, results, names)
        ep.home = "acc" if ctx.epilogue_home == "auto" else ctx.epilogue_home
        lower = lookup_lowering(b.value.op.name)
        if lower is None:
            raise NotSupported(f"{b.value.op.name}: no NPU lowering")
        args = _call_args(ctx, res, b.value)
        ctx.kb.epilogue = ep
        try:
            if ctx.epilogue_home == "auto" and ctx.home_replay is not None:
                choose_epilogue_home(ctx, ep, AUTO_HOMES,
                                     lambda: lower(ctx, b.value, args, out))
            else:
                lower(ctx, b.value, args, out)
        finally:
            ctx.kb.epilogue = None
        if not ep.hits or mark.writes(out):
            raise NotSupported("the product's result is not stored through its epilogue")
    except NotSupported:
        mark.rollback()
        return None
    mark.relabel(b.value.op.name, names)
    res.env[id(last)] = results[0]
    if copy:
        res.casts[id(last)] = results[1]
    res.on_chip[b.var.name_hint] = last.name_hint
    res.on_chip.update((c.var.name_hint, last.name_hint) for c in chain[:-1])
    return range(j, end)


class _Mark:
    """What a context and its kernel builder hold at a point, to roll back to (a fused
    epilogue found impossible midway) or to name the kernels emitted since."""

    def __init__(self, ctx: LoweringContext):
        self.ctx, kb = ctx, ctx.kb
        self.point = ctx.checkpoint()
        self.streams = [len(st) for st in kb.streams]
        self.nkernels = len(kb.kernels)

    def new(self) -> list[Instr]:
        return [ins for st, n in zip(self.ctx.kb.streams, self.streams) for ins in st[n:]]

    def writes(self, t: DramTensor) -> bool:
        """Whether an instruction emitted since writes DRAM tensor ``t``."""
        end = t.addr + max(1, int(np.prod(t.shape, dtype=np.int64)) * dram_itemsize(t.dtype))
        return any(ins.op == "dma.store" and ins.args["dst"].mem == MEM_ID[DRAM] and
                   t.addr <= ins.args["dst"].addr < end for ins in self.new())

    def rollback(self) -> None:
        self.ctx.rollback(self.point)

    def relabel(self, op: str, names: str) -> None:
        """Label the product kernels emitted since with their fused ops
        (``007:nn.conv2d+add+relu``)."""
        kb = self.ctx.kb
        for info in kb.kernels[self.nkernels:]:
            if info.op != op and not info.op.startswith(op + "."):  # nn.conv2d.depthwise
                continue
            old = info.label  # the op stays the product's (what kinds of kernel count)
            info.label = f"{old}+{names}"
            for bid, lab in kb.labels.items():
                if lab == old:
                    kb.labels[bid] = info.label


def region_outputs(func: g.Function, res: RegionLowering, ctx: LoweringContext
                   ) -> list[DramTensor]:
    """The DRAM tensors of ``func``'s result (a constant result is uploaded)."""
    body = func.body.body
    outs = list(body.fields) if isinstance(body, g.Tuple) else [body]
    return [ctx.tensor(operand_value(res.env, o)) for o in outs]
