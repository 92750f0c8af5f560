"""Sub-batches at the front of a network: the first layers of a batch-``N`` region run per
slice of ``b`` images so that their intermediates fit in L1.

On-chip residency (:mod:`.residency`) keeps a tensor in L1 when it fits there over its live
interval; at the front of a network the activations are the largest (ResNet-18's stem at 224
writes 3.2 MB per image), and a batch multiplies them, so they cross the DRAM channel twice per
layer. Those layers have small weights and no dependence between images: running the chain
of them once per slice of the batch shrinks every intermediate by ``N / b``, and the
residency pass then finds them room in L1. The later layers, where weights dominate, stay at
the full batch, so their weights are still loaded once per batch.

This module decides (:func:`plan_sub_batches`) and builds the sliced graph
(:func:`slice_function`); :func:`kiln.schedule.npu.region.lower_region` lowers the sliced
bindings once per slice with every batch-``N`` operand and result a view ``b`` images into
the full tensor (:func:`relocate_dram` points the slice's stores of its results there), so
each slice's kernels read their part of the input and write their part of the boundary
tensors, and only the slice's own intermediates are new (small) DRAM tensors.

The decision is the cost model of the hardware description, before anything is emitted: per
prefix of sliceable bindings (convolutions, pooling, element-wise ops and casts whose
run-time operands all lead with the batch) and slice size ``b`` (a divisor of ``N``):

- *saved*: the DRAM bytes (written once, read per consumer; a product's operand in the
  dtype it reads) of the prefix's intermediates that residency would keep in L1 at the
  slice's size, less those it keeps at the full batch -- modelled as residency chooses:
  greedily by bytes moved per byte held, each where the chosen ones live with it leave
  room in :data:`L1_SHARE` of L1 (the rest is the kernels' own staging);
- *extra*: per additional slice, the prefix's weights loaded again and each kernel's fill and
  tail (a barrier and two DRAM latencies: its first loads, its last store), as bytes of the
  DRAM channel.

The prefix and ``b`` with the largest ``saved - extra`` win; nothing is sliced unless it is
positive. Every output element is computed by the same kernels' arithmetic on the same
operands (only the batch rows a kernel covers change): the bits of a product, whose K steps
are planned per layer, are checked by the tests and the benchmark against the unsliced build.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ... import graph as g
from ...npu.isa import Block
from ...target.npu import L1, MEMORY_NAMES
from .emit import DRAM_ALIGN, DramTensor, itemsize
from .lowering import LoweringContext
from .ops import ELEMENTWISE_OPS, GEMM_OPS, product_operand_dtype

__all__ = ["L1_SHARE", "SLICEABLE_OPS", "SUB_BATCH_KEY", "SubBatchPlan", "plan_sub_batches",
           "relocate_dram", "slice_function"]

#: PassContext option (registered by :mod:`kiln.codegen.npu.compile`): run the front of a
#: batched region per sub-batch where the cost model says it saves DRAM traffic.
SUB_BATCH_KEY = "npu.sub_batch"

#: Ops whose result for one image depends on that image alone (no halo across the batch):
#: they may run per slice of the batch.
SLICEABLE_OPS = frozenset(("nn.conv2d", "nn.max_pool2d", "nn.avg_pool2d",
                           "nn.adaptive_avg_pool2d", "cast", "qnn.requantize",
                           "qnn.quantize", "qnn.dequantize", *ELEMENTWISE_OPS))

#: The share of L1 the planner lets a slice's live intermediates take: the rest is the
#: kernels' own (a convolution stages its input rows in L1).
L1_SHARE = 0.5

_DRAM_ID = MEMORY_NAMES.index("dram")


@dataclass(frozen=True)
class SubBatchPlan:
    """Bindings ``[0, end)`` of a region run ``batch // size`` times, on ``size`` images each;
    the cost model's DRAM bytes ``saved`` by the intermediates kept in L1 and its cycles of
    those bindings at the full batch (``whole``) and sliced."""

    end: int
    batch: int
    size: int
    saved: float
    whole: float
    sliced: float

    @property
    def slices(self) -> int:
        return self.batch // self.size

    @property
    def gain(self) -> float:
        return self.whole - self.sliced

    def describe(self) -> str:
        return (f"{self.end} binding(s) in {self.slices} sub-batches of {self.size} "
                f"(est. {self.saved / 1e6:.2f} MB of DRAM traffic saved, {self.whole:.0f} -> "
                f"{self.sliced:.0f} cycles)")


def _shape(expr: Any) -> tuple[tuple[int, ...], str] | None:
    si = getattr(expr, "struct_info", None)
    if not isinstance(si, g.TensorStructInfo) or si.shape is None:
        return None
    dims = [getattr(d, "value", d) for d in si.shape]
    if not all(isinstance(d, int) for d in dims):
        return None
    return tuple(int(d) for d in dims), str(si.dtype)


def _nbytes(shape: tuple[int, ...], dtype: str) -> int:
    return math.prod(shape) * itemsize(dtype)


def _sliceable(b: Any, batch: int, bound: set[int], params: set[int]) -> bool:
    """Binding ``b`` may run per slice of a batch of ``batch``: a sliceable op whose result
    and run-time operands (region parameters or values of the prefix) lead with the batch,
    its constants broadcast over it."""
    value = b.value
    if not (isinstance(b, g.VarBinding) and isinstance(value, g.Call) and
            isinstance(value.op, g.Op) and value.op.name in SLICEABLE_OPS):
        return False
    out = _shape(b.var)
    if out is None or len(out[0]) < 2 or out[0][0] != batch or out[1] not in _ITEMSIZES:
        return False
    windowed = value.op.name not in ELEMENTWISE_OPS and not value.op.name.startswith(
        ("cast", "qnn."))  # a convolution's or pooling's image, then its weights
    for k, a in enumerate(value.args):
        if isinstance(a, g.Var):
            t = _shape(a)
            if id(a) not in bound | params or t is None or len(t[0]) != len(out[0]) or \
                    t[0][0] != batch or (windowed and k > 0):
                return False
        elif isinstance(a, g.Constant):
            shp = np.shape(a.data)
            if k == 0 or (not windowed and len(shp) == len(out[0]) and shp[0] != 1):
                return False
        else:
            return False
    return True


_ITEMSIZES = ("bool", "int8", "uint8", "int16", "float16", "bfloat16", "int32", "float32")


@dataclass
class _Value:
    """A prefix value's DRAM life: its bytes (every copy stored), the bytes its writes and
    reads move, the bindings it is live over."""

    nbytes: int
    traffic: int
    first: int
    last: int


@dataclass
class _Kernel:
    """The kernel that computes a materialized value (with the bindings fused into it): its
    tensor and vector units' cycles at the full batch (they overlap), the weights it loads,
    the values it reads (binding index, None for a region parameter; bytes) and the one it
    writes."""

    tensor: float = 0.0
    vector: float = 0.0
    weights: int = 0
    reads: list[tuple[int | None, int]] = field(default_factory=list)
    writes: int | None = None


def _consumers(bindings: list[Any], i: int) -> list[int]:
    var = bindings[i].var
    return [k for k in range(i + 1, len(bindings)) if isinstance(bindings[k].value, g.Call)
            and any(a is var for a in bindings[k].value.args)]


def _read_dtype(ctx: LoweringContext, call: Any, k: int, dtype: str) -> str:
    """The dtype ``call`` reads its operand ``k`` in (a product's activation cast)."""
    want = product_operand_dtype(ctx, call, dtype) if k == 0 else None
    return want or dtype


def _values(ctx: LoweringContext, bindings: list[Any], end: int, uses: dict[int, int],
            outputs: set[int]) -> dict[int, _Value]:
    """The materialized values of bindings ``[0, end)`` (an element-wise value used once by
    the next element-wise op, or a product's used once by one, stays on chip), by binding."""
    out: dict[int, _Value] = {}
    for i in range(end):
        b = bindings[i]
        shape, dtype = _shape(b.var)  # type: ignore[misc]
        consumers = _consumers(bindings, i)
        if _fused(bindings, i, uses, outputs):
            continue
        copies: dict[str, int] = {}
        reads = 0
        for k in consumers:
            c = bindings[k].value
            dt = _read_dtype(ctx, c, [a is b.var for a in c.args].index(True), dtype)
            copies[dt] = _nbytes(shape, dt)
            reads += copies[dt]
        if id(b.var) in outputs or not consumers:
            copies[dtype] = _nbytes(shape, dtype)
        last = max(consumers + [len(bindings) if id(b.var) in outputs else i])
        size = sum(copies.values())
        out[i] = _Value(size, size + reads, i, last)
    return out


def _fused(bindings: list[Any], i: int, uses: dict[int, int], outputs: set[int]) -> bool:
    """Binding ``i``'s value stays in its kernel: used once, by an element-wise op."""
    consumers = _consumers(bindings, i)
    return uses.get(id(bindings[i].var), 0) == 1 and len(consumers) == 1 and \
        bindings[consumers[0]].value.op.name in ELEMENTWISE_OPS and \
        id(bindings[i].var) not in outputs


#: Vector instructions per element of the lowerings that take more than one (:mod:`.quantize`:
#: requantize adds the bias, multiplies, clamps and narrows; quantize and dequantize scale
#: and cast).
_VECTOR_STEPS = {"qnn.requantize": 4, "qnn.quantize": 2, "qnn.dequantize": 2}
#: Bytes per element the vector unit streams at least: the qnn lowerings compute in int32 or
#: float32.
_QNN_COMPUTE_BYTES = 4


def _compute_cycles(ctx: LoweringContext, call: Any, out: tuple[tuple[int, ...], str]
                    ) -> tuple[float, float]:
    """The cycles a sliceable call keeps the tensor unit and the vector unit busy at the
    full batch (every core working)."""
    cfg = ctx.config
    shape, dtype = out
    name = call.op.name
    x = _shape(call.args[0])
    w = np.shape(call.args[1].data) if len(call.args) > 1 and \
        isinstance(call.args[1], g.Constant) else None
    if name == "nn.conv2d" and x is not None and w is not None and len(w) == 4:
        groups = int(getattr(call.attrs, "groups", 1))
        if groups > 1 and groups == x[0][1]:  # depthwise: per output element, its taps
            return 0.0, cfg.vector_ops_cycles(_nbytes(shape, dtype) * w[2] * w[3]) / cfg.cores
        dt = _read_dtype(ctx, call, 0, x[1])
        td = cfg.tensor_dtype(dt, dt)
        per_cycle = math.prod(cfg.tensor_shape) / (td.cycles_per_tile if td else 1)
        return math.prod(shape) * math.prod(w[1:]) / per_cycle / cfg.cores, 0.0
    wide = max([itemsize(dtype)] + [itemsize(t[1]) for t in map(_shape, call.args)
                                    if t is not None and t[1] in _ITEMSIZES])
    if name.startswith("qnn."):
        wide = max(wide, _QNN_COMPUTE_BYTES)
    steps = _VECTOR_STEPS.get(name, 1)
    window = math.prod(getattr(call.attrs, "pool_size", None) or (1,))
    if name == "nn.adaptive_avg_pool2d" and x is not None:
        window = math.prod(x[0][2:]) // max(1, math.prod(shape[2:]))
    nbytes = math.prod(shape) * wide * steps * window
    return 0.0, cfg.vector_ops_cycles(nbytes) / cfg.cores


def _kernels(ctx: LoweringContext, bindings: list[Any], end: int, uses: dict[int, int],
             outputs: set[int], values: dict[int, _Value]) -> dict[int, _Kernel]:
    """Bindings ``[0, end)`` grouped into the kernels that write their materialized values
    (a fused binding joins its consumer's), keyed by that value's binding."""
    group: dict[int, int] = {}
    for i in reversed(range(end)):
        consumers = _consumers(bindings, i)
        fused = i not in values and consumers and consumers[0] < end
        group[i] = group[consumers[0]] if fused else i
    index = {id(b.var): i for i, b in enumerate(bindings[:end])}
    kernels: dict[int, _Kernel] = {}
    for i in range(end):
        b = bindings[i]
        kern = kernels.setdefault(group[i], _Kernel())
        if i in values:
            kern.writes = i
        tensor, vector = _compute_cycles(ctx, b.value, _shape(b.var))  # type: ignore[arg-type]
        kern.tensor += tensor
        kern.vector += vector
        kern.weights += _weight_bytes(ctx, b.value)
        for k, a in enumerate(b.value.args):
            if not isinstance(a, g.Var):
                continue
            j = index.get(id(a))
            if j is not None and group.get(j) == group[i]:
                continue  # on chip, inside the kernel
            shape, dtype = _shape(a)  # type: ignore[misc]
            kern.reads.append((j, _nbytes(shape, _read_dtype(ctx, b.value, k, dtype))))
    return kernels


def _cycles(ctx: LoweringContext, kernels: dict[int, _Kernel], inner: dict[int, _Value],
            batch: int, size: int, budget: float) -> float:
    """The kernels' cycles over the whole batch run in slices of ``size``: per slice and
    kernel the largest of its compute, its DRAM traffic (the weights every time) and its
    on-chip traffic (the values residency keeps in L1 at the slice's size), plus a fill."""
    cfg = ctx.config
    dram = cfg.memory("dram")
    fill = cfg.barrier_latency + 2 * dram.latency
    onchip_bw = cfg.dma_onchip_bandwidth * cfg.cores
    scale = size / batch
    resident = _resident(inner, scale, budget)
    total = 0.0
    for kern in kernels.values():
        moved = [(j, n) for j, n in kern.reads]
        if kern.writes is not None:
            moved.append((kern.writes, inner[kern.writes].nbytes if kern.writes in inner
                          else 0))
        off = sum(n for j, n in moved if j not in resident) * scale
        on = sum(n for j, n in moved if j in resident) * scale
        total += max(kern.tensor * scale, kern.vector * scale,
                     (off + kern.weights) / dram.bandwidth,
                     on / onchip_bw) + fill
    return total * (batch // size)


def plan_sub_batches(ctx: LoweringContext, func: g.Function) -> SubBatchPlan | None:
    """The prefix of ``func``'s bindings to run per sub-batch, and the sub-batch size, that
    the cost model of ``ctx``'s hardware description prefers (see the module docstring);
    None: nothing pays (or nothing is batched)."""
    bindings = [b for blk in func.body.blocks for b in blk.bindings]
    if not bindings or not isinstance(bindings[0], g.VarBinding):
        return None
    first = _shape(bindings[0].var)
    if first is None or first[0][0] < 2:
        return None
    batch = first[0][0]
    params = {id(p) for p in func.params}
    bound: set[int] = set()
    end = 0
    while end < len(bindings) and _sliceable(bindings[end], batch, bound, params):
        bound.add(id(bindings[end].var))
        end += 1
    if end == 0:
        return None
    body = func.body.body
    outputs = {id(v) for v in (body.fields if isinstance(body, g.Tuple) else [body])
               if isinstance(v, g.Var)}
    uses = g.binding_uses(func)
    values = _values(ctx, bindings, end, uses, outputs)
    budget = ctx.config.memory(L1).size * L1_SHARE
    best: SubBatchPlan | None = None
    for e in range(1, end + 1):
        leaving = [i for i in range(e) if max(_consumers(bindings, i) + [
            len(bindings) if id(bindings[i].var) in outputs else i]) >= e]
        if any(i not in values or bindings[i].value.op.name in GEMM_OPS for i in leaving):
            continue  # a fused chain or a product's epilogue would be cut in two
        inner = {i: v for i, v in values.items() if i < e and i not in leaving}
        kernels = _kernels(ctx, bindings, e, uses, outputs, values)
        whole = _cycles(ctx, kernels, inner, batch, batch, budget)
        for size in (d for d in range(1, batch) if batch % d == 0):
            if any(_nbytes(*_shape(bindings[i].var)) // batch * size % DRAM_ALIGN  # type: ignore
                   for i in range(e)):
                continue  # a slice's view must start on a DRAM_ALIGN boundary
            sliced = _cycles(ctx, kernels, inner, batch, size, budget)
            saved = sum(inner[i].traffic for i in _resident(inner, size / batch, budget)) - \
                sum(inner[i].traffic for i in _resident(inner, 1.0, budget))
            if sliced < whole and (best is None or whole - sliced > best.gain):
                best = SubBatchPlan(e, batch, size, float(saved), whole, sliced)
    return best


def _resident(values: dict[int, _Value], scale: float, budget: float) -> set[int]:
    """The values residency would keep in L1 at ``scale`` of their size: as it chooses,
    greedily by the bytes their accesses move per byte they hold, each where the bytes
    chosen before it and live with it leave room over its whole interval."""
    live: dict[int, float] = {}
    chosen: set[int] = set()
    for i in sorted(values, key=lambda i: (-values[i].traffic / max(values[i].nbytes, 1), i)):
        v = values[i]
        size = v.nbytes * scale
        if all(live.get(p, 0.0) + size <= budget for p in range(v.first, v.last + 1)):
            chosen.add(i)
            for p in range(v.first, v.last + 1):
                live[p] = live.get(p, 0.0) + size
    return chosen


def _weight_bytes(ctx: LoweringContext, call: Any) -> int:
    """The bytes of a product's constant operands as the tensor unit reads them (each
    slice loads them again)."""
    if call.op.name not in GEMM_OPS:
        return 0
    x = _shape(call.args[0])
    want = product_operand_dtype(ctx, call, x[1]) if x else None
    total = 0
    for a in call.args[1:]:
        if isinstance(a, g.Constant):
            data = np.asarray(a.data)
            total += data.size * (itemsize(want) if want else data.itemsize)
    return total


def slice_function(func: g.Function, end: int, size: int
                   ) -> tuple[g.Function, list[g.Var], list[g.Var]]:
    """Bindings ``[0, end)`` of ``func`` as a function of their batch-leading parameters,
    each at batch ``size`` (shapes re-inferred), returning as a tuple the values that later
    bindings or ``func``'s result read. Also returns ``func``'s parameters that the new
    function's stand for (in its order) and the values returned (in ``func``'s variables, in
    the order of the result tuple)."""
    bindings = [b for blk in func.body.blocks for b in blk.bindings][:end]
    body = func.body.body
    later = [b for blk in func.body.blocks for b in blk.bindings][end:]
    read: set[int] = set()

    def mark(e: Any) -> None:
        if isinstance(e, g.Var):
            read.add(id(e))
        elif isinstance(e, g.Call):
            for a in e.args:
                mark(a)
        elif isinstance(e, g.Tuple):
            for f in e.fields:
                mark(f)
        elif isinstance(e, g.TupleGetItem):
            mark(e.tuple_value)

    for b in later:
        mark(b.value)
    mark(body)
    used = {id(a) for b in bindings for a in b.value.args if isinstance(a, g.Var)}
    mapping: dict[int, g.Var] = {}
    params = []
    for p in func.params:
        if id(p) in used:
            shape, dtype = _shape(p)  # type: ignore[misc]
            q = g.Var(p.name_hint, g.TensorStructInfo((size, *shape[1:]), dtype))
            mapping[id(p)] = q
            params.append((p, q))
    bb = g.BlockBuilder()
    leaving = [b.var for b in bindings if id(b.var) in read]
    with bb.function("sub_batch", [q for _, q in params]):
        for b in bindings:
            args = [mapping[id(a)] if isinstance(a, g.Var) else a for a in b.value.args]
            mapping[id(b.var)] = bb.emit(b.value.replace(args=tuple(args)), b.var.name_hint)
        bb.emit_func_output(g.Tuple([mapping[id(v)] for v in leaving]))
    sub = bb.get()["sub_batch"]
    return sub, [p for p, _ in params], leaving


def relocate_dram(streams: list[list[Any]], starts: list[int], old: DramTensor,
                  new_addr: int) -> int:
    """Point every DRAM block of the instructions from ``starts`` (per stream) on that falls
    in ``old``'s bytes at the same offset from ``new_addr``; returns how many moved."""
    lo = old.addr
    hi = lo + max(1, _nbytes(old.shape, old.dtype))
    moved = 0
    for stream, start in zip(streams, starts):
        for ins in stream[start:]:
            for k, v in list(ins.args.items()):
                if isinstance(v, Block) and v.mem == _DRAM_ID and lo <= v.addr < hi:
                    ins.args[k] = v._replace(addr=new_addr + v.addr - lo)
                    moved += 1
    return moved
