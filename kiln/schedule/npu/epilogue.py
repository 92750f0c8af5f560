"""A product's element-wise epilogue, computed on its accumulator tile before the store.

A product (conv2d, dense, matmul) whose result's only consumer is a chain of element-wise
calls -- a bias or batch norm's per-channel multiply/add, relu, clip, a residual ``add`` of
another DRAM tensor, a final cast to the next product's operand dtype -- need not write its
float32 result to DRAM for a vector kernel to read back: :class:`Epilogue` is installed on the
kernel builder (``KernelBuilder.epilogue``) while the product is emitted, and every store of
the product's result (``KernelBuilder.store``, which both lowering routes call for each output
tile or tail piece) becomes, per chunk of the tile:

1. DMA-in loads the chunk of each tensor operand of the result's shape (a residual: its
   strides of the tile's view) into an epilogue slot -- in bank groups of L0 weight or L0
   input that the product's operand slots leave free (``KernelBuilder.l0_slots``; the
   epilogue's :attr:`~Epilogue.home`, :meth:`Epilogue._by_groups`), so that the
   accumulators hold only the product's tiles and the units using the epilogue's buffers
   meet no other unit's there; else in the accumulator memory, above the product's output
   slots (``KernelBuilder.acc_top``); an operand that broadcasts (a
   per-channel constant: a bias, batch norm's scale and shift) is loaded whole -- its distinct
   elements, compact -- once per core and kernel, into a buffer of its own (below the slots),
   and each chunk reads its channels there (stride 0 along the broadcast dims). Loaded per
   chunk, its DRAM round trip sat in DMA-in's in-order queue behind the vector unit's previous
   chunk, ahead of the next step's gathers: the tensor unit waited (default, ResNet-18's
   stem: 393 cycles every other step, 80.5 -> 89.7% of the roofline);
2. the vector unit runs the chain's instructions on the accumulator tile in place (float32,
   the order and the operands' positions of the unfused kernel's steps, so the same bits) and
   a final ``vcast`` into a float16 buffer where a product wants the result cast; where the
   float32 result is stored too and the slots lie in bank groups of their own (of L0
   weight / input, or of the accumulators above the output slots), the chain's last step
   writes it into the slot instead (:meth:`Epilogue.stages`: DMA-out then never reads a
   tile chunk in the group where the vector unit computes the next -- ResNet-18's stem,
   whose float32 result the max pool reads, lost 9,304 cycles to that conflict);
3. DMA-out stores what the chain produced: the float32 result, the cast copy, or both (a
   result read by a product and by something else: no separate cast kernel).

The tokens: the tensor unit tells the vector unit too when a tile is done
(``KernelBuilder.tile_done``); each chunk's operands come from DMA-in
(``DMA_IN -> VECTOR``, and back when the vector unit has read them: the slot is free again;
the whole broadcast operands once per core and kernel, one ``DMA_IN -> VECTOR`` token before
the first chunk's, none back: nothing overwrites them within the kernel);
each computed chunk goes to DMA-out (``VECTOR -> DMA_OUT``), which returns a cast or staged
buffer's slot once stored (``DMA_OUT -> VECTOR``; the slots rotate across tiles, and the
vector unit waits for one just before it writes there). The tensor unit's own protocol is
unchanged: an accumulator slot is reused only after its store, which now follows the
epilogue.

The chunks are as large as the epilogue slots allow (the accumulator memory left over by the
tiling, in ``nbuf`` slots); when not even one row of a tile fits, or an operand's view of a
tile is not a strided block, :class:`~.lowering.Unfusable` is raised and the caller
(:func:`.region.lower_region`) emits the product and the chain unfused.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...npu.isa import UNIT_DMA_IN, UNIT_DMA_OUT, UNIT_TENSOR, UNIT_VECTOR, Block
from ...target.npu.config import DRAM, NPUConfig
from .emit import MEM_ID, DramTensor, DramView, KernelBuilder, block, itemsize, row_major
from .lowering import Unfusable
from .vector import VecStep, emit_steps

__all__ = ["AUTO_HOMES", "EPILOGUE_HOME_KEY", "HOMES", "Epilogue", "broadcast_strides", "chunks"]

#: The memories a fused epilogue may keep its operand and cast buffers in: the vector unit
#: reads and writes any L0 buffer (docs/npu.md, the instruction set), not L1.
HOMES = ("acc", "input", "weight")
#: The homes ``"auto"`` replays, in the order a tie keeps.
AUTO_HOMES = ("weight", "input", "acc")
#: PassContext option (registered by :mod:`kiln.codegen.npu.compile`): where the fused
#: epilogues keep their buffers -- one of :data:`HOMES`, or ``"auto"``: per product, by
#: the replay of its kernel (:mod:`.feedback`'s ``choose_epilogue_home``).
EPILOGUE_HOME_KEY = "npu.epilogue_home"

#: Alignment of the epilogue's buffers in the accumulator memory.
_ALIGN = 64
#: The smallest chunk of a tile, in bytes of the tile: a store is cut into ``nbuf``
#: chunks (DMA-out stores one while the vector unit computes the next; a third would wait
#: for the first one's store to free its cast buffer) of at least this, or as many as the
#: slots need (each chunk costs its tokens and fences: ResNet-18 224, default, in chunks of
#: 4 KiB: 1198856 cycles; 16 KiB: 972611; one per store: 956779; two: 952040).
CHUNK_MIN_BYTES = 16384


def broadcast_strides(t: DramTensor | DramView, rank: int) -> tuple[int, ...]:
    """The element strides of operand ``t`` over a result of ``rank`` dims (numpy
    broadcasting: 0 along a dim it does not have or has once)."""
    shape = (1,) * (rank - len(t.shape)) + tuple(t.shape)
    st = (0,) * (rank - len(t.shape)) + tuple(t.strides)
    return tuple(0 if n == 1 else s for n, s in zip(shape, st))


def chunks(shape: tuple[int, int, int], limit: int
           ) -> list[tuple[tuple[int, int, int], tuple[int, int, int]]]:
    """``(origin, extent)`` of the pieces of a 3-D block of at most ``limit`` elements each:
    runs of the outermost dim of extent > 1 (as many slices as fit), a slice too large split
    the same way along the next dims."""
    if math.prod(shape) <= limit:
        return [((0, 0, 0), shape)]
    d = next(i for i, e in enumerate(shape) if e > 1)
    inner = math.prod(shape[d + 1:])
    out = []
    if inner <= limit:
        per = limit // inner
        for i0 in range(0, shape[d], per):
            ext = tuple(min(per, shape[d] - i0) if i == d else e for i, e in enumerate(shape))
            out.append((tuple(i0 if i == d else 0 for i in range(3)), ext))
        return out  # type: ignore[return-value]
    sub = tuple(1 if i == d else e for i, e in enumerate(shape))
    for i0 in range(shape[d]):
        for o, e in chunks(sub, limit):  # type: ignore[arg-type]
            out.append((tuple(i0 if i == d else x for i, x in enumerate(o)), e))
    return out  # type: ignore[return-value]


def _in_order(buf: Block, order: list[int], ext: tuple[int, ...], d_str: tuple[int, ...]
              ) -> bool:
    """Whether a store of a chunk of extents ``ext`` (DRAM strides ``d_str``) reads a slot's
    buffer ``buf`` contiguously along DRAM's innermost dim."""
    dims = [j for j in range(3) if ext[j] > 1]
    if not dims:
        return True
    inner = min(dims, key=lambda j: d_str[j])
    return _in_dram_order(buf, order).strides[inner] == 1


def _in_dram_order(buf: Block, order: list[int]) -> Block:
    """A slot's buffer (row-major in the vector unit's ``order`` of the chunk's dims) with
    its strides per dim of the chunk as the store walks it (DRAM's order)."""
    st = [0, 0, 0]
    for pos, j in enumerate(order):
        st[j] = buf.strides[pos]
    return buf._replace(strides=tuple(st))


@dataclass(frozen=True)
class _Layout:
    """An epilogue's buffers in one kernel: the hoisted operands' whole buffers (``slots_at``
    bytes, from ``hoist_at``), and ``nbuf`` slots of ``slot_bytes`` (from ``slot_at``), each
    a ``(memory, address)``: in the accumulators all from a base above the output slots,
    the slots after the hoisted buffers; elsewhere, where the kernel leaves whole bank
    groups free, each in groups of its own (:meth:`Epilogue._by_groups`)."""

    #: elements of the result per chunk
    elems: int
    #: elements each operand's buffer holds
    holds: list[int]
    slot_bytes: int
    #: each operand's buffer: from the base if hoisted, else in a slot
    in_at: list[int]
    #: each cast's buffer in a slot
    cast_at: list[int]
    #: per operand: the ``(shape, strides)`` of the DMA that loads it whole (hoisted), or None
    hoist: list[tuple[tuple[int, ...], tuple[int, ...]] | None]
    slots_at: int
    #: where the hoisted buffers start
    hoist_at: tuple[str, int] = ("acc", 0)
    #: where each slot starts
    slot_at: tuple[tuple[str, int], ...] = ()
    #: the staged result's buffer in a slot (:meth:`Epilogue._layout_for`), or None: the
    #: result of the product's dtype is stored from the accumulator tile itself
    keep_at: int | None = None


@dataclass
class Epilogue:
    """The element-wise chain ``steps`` (``("out",)``: the accumulator tile, ``("in", k)``:
    ``inputs[k]``, broadcast to ``out``'s shape) applied to every tile of product result
    ``out`` (never written itself), computed in ``out.dtype``; ``results``: the tensors of
    ``out``'s shape stored from each tile -- one in ``out.dtype`` (the chain's value) and/or
    one of another dtype (its cast, ``vcast`` rounding to nearest even as a cast kernel
    does). ``names``: the chain's ops, for kernel labels (``nn.conv2d+add+relu``)."""

    out: DramTensor
    steps: list[VecStep]
    inputs: list[DramTensor | DramView]
    results: list[DramTensor]
    names: str
    #: stores of the product's result this epilogue took (a product lowering that writes its
    #: result some other way is not fused: the caller checks)
    hits: int = 0
    #: tiles the tensor unit announced to the vector unit (``KernelBuilder.tile_done``): one
    #: per store, or the tokens would not match (checked at each kernel's end)
    tiles: int = 0
    #: per core: chunks whose operands were loaded in the current kernel (the operand slots
    #: rotate through them; the tokens each returned are popped at the kernel's end)
    loaded: dict[int, int] = field(default_factory=dict)
    #: per core: chunks computed into the slots' cast or staged buffers in the current
    #: kernel (they rotate through the slots across tiles: a chunk waits only for the
    #: store of the one that used its slot ``nbuf`` chunks before; the tokens left are
    #: popped at the kernel's end)
    filled: dict[int, int] = field(default_factory=dict)
    #: the current kernel's slot layout (:meth:`_layout`)
    layout: _Layout | None = None
    #: cores that loaded the whole broadcast operands in the current kernel
    hoisted: set[int] = field(default_factory=set)
    #: where its operand and cast buffers go (:data:`HOMES`): the accumulators, above the
    #: output slots, or whole bank groups of L0 weight / L0 input (that one first) that the
    #: product's operand slots leave free, where the kernel says what they take
    #: (``KernelBuilder.l0_slots``; :meth:`_layout`)
    home: str = "acc"
    #: the memories the layouts of the kernels emitted so far put buffers in (whether
    #: :attr:`home` took effect: :func:`~.feedback.choose_epilogue_home`)
    placed: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        rank = len(self.out.shape)
        self.bstrides = [broadcast_strides(x, rank) for x in self.inputs]
        self.full = [s == tuple(row_major(self.out.shape)) for s in self.bstrides]
        self.nbytes = math.prod(self.out.shape) * itemsize(self.out.dtype)
        self.casts = [r for r in self.results if r.dtype != self.out.dtype]
        self.keep = [r for r in self.results if r.dtype == self.out.dtype]

    def signature(self) -> str:
        """What this epilogue adds to each tile of its product, as text for the product's
        tiling knob key (:meth:`~.emit.KernelBuilder.knob_context`): its ops and vector
        instructions, each operand's dtype and element strides over the result (a residual of
        the result's shape or a broadcast per-channel constant), the dtypes stored. Two
        products with equal signatures (and GEMM shapes) run the same kernel."""
        ins = ", ".join(f"{x.dtype}{list(st)}" for x, st in zip(self.inputs, self.bstrides))
        ops = ",".join(s.opcode for s in self.steps)
        outs = ",".join(r.dtype for r in self.results)
        return f"epilogue={self.names} ({ops}) in=[{ins}] out=[{outs}]"

    def snapshot(self) -> tuple[Any, ...]:
        """Its emission state, for :meth:`LoweringContext.checkpoint`: a tiling the program
        generator refuses half-way is rolled back with the tiles, stores and operand loads
        it counted here (else the retry's tokens would not pair up)."""
        return (self.hits, self.tiles, dict(self.loaded), dict(self.filled), self.layout,
                set(self.hoisted), self.home)

    def restore(self, state: tuple[Any, ...]) -> None:
        self.hits, self.tiles, loaded, filled, self.layout, hoisted, self.home = state
        self.loaded, self.filled, self.hoisted = dict(loaded), dict(filled), set(hoisted)

    def covers(self, dst: Block) -> bool:
        """Whether a store writes into the product's result (the epilogue's to run)."""
        return dst.mem == MEM_ID[DRAM] and dst.dtype == self.out.dtype and \
            self.out.addr <= dst.addr < self.out.addr + self.nbytes

    def _offset(self, k: int, flat: np.ndarray | int, compact: bool = False) -> np.ndarray:
        """Element offset in ``inputs[k]`` of the result's flat element index ``flat`` (with
        ``compact``: in its hoisted buffer, :meth:`_compact_strides`)."""
        idx = np.unravel_index(np.asarray(flat, dtype=np.int64), self.out.shape)
        strides = self._compact_strides(k) if compact else self.bstrides[k]
        return sum(np.asarray(i, dtype=np.int64) * s for i, s in zip(idx, strides))

    def _compact_strides(self, k: int) -> tuple[int, ...]:
        """The strides over the result's dims of ``inputs[k]``'s distinct elements laid out
        row-major (0 along the dims it broadcasts over): its hoisted buffer."""
        out, at = [0] * len(self.out.shape), 1
        for d in reversed(range(len(self.out.shape))):
            if self.bstrides[k][d]:
                out[d] = at
                at *= self.out.shape[d]
        return tuple(out)

    def _hoist_load(self, k: int) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        """``(shape, strides)`` of the one DMA that loads ``inputs[k]``'s distinct elements
        whole into its compact buffer (its dims of the result that it does not broadcast
        over, merged where contiguous in DRAM), or None where that takes more than a DMA's
        three dims."""
        dims: list[list[int]] = []  # [extent, DRAM stride] outermost first
        for d, n in enumerate(self.out.shape):
            st = self.bstrides[k][d]
            if not st:
                continue
            if dims and dims[-1][1] == st * n:
                dims[-1] = [dims[-1][0] * n, st]
            else:
                dims.append([n, st])
        if len(dims) > 3:
            return None
        dims = [[1, 0]] * (3 - len(dims)) + dims
        return tuple(n for n, _ in dims), tuple(st for _, st in dims)

    def _operand_block(self, k: int, e: int, d_str: tuple[int, ...], ext: tuple[int, ...],
                       compact: bool = False) -> tuple[int, tuple[int, int, int]]:
        """Offset and strides of ``inputs[k]`` (``compact``: of its hoisted buffer) over a
        chunk of the result that starts at flat element ``e`` and steps ``d_str`` along dims
        of extent ``ext``; Unfusable when the operand's view of it is not one strided
        block."""
        if self.full[k]:
            return e, d_str  # type: ignore[return-value]
        base = int(self._offset(k, e, compact))
        st = tuple(int(self._offset(k, e + d, compact)) - base if n > 1 else 0
                   for d, n in zip(d_str, ext))
        grid = np.indices(ext, dtype=np.int64).reshape(3, -1)
        flat = e + sum(g * d for g, d in zip(grid, d_str))
        if not np.array_equal(self._offset(k, flat, compact),
                              base + sum(g * s for g, s in zip(grid, st))):
            raise Unfusable(f"{self.names}: operand {k} {self.inputs[k].shape} is not a "
                               f"strided block of the product's tile")
        return base, st  # type: ignore[return-value]

    def chunk_elems(self, cfg: NPUConfig, acc_top: int, nbuf: int, tile_elems: int,
                    l0_slots: dict[str, tuple[int, int]] | None = None) -> int:
        """Elements of the chunks (at most the tile) :meth:`store` would cut a tile of
        ``tile_elems`` result elements into, with the product's output slots taking
        ``acc_top`` bytes of the accumulators and ``nbuf`` epilogue slots (0: not one element
        fits): what :func:`~.gemm.acc_slots` compares before it takes a slot more, which
        would shrink the room above the slots (small chunks, each a DMA round trip).
        ``l0_slots``: the product's operand slots (``KernelBuilder.l0_slots``), with which
        the buffers may go to another :attr:`home` (:meth:`_layout`, the same decision the
        stores take), where they do not take the accumulators' room."""
        most = self._layout_in(cfg, acc_top, nbuf, l0_slots or {}, tile_elems).elems
        return max(0, min(tile_elems, self._chunk(tile_elems, nbuf, most)))

    def _layout(self, kb: KernelBuilder, tile_elems: int) -> _Layout:
        """The epilogue's buffers of the kernel ``kb`` emits (:meth:`_layout_for`), whose
        first store is of ``tile_elems`` elements: with a :attr:`home` other than the
        accumulators, where the kernel says what its operand slots take in L0 input and
        weight, a tile's chunks are as large there as in the accumulators (fewer would each
        cost a DMA round trip and their tokens) and the buffers take whole bank groups the
        operand slots leave free (:meth:`_by_groups`); else in the accumulators -- where the
        buffers would share a group with the operand slots, the tensor unit reading them
        and DMA-in filling them would meet the vector unit there instead."""
        return self._layout_in(kb.config, kb.acc_top, kb.nbuf, kb.l0_slots, tile_elems,
                               kb.acc_tile)

    def _layout_in(self, cfg: NPUConfig, acc_top: int, nbuf: int,
                   l0_slots: dict[str, tuple[int, int]], tile_elems: int, acc_tile: int = 0
                   ) -> _Layout:
        """:meth:`_layout` of a kernel whose output slots take ``acc_top`` bytes (of
        ``acc_tile`` each; 0: unknown) and whose operand slots are ``l0_slots``."""
        acc = self._layout_for(cfg, acc_top, nbuf)
        if self.home == "acc" or self.home not in l0_slots:
            return acc
        want = self._chunk(tile_elems, nbuf, tile_elems)
        # slots of the chunks the stores will cut (not of all the room: in groups of
        # their own, a slot larger than it needs would take more of them), sized as if
        # the home's memory were free: _by_groups places them in the groups that are
        lay = self._layout_for(cfg, 0, nbuf, self.home, want)
        if lay.elems < min(acc.elems, want):
            return acc
        acc_slots = {"acc": (acc_top // acc_tile, acc_tile)} if acc_tile else {}
        return self._by_groups(cfg, nbuf, {**l0_slots, **acc_slots}, lay, acc_top) or acc

    def _chunk(self, tile_elems: int, nbuf: int, most: int) -> int:
        """Elements of the chunks a store of ``tile_elems`` cuts (slots for ``most``):
        ``nbuf`` chunks a tile (a third would wait for the first one's store), not tiny.
        (Whole tiles in slots that rotate across tiles were slower: ResNet-18's stem 33,037
        -> 33,088 cycles.)"""
        return min(most, max(-(-tile_elems // nbuf), CHUNK_MIN_BYTES // itemsize(self.out.dtype)))

    def _by_groups(self, cfg: NPUConfig, nbuf: int, l0_slots: dict[str, tuple[int, int]],
                   lay: _Layout, acc_top: int) -> _Layout | None:
        """``lay`` (its buffers sized as if :attr:`home` were free) with its hoisted
        buffers and each slot in bank groups of their own, whole groups the kernel's operand
        slots leave free in L0 input and L0 weight (:attr:`home`'s first), then in the
        accumulators where the kernel says what its output slots take (``l0_slots["acc"]``;
        BERT's FFN products leave one group of L0 input and one of acc), each piece in
        the fewest consecutive groups of one memory that hold it; None where they do not
        go round (or the description has no groups), and not in a memory of fewer ports
        than the accumulators (where two units share a group without a stretch, edge's).
        Four units touch these buffers at
        once -- DMA-in filling slot ``i + 1`` and DMA-out storing slot ``i - 1`` while the
        vector unit reads the hoisted constants and slot ``i`` -- besides the tensor unit
        and DMA-in on the operand slots: in groups of their own they meet only the units
        that use them in turn. The slots go first; the hoisted buffers, where no group is
        left for them, go to the accumulators above the output slots (``acc_top``) where
        they fit: only the vector unit reads them, as it reads the tiles, and
        the bank placement moves them off the group the tensor unit writes (ResNet-18's
        stem, default: its input slots fill L0 input, its weights leave two groups of L0
        weight, which its two staged slots take)."""
        free: list[tuple[str, int, int]] = []  # (memory, first free group, groups)
        ports = cfg.memory("acc").ports
        for mem in dict.fromkeys((self.home, "input", "weight", "acc")):
            spec = cfg.memory(mem)
            if mem == "acc" and mem not in l0_slots:
                continue  # the output slots' size unknown
            if mem not in l0_slots or spec.bank_groups < 2:
                return None
            if spec.ports < ports:  # fewer units at once there (edge: acc has two ports)
                continue
            # the operand slots' groups: each slot in groups of its own where they go
            # round (the bank placement moves them apart: DMA-in fills one while the tensor
            # unit reads another), else as they lie
            count, size = l0_slots[mem]
            g0 = count * -(-size // spec.group_bytes)
            if g0 > spec.bank_groups:
                g0 = -(-count * size // spec.group_bytes)
            free.append((mem, g0, spec.bank_groups - g0))
        def take(size: int) -> tuple[str, int] | None:
            for i, (mem, g0, n) in enumerate(free):
                group = cfg.memory(mem).group_bytes
                need = -(-size // group)
                if need <= n:
                    free[i] = (mem, g0 + need, n - need)
                    return mem, g0 * group
            return None

        at = [take(lay.slot_bytes) for _ in range(nbuf)]
        if None in at:
            return None
        hoist_at = lay.hoist_at
        if lay.slots_at:
            ends = [a + lay.slot_bytes for m, a in at if m == "acc"]  # type: ignore[misc]
            # above the output slots and any slot the accumulators took (below them, in
            # room the bank placement gives the tiles: BERT 5,402 -> 8,958 conflict cycles)
            above = -(-max([acc_top, *ends]) // _ALIGN) * _ALIGN
            hoist_at = take(lay.slots_at) or (  # type: ignore[assignment]
                ("acc", above) if above + lay.slots_at <= cfg.memory("acc").size else None)
            if hoist_at is None:
                return None
        return dataclasses.replace(lay, hoist_at=hoist_at, slot_at=tuple(at))  # type: ignore

    def stages(self, mem: str) -> list[DramTensor]:
        """The result of the product's dtype when the chain's last step writes it into an
        epilogue slot of a layout for ``mem`` rather than back into the accumulator tile:
        only for a home other than the accumulators (whose layouts :meth:`_by_groups`
        places each slot in bank groups of its own), and only where the chain has a step to
        redirect. Stored from the tile, DMA-out reads one chunk
        while the vector unit computes the next in the same bank group (ResNet-18's stem,
        whose float32 result the max pool reads: 9,304 conflict cycles on default);
        staged, each unit has a group of its own and no instruction is added."""
        return self.keep[:1] if mem != "acc" and self.steps else []

    def _layout_for(self, cfg: NPUConfig, top: int, nbuf: int, mem: str = "acc",
                    most: int | None = None) -> _Layout:
        """The epilogue's buffers in memory ``mem`` above ``top`` (:class:`_Layout`): the
        hoisted operands' whole buffers, then ``nbuf`` slots of the chunked operands and
        the casts. An operand that broadcasts (a per-channel constant) holds at most its
        distinct elements: hoisted where one DMA loads them, else a fixed buffer in every
        slot -- not one per element of the chunk. ``most``: the most elements a chunk
        needs (the slots hold no more)."""
        base = -(-top // _ALIGN) * _ALIGN
        free = cfg.memory(mem).size - base
        limit = max(0, free // nbuf - _ALIGN * (len(self.inputs) + len(self.casts) + 1))
        caps = [math.prod(n for n, s in zip(self.out.shape, st) if s) for st in self.bstrides]
        small = [cap * itemsize(x.dtype) * 8 <= limit for cap, x in zip(caps, self.inputs)]
        hoist = [self._hoist_load(k) if sm and any(
            n > 1 and not st for n, st in zip(self.out.shape, self.bstrides[k])) else None
            for k, sm in enumerate(small)]
        hoist_at, at = [], 0
        for cap, x, h in zip(caps, self.inputs, hoist):
            hoist_at.append(at)
            at += -(-cap * itemsize(x.dtype) // _ALIGN) * _ALIGN if h else 0
        slots_at = at
        limit = max(0, (free - slots_at) // nbuf -
                    _ALIGN * (len(self.inputs) + len(self.casts) + 1))
        fixed = sum(cap * itemsize(x.dtype) for cap, x, sm, h in
                    zip(caps, self.inputs, small, hoist) if sm and not h)
        staged = self.stages(mem)
        per = sum(itemsize(x.dtype) for x, sm in zip(self.inputs, small) if not sm) + \
            sum(itemsize(r.dtype) for r in [*self.casts, *staged])
        elems = (limit - fixed) // per if per else 1 << 30
        elems = min(elems, cfg.encoding.max_extent ** 2, most or elems)
        holds = [cap if sm else elems for cap, sm in zip(caps, small)]
        offs, at = [], 0
        for n, sz in [(h, itemsize(x.dtype)) for h, x, ho in zip(holds, self.inputs, hoist)
                      if not ho] + [(elems, itemsize(r.dtype))
                                    for r in [*self.casts, *staged]]:
            offs.append(at)
            at += -(-n * sz // _ALIGN) * _ALIGN
        chunked = [k for k, h in enumerate(hoist) if not h]
        in_at = [hoist_at[k] if h else 0 for k, h in enumerate(hoist)]
        for k, off in zip(chunked, offs):
            in_at[k] = off
        casts_at = offs[len(chunked):len(chunked) + len(self.casts)]
        return _Layout(elems, holds, at, in_at, casts_at, hoist, slots_at,
                       (mem, base), tuple((mem, base + slots_at + k * at) for k in range(nbuf)),
                       offs[-1] if staged else None)

    def store(self, kb: KernelBuilder, core: int, shape: tuple[int, ...], dst: Block,
              src: Block) -> None:
        """The epilogue of one store of the product's result: ``shape`` elements of the
        accumulators at ``src`` that would go to ``dst`` (see the module docstring)."""
        self.hits += 1
        shape3 = tuple(int(x) for x in ((1,) * (3 - len(shape)) + tuple(shape)))
        d_str, s_str = tuple(dst.strides), tuple(src.strides)
        osz = itemsize(self.out.dtype)
        e0 = (dst.addr - self.out.addr) // osz
        # the vector unit walks the tile in the accumulators' order (the largest stride
        # outermost), the DMAs in DRAM's (the store's)
        order = sorted(range(3), key=lambda j: (shape3[j] > 1, -s_str[j]))
        if self.layout is None:  # one layout per kernel: the slots are reused across stores
            self.layout = self._layout(kb, math.prod(shape3))
            self.placed |= {m for m, _ in (self.layout.hoist_at, *self.layout.slot_at)}
        lay = self.layout
        holds, in_at, cast_at = lay.holds, lay.in_at, lay.cast_at
        elems = self._chunk(math.prod(shape3), kb.nbuf, lay.elems)
        if elems < shape3[order[-1]]:
            raise Unfusable(f"{self.names}: no room for the epilogue's buffers beside the "
                               f"product's accumulator tiles")
        hmem, hoisted = lay.hoist_at  # the hoisted operands' buffers
        nbuf = kb.nbuf
        chunked = [k for k, h in enumerate(lay.hoist) if not h]
        # the broadcast operands, whole, at the core's first store of the kernel
        first = any(lay.hoist) and core not in self.hoisted
        if first:
            for k, h in enumerate(lay.hoist):
                if h:
                    kb.load(core, shape=h[0],
                            dst=block(hmem, hoisted + in_at[k], self.inputs[k].dtype,
                                      row_major(h[0])),
                            src=self.inputs[k].at(0, h[1]))
            kb.push(core, UNIT_DMA_IN, UNIT_VECTOR)
            self.hoisted.add(core)
        pieces = chunks(shape3, elems)  # type: ignore[arg-type]
        for i, (o, ext) in enumerate(pieces):
            e = e0 + sum(a * d for a, d in zip(o, d_str))
            acc_at = src.addr + sum(a * s for a, s in zip(o, s_str)) * osz
            vext = tuple(ext[j] for j in order)
            tile = block("acc", acc_at, self.out.dtype, tuple(s_str[j] for j in order))
            # each operand's chunk: DMA-in, into the next epilogue slot (a hoisted one: its
            # channels in its buffer)
            reads: list[Block | None] = [None] * len(self.inputs)
            for k, h in enumerate(lay.hoist):
                if h:
                    off, st = self._operand_block(k, e, d_str, ext, compact=True)
                    reads[k] = block(hmem, hoisted + in_at[k] + off * itemsize(
                        self.inputs[k].dtype), self.inputs[k].dtype,
                        tuple(st[j] for j in order))
            if chunked:
                n = self.loaded.get(core, 0)
                smem, slot = lay.slot_at[n % nbuf]
                if n >= nbuf:  # the vector unit has read what the slot held
                    kb.pop(core, UNIT_VECTOR, UNIT_DMA_IN)
                for k in chunked:
                    x = self.inputs[k]
                    off, st = self._operand_block(k, e, d_str, ext)
                    cext = tuple(n_ if s_ else 1 for n_, s_ in zip(vext, (st[j] for j in order)))
                    if math.prod(cext) > holds[k]:
                        raise Unfusable(f"{self.names}: operand {k}'s chunk exceeds its "
                                           "buffer")
                    cstr = row_major(cext)
                    # the buffer's strides, per dim of the chunk (0 where broadcast)
                    bstr = [0, 0, 0]
                    for pos, j in enumerate(order):
                        bstr[j] = cstr[pos] if st[j] else 0
                    kb.load(core, shape=tuple(n_ if s_ else 1 for n_, s_ in zip(ext, st)),
                            dst=block(smem, slot + in_at[k], x.dtype,
                                      tuple(bstr[j] if st[j] else 0 for j in range(3))),
                            src=x.at(off, st))
                    reads[k] = block(smem, slot + in_at[k], x.dtype,
                                     tuple(bstr[j] for j in order))
                kb.push(core, UNIT_DMA_IN, UNIT_VECTOR)
                self.loaded[core] = n + 1
            # the chain on the tile, in place; then the casts
            if i == 0:  # the tensor unit's token: the tile is in the accumulators
                kb.pop(core, UNIT_TENSOR, UNIT_VECTOR)
                if first:  # the hoisted operands are in
                    kb.pop(core, UNIT_DMA_IN, UNIT_VECTOR)
            if chunked:
                kb.pop(core, UNIT_DMA_IN, UNIT_VECTOR)
            f = self.filled.get(core, 0)
            cmem, cslot = lay.slot_at[f % nbuf]
            # the chain's value: in the tile, or (staged) its last step writes a slot --
            # where the store then reads it in order (else the store's strided reads of a
            # memory of fewer banks cost more than the conflicts it saves)
            value = tile
            if lay.keep_at is not None:
                staged = block(cmem, cslot + lay.keep_at, self.out.dtype, row_major(vext))
                if _in_order(staged, order, ext, d_str):
                    value = staged
            slotted = bool(self.casts) or value is not tile
            # the slot's buffers' last store is done: waited for just before the first
            # instruction that writes them (the chain's steps before it run meanwhile)
            wait = (UNIT_DMA_OUT, UNIT_VECTOR) if slotted and f >= nbuf else None
            staged_value = value is not tile
            emit_steps(kb, core, self.steps, vext, tile, [r for r in reads if r is not None],
                       out=value, wait=wait if staged_value else None)  # every operand's
            if staged_value:
                wait = None
            cbufs = []
            for c, r in enumerate(self.casts):
                kb.fence(core, UNIT_VECTOR)
                if wait:
                    kb.pop(core, *wait)
                    wait = None
                cb = block(cmem, cslot + cast_at[c], r.dtype, row_major(vext))
                kb.emit(core, "vcast", shape=vext, mode="rne", dst=cb, a=value)
                cbufs.append(cb)
            if chunked:
                kb.push(core, UNIT_VECTOR, UNIT_DMA_IN)  # the operands' slot is read
            kb.push(core, UNIT_VECTOR, UNIT_DMA_OUT)
            # the stores, in DRAM's order
            kb.pop(core, UNIT_VECTOR, UNIT_DMA_OUT)
            for r in self.keep:
                kb.split_store(core, ext, dst=r.at(e, d_str),
                               src=tile._replace(strides=tuple(s_str)) if value is tile
                               else _in_dram_order(value, order))
            for r, cb in zip(self.casts, cbufs):
                kb.split_store(core, ext, dst=r.at(e, d_str), src=_in_dram_order(cb, order))
            if slotted:
                kb.push(core, UNIT_DMA_OUT, UNIT_VECTOR)  # the slot's buffers are free
                self.filled[core] = f + 1

    def finish(self, kb: KernelBuilder) -> None:
        """At a kernel's end: DMA-in takes back the operand slots' tokens it has not popped
        (the next kernel starts with empty queues). Unfusable when the product's tiles
        and its stores did not pair up (a lowering that stores a tile in several pieces
        after one token): the caller emits it unfused."""
        if self.tiles != self.hits:
            raise Unfusable(f"{self.names}: {self.tiles} tiles announced, {self.hits} "
                               "stores through the epilogue")
        for core, n in self.loaded.items():
            for _ in range(min(n, kb.nbuf)):
                kb.pop(core, UNIT_VECTOR, UNIT_DMA_IN)
        for core, n in self.filled.items():  # the cast or staged buffers' last stores
            for _ in range(min(n, kb.nbuf)):
                kb.pop(core, UNIT_DMA_OUT, UNIT_VECTOR)
        self.loaded, self.filled = {}, {}
        self.layout = None
        self.hoisted = set()
