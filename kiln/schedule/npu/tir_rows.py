"""Row kernels on the NPU through TIR: softmax over the last axis, layer_norm over trailing
axes and the mean of each row (global average pooling, ``mean`` over trailing axes) as TE
PrimFuncs of whole rows, scheduled into the L0 scopes and tensorized onto the vector
intrinsics (reductions ``vred.*`` included), then generated into instructions.

1. :func:`rows_prim_func`: ``x`` viewed as ``(rows, length)``, its rows padded with zeros to
   whole blocks (``X0_pad``); one stage per vector instruction (:class:`RowStage`): a stage
   over whole rows ``(rows, length)``, one per-row value ``(rows, 1)`` (a reduction's result
   and what is computed on it), reading the input, an earlier stage (a per-row one
   broadcast along the row), a constant row (``gamma``, ``beta``: ``(1, length)``, broadcast
   across the rows) or an immediate; ``C``, the crop of the last stage.
2. :func:`schedule_rows`: the last stage's rows split by the emitter's block
   (:func:`~.vector.plan_rows`), the stages ``cache_write``'d into the scope of their
   placement and ``compute_at``'ed under the block loop, the input ``cache_read`` into
   ``npu.l0.input`` there, each constant row into ``npu.l0.weight`` there marked
   ``npu.held`` (it stays on its core: loaded by the core's first block only), the block loop
   annotated ``software_pipeline = nbuf``, each stage annotated with its placement
   (:data:`PLACE_KEY`) and tensorized.
3. :func:`emit_rows_scheduled`: :class:`~.tir_vector.VectorGenerator`'s walk with the row
   kernels' L0 layout (the emitter's): per step the held rows first (a core's first step),
   the input block in its slot; the accumulator slot (``rt * out_len`` values) holds the
   stages placed ``"out"``; per-row values placed ``"stat<i>"`` live in the L0 weight's
   room for four per row of the output slot (``i`` valid rows in), read with stride 0 along
   the row; a stage placed ``"input"`` overwrites the input block (spent by then); the held
   rows after the per-row rooms of all slots.

Same bits and cycles as :func:`~.vector.emit_softmax`, :func:`~.vector.emit_layer_norm` and
:func:`~.vector.emit_row_mean` (the tests compare the instruction streams). What the emitted
lowerings refuse (another axis, another dtype) they refuse here too: the TIR lowering calls
them for it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from ... import te
from ...ir.errors import KilnError
from ...npu.isa import UNIT_VECTOR
from ...tir import expr as E
from ...tir.buffer import Buffer
from ...tir.function import PrimFunc
from ...tir.schedule import Schedule
from ...tir.stmt import Stmt
from ...tir.tensor_intrin.npu import SCOPE_ACC, SCOPE_INPUT, SCOPE_WEIGHT
from ...tir.tensor_intrin.npu_vector import REDUCTIONS, VecOperand, vector_intrin, vector_value
from .emit import (
    MEM_ID,
    DramTensor,
    DramView,
    KernelBuilder,
    KernelInfo,
    Pipeline,
    block,
    itemsize,
)
from .lowering import LoweringContext, NotSupported, register_tir_lowering
from .pooling import (
    lower_adaptive_avg_pool2d,
    lower_layer_norm,
    lower_mean,
    lower_softmax,
    trailing_reduction_rows,
)
from .tir_program import HELD_KEY, PIPELINE_KEY
from .tir_vector import Staged, VectorGenerator, buffer_shape, is_tensorized, loop_nest, pad3
from .vector import plan_rows, rows_bound

__all__ = ["PLACE_KEY", "RowStage", "RowsGenerator", "RowsKernel", "emit_rows_scheduled",
           "layer_norm_stages", "lower_rows_tir", "row_mean_stages", "rows_prim_func",
           "schedule_rows", "scheduled_rows", "softmax_stages"]

#: The stage block annotation of where its block lives in a step: ``"out"`` (the
#: accumulator slot), ``"stat<i>"`` (the i-th per-row value of the L0 weight's room) or
#: ``"input"`` (over the input block).
PLACE_KEY = "npu.place"
_SCOPE_OF = {"out": SCOPE_ACC, "input": SCOPE_INPUT}


@dataclass(frozen=True)
class RowStage:
    """One vector instruction of a row kernel: ``name = opcode(srcs)``, over whole rows
    (``row=False``) or one value per row; a source is ``("x",)`` (the input block),
    ``("s", name)`` (an earlier stage), ``("c", i)`` (constant row i) or ``("imm", v)``;
    ``place``: see :data:`PLACE_KEY`."""

    name: str
    opcode: str
    srcs: tuple[tuple[Any, ...], ...]
    row: bool
    place: str


def softmax_stages() -> list[RowStage]:
    """``vred.max``, ``vsub`` of the max, ``vexp``, ``vred.sum``, then the division by the
    sum as the emitter's: one ``vdiv`` per row of a 1 by the sum (``1 * recip(sum)``, a 1 made
    as ``sum * 0 + 1``) and a ``vmul`` of the row by it -- ``vdiv`` is ``x * recip(b)``
    (docs/npu.md, Numerics), so the bits of a ``vdiv`` of the row by its sum, at a vector
    cycle a block instead of ``[vector.cost] div``'s (BERT-base's attention, 1536 rows of 128,
    default: 18675 -> 14235 cycles)."""
    return [RowStage("M", "vred.max", (("x",),), True, "stat0"),
            RowStage("Z", "vsub", (("x",), ("s", "M")), False, "out"),
            RowStage("E", "vexp", (("s", "Z"),), False, "out"),
            RowStage("Sum", "vred.sum", (("s", "E"),), True, "stat0"),
            RowStage("Zero", "vmul", (("s", "Sum"), ("imm", 0.0)), True, "stat1"),
            RowStage("One", "vadd", (("s", "Zero"), ("imm", 1.0)), True, "stat1"),
            RowStage("R", "vdiv", (("s", "One"), ("s", "Sum")), True, "stat1"),
            RowStage("P", "vmul", (("s", "E"), ("s", "R")), False, "out")]


def layer_norm_stages(length: int, epsilon: float) -> list[RowStage]:
    """The mean, the deviation, its square (over the input block), the mean square, ``vrsqrt``
    of it plus ``epsilon``, the scale and shift by the constant rows (the emitter's)."""
    inv = 1.0 / length
    return [RowStage("Msum", "vred.sum", (("x",),), True, "stat0"),
            RowStage("Mean", "vmul", (("s", "Msum"), ("imm", inv)), True, "stat0"),
            RowStage("D", "vsub", (("x",), ("s", "Mean")), False, "out"),
            RowStage("Sq", "vmul", (("s", "D"), ("same",)), False, "input"),
            RowStage("Vsum", "vred.sum", (("s", "Sq"),), True, "stat1"),
            RowStage("Var", "vmul", (("s", "Vsum"), ("imm", inv)), True, "stat1"),
            RowStage("VarE", "vadd", (("s", "Var"), ("imm", float(epsilon))), True, "stat1"),
            RowStage("Rstd", "vrsqrt", (("s", "VarE"),), True, "stat1"),
            RowStage("N", "vmul", (("s", "D"), ("s", "Rstd")), False, "out"),
            RowStage("G", "vmul", (("s", "N"), ("c", 0)), False, "out"),
            RowStage("Y", "vadd", (("s", "G"), ("c", 1)), False, "out")]


def row_mean_stages(length: int, mean: bool = True) -> list[RowStage]:
    """``vred.sum`` of each row, times ``1 / length`` (``mean=False``: the sum)."""
    stages = [RowStage("Sum", "vred.sum", (("x",),), True, "out")]
    if mean:
        stages.append(RowStage("Mean", "vmul", (("s", "Sum"), ("imm", 1.0 / length)), True,
                               "out"))
    return stages


@dataclass(frozen=True)
class RowsKernel:
    """A row kernel: ``rows`` rows of ``length`` values of ``dtype`` -> rows of ``out_len``
    (``length``, or 1: a per-row result), ``consts`` constant rows, blocks of ``rt`` rows."""

    rows: int
    length: int
    out_len: int
    dtype: str
    stages: tuple[RowStage, ...]
    consts: int
    rt: int

    @property
    def padded(self) -> int:
        return -(-self.rows // self.rt) * self.rt


def rows_prim_func(k: RowsKernel) -> PrimFunc:
    """Step 1 of the module docstring."""
    rp, n = k.padded, k.length
    x = te.placeholder((k.rows, n), k.dtype, name="X0")
    if rp != k.rows:
        x_pad = te.compute((rp, n), lambda r, c: te.if_then_else(
            r < k.rows, x[r, c], E.make_const(k.dtype, 0)), name="X0_pad")
    else:
        x_pad = te.compute((rp, n), lambda r, c: x[r, c], name="X0_pad")
    consts = [te.placeholder((1, n), k.dtype, name=f"K{i}") for i in range(k.consts)]
    made: dict[str, Any] = {}
    rows_of = {s.name: s.row for s in k.stages}
    for st in k.stages:
        def read(src: tuple[Any, ...], r: Any, c: Any) -> Any:
            if src[0] == "x":
                return x_pad[r, c]
            if src[0] == "c":
                return consts[src[1]][0, c]
            if src[0] == "imm":
                return E.make_const(k.dtype, src[1])
            t = made[src[1]]
            return t[r, 0] if rows_of[src[1]] else t[r, c]

        if st.opcode in REDUCTIONS:
            red = te.reduce_axis((0, n), name="k")
            fn = {"vred.sum": te.sum, "vred.max": te.max, "vred.min": te.min}[st.opcode]
            made[st.name] = te.compute((rp, 1), lambda r, z, st=st, red=red, fn=fn: fn(
                read(st.srcs[0], r, red), axis=red), name=st.name)
            continue

        def value(r: Any, c: Any, st: RowStage = st) -> Any:
            vals: list[Any] = []
            for src in st.srcs:
                vals.append(vals[0] if src[0] == "same" else read(src, r, c))
            return vector_value(st.opcode, k.dtype, vals)

        made[st.name] = te.compute((rp, 1 if st.row else n), value, name=st.name)
    last = made[k.stages[-1].name]
    c = te.compute((k.rows, k.out_len), lambda r, j: last[r, j], name="C")
    return te.create_prim_func([x, *consts, c])


def _read_index(sch: Schedule, blk: Any, name: str) -> int:
    for i, r in enumerate(sch.get(blk).reads):
        if r.buffer.name == name:
            return i
    raise KilnError(f"block {sch.get(blk).name_hint!r} reads no buffer {name!r}")


def _scope(place: str) -> str:
    return _SCOPE_OF.get(place, SCOPE_WEIGHT)


def _operand(k: RowsKernel, st: RowStage, src: tuple[Any, ...]) -> VecOperand:
    if src[0] == "imm":
        return VecOperand(None, (True, True), value=float(src[1]))
    if src[0] == "same":
        return VecOperand(SCOPE_ACC, (True, True), same=True)
    if src[0] == "x":
        return VecOperand(SCOPE_INPUT, (True, True))
    if src[0] == "c":
        return VecOperand(SCOPE_WEIGHT, (False, True))
    prod = next(s for s in k.stages if s.name == src[1])
    # a per-row value is read at column 0 (by a whole-row stage: with stride 0 along it)
    return VecOperand(_scope(prod.place), (True, not prod.row))


def schedule_rows(func: PrimFunc, k: RowsKernel, nbuf: int) -> Schedule:
    """Step 2 of the module docstring on :func:`rows_prim_func`'s result."""
    sch = Schedule(func)
    last = sch.get_block(k.stages[-1].name)
    r, *_ = sch.get_loops(last)
    ro, _ = sch.split(r, [None, k.rt])
    sch.compute_inline(sch.cache_write(last, 0, _scope(k.stages[-1].place)))
    sch.reverse_compute_at(sch.get_block("C"), ro)
    for st in reversed(k.stages[:-1]):
        blk = sch.get_block(st.name)
        sch.compute_inline(sch.cache_write(blk, 0, _scope(st.place)))
        sch.compute_at(blk, ro, preserve_unit_loops=True)
    # the input block, read by several stages: the padded copy itself staged into L0 input
    # (its write-back inlined into every reader), with the padding in the copy
    pad = sch.get_block("X0_pad")
    sch.compute_inline(sch.cache_write(pad, 0, SCOPE_INPUT))
    sch.compute_at(pad, ro, preserve_unit_loops=True)
    for i in range(k.consts):
        user = next(s.name for s in k.stages if ("c", i) in s.srcs)
        blk = sch.get_block(user)
        copy = sch.cache_read(blk, _read_index(sch, blk, f"K{i}"), SCOPE_WEIGHT)
        sch.compute_at(copy, ro, preserve_unit_loops=True)
        sch.annotate(copy, HELD_KEY, True)
    sch.annotate(ro, PIPELINE_KEY, nbuf)
    for st in k.stages:
        outer = sch.blockize(sch.get_loops(sch.get_block(st.name))[1])
        sch.annotate(outer, PLACE_KEY, st.place)
        operands = tuple(_operand(k, st, s) for s in st.srcs)
        if st.opcode in REDUCTIONS:
            operands = (VecOperand(operands[0].scope, (True, True)),)
        intrin = vector_intrin(st.opcode, k.dtype, k.dtype, operands, dst=_scope(st.place),
                               rank=2)
        sch.tensorize(outer, intrin)
    return sch


@functools.lru_cache(maxsize=256)
def scheduled_rows(k: RowsKernel, nbuf: int) -> Schedule:
    """The scheduled PrimFunc of ``k``, kept per kernel (see
    :func:`~.tir_vector.scheduled_elementwise`)."""
    return schedule_rows(rows_prim_func(k), k, nbuf)


class RowsGenerator(VectorGenerator):
    """:class:`~.tir_vector.VectorGenerator` with the row kernels' L0 layout (module
    docstring, step 3)."""

    def __init__(self, kb: KernelBuilder, dram: dict[Buffer, Any], k: RowsKernel):
        super().__init__(kb, dram)
        self.k = k
        self.isz = itemsize(k.dtype)
        self.held: dict[Buffer, int] = {}
        self.core_steps = [0] * self.cfg.cores

    def step(self, body: list[Stmt]) -> None:
        k, isz, nbuf = self.k, self.isz, self.kb.nbuf
        core = self.blocks % self.cfg.cores
        self.blocks += 1
        p: Pipeline = self.pipes[core]
        held, loads, computes, stores = [], [], [], []
        for s in body:
            loops, realize = loop_nest(s)
            if realize is None:
                raise NotSupported("a pipelined step holds neither copies nor stages")
            if is_tensorized(realize):
                if loops:
                    raise NotSupported(f"stage {realize.block.name_hint!r} is tensorized "
                                       "inside a loop")
                computes.append(realize)
                continue
            c = self.match_copy(loops, realize)
            if c.src.scope == "global" and c.dst.scope != "global":
                (held if realize.block.annotations.get(HELD_KEY) else loads).append(c)
            elif c.src.scope != "global" and c.dst.scope == "global":
                stores.append(c)
            else:
                raise NotSupported(f"copy {c.name!r} from {c.src.scope!r} to {c.dst.scope!r}")
        if len(stores) != 1 or len(loads) != 1 or not computes:
            raise NotSupported("a row step loads one block, computes it and stores it")
        store, load = stores[0], loads[0]
        valid = store.per_dim(store.valid)
        rs = valid[0]
        const_base = nbuf * k.rt * 4 * isz
        for c in held:
            n = self.held.setdefault(c.dst, len(self.held))
            tile = Staged("weight", const_base + n * k.length * isz, c.base_d,
                          c.per_dim(c.valid))
            if self.core_steps[core] == 0:  # the core's first step: loaded once
                t, offset, strides = self.dram_at(c.src, c.base_s)
                self.kb.load(core, shape=pad3(tile.extent), dst=self.block_of(tile, c.dst),
                             src=t.at(offset, strides))
            self.staged[c.dst] = tile
        self.core_steps[core] += 1
        slot = p.load_slot()
        self.load(core, load, slot)
        p.loaded()
        p.compute_begin()
        oslot = p.out_slot()
        origin = store.base_s
        for realize in computes:
            dst = self.call(realize).args[2].args[0].buffer
            place = realize.block.annotations.get(PLACE_KEY, "")
            if place == "out":
                tile = Staged("acc", oslot * k.rt * k.out_len * isz, origin, valid)
            elif place == "input":
                tile = self.staged[load.dst]
            elif place.startswith("stat"):
                tile = Staged("weight", oslot * k.rt * 4 * isz + int(place[4:]) * rs * isz,
                              origin, (rs, 1))
            else:
                raise NotSupported(f"stage {realize.block.name_hint!r} has no placement")
            self.staged[dst] = tile
        for i, realize in enumerate(computes):
            if i:
                self.kb.fence(core, UNIT_VECTOR)
            self.compute(core, realize, valid)
        p.computed()
        p.produced()
        p.store_begin()
        self.store(core, store)
        p.stored()

    def operand(self, ref: Any) -> Any:
        """A row kernel's L0 block as the vector unit reads it: the rows one tile row apart
        (a held constant row: repeated, stride 0), a per-row value repeated along the row
        (stride 0) -- by the block's role, not its extents: one row is still rows."""
        blk = super().operand(ref)
        if not hasattr(blk, "mem") or blk.mem == MEM_ID["acc"]:
            return blk
        buf = ref.args[0].buffer
        tile = self.staged[buf]
        width = buffer_shape(buf)[-1]
        return blk._replace(strides=(0, 0 if buf in self.held else tile.extent[-1],
                                     1 if width > 1 else 0))

    @staticmethod
    def block_of(tile: Staged, buf: Buffer) -> Any:
        """A held row's block: read with stride 0 across the rows (its extent-1 dim)."""
        return block(tile.mem, tile.addr, str(buf.dtype), tile.strides(buffer_shape(buf)))


def emit_rows_scheduled(kb: KernelBuilder, func: PrimFunc, k: RowsKernel,
                        dram: dict[str, DramTensor | DramView]) -> None:
    """Emit scheduled row PrimFunc ``func`` into ``kb``'s streams (module docstring)."""
    by_buffer = {}
    for buf in func.buffer_map.values():
        if buf.name not in dram:
            raise KilnError(f"NPU row generator: no DRAM tensor for parameter {buf.name!r}")
        by_buffer[buf] = dram[buf.name]
    gen = RowsGenerator(kb, by_buffer, k)
    gen.walk(func.body)
    gen.finish()


def lower_rows_tir(ctx: LoweringContext, op: str, x: DramTensor, out: DramTensor, rows: int,
                   length: int, out_len: int, stages: list[RowStage],
                   consts: tuple[DramTensor, ...] = ()) -> None:
    """A row kernel through TIR (the module docstring); its schedule goes to ``ctx.tir``."""
    kb = ctx.kb
    isz = itemsize(x.dtype)
    rt = plan_rows(ctx.config, kb.nbuf, isz, rows, length, out_len, len(consts))
    k = RowsKernel(rows, length, out_len, x.dtype, tuple(stages), len(consts), rt)
    sch = scheduled_rows(k, kb.nbuf)
    dram: dict[str, Any] = {"X0": DramView(x, 0, (rows, length), (length, 1)),
                            "C": DramView(out, 0, (rows, out_len), (out_len, 1))}
    for i, c in enumerate(consts):
        dram[f"K{i}"] = DramView(c, 0, (1, length), (0, 1))
    emit_rows_scheduled(kb, sch.func, k, dram)
    bound = rows_bound(kb, isz, rows, length, out_len, len(consts))
    kb.end_kernel(KernelInfo(ctx.label(op), op, f"TIR: {rt} rows of {rows} x {length}",
                             bound, bound))
    ctx.tir.append((op, sch))


def _float32(ctx: LoweringContext, x: Any) -> bool:
    return isinstance(x, DramTensor) and x.dtype == "float32" and \
        ctx.config.supports_vector_dtype("float32")


@register_tir_lowering("nn.softmax")
def lower_softmax_tir(ctx: LoweringContext, call: Any, args: list[Any], out: DramTensor
                      ) -> None:
    """Softmax over the last axis in float32 through TIR; anything else is the emitted
    lowering's (which refuses it)."""
    x = args[0]
    if not _float32(ctx, x) or call.attrs.axis not in (-1, len(x.shape) - 1):
        return lower_softmax(ctx, call, args, out)
    length = x.shape[-1]
    rows = int(np.prod(x.shape[:-1], dtype=np.int64))
    lower_rows_tir(ctx, "nn.softmax", x, out, rows, length, length, softmax_stages())


@register_tir_lowering("nn.layer_norm")
def lower_layer_norm_tir(ctx: LoweringContext, call: Any, args: list[Any], out: DramTensor
                         ) -> None:
    """layer_norm over trailing axes in float32 through TIR; else the emitted lowering."""
    x = args[0]
    if not _float32(ctx, x):
        return lower_layer_norm(ctx, call, args, out)
    rank = len(x.shape)
    axes = sorted(a % rank for a in call.attrs.axes)
    if axes != list(range(rank - len(axes), rank)):
        return lower_layer_norm(ctx, call, args, out)
    gamma, beta = (ctx.tensor(a) for a in args[1:3])
    length = int(np.prod(gamma.shape, dtype=np.int64))
    rows = int(np.prod(x.shape, dtype=np.int64)) // length
    lower_rows_tir(ctx, "nn.layer_norm", x, out, rows, length, length,
                   layer_norm_stages(length, call.attrs.epsilon), (gamma, beta))


@register_tir_lowering("mean")
def lower_mean_tir(ctx: LoweringContext, call: Any, args: list[Any], out: DramTensor) -> None:
    """A mean over trailing axes through TIR; else the emitted lowering."""
    x = args[0]
    if not _float32(ctx, x):  # float16/bfloat16: summed in float32 by the emitted lowering
        return lower_mean(ctx, call, args, out)
    rows = trailing_reduction_rows("mean", x.shape, call.attrs.axis)
    length = int(np.prod(x.shape, dtype=np.int64)) // rows
    lower_rows_tir(ctx, "mean", x, out, rows, length, 1, row_mean_stages(length))


@register_tir_lowering("nn.adaptive_avg_pool2d")
def lower_adaptive_avg_pool2d_tir(ctx: LoweringContext, call: Any, args: list[Any],
                                  out: DramTensor) -> None:
    """Global average pooling (to 1x1) through TIR; other sizes are the emitted lowering's
    (a pooling kernel)."""
    x = args[0]
    if not (_float32(ctx, x) and call.attrs.layout == "NCHW" and tuple(out.shape[2:]) == (1, 1)):
        return lower_adaptive_avg_pool2d(ctx, call, args, out)  # float16: summed in float32
    rows = x.shape[0] * x.shape[1]
    length = int(np.prod(x.shape, dtype=np.int64)) // rows
    lower_rows_tir(ctx, "nn.adaptive_avg_pool2d", x, out, rows, length, 1,
                   row_mean_stages(length))

