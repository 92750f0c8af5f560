"""Prefetch across kernel boundaries: a kernel's first loads move above the barrier that ends
the kernel before it (issue 23, "schedule instructions across layer boundaries so the units of
consecutive layers overlap").

Kernels are separated by chip-wide barriers (:mod:`kiln.schedule.npu.emit` closes each one
with one), so every kernel used to start by waiting for its first tiles -- a DMA's issue
overhead, the DRAM latency, the transfer -- while the tensor unit idled, and the tail of the
kernel before it (its last products, the stores of its last tile) left the load queue idle:
the pipeline's fill was about 8.4% of ResNet-18's cycles on "default". This pass takes, per
core and per barrier, the loads at the head of the next kernel's ``dma_in`` queue -- up to
its first ``tok.pop`` from another unit (a wait on that kernel's own work), across the
queue's fences on itself (which then order the moved loads too) -- and moves the safe ones
to the end of the previous kernel's ``dma_in`` queue, where they run once the previous
kernel's loads are issued, beside its products and stores. The barrier still waits for
them (a barrier waits for every unit's work to complete), so the next kernel finds its
tiles in place.

A load moves only when:

- **its source is not written by the kernel it joins**: no DMA store of that kernel (on any
  core) overlaps its bytes -- the DRAM plan (:mod:`.dram_plan`) ran before, so the addresses
  are final and a tensor that shares bytes with one the kernel writes is caught too; no
  scalar-unit store in that kernel addresses the source's memory (registers: unknown bytes).
  Weights and constants are the common case; an activation the kernel writes stays;
- **its destination is free during that kernel**: no operand of the kernel's instructions
  (on the core for an L0 buffer, on any core for L1) meets it. Kernels place their buffers
  from the bottom of each memory, so the next kernel's first buffers usually overlap; then
  the next kernel's whole *buffer* there (its operands' extents merged where they overlap,
  as :mod:`.bank_plan` defines it) moves to a range free in both kernels and of the bytes
  any kernel carries across barriers (the L1-resident tensors, :mod:`kiln.schedule.npu
  .residency`), keeping its address modulo the banks' span (the same banks) -- per bank
  group the lowest such range, the one whose groups meet the fewest of the kernel's other
  buffers taken (the bank placement ran before and had put them apart) -- L0 buffers
  only; a buffer holding carried bytes or addressed by the scalar unit stays;
- **it commutes with the loads it passes** at the head of its queue (no shared bytes).

Tokens are untouched: the ``tok.push`` that follows the loads stays after the barrier and
still waits for everything its unit issued before it, the moved loads included (a token
pushed before a barrier and popped after is matched in order, :mod:`kiln.npu.simulator`, but
no push needs to move). The moves only reorder reads of bytes nobody writes meanwhile into
bytes nobody else uses meanwhile, so the outputs are bit-identical.

Whether a boundary's moves pay is measured, not guessed: the two kernels are replayed
timing-only alone (the simulator's own rules; a pair with scalar code is left, its replay
needs the data) without moves and with the first step's safe loads (before the queue's first
token to another unit), those expected to complete in the load queue's idle time at the end
of the kernel before (from a traced replay of the whole program), or all of them; the
fastest is kept if it beats no move. The whole program is replayed at the end and kept
only if faster.

It runs last, after the DRAM plan and residency (their intervals are by kernel; a moved load
reads a tensor that is live in the kernel it joins -- a constant, an input, or written
earlier -- and no store of that kernel touches its bytes at their final addresses) and after
the bank-group placement (:mod:`.bank_plan`: placed before, the moved tiles would be bytes
carried between phases, which pin their range for the placement in every phase -- on
ResNet-18 at 224 that cost far more in bank conflicts than the prefetch gains); its replays
use the simulator's bank-group rules, so a buffer it moves onto a colliding group shows as
slower. Phases stay "between barriers": a moved load's time and DRAM bytes count in the
kernel it joins (the next kernel's phase gets shorter). ``build_npu(..., prefetch=False)``
or the PassContext option ``"npu.prefetch"`` switches it off.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from ...npu.isa import UNIT_DMA_IN, UNIT_SCALAR, Block, Instr, unit_of
from ...npu.numerics import np_dtype
from ...npu.program import Program
from ...npu.simulator import (
    Machine,
    Report,
    SimulationError,
    Simulator,
    block_extent,
    onchip_operands,
)
from ...target.npu.config import L1, MEMORY_NAMES, NPUConfig
from .bank_plan import PhaseWrites, writes_operand

__all__ = ["PREFETCH_KEY", "PrefetchPlan", "prefetch_program"]

#: PassContext option: move the next kernel's first loads above the barrier (default True).
PREFETCH_KEY = "npu.prefetch"

_DRAM_ID = MEMORY_NAMES.index("dram")
_L1_ID = MEMORY_NAMES.index(L1)
#: (scope, memory id): scope -1 is the shared L1, else the core whose L0 it is
_Key = tuple[int, int]


@dataclass
class PrefetchPlan:
    """What the pass did to one program: the loads moved above a barrier and their bytes,
    the buffers relocated to make room (``(phase, core, memory name, old low, new low)``)
    and, per reason, how many head-of-queue loads stayed."""

    moved: int = 0
    moved_bytes: int = 0
    #: the timing replays' cycles without and with the moves (equal when none was kept)
    cycles_before: float = 0.0
    cycles_after: float = 0.0
    #: the moves (counted above) were undone: the replay of the moved program was not faster
    reverted: bool = False
    relocated: list[tuple[int, int, str, int, int]] = field(default_factory=list)
    kept: dict[str, int] = field(default_factory=dict)
    #: per kernel label, the DRAM bytes of its loads that run in the kernel before it (a
    #: phase's cycles no longer hold them; a per-layer utilization charges them back)
    prefetched: dict[str, int] = field(default_factory=dict)

    def keep(self, why: str) -> None:
        self.kept[why] = self.kept.get(why, 0) + 1


class _Ranges:
    """Byte ranges ``[lo, hi)``, merged where they overlap (``touching``: also where they
    meet), for overlap queries."""

    def __init__(self, ranges: list[tuple[int, int]] | None = None, touching: bool = True):
        self.lo: list[int] = []
        self.hi: list[int] = []
        for lo, hi in sorted(ranges or []):
            if self.hi and (lo < self.hi[-1] or (touching and lo == self.hi[-1])):
                self.hi[-1] = max(self.hi[-1], hi)
            else:
                self.lo.append(lo)
                self.hi.append(hi)

    def meets(self, lo: int, hi: int) -> bool:
        i = bisect.bisect_left(self.hi, lo + 1)  # the first range ending after lo
        return i < len(self.lo) and self.lo[i] < hi

    def containing(self, lo: int, hi: int) -> tuple[int, int] | None:
        i = bisect.bisect_right(self.lo, lo) - 1
        if i >= 0 and hi <= self.hi[i]:
            return self.lo[i], self.hi[i]
        return None

    def pairs(self) -> list[tuple[int, int]]:
        return list(zip(self.lo, self.hi))


def _scope(core: int, mem: int) -> int:
    return -1 if mem == _L1_ID else core


def _is_scalar_memory(ins: Instr) -> bool:
    return ins.op in ("s.ld", "s.st")


@dataclass
class _Phase:
    """One kernel's on-chip use across the cores: every operand's extent and the written ones
    per (scope, memory), the memories the scalar unit addresses, the DRAM bytes stored."""

    used: dict[_Key, list[tuple[int, int]]] = field(default_factory=dict)
    written: dict[_Key, list[tuple[int, int]]] = field(default_factory=dict)
    scalar: set[_Key] = field(default_factory=set)  # scalar access: any byte
    scalar_dram_writes: bool = False
    dram_written: list[tuple[int, int]] = field(default_factory=list)

    def add(self, core: int, ins: Instr) -> None:
        if _is_scalar_memory(ins):
            mem = int(ins.args.get("mem", _DRAM_ID))
            if mem == _DRAM_ID:
                self.scalar_dram_writes |= ins.op == "s.st"
            else:
                self.scalar.add((_scope(core, mem), mem))
            return
        if ins.op == "s.copy":
            self.scalar_dram_writes = True
            return
        if ins.op == "dma.store" and ins.args["dst"].mem == _DRAM_ID:
            self.dram_written.append(block_extent(ins.args["dst"], tuple(ins.args["shape"])))
        for name, blk, shape in onchip_operands(ins):
            key = (_scope(core, blk.mem), blk.mem)
            ext = block_extent(blk, shape)
            self.used.setdefault(key, []).append(ext)
            if writes_operand(ins, name):
                self.written.setdefault(key, []).append(ext)


def _phase_of(phases: list[list[list[Instr]]], p: int) -> _Phase:
    out = _Phase()
    for core, per_core in enumerate(phases):
        for ins in per_core[p]:
            out.add(core, ins)
    return out


def _carried(phases: list[list[list[Instr]]], config: NPUConfig) -> dict[_Key, _Ranges]:
    """Per (scope, memory), the bytes some phase reads before writing them (data carried from
    an earlier phase, e.g. an L1-resident tensor), or the whole memory where the scalar unit
    addresses it: no buffer may move over them or hold them."""
    out: dict[_Key, list[tuple[int, int]]] = {}
    for core, per_core in enumerate(phases):
        for instrs in per_core:
            written = PhaseWrites(config)
            for ins in instrs:
                if _is_scalar_memory(ins) and int(ins.args.get("mem", _DRAM_ID)) != _DRAM_ID:
                    mem = int(ins.args["mem"])
                    out.setdefault((_scope(core, mem), mem), []).append(
                        (0, config.memory(MEMORY_NAMES[mem]).size))
                    continue
                ops = onchip_operands(ins)
                for name, blk, shape in ops:
                    if written.carries(ins, name, blk, shape):
                        out.setdefault((_scope(core, blk.mem), blk.mem), []).append(
                            block_extent(blk, shape))
                written.record(ins, ops)
    return {k: _Ranges(v) for k, v in out.items()}


def _split(program: Program) -> list[list[list[Instr]]] | None:
    """Per core, its instructions per phase (the last phase: after the last barrier); None
    when the cores do not have the same barriers."""
    phases: list[list[list[Instr]]] = []
    ids: list[list[int]] = []
    for stream in program.streams:
        per: list[list[Instr]] = [[]]
        bar: list[int] = []
        for ins in stream:
            if ins.op == "barrier":
                bar.append(ins.args["id"])
                per.append([])
            else:
                per[-1].append(ins)
        phases.append(per)
        ids.append(bar)
    if any(b != ids[0] for b in ids):
        return None
    return phases


def _extent(ins: Instr, name: str) -> tuple[Block, tuple[int, int]]:
    ops = {n: (b, s) for n, b, s in onchip_operands(ins)}
    if name in ops:
        blk, shape = ops[name]
        return blk, block_extent(blk, shape)
    blk = ins.args[name]  # a DRAM source or destination
    return blk, block_extent(blk, tuple(ins.args["shape"]))


def _disjoint(a: tuple[Block, tuple[int, int]], b: tuple[Block, tuple[int, int]]) -> bool:
    (ba, (alo, ahi)), (bb, (blo, bhi)) = a, b
    return ba.mem != bb.mem or ahi <= blo or bhi <= alo


class _Prefetcher:
    def __init__(self, program: Program, phases: list[list[list[Instr]]], plan: PrefetchPlan,
                 slack: list[list[tuple[float, float]]], machine: Machine):
        self.config = program.config
        self.machine = machine
        self.barriers = [[ins for ins in s if ins.op == "barrier"] for s in program.streams]
        # per phase, the label the simulator reports it under (its closing barrier's)
        self.labels = [program.labels.get(b.args["id"], f"phase{k}")
                       for k, b in enumerate(self.barriers[0])] + ["tail"]
        self.phases = phases
        self.plan = plan
        self.slack = slack
        self.carried = _carried(phases, program.config)
        # per core, per phase: the indices of its instructions moved into the phase before
        self.moved: list[dict[int, list[int]]] = [{} for _ in phases]

    def boundary(self, k: int) -> None:
        """Move phase ``k + 1``'s head loads that are safe to the end of phase ``k`` if the
        timing replay of the two kernels says it is faster: the first step's, those expected
        to complete in the load queue's idle time at the end of phase ``k``, or all of them
        -- the fastest of the three."""
        if self._scalar_code(k) or self._scalar_code(k + 1):
            self.plan.keep("a kernel of the two runs scalar code (its replay needs the data)")
            return
        saved = [list(per_core[k + 1]) for per_core in self.phases]
        relocated = len(self.plan.relocated)
        safe, fitting, first = self._safe(k)
        if not any(safe):
            self._restore(k, saved, relocated)
            return
        base = self._pair_cycles(k, [[] for _ in self.phases], saved)
        options: list[list[list[int]]] = []
        for option in (first, fitting, safe):
            if any(option) and option not in options:
                options.append(option)
        timed = [(self._pair_cycles(k, o), n, o) for n, o in enumerate(options)]
        cycles, _, best = min(timed)
        if base is None or cycles is None or cycles >= base:
            for chosen in safe:
                for _ in chosen:
                    self.plan.keep("the replay of the two kernels was not faster with it")
            self._restore(k, saved, relocated)
            return
        for core, chosen in enumerate(best):
            if chosen:
                self.moved[core][k + 1] = chosen
                self.plan.moved += len(chosen)
                self.plan.moved_bytes += sum(_nbytes(self.phases[core][k + 1][i])
                                             for i in chosen)
                label = self.labels[k + 1]
                self.plan.prefetched[label] = self.plan.prefetched.get(label, 0) + sum(
                    _nbytes(ins) for ins in (self.phases[core][k + 1][i] for i in chosen)
                    if ins.args["src"].mem == _DRAM_ID)
            for _ in set(safe[core]) - set(chosen):
                self.plan.keep("the replay was faster without it")

    def _restore(self, k: int, saved: list[list[Instr]], relocated: int) -> None:
        """Undo the buffer moves made in phase ``k + 1`` for loads that stay."""
        for per_core, instrs in zip(self.phases, saved):
            per_core[k + 1] = instrs
        del self.plan.relocated[relocated:]

    def _scalar_code(self, p: int) -> bool:
        return p < len(self.phases[0]) and any(
            unit_of(ins) == UNIT_SCALAR for per_core in self.phases for ins in per_core[p])

    def _pair_cycles(self, k: int, chosen: list[list[int]],
                     nxt: list[list[Instr]] | None = None) -> float | None:
        """Cycles of a timing replay of phases ``k`` and ``k + 1`` alone (``nxt``: phase
        ``k + 1``'s instructions per core, default the current ones) with the head loads
        ``chosen`` per core moved into phase ``k``; None if the pair cannot run alone."""
        streams = []
        for core, per_core in enumerate(self.phases):
            head = nxt[core] if nxt is not None else per_core[k + 1]
            gone = set(self.moved[core].get(k, []))
            stream = [ins for i, ins in enumerate(per_core[k]) if i not in gone]
            stream += [head[i] for i in chosen[core]]
            stream.append(self.barriers[core][k])
            picked = set(chosen[core])
            stream += [ins for i, ins in enumerate(head) if i not in picked]
            if k + 1 < len(self.barriers[core]):
                stream.append(self.barriers[core][k + 1])
            streams.append(stream)
        try:
            return Simulator(self.config, self.machine, timing_only=True).run(
                Program(self.config, streams)).cycles
        except SimulationError:
            return None

    def _safe(self, k: int) -> tuple[list[list[int]], list[list[int]], list[list[int]]]:
        """Per core, the head loads of phase ``k + 1`` (up to its load queue's first wait on
        another unit) that may move into phase ``k``, those of them expected to complete in
        its load queue's idle time, and those of the first step (before the queue's first
        token to another unit) -- moving the next phase's buffers where a destination needs
        room."""
        before = _phase_of(self.phases, k)
        dram_written = _Ranges(before.dram_written)
        written = {key: _Ranges(v) for key, v in before.written.items()}
        used = {key: _Ranges(v) for key, v in before.used.items()}
        safe: list[list[int]] = []
        fitting: list[list[int]] = []
        first: list[list[int]] = []
        for core, per_core in enumerate(self.phases):
            free, arrive = self.slack[core][k]  # the load queue idles from free to arrive
            staying: list[int] = []  # head loads that stay, which a moved one passes
            fenced: list[int] = []  # head loads before the queue's last fence on itself
            safe.append([])
            fitting.append([])
            first.append([])
            steps = 0
            for i in range(len(per_core[k + 1])):
                ins = per_core[k + 1][i]
                if ins.op == "tok.pop" and ins.args["src"] == ins.args["dst"] == UNIT_DMA_IN:
                    # the queue's fence on itself orders the loads after it behind those
                    # before it, moved or not: a moved load crosses it
                    fenced = [j for j in range(i) if per_core[k + 1][j].op == "dma.load"]
                    continue
                if ins.op == "tok.push" and ins.args["src"] == ins.args["dst"] == UNIT_DMA_IN:
                    continue
                if ins.op == "tok.pop" and ins.args["dst"] == UNIT_DMA_IN:
                    break
                if ins.op == "tok.push" and ins.args["src"] == UNIT_DMA_IN:
                    steps += 1  # the loads after it are the next step's tiles
                    continue
                if ins.op != "dma.load":
                    continue
                why = self._unsafe_source(ins, core, before, dram_written, written)
                if why is None:
                    why = self._room(ins, core, k, before, used)
                ins = per_core[k + 1][i]  # the room may have moved its buffer
                if why is None and not all(
                        _disjoint(_extent(ins, a), _extent(per_core[k + 1][j], b))
                        for j in sorted({*staying, *fenced})
                        for a, b in (("src", "dst"), ("dst", "dst"), ("dst", "src"))):
                    why = "it shares bytes with a load it would pass"
                if why is not None:
                    self.plan.keep(why)
                    staying.append(i)
                    continue
                safe[-1].append(i)
                if not steps:
                    first[-1].append(i)
                busy, done = self._duration(ins)
                if free + done <= arrive:
                    fitting[-1].append(i)
                    free += busy
        return safe, fitting, first

    def _duration(self, ins: Instr) -> tuple[float, float]:
        """A load's estimated cycles: until its queue may issue the next one (the issue
        overhead and the transfer, at a core's share of the DRAM channel or the engine's
        on-chip bandwidth) and until its data is usable (the memory's latency on top)."""
        cfg = self.config
        src = ins.args["src"]
        spec = cfg.memory(MEMORY_NAMES[src.mem])
        bandwidth = spec.bandwidth / cfg.cores if src.mem == _DRAM_ID else \
            cfg.dma_onchip_bandwidth
        busy = cfg.dma_latency + _nbytes(ins) / bandwidth
        return busy, busy + spec.latency

    def _unsafe_source(self, ins: Instr, core: int, before: _Phase, dram_written: _Ranges,
                       written: dict[_Key, _Ranges]) -> str | None:
        src = ins.args["src"]
        lo, hi = block_extent(src, tuple(ins.args["shape"]))
        if src.mem == _DRAM_ID:
            if before.scalar_dram_writes:
                return "the kernel before stores to DRAM from the scalar unit"
            if dram_written.meets(lo, hi):
                return "its DRAM source is written by the kernel before"
            return None
        key = (_scope(core, src.mem), src.mem)
        if key in before.scalar or (key in written and written[key].meets(lo, hi)):
            return "its on-chip source is written by the kernel before"
        return None

    def _room(self, ins: Instr, core: int, k: int, before: _Phase,
              used: dict[_Key, _Ranges]) -> str | None:
        """None when the load's destination is free during phase ``k`` (after moving the
        next phase's buffer holding it, if that was needed and possible); else why not."""
        dst, (lo, hi) = _extent(ins, "dst")
        key = (_scope(core, dst.mem), dst.mem)
        if key in before.scalar:
            return "the kernel before addresses its destination's memory from the scalar unit"
        if key not in used or not used[key].meets(lo, hi):
            return None
        if dst.mem == _L1_ID:
            return "its L1 destination is in use by the kernel before"
        return self._relocate(core, k + 1, key, lo, hi, used[key])

    def _relocate(self, core: int, p: int, key: _Key, lo: int, hi: int, busy: _Ranges
                  ) -> str | None:
        """Move phase ``p``'s buffer holding ``[lo, hi)`` (on ``core``'s L0 memory of
        ``key``) to a range free in phase ``p`` and ``busy`` (phase ``p - 1``'s use)."""
        mem = key[1]
        instrs = self.phases[core][p]
        if any(_is_scalar_memory(ins) and ins.args.get("mem") == mem for ins in instrs):
            return "its buffer is addressed by the scalar unit"
        extents: list[tuple[int, int]] = []
        for ins in instrs:
            for _, blk, shape in onchip_operands(ins):
                if blk.mem == mem:
                    extents.append(block_extent(blk, shape))
        buffers = _Ranges(extents, touching=False)  # a double buffer's halves move apart
        buf = buffers.containing(lo, hi)
        carried = self.carried.get(key, _Ranges())
        if buf is None or carried.meets(*buf):
            return "its buffer holds bytes carried between kernels"
        spec = self.config.memory(MEMORY_NAMES[mem])
        align = spec.banks * spec.bank_width
        size = buf[1] - buf[0]
        taken = _Ranges([r for r in buffers.pairs() if r != buf] + busy.pairs() +
                        carried.pairs())
        # per bank group, the lowest free start in it; the one whose groups meet the
        # fewest of the phase's other buffers is taken (the bank placement had put the
        # buffer apart from the ones used beside it: the lowest free range alone put a
        # double buffer's moved half back into its sibling's group), then the lowest
        group = spec.group_bytes
        others = [r for r in buffers.pairs() if r != buf]
        starts = []
        start = buf[0] % align
        while start + size <= spec.size:
            if not taken.meets(start, start + size):
                starts.append(start)
                nxt = (start // group + 1) * group
            else:
                nxt = taken.hi[bisect.bisect_left(taken.hi, start + 1)]
            start = nxt + (buf[0] - nxt) % align
        if not starts:
            return "no free range for its buffer beside the kernel before's"
        start = min(starts, key=lambda at: (sum(
            a // group <= (at + size - 1) // group and at // group <= (b - 1) // group
            for a, b in others), at))
        delta = start - buf[0]
        for i, ins in enumerate(instrs):
            new = {}
            for name, blk, shape in onchip_operands(ins):
                if blk.mem == mem and buf[0] <= block_extent(blk, shape)[0] < buf[1]:
                    new[name] = ins.args[name]._replace(addr=ins.args[name].addr + delta)
            if new:
                instrs[i] = Instr(ins.op, note=ins.note, **{**ins.args, **new})
        self.plan.relocated.append((p, core, MEMORY_NAMES[mem], buf[0], start))
        return None

    def streams(self, program: Program) -> list[list[Instr]]:
        out = []
        barriers = self.barriers
        for core, per_core in enumerate(self.phases):
            stream: list[Instr] = []
            for p, instrs in enumerate(per_core):
                gone = set(self.moved[core].get(p, []))
                stream += [ins for i, ins in enumerate(instrs) if i not in gone]
                if p + 1 < len(per_core):
                    stream += [per_core[p + 1][i] for i in self.moved[core].get(p + 1, [])]
                    stream.append(barriers[core][p])
            out.append(stream)
        return out


def _nbytes(ins: Instr) -> int:
    """The bytes a load moves (its shape's elements, without padding)."""
    s = ins.args["shape"]
    return int(s[0]) * int(s[1]) * int(s[2]) * np_dtype(ins.args["src"].dtype).itemsize


def _slack(report: Report, phases: int, cores: int) -> list[list[tuple[float, float]]]:
    """Per core and phase of a traced run: when its load queue's last load of the phase
    completes and when the phase's barrier is reached (every unit done)."""
    free = [[0.0] * phases for _ in range(cores)]
    arrive = [[0.0] * phases for _ in range(cores)]
    seen = [0] * cores
    for core, unit, op, start, finish, _ in report.events:
        if unit != "dma_in":
            continue
        p = seen[core]
        if op == "barrier":
            arrive[core][p] = start
            seen[core] += 1
            if seen[core] < phases:
                free[core][seen[core]] = finish
        elif p < phases:
            free[core][p] = max(free[core][p], finish)
    return [[(f, max(a, f)) for f, a in zip(fc, ac)] for fc, ac in zip(free, arrive)]


def prefetch_program(program: Program, machine: Machine) -> tuple[Program, PrefetchPlan]:
    """``program`` with each kernel's safe head-of-queue loads moved above the barrier before
    it where they complete in the previous kernel's idle time (the module docstring);
    returns the program to run (``program`` itself when nothing moved or the timing replay
    of the moved program is not faster) and what was done. ``machine`` lends its DRAM's size
    to the timing replays."""
    plan = PrefetchPlan()
    phases = _split(program)
    if phases is None or len(phases[0]) < 2:
        return program, plan
    before = Simulator(program.config, machine, timing_only=True, trace=True).run(program)
    plan.cycles_before = plan.cycles_after = before.cycles
    pre = _Prefetcher(program, phases, plan, _slack(before, len(phases[0]), len(phases)),
                      machine)
    for k in range(len(phases[0]) - 1):
        pre.boundary(k)
    if not plan.moved:
        return program, plan
    moved = Program(program.config, pre.streams(program), dict(program.labels),
                    program.dram_bytes)
    after = Simulator(program.config, machine, timing_only=True).run(moved)
    if after.cycles >= before.cycles:
        plan.reverted = True
        return program, plan
    plan.cycles_after = after.cycles
    return moved, plan
