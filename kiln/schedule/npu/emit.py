"""Building NPU kernels: DRAM tensors, instruction streams, and the token protocol of a
double-buffered pipeline.

A kernel is emitted into :class:`KernelBuilder`: one instruction list per core, kernels separated
by chip-wide barriers (which order their DRAM traffic and name their phase in the simulator's
report). Inside a kernel, each core runs a three-stage pipeline -- DMA-in, a compute unit
(tensor or vector), DMA-out -- whose stages order themselves only through dependency tokens
(:class:`Pipeline`), as in VTA: with ``nbuf = 2`` slots per on-chip buffer the DMA loads step
``s + 1`` while the compute unit works on step ``s`` (double buffering); ``nbuf = 1`` serializes
them (what the benchmark compares).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ...npu.isa import OPCODES, UNIT_DMA_IN, UNIT_DMA_OUT, UNIT_TENSOR, UNIT_VECTOR, Block, Instr
from ...npu.program import Program
from ...target.npu.config import DRAM, MEMORY_NAMES, NPUConfig

__all__ = ["DramTensor", "DramView", "ITEMSIZE", "KernelBuilder", "KernelInfo", "Pipeline",
           "block", "dram_itemsize", "itemsize", "row_major", "store_piece_bytes", "store_pieces",
           "vector_work"]

MEM_ID = {name: i for i, name in enumerate(MEMORY_NAMES)}
#: DRAM alignment of every tensor (a whole burst of the largest shipped description).
DRAM_ALIGN = 64


def block(mem: str, addr: int, dtype: str, strides: tuple[int, ...]) -> Block:
    """A block operand of memory ``mem`` (strides in elements, right-aligned to 3)."""
    s = tuple(int(x) for x in strides)
    return Block(MEM_ID[mem], int(addr), dtype, (0,) * (3 - len(s)) + s)


def row_major(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major element strides of ``shape``."""
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= n
    return tuple(reversed(out))


@dataclass(frozen=True)
class DramTensor:
    """A tensor in DRAM: byte address, shape, dtype, row-major."""

    addr: int
    shape: tuple[int, ...]
    dtype: str

    @property
    def strides(self) -> tuple[int, ...]:
        return row_major(self.shape)

    def at(self, offset: int, strides: tuple[int, ...]) -> Block:
        """The block starting ``offset`` elements into the tensor with ``strides``."""
        return block("dram", self.addr + offset * itemsize(self.dtype), self.dtype, strides)


@dataclass(frozen=True)
class DramView:
    """A strided view of a DRAM tensor: ``shape`` elements starting ``offset`` elements into
    ``tensor``, dim ``i`` stepping ``strides[i]`` elements (any order, any sign; 0 repeats).
    A transpose, a slice or one input's place in a concatenation is a view, so the DMA's
    strides move the data and no index arithmetic runs on chip. It stands in for a
    :class:`DramTensor` wherever a kernel only reads ``shape``/``strides``/``dtype``/``at``."""

    tensor: DramTensor
    offset: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]

    @property
    def dtype(self) -> str:
        return self.tensor.dtype

    def at(self, offset: int, strides: tuple[int, ...]) -> Block:
        return self.tensor.at(self.offset + offset, strides)


#: Bytes per element of the dtypes a tensor in the NPU's DRAM may have (bool: bytes 0 and 1).
ITEMSIZE = {"bool": 1, "int8": 1, "uint8": 1, "int16": 2, "float16": 2, "bfloat16": 2,
            "int32": 4, "float32": 4, "int64": 8}


def itemsize(dtype: str) -> int:
    """Bytes per element of an NPU dtype."""
    return ITEMSIZE[dtype]


def dram_itemsize(dtype: str) -> int:
    """Bytes per element of a tensor held in the NPU's DRAM: an NPU dtype, or any fixed-width
    numpy dtype (float64, uint32, ...) that only CPU steps read and write -- DRAM is the
    executable's one memory, so a CPU op's float64 operands live there too, although no NPU
    instruction can address them. 0 for what has no fixed width (strings)."""
    if dtype in ITEMSIZE:
        return ITEMSIZE[dtype]
    try:
        dt = np.dtype(dtype)
    except TypeError:
        return 0
    return 0 if dt.kind in "OSUV" else dt.itemsize


def store_piece_bytes(config: NPUConfig) -> int:
    """The largest piece of a split store: the bytes DRAM moves in one DRAM latency."""
    dram = config.memory(DRAM)
    return max(dram.burst, dram.latency * dram.bandwidth)


def store_pieces(config: NPUConfig, shape: tuple[int, ...], dst: Block, src: Block,
                 floor: int = 0) -> list[tuple[tuple[int, int, int], Block, Block]]:
    """``(shape, dst, src)`` of the pieces of a 3-D block copy of at most
    ``max(store_piece_bytes, floor)`` bytes each (a single innermost row may exceed it): slices
    of the outermost dim with extent > 1, several per piece, or each slice split further."""
    limit = max(store_piece_bytes(config), floor)
    shp = tuple(int(e) for e in shape)
    isz = itemsize(src.dtype)
    if math.prod(shp) * isz <= limit:
        return [(shp, dst, src)]
    d = next(i for i, e in enumerate(shp) if e > 1)
    slice_bytes = math.prod(shp[d + 1:]) * isz
    per = max(1, limit // slice_bytes)
    out = []
    for i0 in range(0, shp[d], per):
        n = min(per, shp[d] - i0)
        sub = shp[:d] + (n,) + shp[d + 1:]
        d_at = dst._replace(addr=dst.addr + i0 * dst.strides[d] * isz)
        s_at = src._replace(addr=src.addr + i0 * src.strides[d] * isz)
        if n == 1 and slice_bytes > limit and d < 2:
            out += store_pieces(config, sub, d_at, s_at, floor)
        else:
            out.append((sub, d_at, s_at))
    return out


def vector_work(config: NPUConfig, instrs: list[Instr]) -> float:
    """Cycles the vector unit needs for the vector instructions among ``instrs`` at its
    throughput in the description: per instruction, its widest operand's bytes in blocks of
    ``vector.width`` times its op class's ``[vector.cost]`` (the simulator's occupancy without
    bank conflicts, and without the latency a fence adds: what no schedule can go below)."""
    total = 0.0
    for ins in instrs:
        spec = OPCODES[ins.op]
        if spec.unit != UNIT_VECTOR:
            continue
        wide = max((ITEMSIZE[b.dtype] for b in ins.args.values() if isinstance(b, Block)),
                   default=1)
        total += config.vector_ops_cycles(math.prod(ins.args["shape"]) * wide, spec.cost)
    return total


@dataclass
class KernelInfo:
    """One emitted kernel: its label (the phase name in reports), the op, the tiling chosen
    and the cost model's estimate of its cycles; its roofline bound and the bound's two sides
    (cycles of the compute unit's work, of the DRAM's minimum traffic; 0: not computed).
    ``macs``: a product kernel's useful multiply-accumulates where its ``mma`` instructions
    do more (a depthwise convolution's block-diagonal products multiply ``g - 1`` zeros per
    useful MAC); 0: its instructions' extents are the count."""

    label: str
    op: str
    tiling: str
    estimate: float
    roofline: float = 0.0
    compute: float = 0.0
    traffic: float = 0.0
    macs: int = 0
    #: a product kernel's tiling knob key (:func:`~.gemm.tiling_knob_key`, with its context):
    #: which kernels of a built model a key's decision made (the tuner measures them so)
    knob: str = ""
    #: the DRAM bytes the roofline's traffic side counted for the operands read (a product's
    #: A and B) and for the results written (its C), so that :func:`~.residency.rebound`
    #: takes off no more than that for the tensors residency keeps in L1; 0: not recorded
    #: (an element-wise or row kernel, whose bound counts every operand it touches)
    reads: float = 0.0
    writes: float = 0.0
    #: a product kernel whose output tiles could take a third accumulator slot
    #: (:func:`~.gemm.acc_slots`) and whose build replayed it both ways
    #: (:func:`~.feedback.choose_acc_slots`): ``(slots kept, its replay's cycles, the other
    #: count, its cycles)``; None: not chosen so
    acc_choice: tuple[int, float, int, float] | None = None

    @property
    def dram_bound(self) -> bool:
        """The DRAM side of the roofline binds: a DMA-bound layer."""
        return self.traffic > self.compute

    @property
    def overlap_gain(self) -> float:
        """What overlapping the roofline's two sides gains: both one after the other against
        the larger alone (1.0 when not computed). For a plain GEMM, whose DMA work is its
        DRAM traffic, the most double buffering can give; a convolution's DMA queue also
        carries its gathers from L1 and waits for the staging, which overlap too."""
        top = max(self.compute, self.traffic)
        return (self.compute + self.traffic) / top if top else 1.0

    def achievable_gain(self, moved: float) -> float:
        """What overlapping the compute side with the DRAM traffic the kernel really moves
        gains: ``moved`` cycles of the channel (the bytes a simulation of the kernel put on
        it, over the bandwidth: every reload of a tile, whole bursts) instead of the
        roofline's minimum traffic, so the honest ceiling of double buffering's speed-up
        for the tiling chosen. 1.0 when the compute side is not computed."""
        top = max(self.compute, moved)
        return (self.compute + moved) / top if self.compute and top else 1.0


@dataclass
class KernelBuilder:
    """Instruction streams per core under construction, plus the kernels emitted so far."""

    config: NPUConfig
    double_buffer: bool = True
    streams: list[list[Instr]] = field(default_factory=list)
    labels: dict[int, str] = field(default_factory=dict)
    kernels: list[KernelInfo] = field(default_factory=list)
    #: the smallest piece :meth:`store` splits a store into, besides one DRAM latency's bytes:
    #: ``emit_gemm`` sets it to the loads that stream every step of a kernel of one K step per
    #: tile, so that a store is not starved behind them on the channel, which serves
    #: transfers in the order they are issued -- small store pieces each waiting for a whole
    #: load keep the accumulator slot busy and stall the tensor unit
    store_floor: int = 0
    #: bytes of the accumulators the current product kernel's output slots take (set by
    #: ``emit_gemm`` and the TIR route's generator): a fused epilogue's buffers go above
    acc_top: int = 0
    #: bytes of one of those output slots (0: unknown): with :attr:`acc_top`, the slots'
    #: count, whose bank groups a fused epilogue's buffers keep off (:mod:`.epilogue`)
    acc_tile: int = 0
    #: ``(count, bytes)`` of the current product kernel's operand slots in L0 input and L0
    #: weight (by memory name), from address 0 (set by ``emit_gemm`` and the TIR route's
    #: generator; absent: unknown, and a fused epilogue keeps its buffers in the
    #: accumulators): a fused epilogue may keep its operand and cast buffers in the bank
    #: groups they leave free (:mod:`.epilogue`)
    l0_slots: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: a product's fused element-wise epilogue (:class:`~.epilogue.Epilogue`, duck-typed
    #: here: ``covers(dst)``, ``store(kb, core, shape, dst, src)``, ``finish(kb)``, ``tiles``:
    #: the tiles :meth:`tile_done` announced to it) while its
    #: kernels are emitted: a store of the product's result runs the chain on the tile
    #: and stores what the chain produces instead (None: plain stores)
    epilogue: Any = None
    #: the most accumulator slots the product kernel being emitted rotates its output
    #: tiles through (0: as many as ``gemm.acc_slots`` gives; set while the build tries
    #: the kernel with fewer, ``feedback.choose_acc_slots``)
    acc_slot_cap: int = 0
    #: the most accumulator slots ``gemm.kernel_acc_slots`` gave the kernel being emitted
    #: (reset by ``feedback.lower_with_feedback`` before each attempt)
    acc_slots_used: int = 0

    def __post_init__(self) -> None:
        if not self.streams:
            self.streams = [[] for _ in range(self.config.cores)]

    @property
    def nbuf(self) -> int:
        return 2 if self.double_buffer else 1

    @property
    def l0_top(self) -> dict[str, int]:
        """Bytes of each L0 buffer the current product kernel's operand slots take
        (:attr:`l0_slots`)."""
        return {m: n * b for m, (n, b) in self.l0_slots.items()}

    def emit(self, core: int, op: str, note: str = "", **args: object) -> None:
        """Append an instruction; a float immediate is rounded to float32 here, the precision
        the encoding holds and the vector unit computes with (``1 / 36`` for a mean: the
        simulator rounded it anyway, but the executable could not be saved)."""
        for k, v in args.items():
            if isinstance(v, (float, np.floating)) and np.isfinite(v):
                args[k] = float(np.float32(v))
        self.streams[core].append(Instr(op, note=note, **args))

    def push(self, core: int, src: int, dst: int) -> None:
        self.emit(core, "tok.push", src=src, dst=dst)

    def pop(self, core: int, src: int, dst: int) -> None:
        self.emit(core, "tok.pop", src=src, dst=dst)

    def load(self, core: int, shape: tuple[int, ...], dst: Block, src: Block,
             pad_lo: tuple[int, int, int] = (0, 0, 0), pad_hi: tuple[int, int, int] = (0, 0, 0),
             fill: float = 0) -> None:
        """A ``dma.load`` (no padding unless given)."""
        self.emit(core, "dma.load", shape=shape, dst=dst, src=src, pad_lo=pad_lo, pad_hi=pad_hi,
                  fill=fill)

    def stage_begin(self, core: int, dst: Block, box: tuple[int, int, int],
                    padding_only: bool) -> bool:
        """The start of a product's staging DMA into L1 slot ``dst`` (a convolution's input
        rows): with one slot, wait for the last step's gathers that may still read it; when
        the ``box`` (channels, rows, pixels) holds ``padding_only``, fill it with zeros -- a
        one-element load of DRAM address 0, padded -- and return True (nothing else to
        load)."""
        if self.nbuf == 1:  # the one slot may still be read by the last step's gathers
            self.fence(core, UNIT_DMA_IN)
        if padding_only:
            self.load(core, shape=(1, 1, 1), dst=dst,
                      src=block(DRAM, 0, dst.dtype, (0, 0, 0)),
                      pad_hi=tuple(d - 1 for d in box), fill=0)
        return padding_only

    def store(self, core: int, shape: tuple[int, ...], dst: Block, src: Block) -> None:
        """A ``dma.store``, split into pieces that hold the DRAM channel no longer than one
        DRAM latency each (:func:`store_pieces`), so that the loads of the next steps -- on
        this core's DMA-in and on the other cores -- interleave with a large output tile
        instead of queueing behind all of it. The same bytes move; only the order of the
        transfers on the shared channel changes. A store of the product's result under a
        fused epilogue (:attr:`epilogue`) becomes the epilogue's vector work on the tile and
        the stores of what it computes."""
        if self.epilogue is not None and self.epilogue.covers(dst):
            self.epilogue.store(self, core, shape, dst, src)
            return
        self.split_store(core, shape, dst, src)

    def split_store(self, core: int, shape: tuple[int, ...], dst: Block, src: Block) -> None:
        """A ``dma.store`` split into pieces as :meth:`store` says (no epilogue)."""
        for shp, d, s in store_pieces(self.config, shape, dst, src, self.store_floor):
            self.emit(core, "dma.store", shape=shp, dst=d, src=s)

    def tile_done(self, core: int) -> None:
        """The tensor unit's token that an output tile (or a piece of it) is computed: to
        DMA-out, which stores it, and with a fused :attr:`epilogue` to the vector unit too,
        which runs the epilogue on it meanwhile (DMA-out then waits for the vector unit)."""
        self.push(core, UNIT_TENSOR, UNIT_DMA_OUT)
        if self.epilogue is not None:
            self.push(core, UNIT_TENSOR, UNIT_VECTOR)
            self.epilogue.tiles += 1

    def fence(self, core: int, unit: int) -> None:
        """Wait until everything ``unit`` issued has completed (a unit pipelines its
        instructions: one that reads or rewrites what the previous one writes must wait)."""
        self.push(core, unit, unit)
        self.pop(core, unit, unit)

    def knob_context(self) -> str:
        """What the kernel being emitted does besides its product, for the product's tiling
        knob key (:func:`~.gemm.tiling_knob_key`): the fused epilogue's signature, whose
        loads, vector work and stores per tile change which tiling is fastest ('' without)."""
        return "" if self.epilogue is None else self.epilogue.signature()

    def residual_epilogue(self) -> bool:
        """Whether the fused epilogue (if any) loads an operand of the whole output's shape
        per output tile -- a residual, whose chunk loads share DMA-in's in-order queue with
        the product's operand loads (:data:`~.gemm.DEFER_STORES`,
        :data:`~.gemm.STAGGER_FIRST_LOADS`)."""
        e = self.epilogue
        if e is None:
            return False
        size = math.prod(e.out.shape)
        return any(math.prod(n for n, st in zip(e.out.shape, bs) if st) == size
                   for bs in e.bstrides)

    def result_itemsize(self, out_dtype: str) -> int:
        """Bytes a product kernel stores per element of its result: its fused epilogue's
        results' together (:attr:`~.epilogue.Epilogue.results`: the chain's value and/or its
        cast), else one ``out_dtype`` element -- what its roofline counts for C."""
        if self.epilogue is None:
            return itemsize(out_dtype)
        return sum(itemsize(r.dtype) for r in self.epilogue.results)

    def end_kernel(self, info: KernelInfo) -> None:
        """Close the kernel with a barrier on every core (its id labels the phase); a fused
        epilogue first returns the tokens it still holds."""
        if self.epilogue is not None:
            self.epilogue.finish(self)
        self.acc_top = self.acc_tile = 0
        self.l0_slots = {}
        if not info.compute:
            info = self.with_vector_side(info)
        bid = len(self.labels) + 1
        self.labels[bid] = info.label
        for core in range(self.config.cores):
            self.emit(core, "barrier", id=bid)
        self.kernels.append(info)

    def with_vector_side(self, info: KernelInfo) -> KernelInfo:
        """``info`` (a kernel whose record has no compute side: element-wise, row, pooling
        kernels, whose bound was their traffic alone) with the vector unit's side: the
        :func:`vector_work` of the instructions it emitted since the last barrier, shared
        evenly by the cores; its bound the larger of that and its traffic. A chain of an
        ``erf`` and four other steps on float32 is bound by the vector unit, not by DRAM
        (BERT's GELU: 117% of a traffic-only bound)."""
        work = 0.0
        for stream in self.streams:
            start = next((i + 1 for i in range(len(stream) - 1, -1, -1)
                          if stream[i].op == "barrier"), 0)
            work += vector_work(self.config, stream[start:])
        if not work:
            return info
        traffic = info.traffic or info.roofline
        compute = work / self.config.cores
        return replace(info, compute=compute, traffic=traffic, roofline=max(compute, traffic))

    def program(self, dram_bytes: int) -> Program:
        return Program(self.config, self.streams, dict(self.labels), dram_bytes)


class Pipeline:
    """The token protocol of one core's load -> compute -> store pipeline with ``nbuf`` slots.

    ``nout``: slots of the outputs (default ``nbuf``). Call order per step: ``load_slot()``
    (DMA-in waits until the slot is free), the loads,
    ``loaded()``; ``compute_begin()``, for the first step of an output ``out_slot()``, the
    compute, ``computed()`` (frees the input slot); after an output's last step ``produced()``,
    ``store_begin()``, the stores, ``stored()``. ``finish()`` pops the tokens left so that the
    next kernel starts with empty queues.
    """

    def __init__(self, kb: KernelBuilder, core: int, unit: int, nout: int = 0):
        self.kb, self.core, self.unit, self.nbuf = kb, core, unit, kb.nbuf
        #: output slots: ``nbuf``, or more where the caller has room (an output tile's store
        #: then has that many steps to finish before its slot is taken again)
        self.nout = nout or kb.nbuf
        self.loads = 0
        self.outs = 0

    def load_slot(self) -> int:
        if self.loads >= self.nbuf:
            self.kb.pop(self.core, self.unit, UNIT_DMA_IN)
        return self.loads % self.nbuf

    def loaded(self) -> None:
        self.kb.push(self.core, UNIT_DMA_IN, self.unit)
        self.loads += 1

    def compute_begin(self) -> None:
        self.kb.pop(self.core, UNIT_DMA_IN, self.unit)

    def out_slot(self) -> int:
        if self.outs >= self.nout:
            self.kb.pop(self.core, UNIT_DMA_OUT, self.unit)
        return self.outs % self.nout

    def computed(self) -> None:
        self.kb.push(self.core, self.unit, UNIT_DMA_IN)

    def produced(self) -> None:
        if self.unit == UNIT_TENSOR:
            self.kb.tile_done(self.core)
        else:
            self.kb.push(self.core, self.unit, UNIT_DMA_OUT)
        self.outs += 1

    def store_begin(self) -> None:
        self.kb.pop(self.core, self.unit, UNIT_DMA_OUT)

    def stored(self) -> None:
        self.kb.push(self.core, UNIT_DMA_OUT, self.unit)

    def finish(self) -> None:
        for _ in range(min(self.loads, self.nbuf)):
            self.kb.pop(self.core, self.unit, UNIT_DMA_IN)
        for _ in range(min(self.outs, self.nout)):
            self.kb.pop(self.core, UNIT_DMA_OUT, self.unit)
