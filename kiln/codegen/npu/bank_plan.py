"""Bank-group conflicts of an NPU program, found statically and removed by moving on-chip
buffers (issue 23).

The simulator (:mod:`kiln.npu.simulator`, the specification) stretches an instruction when
another unit of its core touches the same bank group of an on-chip memory at the same time
(the DMA loading the next step's tile into L0 input while the tensor unit reads the current
one from the same group). Which groups collide is a matter of addresses, which the lowerings
choose without looking at groups; this pass moves them after the fact:

1. **Replay** the program timing-only (``Simulator(timing_only=True, record_accesses=True)``:
   the simulator's own timing rules, without the data work) for every instruction's busy
   interval, its on-chip accesses and the conflicts it suffered.
2. **Buffers**: per phase (the kernel between two barriers), scope (a core's L0, or the
   shared L1) and memory with ``bank_groups > 1``, the byte extents of every operand, merged
   where they overlap: a buffer is a range that no operand crosses, so it can move as a whole
   by relocating every operand inside it. A buffer is *pinned* (never moved, and never a
   destination) when it meets bytes some phase reads before writing them (data carried from
   an earlier phase, whose writer would have to move alike) in a phase they are live in --
   from the earliest phase that last wrote them to the reader (elsewhere the bytes are
   free: an earlier version pinned them in every phase, so a kernel reusing the bytes of
   two phases before could not move its buffers) -- or the memory is addressed by the
   scalar unit (through registers, which the pass cannot rewrite: in every phase).
3. **Pairs**: each recorded conflict names the two accesses' ranges, hence a pair of
   buffers; pairs are ranked by the cycles they cost.
4. **Placement**, per pair in that order: one of its buffers (either, if it is not pinned)
   moves to the free range where the **cost model** is lowest, if that is below its cost
   where it is. The model counts accesses, not buffers: the cycles each of the buffer's
   accesses overlaps another unit's access whose extent -- each shifted with its buffer --
   shares a bank group with it, divided by the memory's ports. The ranges tried are, per
   group, the lowest free one starting in it, and every free one that puts a group
   boundary on an edge of one of the buffer's accesses: a buffer two units use at once in
   different parts (the chunk of an accumulator tile DMA-out stores while the vector unit
   computes the next, a product's tail piece stored while the tensor unit writes the next)
   straddles the boundary between them. Free means no other buffer of the phase there, and
   no carried bytes live in the phase; a move keeps the address modulo ``bank_width`` (the
   alignment the instruction cost model and the strided-stream timing see: the simulator's
   bank conflicts of a block depend on its strides, not on which bank it starts in; keeping
   it modulo ``banks x bank_width`` left a chunk edge that is no multiple of the bank span
   a bank line off the group boundary, in the other chunk's group). A pair with no movable
   buffer, or no free range that helps, is left, with the reason.
5. **Re-check** by replaying the moved program; rounds (up to six) repeat while conflicts
   remain and fall. The placement is kept only if the replay's cycles do not grow.

The data never changes (a moved buffer is written in its phase before it is read, the
moves only rename bytes), so a program gives the same bits with and without the pass.
``kiln.codegen.npu.build_npu(..., bank_plan=True)`` (the default) runs it per program and
keeps each program's :class:`BankPlan` (``exe.bank_plans``, ``exe.bank_conflicts``).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ...npu.isa import Block, Instr
from ...npu.numerics import np_dtype
from ...npu.program import Program
from ...npu.simulator import (
    Access,
    Machine,
    Report,
    Simulator,
    block_extent,
    onchip_operands,
)
from ...target.npu.config import L1, MEMORY_NAMES, NPUConfig

__all__ = ["BankAnalysis", "BankPlan", "Buffer", "ConflictPair", "PhaseWrites", "analyse_banks",
           "byte_view", "live_in", "plan_banks", "reads_operand", "writes_operand"]

_L1_ID = MEMORY_NAMES.index(L1)
_ROUNDS = 6
#: Edges of a buffer's accesses tried on a group boundary (its straddling placements)
_MAX_CUTS = 64
#: One operand use: (core, index in its stream, argument name, extent first, extent last)
_Use = tuple[int, int, str, int, int]
#: Bytes carried between phases: (first, last, the first phase and the last it is live in)
_Carried = tuple[int, int, int, int]
#: The last phase of the scalar unit's carried ranges: every phase
_ALL_PHASES = 1 << 30


@dataclass(frozen=True)
class Buffer:
    """An on-chip address range ``[lo, hi)`` of memory ``mem`` (its id) that the operands of
    phase ``phase`` use as a whole, in ``scope`` (a core's L0; -1: the shared L1)."""

    phase: int
    scope: int
    mem: int
    lo: int
    hi: int

    @property
    def size(self) -> int:
        return self.hi - self.lo

    def __str__(self) -> str:
        where = "l1" if self.scope < 0 else f"core {self.scope} {MEMORY_NAMES[self.mem]}"
        return f"phase {self.phase} {where}[{self.lo:#x}, {self.hi:#x})"


@dataclass
class ConflictPair:
    """Two buffers touched by different units at once in one bank group, and the cycles the
    simulator stretched instructions by for it."""

    a: Buffer
    b: Buffer
    cycles: float


@dataclass
class BankAnalysis:
    """A program's timing replay: its cycles, the cycles lost to bank-group conflicts (in
    total and per phase label), the colliding buffer pairs ranked by cycles, and the buffers
    that may not move."""

    cycles: float
    conflict_cycles: float
    phase_conflicts: dict[str, float]
    pairs: list[ConflictPair]
    buffers: dict[tuple[int, int, int], list[Buffer]] = field(repr=False)
    pinned: set[Buffer] = field(repr=False)
    carried: dict[tuple[int, int], list[_Carried]] = field(repr=False)
    accesses: dict[Buffer, list[Access]] = field(repr=False)
    uses: dict[tuple[int, int, int], list[_Use]] = field(repr=False)


@dataclass
class BankPlan:
    """What the placement did to one program: conflict cycles and program cycles of the
    timing replay before and after, conflict cycles per phase label before and after, the
    moves (``buffer -> new low address``) and the pairs left with their reason."""

    conflicts_before: float
    conflicts_after: float
    cycles_before: float
    cycles_after: float
    phases_before: dict[str, float]
    phases_after: dict[str, float]
    moves: list[tuple[Buffer, int]] = field(default_factory=list)
    left: list[str] = field(default_factory=list)

    def summary(self) -> str:
        lines = [f"bank conflicts: {self.conflicts_before:.0f} cycles before placement, "
                 f"{self.conflicts_after:.0f} after ({len(self.moves)} buffer(s) moved); "
                 f"cycles {self.cycles_before:.0f} -> {self.cycles_after:.0f}"]
        lines += [f"  left: {why}" for why in self.left]
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# buffers
# ---------------------------------------------------------------------------------------------
def _grouped(config: NPUConfig) -> set[int]:
    """The ids of the on-chip memories that have bank groups."""
    return {i for i, n in enumerate(MEMORY_NAMES)
            if i > 0 and config.memory(n).bank_groups > 1}


def _scope(core: int, mem: int) -> int:
    return -1 if mem == _L1_ID else core


def writes_operand(ins: Instr, name: str) -> bool:
    """Whether ``ins`` writes its operand ``name``."""
    return name in ("dst", "c")


def reads_operand(ins: Instr, name: str) -> bool:
    """Whether ``ins`` reads its operand ``name`` (an accumulating destination too)."""
    if name == "c":
        return ins.op == "mma"
    if name == "dst":
        return ins.op == "vmac" or (ins.op.startswith("vred.") and bool(ins.args.get("acc")))
    return True


def byte_view(mask: np.ndarray, blk: Block, shape: tuple[int, ...]) -> np.ndarray:
    """The entries of a per-byte mask that a block touches (as the simulator's hazard check
    views its shadows)."""
    isz = np_dtype(blk.dtype).itemsize
    strides = blk.strides[-len(shape):]
    return as_strided(mask[blk.addr:], shape=(*shape, isz),
                      strides=(*(s * isz for s in strides), 1), writeable=True)


class PhaseWrites:
    """The on-chip bytes written so far in one phase (per memory, a byte mask): a read of
    bytes not all written before it in the phase finds data carried in from an earlier one
    (the bank placement pins those bytes; the prefetch keeps its loads off them)."""

    def __init__(self, config: NPUConfig):
        self.config = config
        self.masks: dict[int, np.ndarray] = {}

    def carries(self, ins: Instr, name: str, blk: Block, shape: tuple[int, ...]) -> bool:
        """Whether operand ``name`` of ``ins`` reads bytes this phase has not all written."""
        mask = self.masks.get(blk.mem)
        return reads_operand(ins, name) and \
            (mask is None or not byte_view(mask, blk, shape).all())

    def record(self, ins: Instr, ops: list[tuple[str, Block, tuple[int, ...]]]) -> None:
        """Mark the bytes ``ins`` writes through its operands ``ops``."""
        for name, blk, shape in ops:
            if writes_operand(ins, name):
                mask = self.masks.get(blk.mem)
                if mask is None:
                    mask = self.masks[blk.mem] = np.zeros(
                        self.config.memory(MEMORY_NAMES[blk.mem]).size, bool)
                byte_view(mask, blk, shape)[...] = True


def _phases(program: Program) -> list[list[list[tuple[int, Instr]]]]:
    """Each core's stream cut at its barriers: ``[phase][core] -> [(index, instr)]``
    (barriers are chip-wide, so every core has the same phases)."""
    out: list[list[list[tuple[int, Instr]]]] = []
    for core, stream in enumerate(program.streams):
        phase = 0
        for idx, ins in enumerate(stream):
            if ins.op == "barrier":
                phase += 1
                continue
            while len(out) <= phase:
                out.append([[] for _ in program.streams])
            out[phase][core].append((idx, ins))
    return out


def _collect(program: Program, grouped: set[int]
             ) -> tuple[dict[tuple[int, int, int], list[_Use]],
                        dict[tuple[int, int], list[_Carried]]]:
    """Every on-chip operand use of a grouped memory, per (phase, scope, memory), and the
    carried ranges per (scope, memory), each with the phases it is live in: bytes a phase
    reads before writing them, from the earliest phase that last wrote any of them before
    (the bytes' writers) to the reader; the whole memory in every phase where the scalar
    unit addresses it (through registers: unknown bytes, written or read in any phase)."""
    cfg = program.config
    uses: dict[tuple[int, int, int], list[_Use]] = {}
    carried: dict[tuple[int, int], list[_Carried]] = {}
    scalar: set[tuple[int, int]] = set()
    #: per (scope, memory): the phase that last wrote each byte before the current one
    #: (-1: none; such bytes count as live from phase 0)
    last_write: dict[tuple[int, int], np.ndarray] = {}
    for phase, cores in enumerate(_phases(program)):
        masks: list[tuple[tuple[int, int], np.ndarray]] = []
        for core, stream in enumerate(cores):
            written = PhaseWrites(cfg)
            for idx, ins in stream:
                if ins.op in ("s.ld", "s.st") and ins.args.get("mem") in grouped:
                    mem = ins.args["mem"]
                    scalar.add((_scope(core, mem), mem))
                    continue
                ops = [(n, b, s) for n, b, s in onchip_operands(ins) if b.mem in grouped]
                for name, blk, shape in ops:
                    first, last = block_extent(blk, shape)
                    key = (phase, _scope(core, blk.mem), blk.mem)
                    uses.setdefault(key, []).append((core, idx, name, first, last))
                    if written.carries(ins, name, blk, shape):
                        lw = last_write.get(key[1:])
                        since = 0 if lw is None else max(0, int(lw[first:last].min()))
                        carried.setdefault(key[1:], []).append((first, last, since, phase))
                written.record(ins, ops)
            masks += [((_scope(core, mem), mem), m) for mem, m in written.masks.items()]
        for key, mask in masks:  # the phase's writes, once its reads are classified
            lw = last_write.get(key)
            if lw is None:
                lw = last_write[key] = np.full(mask.size, -1, np.int32)
            lw[mask] = phase
    for scope, mem in scalar:
        carried.setdefault((scope, mem), []).append(
            (0, cfg.memory(MEMORY_NAMES[mem]).size, 0, _ALL_PHASES))
    return uses, carried


def live_in(carried: list[_Carried], phase: int) -> list[tuple[int, int]]:
    """The byte ranges of ``carried`` live in ``phase`` (from their writers' phase to their
    reader's, both included)."""
    return [(lo, hi) for lo, hi, since, until in carried if since <= phase <= until]


def _merge(uses: list[_Use], phase: int, scope: int, mem: int) -> list[Buffer]:
    out: list[Buffer] = []
    for first, last in sorted((f, la) for _, _, _, f, la in uses):
        if out and first < out[-1].hi:
            if last > out[-1].hi:
                out[-1] = Buffer(phase, scope, mem, out[-1].lo, last)
        else:
            out.append(Buffer(phase, scope, mem, first, last))
    return out


def _find(buffers: list[Buffer], first: int) -> Buffer | None:
    i = bisect.bisect_right([b.lo for b in buffers], first) - 1
    return buffers[i] if i >= 0 and first < buffers[i].hi else None


def _meets(lo: int, hi: int, ranges: list[tuple[int, int]]) -> bool:
    return any(lo < b and a < hi for a, b in ranges)


# ---------------------------------------------------------------------------------------------
# analysis
# ---------------------------------------------------------------------------------------------
def _replay(program: Program, machine: Machine) -> tuple[Report, Simulator]:
    sim = Simulator(program.config, machine, timing_only=True, record_accesses=True)
    return sim.run(program), sim


def analyse_banks(program: Program, machine: Machine) -> BankAnalysis:
    """Replay ``program`` timing-only on ``machine`` (whose DRAM must hold the program's
    tensors; its contents are not used) and list its colliding buffer pairs."""
    grouped = _grouped(program.config)
    report, sim = _replay(program, machine)
    phase_conflicts = {label: sum(mems.values())
                       for label, mems in report.phase_conflicts.items()}
    if not sim.conflicts:  # nothing to place: no buffers needed
        return BankAnalysis(report.cycles, report.total_conflict_cycles, phase_conflicts, [],
                            {}, set(), {}, {}, {})
    uses, carried = _collect(program, grouped)
    buffers = {key: _merge(u, *key) for key, u in uses.items()}
    pinned = {b for key, bufs in buffers.items() for b in bufs
              if _meets(b.lo, b.hi, live_in(carried.get(key[1:], []), key[0]))}
    accesses: dict[Buffer, list[Access]] = {}
    for acc in sim.accesses:
        buf = _find(buffers.get((acc.phase, acc.scope, acc.mem), []), acc.first)
        if buf is not None:
            accesses.setdefault(buf, []).append(acc)
    pairs: dict[tuple[Buffer, Buffer], float] = {}
    for c in sim.conflicts:
        bufs = buffers.get((c.phase, c.scope, c.mem), [])
        a, b = _find(bufs, c.first), _find(bufs, c.other_first)
        if a is None or b is None:
            continue
        key = (a, b) if (a.lo, a.hi) <= (b.lo, b.hi) else (b, a)
        pairs[key] = pairs.get(key, 0.0) + c.cycles
    ranked = sorted((ConflictPair(a, b, cyc) for (a, b), cyc in pairs.items()),
                    key=lambda p: (-p.cycles, p.a.phase, p.a.lo, p.b.lo))
    return BankAnalysis(report.cycles, report.total_conflict_cycles, phase_conflicts, ranked,
                        buffers, pinned, carried, accesses, uses)


def _overlapping(accesses: list[Access], units: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every pair of ``accesses`` by different units (``units``: an id per access) whose
    busy intervals overlap: the two indices and the cycles of the overlap (a sweep over the
    intervals in order of their beginning)."""
    if not accesses:
        empty = np.zeros(0, np.int64)
        return empty, empty, np.zeros(0)
    begin = np.array([a.begin for a in accesses])
    end = np.array([a.end for a in accesses])
    order = np.argsort(begin, kind="stable")
    sb = begin[order]
    stops = np.searchsorted(sb, end[order], side="left")
    pi, pj, ov = [], [], []
    for k, stop in enumerate(stops):
        if stop <= k + 1:
            continue
        i, js = order[k], order[k + 1:stop]
        cyc = np.minimum(end[i], end[js]) - begin[js]
        keep = (cyc > 0) & (units[js] != units[i])
        pi.append(np.full(int(keep.sum()), i))
        pj.append(js[keep])
        ov.append(cyc[keep])
    if not pi:
        empty = np.zeros(0, np.int64)
        return empty, empty, np.zeros(0)
    return (np.concatenate(pi).astype(np.int64), np.concatenate(pj).astype(np.int64),
            np.concatenate(ov))


# ---------------------------------------------------------------------------------------------
# placement
# ---------------------------------------------------------------------------------------------
class _Placer:
    """The placement of one (phase, scope, memory)'s buffers while moves are decided.

    The cost model works on accesses, not buffers: every pair of accesses by different
    units whose busy intervals overlap (found once, by a sweep over the intervals) costs its
    overlap when the bank groups its two extents span -- each shifted with its buffer's
    move -- intersect. Two accesses of one buffer count too: a buffer that two units use at
    once in different parts (an accumulator tile whose next chunk the vector unit computes
    while DMA-out stores the last one) can be placed across a group boundary that falls
    between those parts."""

    def __init__(self, config: NPUConfig, key: tuple[int, int, int], buffers: list[Buffer],
                 analysis: BankAnalysis):
        spec = config.memory(MEMORY_NAMES[key[2]])
        self.size, self.group = spec.size, spec.group_bytes
        self.align = spec.bank_width
        self.weight = 1.0 / spec.ports
        self.where = {b: b.lo for b in buffers}
        self.carried = live_in(analysis.carried.get(key[1:], []), key[0])
        self.index = {b: i for i, b in enumerate(buffers)}
        self.shift = np.zeros(len(buffers), np.int64)
        accs = [(self.index[b], a) for b in buffers for a in analysis.accesses.get(b, [])]
        self.buf = np.array([i for i, _ in accs], np.int64)
        self.first = np.array([a.first for _, a in accs], np.int64)
        self.last = np.array([a.last for _, a in accs], np.int64)
        self.pi, self.pj, self.ov = _overlapping(
            [a for _, a in accs], np.array([a.unit[0] * 8 + a.unit[1] for _, a in accs]))

    def groups(self, lo: int, size: int) -> range:
        return range(lo // self.group, (lo + size - 1) // self.group + 1)

    def pair_cost(self, pairs: np.ndarray, buf: Buffer | None = None, lo: int = 0) -> float:
        """Cycles per port the access pairs ``pairs`` (indices into the overlap list) share a
        group, with the current placement and ``buf`` at ``lo``."""
        shift = self.shift
        if buf is not None:
            shift = shift.copy()
            shift[self.index[buf]] = lo - buf.lo
        i, j = self.pi[pairs], self.pj[pairs]
        si, sj = shift[self.buf[i]], shift[self.buf[j]]
        g = self.group
        lo_i, hi_i = (self.first[i] + si) // g, (self.last[i] - 1 + si) // g
        lo_j, hi_j = (self.first[j] + sj) // g, (self.last[j] - 1 + sj) // g
        meet = (lo_i <= hi_j) & (lo_j <= hi_i)
        return self.weight * float(self.ov[pairs][meet].sum())

    def pairs_of(self, buf: Buffer) -> np.ndarray:
        """The overlapping access pairs one side of which is ``buf``'s."""
        b = self.index[buf]
        return np.flatnonzero((self.buf[self.pi] == b) | (self.buf[self.pj] == b))

    def cost(self, buf: Buffer, lo: int) -> float:
        """The cost model: cycles ``buf`` at ``lo`` would share a group with another unit's
        access while one of its own is busy, per port."""
        return self.pair_cost(self.pairs_of(buf), buf, lo)

    def _free(self, buf: Buffer, start: int, taken: list[tuple[int, int]]) -> bool:
        return 0 <= start and start + buf.size <= self.size and \
            (start - buf.lo) % self.align == 0 and \
            not any(lo < start + buf.size and start < hi for lo, hi in taken)

    def starts(self, buf: Buffer) -> list[int]:
        """Where ``buf`` may go: per bank group, the lowest start of a free range beginning
        in it, and every free start that puts a group boundary between two of its accesses
        (an edge of one of them on the boundary, its address modulo the bank span kept)."""
        taken = sorted([(lo, lo + b.size) for b, lo in self.where.items() if b is not buf] +
                       list(self.carried))
        out = []
        for g in range(self.size // self.group):
            start = g * self.group
            start += (buf.lo - start) % self.align
            while start + buf.size <= self.size and start < (g + 1) * self.group:
                clash = [hi for lo, hi in taken if lo < start + buf.size and start < hi]
                if not clash:
                    out.append(start)
                    break
                nxt = max(clash)
                start = nxt + (buf.lo - nxt) % self.align
        mine = self.buf == self.index[buf]
        cuts = {int(c) - buf.lo for c in np.concatenate([self.first[mine], self.last[mine]])}
        cuts = sorted(c for c in cuts if 0 < c < buf.size)[:_MAX_CUTS]
        for c in cuts:
            for g in range(1, self.size // self.group):
                start = g * self.group - c
                start -= (start - buf.lo) % self.align
                if self._free(buf, start, taken):
                    out.append(start)
        return sorted(set(out))

    def best_move(self, buf: Buffer) -> tuple[float, int] | None:
        """(gain, new low address) of the best free range for ``buf``, if one lowers its
        cost."""
        pairs = self.pairs_of(buf)
        here = self.pair_cost(pairs, buf, self.where[buf])
        best = None
        for start in self.starts(buf):
            c = self.pair_cost(pairs, buf, start)
            if c < here - 1e-9 and (best is None or c < best[0]):
                best = (c, start)
        return None if best is None else (here - best[0], best[1])

    def move(self, buf: Buffer, lo: int) -> None:
        self.where[buf] = lo
        self.shift[self.index[buf]] = lo - buf.lo


def _named(pair: ConflictPair, why: str) -> str:
    """A pair left, as :attr:`BankPlan.left` names it: its buffer(s), then its cycles and
    ``why``."""
    what = f"{pair.a}" if pair.a == pair.b else f"{pair.a} and {pair.b}"
    return f"{what}: " + (f"{pair.cycles:.0f} cycles, {why}" if why else "")


def _place(program: Program, analysis: BankAnalysis) -> tuple[dict[Buffer, int], list[str]]:
    """Decide the moves for the ranked pairs: ``{buffer: new low address}`` and the reasons
    of the pairs left."""
    placers: dict[tuple[int, int, int], _Placer] = {}
    moves: dict[Buffer, int] = {}
    left: list[str] = []
    for pair in analysis.pairs:
        key = (pair.a.phase, pair.a.scope, pair.a.mem)
        placer = placers.get(key)
        if placer is None:
            placer = placers[key] = _Placer(program.config, key, analysis.buffers[key],
                                            analysis)
        if pair.a != pair.b and \
                not set(placer.groups(placer.where[pair.a], pair.a.size)) & \
                set(placer.groups(placer.where[pair.b], pair.b.size)):
            continue  # an earlier move separated them
        movable = [b for b in dict.fromkeys((pair.a, pair.b)) if b not in analysis.pinned]
        if not movable:
            left.append(_named(pair, f"{'it holds' if pair.a == pair.b else 'both hold'} "
                               "data carried between phases (pinned)"))
            continue
        options = [(mv, b) for b in movable if (mv := placer.best_move(b)) is not None]
        if not options:
            mem = MEMORY_NAMES[pair.a.mem]
            left.append(_named(pair, (
                f"two units at once in one buffer, and no free range of {mem} where a group "
                "boundary between their parts would cost fewer (interleaved parts, or memory "
                "full)") if pair.a == pair.b else
                f"no free range of {mem} where one of them would cost fewer (memory full)"))
            continue
        (_, start), buf = max(options, key=lambda o: o[0][0])
        placer.move(buf, start)
        moves[buf] = start
    return {b: lo for b, lo in moves.items() if lo != b.lo}, left


def _relocate(program: Program, analysis: BankAnalysis, moves: dict[Buffer, int]) -> Program:
    """A copy of ``program`` with every operand inside a moved buffer shifted with it."""
    streams = [list(s) for s in program.streams]
    changes: dict[tuple[int, int], dict[str, Block]] = {}
    for key, us in analysis.uses.items():
        bufs = analysis.buffers.get(key, [])
        for core, idx, name, first, _ in us:
            buf = _find(bufs, first)
            if buf is None or buf not in moves:
                continue
            blk = program.streams[core][idx].args[name]
            changes.setdefault((core, idx), {})[name] = \
                blk._replace(addr=blk.addr + moves[buf] - buf.lo)
    for (core, idx), new in changes.items():
        ins = streams[core][idx]
        streams[core][idx] = Instr(ins.op, note=ins.note, **{**ins.args, **new})
    return Program(program.config, streams, dict(program.labels), program.dram_bytes)


def plan_banks(program: Program, machine: Machine) -> tuple[Program, BankPlan]:
    """Move ``program``'s colliding on-chip buffers apart (the module docstring); returns the
    program to run (``program`` itself when nothing helped) and what was done. ``machine``
    only lends its DRAM's size to the timing replays."""
    if not _grouped(program.config):  # no bank groups: nothing to collide, no replay
        return program, BankPlan(0.0, 0.0, 0.0, 0.0, {}, {})
    before = analyse_banks(program, machine)
    plan = BankPlan(before.conflict_cycles, before.conflict_cycles, before.cycles,
                    before.cycles, before.phase_conflicts, before.phase_conflicts)
    if not before.pairs:
        return program, plan
    best, best_an = program, before
    current, an = program, before
    all_moves: list[tuple[Buffer, int]] = []
    for _ in range(_ROUNDS):
        moves, left = _place(current, an)
        plan.left = left
        if not moves:
            break
        candidate = _relocate(current, an, moves)
        new_an = analyse_banks(candidate, machine)
        if new_an.conflict_cycles >= an.conflict_cycles or new_an.cycles > before.cycles:
            # the round's moves are dropped: every pair they were to separate stays
            plan.left = left + [_named(p, "the moves placing it did not lower the replay's "
                                       "conflicts (they shifted the timing)")
                                for p in an.pairs if _named(p, "") not in
                                {why.split(": ", 1)[0] + ": " for why in left}]
            break
        all_moves += sorted(moves.items(), key=lambda m: (m[0].phase, m[0].scope, m[0].lo))
        current, an = candidate, new_an
        best, best_an = candidate, new_an
        plan.left = []
        if not an.pairs:
            break
    else:  # the rounds ran out: why each pair is left, as a next round would see it
        _, left = _place(current, an)
        named = {why.split(": ", 1)[0] + ": " for why in left}
        plan.left = left + [_named(p, f"still colliding after {_ROUNDS} rounds of moves")
                            for p in an.pairs if _named(p, "") not in named]
    plan.conflicts_after, plan.cycles_after = best_an.conflict_cycles, best_an.cycles
    plan.phases_after = best_an.phase_conflicts
    plan.moves = all_moves
    return best, plan
