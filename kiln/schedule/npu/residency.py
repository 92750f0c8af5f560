"""On-chip residency across layers: intermediate tensors that fit in L1 stay there instead of
going through DRAM.

Kernel by kernel, every lowering writes its result to DRAM and the next kernel reads it back,
so a network's activations cross the chip's narrowest link twice per layer (ResNet-18 on the
"default" description moved 54 MB in and 22 MB out of DRAM, half of it activations). L1 is the
on-chip memory every core's DMA engine reaches (shared by the cores: a tensor one core stores
there is read by another -- the intermediates move core to core through it) at the engines'
on-chip bandwidth and L1's latency, with no share of the DRAM channel.

Once a program is emitted, this pass picks the DRAM tensors that only its DMAs touch -- no
scalar-unit access (the scalar unit addresses DRAM), not an input, output or constant of the
executable, not read by a CPU step or another program -- and moves each one that fits into L1
for its live interval (the kernels from its first to its last access; kernels are separated by
barriers, so nothing outlives its interval):

- the room: L1 above every kernel's own use of it (a convolution stages its input rows there:
  the high-water mark of the L1 blocks its instructions touch) during the tensor's interval;
- the choice: greedily by the DRAM bytes a tensor's accesses move per byte of L1 it holds,
  each placed by the runtime's best-fit (:func:`kiln.runtime.memory_plan.place`) from the top
  of L1 down, kept only where it stays above the kernels' use over its whole interval;
- the addresses, by bank group: the best-fit packing put the tensors side by side at the top
  of L1, in one or two of its groups, where a kernel's loads of one (every core's DMA-in)
  and stores of the next (every core's DMA-out) were more units than a group's ports; the
  bank placement (:mod:`kiln.codegen.npu.bank_plan`) cannot move them (they are carried
  between kernels), so each is re-placed here, in order of the DRAM bytes it saves, where
  its groups meet the fewest groups the other DMA direction touches in its kernels (the
  tensors placed before, the kernel's own staging) -- the packing kept if some tensor
  finds no room (``plan_residency(..., by_groups=False)``: the packing's addresses);
- the rewrite: every DMA block in the tensor's DRAM range becomes the same block in L1 (the
  same strides: the layouts agree byte for byte), so the lowerings need not know.

The DMAs move the same bytes in the same order, so the results are bit-identical; the
simulator's hazard checks (L1 is on-chip) and its timing (on-chip bandwidth, L1's banks and
latency) apply to the new blocks. ``build_npu(..., residency=False)`` (or the PassContext
option ``"npu.residency"``) keeps every tensor in DRAM -- the "before" of ``benchmarks/npu.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from ...npu.isa import Block
from ...npu.program import Program
from ...runtime.memory_plan import Interval, place
from ...target.npu import L1, MEMORY_NAMES, NPUConfig
from .dram_ranges import DramRanges, tensor_bytes
from .emit import DRAM_ALIGN, DramTensor, KernelInfo, itemsize

__all__ = ["RESIDENCY_KEY", "ResidencyPlan", "place_by_groups", "plan_residency", "rebound"]

#: PassContext option: keep intermediates in L1 where they fit (default True).
RESIDENCY_KEY = "npu.residency"

_DRAM_ID = MEMORY_NAMES.index("dram")
_L1_ID = MEMORY_NAMES.index(L1)
#: The DMA instructions, the only ones whose DRAM operands may move to L1.
_DMA_OPS = ("dma.load", "dma.store")


@dataclass
class ResidencyPlan:
    """What moved: per tensor (its DRAM address) its L1 address and size, and the DRAM bytes
    its accesses would have moved."""

    l1_addr: dict[int, int] = field(default_factory=dict)
    nbytes: dict[int, int] = field(default_factory=dict)
    saved_bytes: int = 0
    #: (program, kernel) -> the bytes of the L1 tensors that kernel reads and those it
    #: writes: each tensor's footprint in the kernel (the union of the bytes its DMA blocks
    #: cover), once however often a tiling loads a tile again -- what a roofline's minimum
    #: traffic counts for them, the same for every tiling of the layer (:func:`rebound`)
    kernel_bytes: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)

    @property
    def tensors(self) -> int:
        return len(self.l1_addr)


def _block_extent(blk: Block, shape: tuple[int, ...]) -> tuple[int, int]:
    """The bytes ``[lo, hi)`` a block of ``shape`` touches."""
    isz = itemsize(blk.dtype)
    lo = hi = 0
    for e, s in zip(shape, blk.strides):
        step = (int(e) - 1) * int(s) * isz
        lo, hi = (lo + step, hi) if step < 0 else (lo, hi + step)
    return blk.addr + lo, blk.addr + hi + isz


def _operands(ins: Any) -> list[tuple[str, Block, tuple[int, ...] | None]]:
    """Every block operand of ``ins`` with the box it covers (None: unknown -- not a 3-D
    instruction -- so assume all of its memory)."""
    shape = ins.args.get("shape")
    box = tuple(shape) if shape is not None and len(shape) == 3 else None
    out = []
    for k, v in ins.args.items():
        if not isinstance(v, Block):
            continue
        if k == "dst" and ins.op == "dma.load" and box is not None:
            pads = zip(box, ins.args.get("pad_lo", (0, 0, 0)), ins.args.get("pad_hi", (0, 0, 0)))
            out.append((k, v, tuple(e + lo + hi for e, lo, hi in pads)))
        else:
            out.append((k, v, box))
    return out


def _dram_operands(ins: Any, ranges: DramRanges
                   ) -> list[tuple[str, Block, tuple[int, ...] | None, int]]:
    """``ins``'s block operands in a DRAM tensor (not the zeros at address 0), each with its
    box and the tensor's range."""
    out = []
    for k, blk, box in _operands(ins):
        if blk.mem == _DRAM_ID and blk.addr >= DRAM_ALIGN:
            i = ranges.index(blk.addr)
            if i is not None:
                out.append((k, blk, box, i))
    return out


def _kernels(program: Any) -> list[list[Any]]:
    """The program's instructions per kernel (between barriers), every core's together."""
    kernels: list[list[Any]] = []
    for stream in program.streams:
        k = 0
        for ins in stream:
            if ins.op == "barrier":
                k += 1
                continue
            while len(kernels) <= k:
                kernels.append([])
            kernels[k].append(ins)
    return kernels


def plan_residency(config: NPUConfig, programs: list[Program], pinned: list[DramTensor],
                   allocations: list[DramTensor], by_groups: bool = True) -> ResidencyPlan:
    """Move the intermediates of each program that fit into L1 (the instructions are
    rewritten in place; see the module docstring). ``pinned``: the tensors that must stay in
    DRAM besides those the programs' scalar units address or that several programs share --
    the executable's inputs, outputs and constants, the CPU steps' operands and results.
    ``by_groups``: the L1 addresses re-chosen by bank group (``False``: the best-fit
    packing's, from the top of L1). Returns what moved."""
    ranges = DramRanges(allocations)
    keep: set[int] = set()  # ranges that must stay in DRAM
    for t in pinned:
        i = ranges.index(t.addr)
        if i is not None:
            keep.add(i)
    owner: dict[int, int] = {}  # range -> the program using it
    for p, program in enumerate(programs):
        for kernel in _kernels(program):
            for ins in kernel:
                for _, _, _, i in _dram_operands(ins, ranges):
                    if ins.op not in _DMA_OPS:
                        keep.add(i)
                    if owner.setdefault(i, p) != p:
                        keep.add(i)
                for f in ("offset", "src", "dst"):  # the scalar unit's DRAM addresses
                    v = ins.args.get(f)
                    if ins.op.startswith("s.") and isinstance(v, int) and v >= DRAM_ALIGN:
                        i = ranges.index(v)
                        if i is not None:
                            keep.add(i)
    plan = ResidencyPlan()
    for p, program in enumerate(programs):
        _place_program(config, program, p, ranges, owner, keep, plan, by_groups)
    return plan


def _place_program(config: NPUConfig, program: Program, p: int, ranges: DramRanges,
                   owner: dict[int, int], keep: set[int], plan: ResidencyPlan,
                   by_groups: bool) -> None:
    l1_size = config.memory(L1).size
    align = config.memory(L1).bank_width
    kernels = _kernels(program)
    used = [0] * len(kernels)  # each kernel's own L1 high-water mark
    own_ops: list[set[str]] = [set() for _ in kernels]  # the DMAs touching it
    ops: dict[int, dict[int, set[str]]] = {}  # tensor -> kernel -> the DMAs touching it
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    moved: dict[int, int] = {}
    for k, kernel in enumerate(kernels):
        for ins in kernel:
            for _, blk, box in _operands(ins):
                if blk.mem == _L1_ID:
                    used[k] = max(used[k], l1_size if box is None else _block_extent(blk, box)[1])
                    own_ops[k].add(ins.op)
            for _, blk, box, i in _dram_operands(ins, ranges):
                if i not in keep and owner.get(i) == p:
                    ops.setdefault(i, {}).setdefault(k, set()).add(ins.op)
                    first[i] = min(first.get(i, k), k)
                    last[i] = max(last.get(i, k), k)
                    n = 1 if box is None else int(box[0] * box[1] * box[2])
                    moved[i] = moved.get(i, 0) + n * itemsize(blk.dtype)
    size = {i: tensor_bytes(ranges.tensors[i]) for i in first}
    order = sorted(first, key=lambda i: (-moved[i] / max(size[i], 1), i))
    chosen: list[Interval] = []
    offsets: dict[int, int] = {}
    for i in order:
        trial = [*chosen, Interval(i, size[i], first[i], last[i])]
        trial_offsets, peak = place(trial, align)
        if peak > l1_size:
            continue
        # every chosen tensor (placements may shift) stays above the kernels' own use
        if all(l1_size - trial_offsets[iv.key] - _rounded(iv.size, align) >=
               max(used[iv.start:iv.end + 1]) for iv in trial):
            chosen, offsets = trial, trial_offsets
    where = {iv.key: l1_size - offsets[iv.key] - _rounded(iv.size, align) for iv in chosen}
    if not where:
        return
    if by_groups:
        where = place_by_groups(config, chosen, where, ops, used, own_ops, moved)
    for n, kernel in enumerate(kernels):
        spans: dict[tuple[int, bool], list[tuple[int, int]]] = {}  # (tensor, written) -> bytes
        for ins in kernel:
            for k, blk, box, i in _dram_operands(ins, ranges):
                if i in where:
                    ins.args[k] = blk._replace(mem=_L1_ID,
                                               addr=where[i] + blk.addr - ranges.starts[i])
                    lo, hi = _block_extent(blk, box) if box is not None else \
                        (ranges.starts[i], ranges.starts[i] + size[i])
                    spans.setdefault((i, k == "dst"), []).append(
                        (max(lo, ranges.starts[i]), min(hi, ranges.starts[i] + size[i])))
        if spans:
            plan.kernel_bytes[(p, n)] = (
                sum(_union_bytes(v) for (_, w), v in spans.items() if not w),
                sum(_union_bytes(v) for (_, w), v in spans.items() if w))
    for i, addr in where.items():
        plan.l1_addr[ranges.starts[i]] = addr
        plan.nbytes[ranges.starts[i]] = size[i]
        plan.saved_bytes += moved[i]


def place_by_groups(config: NPUConfig, chosen: list[Interval], where: dict[int, int],
                    ops: dict[int, dict[int, set[str]]], used: list[int],
                    own_ops: list[set[str]], moved: dict[int, int]) -> dict[int, int]:
    """The chosen tensors' L1 addresses re-chosen by bank group (``where``: the best-fit
    packing's, kept where nothing better is found): L1's groups are shared by every core's
    DMA engines, and a kernel's loads (DMA-in of each core) reading one tensor while its
    stores (DMA-out of each core) write another in the same group are more units than the
    group's ports -- the stores stretch (:mod:`kiln.npu.simulator`, "Bank groups"). Tensor
    by tensor (most DRAM bytes saved first), the address is the free one -- no byte shared
    with a tensor placed before whose interval meets its own, above the kernels' own use --
    whose groups meet the fewest of the groups that the other direction of DMA touches in
    the kernels accessing it (the tensors placed before, and the kernel's own L1 use: its
    staging, loads only), on the nearest ports: per group, its lowest and highest free
    range, and the packing's own address. A tensor that finds no free range is kept at the
    packing's address, and the others placed again around it (the packing was kept whole
    before: on edge's 256 KiB of L1, MobileNetV2's tensors at 112 all stayed side by side
    where one did not fit)."""
    spec = config.memory(L1)
    if spec.bank_groups <= 1:
        return where
    gbytes, align, size = spec.group_bytes, spec.bank_width, spec.size
    ivs = {iv.key: iv for iv in chosen}
    rsize = {k: _rounded(iv.size, align) for k, iv in ivs.items()}
    order = sorted(ivs, key=lambda k: (-moved[k], k))
    packed: set[int] = set()  # the tensors kept at the packing's addresses
    while True:
        failed = _group_pass(order, packed, ivs, rsize, where, ops, used, own_ops,
                                  gbytes, align, size)
        if isinstance(failed, dict):
            return failed
        packed.add(failed)


def _group_pass(order: list[int], packed: set[int], ivs: dict[int, Interval],
                     rsize: dict[int, int], where: dict[int, int],
                     ops: dict[int, dict[int, set[str]]], used: list[int],
                     own_ops: list[set[str]], gbytes: int, align: int, size: int
                     ) -> dict[int, int] | int:
    """One pass of :func:`place_by_groups`: the tensors of ``packed`` at the packing's
    addresses (``where``; they never overlap each other), the others in ``order``, each where its
    groups meet the fewest the other DMA direction touches; the addresses, or the first
    tensor that finds no free range (to keep at its packing's address in the next pass:
    the packing's addresses of all tensors are a valid placement, so the passes end)."""

    def groups(lo: int, n: int) -> set[int]:
        return set(range(lo // gbytes, (lo + n - 1) // gbytes + 1))

    def clash(a: set[str], b: set[str]) -> bool:
        # different DMA directions: units of both engines in the group (reads and writes)
        return bool(a) and bool(b) and (a | b) != a & b

    placed: dict[int, int] = {k: where[k] for k in order if k in packed}
    for key in order:
        if key in packed:
            continue
        iv, n = ivs[key], rsize[key]
        floor = max(used[iv.start:iv.end + 1])
        busy = [(placed[o], placed[o] + rsize[o]) for o in placed if ivs[o].overlaps(iv)]

        starts = {where[key]}
        for g in range(size // gbytes):
            starts |= {g * gbytes, (g + 1) * gbytes - n}
        starts |= {hi for _, hi in busy} | {lo - n for lo, _ in busy}
        options = sorted(lo for lo in starts
                         if floor <= lo and lo + n <= size and lo % align == 0 and
                         not any(a < lo + n and lo < b for a, b in busy))
        if not options:
            return key
        # the groups the other DMA direction touches in the kernels accessing the tensor
        against: list[set[int]] = []
        for k, kinds in ops[key].items():
            if used[k] and clash(kinds, own_ops[k]):
                against.append(groups(0, used[k]))
            against += [groups(placed[o], rsize[o]) for o in placed
                        if clash(kinds, ops[o].get(k, set()))]
        placed[key] = min(options, key=lambda lo: (
            sum(bool(groups(lo, n) & other) for other in against), lo != where[key], -lo))
    return placed


def rebound(info: KernelInfo, resident: tuple[int, int], config: NPUConfig) -> KernelInfo:
    """``info`` with its roofline recomputed for operands that no longer cross the DRAM
    channel. ``resident``: the bytes of the L1 tensors the kernel reads and writes, each
    tensor's footprint once (:attr:`ResidencyPlan.kernel_bytes`). The minimum traffic loses
    them, at most what the roofline had counted for the operands read and for the results
    written (``info.reads``, ``info.writes``; where not recorded, at most the whole traffic):
    a product's roofline counts A and B once and C once in the accumulator's type, so a tile
    a tiling reloads, a store in a narrower type or an operand the roofline did not count (a
    fused epilogue's residual) never lowers the bound further -- it is a property of the layer
    and the hardware description, the same for every tiling (the bytes a tiling's DMAs move
    made it depend on the tiling: ResNet-18's stage-4 3x3s, whose weights alone take 36,864
    and 73,728 cycles of the channel, were bounded below that). What left the channel is
    still moved by the DMA engines at their on-chip bandwidth -- the loads by each core's
    DMA-in engine, the stores by its DMA-out engine, side by side (counted one after the
    other, the on-chip side put BERT's P @ V above its simulated cycles: 3840 against
    3539) --: the bound is the largest of the compute side, the DRAM channel's share and
    the engines' on-chip share."""
    # an element-wise or row kernel's bound is its traffic alone (its sides not recorded)
    traffic = info.traffic or (info.roofline if not info.compute else 0.0)
    read, written = resident
    if not (read or written) or not traffic:
        return info
    dram_bw = config.memory("dram").bandwidth
    if info.reads or info.writes:
        read, written = min(read, info.reads), min(written, info.writes)
        if not (read or written):
            return info
    scale = min(1.0, traffic * dram_bw / (read + written))  # never more than the traffic
    read, written = read * scale, written * scale
    dram = traffic - (read + written) / dram_bw
    # loads on each core's DMA-in engine, stores on its DMA-out engine, side by side
    onchip = max(read, written) / (config.dma_onchip_bandwidth * config.cores)
    traffic = max(dram, onchip)
    return replace(info, traffic=traffic if info.traffic else 0.0,
                   roofline=max(info.compute, traffic))


def _union_bytes(spans: list[tuple[int, int]]) -> int:
    """Bytes covered by the union of the ``[lo, hi)`` ranges."""
    total, end = 0, None
    for lo, hi in sorted(spans):
        lo = lo if end is None else max(lo, end)
        if hi > lo:
            total, end = total + hi - lo, hi
    return total


def _rounded(n: int, align: int) -> int:
    return -(-max(n, 1) // align) * align
