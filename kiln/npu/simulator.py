"""The NPU simulator: the executable specification of the accelerator.

:class:`Machine` holds the memories (DRAM, the shared L1, each core's L0 buffers) as byte
arrays; :class:`Simulator` runs a :class:`~kiln.npu.program.Program` on it and returns a
:class:`Report`.

**Functional semantics** (:mod:`kiln.npu.numerics` defines the arithmetic): each instruction
is executed with numpy on strided views of the memories, one vectorized operation per
instruction (a 16 x 64 x 576 tile product is one matrix product), which is what makes a
ResNet-18 simulate in seconds. Every access is checked (alignment, bounds, dtype rules of the
opcode, no overlapping destination): a violation raises :class:`SimulationError` naming the
core, unit and instruction.

**Timing** (all parameters from the hardware description):

- each core dispatches its stream into per-unit in-order queues (``dma_in``, ``dma_out``,
  ``tensor``, ``vector``, ``scalar``); the simulator always advances the unit whose next
  instruction can start earliest, so execution follows simulated time;
- an instruction starts when its unit has issued the previous one; ``tok.pop`` also waits for
  a token on its queue, ``tok.push`` for the completion of everything its unit issued before
  (and for room in the queue: ``sync.token_queue_depth``), ``barrier`` for every unit of every
  core;
- DMA: issue overhead (``dma.latency``), then the data phase: DRAM moves whole aligned bursts
  of each contiguous run at the chip's DRAM bandwidth, which every core's engines share (a
  transfer waits for the DRAM channel), on-chip sides move ``dma.onchip_bandwidth`` bytes per
  cycle limited by bank conflicts; the data is usable the memory's latency after the phase;
- tensor unit: ``ceil(M/m) * ceil(N/n) * ceil(K/k)`` tiles at ``cycles_per_tile`` of the dtype,
  slowed by bank conflicts of its operands, plus the pipeline latency;
- vector unit: ``ceil(bytes / width)`` of its widest operand times the op class's cost, slowed
  by bank conflicts, plus latency;
- bank conflicts: a stream of elements with stride ``s`` bytes touches, per cycle, the lines of
  ``width`` bytes' worth of elements; lines of one bank are served ``ports`` per cycle, so a
  stride that maps many lanes to one bank serializes them (:func:`stream_cycles`);
- bank-group conflicts between units: an on-chip memory of ``bank_groups`` > 1 is split by
  address into that many groups (``MemorySpec.group_bytes`` each; a block touches the groups
  its byte extent spans, :func:`block_extent`). Each instruction is busy on its memories
  during one interval (a DMA: its data phase; the tensor and vector units: their
  occupancy). When it starts, every group it touches is checked against the last interval of
  each *other* unit of the core on that group (L1, shared by the cores: any other core's
  units too); if ``n`` units including it overlap there and ``n > ports``, the instruction --
  the later issued, the others are already timed -- is stretched by ``sum(overlap) * (n -
  ports) / (n - 1)``: with one port, two units each run their overlapped part at half rate,
  which costs the later one the overlap. An instruction touching several groups takes the
  largest such stretch. The stretch is added to its busy interval (hence to its unit's busy
  cycles and its completion), and counted in ``Report.conflict_cycles`` per memory and in
  ``Report.phase_conflicts`` per phase. ``bank_groups = 1`` has no arbitration: today's
  cycles exactly.

**Hazard checking** (``check_hazards``, on by default): for every on-chip byte the simulator
remembers when it was last written and read; an instruction reading a byte whose last write
ends after the instruction starts, or writing a byte still being read or written, means the
program's tokens did not order them: a :class:`SimulationError` ("hazard") names both sides.
DRAM is ordered by the barriers between kernels.

The report gives total cycles, per unit busy/stall cycles and instruction counts, DRAM bytes
read and written (requested, and moved in bursts), cycles per labelled phase, and -- with
``trace=True`` -- every instruction's interval for :mod:`kiln.npu.timeline`.

``timing_only=True`` skips the data work (copies, products, vector arithmetic; the scalar
unit still computes, its branches need the values) and gives the same timing for programs
whose timing does not depend on the data (all but an ``s.copy`` at a loaded address): the
static replay that :mod:`kiln.codegen.npu.bank_plan` analyses. ``record_accesses=True`` keeps
every on-chip access of a grouped memory (:class:`Access`) and every group conflict
(:class:`Conflict`) for it.
"""

from __future__ import annotations

import functools
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ..ir.errors import KilnError, RuntimeCheckError
from ..target.npu.config import DRAM, L0_NAMES, L1, MEMORY_NAMES, NPUConfig
from . import numerics as nm
from .isa import UNIT_SCALAR, UNITS, Block, Instr, mem_name, unit_of
from .program import Program

__all__ = ["Access", "Conflict", "Machine", "Report", "SimulationError", "Simulator", "UnitStats",
           "block_extent", "onchip_operands", "stream_cycles"]


class SimulationError(KilnError):
    """An NPU program did something the hardware does not allow (or a hazard, a deadlock)."""


_ITEMSIZE = {d: nm.np_dtype(d).itemsize for d in nm._NP}
_DRAM_ID, _L1_ID = MEMORY_NAMES.index(DRAM), MEMORY_NAMES.index(L1)


class Machine:
    """The memories of an NPU: ``dram_bytes`` of DRAM (at most the description's size), the
    L1 and every core's L0 buffers, all zero-initialized byte arrays."""

    def __init__(self, config: NPUConfig, dram_bytes: int):
        if dram_bytes > config.memory(DRAM).size:
            raise SimulationError(f"{dram_bytes} bytes of DRAM requested, {config.name!r} has "
                                  f"{config.memory(DRAM).size}")
        self.config = config
        self.dram = np.zeros(_round8(dram_bytes), np.uint8)
        self.l1 = np.zeros(config.memory(L1).size, np.uint8)
        self.l0 = [[np.zeros(config.memory(n).size, np.uint8) for n in L0_NAMES]
                   for _ in range(config.cores)]

    def memory(self, core: int, mem: int) -> np.ndarray:
        if mem == _DRAM_ID:
            return self.dram
        if mem == _L1_ID:
            return self.l1
        return self.l0[core][mem - 2]

    def grow_dram(self, nbytes: int) -> None:
        """Make sure at least ``nbytes`` of DRAM exist (keeping the contents)."""
        if nbytes > len(self.dram):
            if nbytes > self.config.memory(DRAM).size:
                raise SimulationError(f"{nbytes} bytes of DRAM needed, {self.config.name!r} has "
                                      f"{self.config.memory(DRAM).size}")
            new = np.zeros(_round8(nbytes), np.uint8)
            new[:len(self.dram)] = self.dram
            self.dram = new

    def write(self, addr: int, data: np.ndarray) -> None:
        """Copy an array's bytes into DRAM at ``addr`` (the host's side of a copy)."""
        raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
        self.grow_dram(addr + raw.size)
        self.dram[addr:addr + raw.size] = raw

    def read(self, addr: int, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """A fresh array of ``shape``/``dtype`` read from DRAM at ``addr``."""
        dt = np.dtype(dtype)
        n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        if addr + n > len(self.dram):
            raise SimulationError(f"read of {n} bytes at DRAM {addr:#x} beyond its "
                                  f"{len(self.dram)} bytes")
        return self.dram[addr:addr + n].view(dt).reshape(shape).copy()


def _round8(n: int) -> int:
    return max(8, -(-int(n) // 8) * 8)


@dataclass
class UnitStats:
    """One unit's totals: cycles busy executing, cycles stalled on tokens and barriers, and
    instructions executed."""

    busy: float = 0.0
    stall: float = 0.0
    instructions: int = 0


@dataclass
class Report:
    """What a simulation measured."""

    config: str
    cycles: float
    units: dict[tuple[int, str], UnitStats]
    dram_read: int = 0  # bytes requested
    dram_written: int = 0
    dram_burst_bytes: int = 0  # bytes moved on the DRAM bus (whole bursts)
    phases: list[tuple[str, float, float]] = field(default_factory=list)
    events: list[tuple[int, str, str, float, float, str]] = field(default_factory=list)
    clock_mhz: int = 1000
    #: per phase label: the bytes it moved on the DRAM bus (whole bursts) and each unit's busy
    #: cycles -- what one kernel really moved and did, against its roofline's minimum traffic
    phase_bytes: dict[str, int] = field(default_factory=dict)
    phase_busy: dict[str, dict[tuple[int, str], float]] = field(default_factory=dict)
    #: cycles lost to bank-group conflicts between units, per memory name, and per phase label
    #: per memory name (the stretch of the later-issued instruction; see the module docstring)
    conflict_cycles: dict[str, float] = field(default_factory=dict)
    phase_conflicts: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def total_conflict_cycles(self) -> float:
        """Cycles lost to bank-group conflicts, all memories."""
        return sum(self.conflict_cycles.values())

    @property
    def microseconds(self) -> float:
        return self.cycles / self.clock_mhz

    def unit_busy(self, unit: str) -> float:
        """Busy cycles of ``unit`` summed over the cores."""
        return sum(s.busy for (_, u), s in self.units.items() if u == unit)

    def phase_cycles(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for label, start, end in self.phases:
            out[label] = out.get(label, 0.0) + (end - start)
        return out

    def summary(self) -> str:
        lines = [f"{self.cycles:.0f} cycles ({self.microseconds:.1f} us at {self.clock_mhz} "
                 f"MHz), DRAM read {self.dram_read} B, written {self.dram_written} B "
                 f"({self.dram_burst_bytes} B in bursts)"]
        lines.append(f"{'core':>4s} {'unit':8s} {'instrs':>8s} {'busy':>10s} {'stall':>10s} "
                     f"{'util':>6s}")
        for (core, unit), s in sorted(self.units.items()):
            util = s.busy / self.cycles if self.cycles else 0.0
            lines.append(f"{core:4d} {unit:8s} {s.instructions:8d} {s.busy:10.0f} "
                         f"{s.stall:10.0f} {util:6.1%}")
        if self.conflict_cycles:
            per = ", ".join(f"{m} {c:.0f}" for m, c in sorted(self.conflict_cycles.items()))
            lines.append(f"bank-group conflicts: {self.total_conflict_cycles:.0f} cycles "
                         f"({per})")
            for label, mems in self.phase_conflicts.items():
                if sum(mems.values()):
                    lines.append(f"  {label}: {sum(mems.values()):.0f}")
        return "\n".join(lines)


class Access(NamedTuple):
    """One on-chip access of a memory with bank groups (``record_accesses``): the phase's
    index, the scope (the core for L0, -1 for the shared L1), the memory id, the unit
    ``(core, unit id)``, the bytes ``[first, last)`` of the block's extent, and the busy
    interval ``[begin, end)`` (stretch included)."""

    phase: int
    scope: int
    mem: int
    unit: tuple[int, int]
    first: int
    last: int
    begin: float
    end: float


class Conflict(NamedTuple):
    """One overlap of two units on one bank group that stretched an instruction: the
    stretched access (its unit and bytes) against the other unit's access, and the cycles this
    pair cost (the overlap's share of the stretch)."""

    phase: int
    scope: int
    mem: int
    group: int
    unit: tuple[int, int]
    first: int
    last: int
    other_unit: tuple[int, int]
    other_first: int
    other_last: int
    cycles: float


@functools.lru_cache(maxsize=1 << 16)
def block_extent(blk: Block, shape: tuple[int, ...]) -> tuple[int, int]:
    """The bytes ``[first, last)`` that a block of ``shape`` spans in its memory (from its
    lowest to its highest element, whatever lies between)."""
    isz = _ITEMSIZE[blk.dtype]
    strides = blk.strides[-len(shape):]
    lo = sum(min(0, (e - 1) * s) for e, s in zip(shape, strides))
    hi = sum(max(0, (e - 1) * s) for e, s in zip(shape, strides))
    return blk.addr + lo * isz, blk.addr + (hi + 1) * isz


def onchip_operands(ins: Instr) -> list[tuple[str, Block, tuple[int, ...]]]:
    """The on-chip data operands of a DMA, tensor or vector instruction: ``(argument name,
    block, shape)`` as the simulator reads or writes them (a DMA's destination with its
    padding, the tensor unit's B as ``(1, k, n)``, a reduction's destination one per row).
    Scalar instructions address memory through registers and give none."""
    a = ins.args
    op = ins.op
    out: list[tuple[str, Block, tuple[int, ...]]] = []
    if op in ("dma.load", "dma.store"):
        shape = tuple(a["shape"])
        pad_lo = tuple(a.get("pad_lo", (0, 0, 0)))
        pad_hi = tuple(a.get("pad_hi", (0, 0, 0)))
        box = tuple(e + lo + hi for e, lo, hi in zip(shape, pad_lo, pad_hi))
        out = [("src", a["src"], shape), ("dst", a["dst"], box)]
    elif op in ("mma", "mma.set"):
        m1, m0, n, k = a["shape"]
        bb = a["b"]
        out = [("a", a["a"], (m1, m0, k)),
               ("b", Block(bb.mem, bb.addr, bb.dtype, (0, bb.strides[0], bb.strides[1])),
                (1, k, n)),
               ("c", a["c"], (m1, m0, n))]
    elif op.startswith("v"):
        shape = tuple(a["shape"])
        out_shape = shape[:-1] + (1,) if op.startswith("vred.") else shape
        out = [("dst", a["dst"], out_shape)]
        out += [(k, a[k], shape) for k in ("a", "b", "mask")
                if isinstance(a.get(k), Block)]
    return [(k, b, s) for k, b, s in out if isinstance(b, Block) and b.mem != _DRAM_ID]


# ---------------------------------------------------------------------------------------------
# timing helpers
# ---------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=4096)
def _conflict_degree(stride: int, itemsize: int, width: int, banks: int, bank_width: int
                     ) -> int:
    """Lines of the busiest bank among the ``width`` bytes' worth of elements one cycle
    touches, for elements ``stride`` bytes apart (0: broadcast)."""
    lanes = max(1, width // itemsize)
    if stride == 0:
        return 1
    addrs = np.arange(lanes, dtype=np.int64) * abs(stride)
    lines = np.unique(addrs // bank_width)
    counts = np.bincount(lines % banks, minlength=banks)
    return int(counts.max())


def stream_cycles(n_elems: int, itemsize: int, stride_elems: int, width: int, spec: Any) -> float:
    """Cycles to stream ``n_elems`` elements, ``stride_elems`` apart, through a port of
    ``width`` bytes per cycle of memory ``spec`` (its banks, bank width and ports)."""
    if n_elems <= 0:
        return 0.0
    lanes = max(1, width // itemsize)
    groups = math.ceil(n_elems / lanes)
    if stride_elems in (0, 1):
        lines = math.ceil(min(lanes, n_elems) * itemsize / spec.bank_width)
        degree = math.ceil(lines / spec.banks)
    else:
        degree = _conflict_degree(stride_elems * itemsize, itemsize, width, spec.banks,
                                  spec.bank_width)
    return groups * max(1, math.ceil(degree / spec.ports))


def _inner_stride(shape: tuple[int, ...], strides: tuple[int, ...]) -> int:
    for e, s in zip(reversed(shape), reversed(strides)):
        if e > 1:
            return s
    return 1


def _dram_runs(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int
               ) -> tuple[int, int]:
    """(number of contiguous runs, bytes per run) of a block in memory."""
    dims = [(e, s) for e, s in zip(shape, strides) if e > 1]
    run = 1
    while dims and dims[-1][1] == run:
        run *= dims[-1][0]
        dims.pop()
    runs = int(np.prod([e for e, _ in dims], dtype=np.int64)) if dims else 1
    return runs, run * itemsize


# ---------------------------------------------------------------------------------------------
# the simulator
# ---------------------------------------------------------------------------------------------
class _Unit:
    __slots__ = ("core", "kind", "queue", "pc", "busy", "done", "stats", "regs", "waiting")

    def __init__(self, core: int, kind: int, queue: list[Instr], nregs: int):
        self.core, self.kind, self.queue, self.pc = core, kind, queue, 0
        self.busy = 0.0  # when the unit can issue its next instruction
        self.done = 0.0  # when everything it issued has completed
        self.stats = UnitStats()
        self.regs: list[Any] = [0] * nregs if kind == UNIT_SCALAR else []
        self.waiting = 0.0


class Simulator:
    """Runs programs on a :class:`Machine` (see the module docstring)."""

    def __init__(self, config: NPUConfig, machine: Machine | None = None,
                 check_hazards: bool = True, trace: bool = False, timing_only: bool = False,
                 record_accesses: bool = False):
        self.config = config
        self.machine = machine if machine is not None else Machine(config, 1 << 16)
        self.check_hazards = check_hazards and not timing_only
        self.trace = trace
        self.timing_only = timing_only
        self.record_accesses = record_accesses
        #: with ``record_accesses``: the accesses and conflicts of the last run
        self.accesses: list[Access] = []
        self.conflicts: list[Conflict] = []
        self._typed: dict[tuple[int, str], np.ndarray] = {}
        self._shadows: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._mem_specs = [config.memory(n) for n in MEMORY_NAMES]

    # ---- memory views -------------------------------------------------------------------
    def _typed_view(self, arr: np.ndarray, dtype: str) -> np.ndarray:
        key = (id(arr), dtype)
        v = self._typed.get(key)
        if v is None or v.base is not arr:
            v = arr.view(nm.np_dtype(dtype))
            self._typed[key] = v
        return v

    def _view(self, core: int, blk: Block, shape: tuple[int, ...], where: str) -> np.ndarray:
        if not isinstance(blk, Block):
            raise SimulationError(f"{where}: expected a block operand, got {blk!r}")
        if blk.dtype not in _ITEMSIZE:
            raise SimulationError(f"{where}: unknown dtype {blk.dtype!r}")
        arr = self.machine.memory(core, blk.mem)
        isz = _ITEMSIZE[blk.dtype]
        if blk.addr % isz:
            raise SimulationError(f"{where}: address {blk.addr:#x} of {mem_name(blk.mem)} is not "
                                  f"aligned to its {isz}-byte {blk.dtype} elements")
        strides = blk.strides[-len(shape):] if len(shape) <= 3 else None
        assert strides is not None
        lo = sum(min(0, (e - 1) * s) for e, s in zip(shape, strides))
        hi = sum(max(0, (e - 1) * s) for e, s in zip(shape, strides))
        first, last = blk.addr + lo * isz, blk.addr + (hi + 1) * isz
        if first < 0 or last > arr.size:
            raise SimulationError(f"{where}: block {blk} of shape {tuple(shape)} reaches bytes "
                                  f"[{first:#x}, {last:#x}) of {mem_name(blk.mem)}, which has "
                                  f"{arr.size:#x}")
        typed = self._typed_view(arr, blk.dtype)
        return as_strided(typed[blk.addr // isz:], shape=tuple(shape),
                          strides=tuple(s * isz for s in strides), writeable=True)

    def _dst(self, core: int, blk: Block, shape: tuple[int, ...], where: str) -> np.ndarray:
        v = self._view(core, blk, shape, where)
        dims = sorted((abs(s), e) for e, s in zip(shape, blk.strides[-len(shape):]) if e > 1)
        span = 1
        for s, e in dims:
            if s < span:
                raise SimulationError(f"{where}: destination {blk} of shape {tuple(shape)} "
                                      "overlaps itself")
            span = s * e
        return v

    # ---- hazards -------------------------------------------------------------------------
    @staticmethod
    def _bytes(shadow: np.ndarray, blk: Block, shape: tuple[int, ...]) -> np.ndarray:
        """The entries of a per-byte ``shadow`` array that a block touches, as a strided view
        of shape ``(*shape, itemsize)`` (no index arrays: a strided or broadcast block costs
        what a dense one does; a byte reached twice appears twice, which neither the max of a
        check nor the store of one cycle count minds). ``_view`` has checked the bounds."""
        isz = _ITEMSIZE[blk.dtype]
        step = shadow.itemsize
        strides = blk.strides[-len(shape):]
        return as_strided(shadow[blk.addr:], shape=(*shape, isz),
                          strides=(*(s * isz * step for s in strides), step), writeable=True)

    def _shadow(self, core: int, mem: int) -> tuple[np.ndarray, np.ndarray]:
        key = mem if mem < 2 else 2 + core * 3 + (mem - 2)
        sh = self._shadows.get(key)
        if sh is None:
            size = self.machine.memory(core, mem).size
            sh = (np.zeros(size, np.float64), np.zeros(size, np.float64))
            self._shadows[key] = sh
        return sh

    def _access(self, core: int, reads: list[tuple[Block, tuple[int, ...]]],
                writes: list[tuple[Block, tuple[int, ...]]], start: float, end: float,
                where: str) -> None:
        if not self.check_hazards:
            return
        late = start + 1e-9
        views = []
        for blk, shape in reads:
            if blk.mem == _DRAM_ID:
                continue
            last_w, last_r = self._shadow(core, blk.mem)
            w = self._bytes(last_w, blk, shape).max(initial=0.0)
            if w > late:
                raise SimulationError(f"{where}: hazard: reads {blk} at cycle {start:.0f} while "
                                      f"a write to it completes at cycle {w:.0f} (missing "
                                      "dependency token)")
            views.append((self._bytes(last_r, blk, shape), None))
        for blk, shape in writes:
            if blk.mem == _DRAM_ID:
                continue
            last_w, last_r = self._shadow(core, blk.mem)
            wv = self._bytes(last_w, blk, shape)
            r = self._bytes(last_r, blk, shape).max(initial=0.0)
            w = wv.max(initial=0.0)
            if r > late or w > late:
                what = "read" if r > late else "written"
                raise SimulationError(f"{where}: hazard: overwrites {blk} at cycle {start:.0f} "
                                      f"while it is being {what} until cycle "
                                      f"{max(r, w):.0f} (missing dependency token)")
            views.append((None, wv))
        for rv, wv in views:
            if rv is not None:
                np.maximum(rv, end, out=rv)
            else:
                wv[...] = end

    # ---- running ---------------------------------------------------------------------------
    def run(self, program: Program | list[list[Instr]]) -> Report:
        """Execute ``program`` (a Program, or one instruction list per core) to the end."""
        if not isinstance(program, Program):
            program = Program(self.config, program)
        if program.config.name != self.config.name:
            raise SimulationError(f"program for {program.config.name!r} run on "
                                  f"{self.config.name!r}")
        cfg = self.config
        units: list[_Unit] = []
        for core, stream in enumerate(program.streams):
            queues: list[list[Instr]] = [[] for _ in UNITS]
            for ins in stream:
                u = unit_of(ins)
                if u is None:
                    for q in queues:
                        q.append(ins)
                else:
                    queues[u].append(ins)
            units += [_Unit(core, k, queues[k], cfg.scalar_registers) for k in range(len(UNITS))]
        self._units = units
        self._tokens: dict[tuple[int, int, int], deque[float]] = {}
        self._pushed: dict[tuple[int, int, int], int] = {}
        self._popped: dict[tuple[int, int, int], list[float]] = {}
        self._dram_free = 0.0
        self._barrier: dict[int, float] = {}
        # per (scope, memory id, group): each unit's last busy interval there and its bytes
        self._groups: dict[tuple[int, int, int], dict[tuple[int, int], tuple[
            float, float, tuple[tuple[int, int], ...]]]] = {}
        self._phase_conflicts: dict[str, float] = {}
        self.accesses, self.conflicts = [], []
        report = Report(cfg.name, 0.0, {(u.core, UNITS[u.kind]): u.stats for u in units},
                        clock_mhz=cfg.clock_mhz)
        self._report = report
        phase_start, phase_label = 0.0, None
        labels = program.labels
        # what the report counted when the current phase began: bus bytes, each unit's busy
        mark = (0, {key: 0.0 for key in report.units})
        while True:
            best, best_t = None, math.inf
            pending = False
            for u in units:
                if u.pc >= len(u.queue):
                    continue
                pending = True
                t = self._ready(u)
                if t is not None and t < best_t:
                    best, best_t = u, t
            if best is None:
                if pending:
                    raise SimulationError(self._deadlock_message())
                break
            ins = best.queue[best.pc]
            if ins.op == "barrier":
                release = self._run_barrier(ins)
                label = labels.get(ins.args["id"], phase_label)
                report.phases.append((label or f"phase{len(report.phases)}", phase_start,
                                      release))
                mark = self._close_phase(report.phases[-1][0], mark)
                phase_start = release
                continue
            self._step(best, ins, best_t)
        end = max([u.done for u in units] + [u.busy for u in units] + [0.0])
        if end > phase_start:
            report.phases.append(("tail", phase_start, end))
            self._close_phase("tail", mark)
        report.cycles = end
        return report

    def _close_phase(self, label: str, mark: tuple[int, dict[tuple[int, str], float]]
                     ) -> tuple[int, dict[tuple[int, str], float]]:
        """Add what happened since ``mark`` to ``label``'s phase totals; the new mark."""
        report = self._report
        moved, busy = mark
        report.phase_bytes[label] = report.phase_bytes.get(label, 0) + \
            report.dram_burst_bytes - moved
        per = report.phase_busy.setdefault(label, {})
        for key, stats in report.units.items():
            per[key] = per.get(key, 0.0) + stats.busy - busy[key]
        conf = report.phase_conflicts.setdefault(label, {})
        for m, c in self._phase_conflicts.items():
            conf[m] = conf.get(m, 0.0) + c
        self._phase_conflicts = {}
        return report.dram_burst_bytes, {key: s.busy for key, s in report.units.items()}

    def _deadlock_message(self) -> str:
        waits = []
        for u in self._units:
            if u.pc < len(u.queue):
                ins = u.queue[u.pc]
                fields = " ".join(f"{k}={v}" for k, v in ins.args.items()
                                  if k in ("src", "dst", "id"))
                waits.append(f"core {u.core} {UNITS[u.kind]} at {ins.op} {fields}")
        return "NPU program deadlocked: " + "; ".join(waits)

    def _ready(self, u: _Unit) -> float | None:
        """When ``u``'s next instruction can start (None: blocked on a token or barrier)."""
        ins = u.queue[u.pc]
        op = ins.op
        if op == "tok.pop":
            q = self._tokens.get((u.core, ins.args["src"], ins.args["dst"]))
            if not q:
                return None
            return max(u.busy, q[0])
        if op == "tok.push":
            key = (u.core, ins.args["src"], ins.args["dst"])
            t = max(u.busy, u.done)
            pushed = self._pushed.get(key, 0)
            popped = self._popped.get(key, [])
            depth = self.config.token_queue_depth
            if pushed - len(popped) >= depth:
                return None  # full: wait for a pop
            if pushed >= depth:
                # room was made by the pop of token (pushed - depth)
                t = max(t, popped[pushed - depth])
            return t
        if op == "barrier":
            bid = ins.args["id"]
            for v in self._units:
                if v.pc >= len(v.queue) or v.queue[v.pc].op != "barrier" or \
                        v.queue[v.pc].args["id"] != bid:
                    return None
            return max(u.busy, u.done)
        return u.busy

    def _run_barrier(self, ins: Instr) -> float:
        arrive = max(max(v.busy, v.done) for v in self._units)
        release = arrive + self.config.barrier_latency
        for v in self._units:
            v.stats.stall += release - max(v.busy, v.done)
            v.busy = v.done = release
            v.pc += 1
            if self.trace:
                self._report.events.append((v.core, UNITS[v.kind], "barrier", arrive, release,
                                            ""))
        return release

    def _where(self, u: _Unit, ins: Instr) -> str:
        return f"core {u.core} {UNITS[u.kind]} #{u.pc} {ins.op}"

    def _step(self, u: _Unit, ins: Instr, start: float) -> None:
        op = ins.op
        where = self._where(u, ins)
        if op == "tok.pop":
            key = (u.core, ins.args["src"], ins.args["dst"])
            token = self._tokens[key].popleft()
            self._popped.setdefault(key, []).append(max(start, token))
            u.stats.stall += max(0.0, start - u.busy)
            u.busy = max(u.busy, start) + 1
            u.done = max(u.done, u.busy)
            u.stats.instructions += 1
            u.pc += 1
            return
        if op == "tok.push":
            key = (u.core, ins.args["src"], ins.args["dst"])
            self._tokens.setdefault(key, deque()).append(start)
            self._pushed[key] = self._pushed.get(key, 0) + 1
            u.stats.stall += max(0.0, start - u.busy)
            u.busy = start + 1
            u.done = max(u.done, u.busy)
            u.stats.instructions += 1
            u.pc += 1
            return
        if u.kind == UNIT_SCALAR:
            self._run_scalar(u, start)
            return
        try:
            occupancy, latency, reads, writes = self._execute(u.core, ins, where, start)
        except SimulationError:
            raise
        except (ValueError, TypeError, KeyError, IndexError, OverflowError) as err:
            raise SimulationError(f"{where}: {err}") from None
        if isinstance(occupancy, tuple):  # DMA: (data start, data end) decided by the DRAM
            data_start, data_end = occupancy
            data_end += self._arbitrate(u, reads + writes, data_start, data_end)
            busy_from = start
            finish = data_end + latency
            u.busy = data_end
        else:
            busy_from = start
            occupancy += self._arbitrate(u, reads + writes, start, start + occupancy)
            u.busy = start + occupancy
            finish = u.busy + latency
        u.done = max(u.done, finish)
        u.stats.busy += u.busy - busy_from
        u.stats.instructions += 1
        self._access(u.core, reads, writes, start, finish, where)
        if self.trace:
            self._report.events.append((u.core, UNITS[u.kind], op, start, finish, ins.note))
        u.pc += 1

    def _arbitrate(self, u: _Unit, operands: list[tuple[Block, tuple[int, ...]]],
                   begin: float, end: float) -> float:
        """The stretch of an instruction of ``u`` busy on ``[begin, end)`` with ``operands``
        from sharing bank groups with other units (the rule of the module docstring); records
        its interval on every group it touches."""
        touched: dict[tuple[int, int, int], list[tuple[int, int]]] = {}
        spans: list[tuple[int, int, int, int]] = []
        for blk, shape in operands:
            if blk.mem == _DRAM_ID:
                continue
            spec = self._mem_specs[blk.mem]
            if spec.bank_groups == 1:
                continue
            first, last = block_extent(blk, shape)
            scope = -1 if blk.mem == _L1_ID else u.core
            spans.append((scope, blk.mem, first, last))
            gb = spec.group_bytes
            for g in range(max(0, first) // gb, (max(first + 1, last) - 1) // gb + 1):
                mine = touched.setdefault((scope, blk.mem, g), [])
                if (first, last) not in mine:
                    mine.append((first, last))
        if not touched:
            return 0.0
        me = (u.core, u.kind)
        extra, worst = 0.0, -1
        found: list[Conflict] = []
        for key, mine in touched.items():
            ports = self._mem_specs[key[1]].ports
            overlaps = [(other, min(end, ob_end) - max(begin, ob), theirs)
                        for other, (ob, ob_end, theirs) in self._groups.get(key, {}).items()
                        if other != me and ob < end and ob_end > begin]
            n = 1 + len(overlaps)
            if n <= ports:
                continue
            share = (n - ports) / (n - 1)
            stretch = sum(o for _, o, _ in overlaps) * share
            if stretch > extra:
                extra, worst = stretch, key[1]
            if self.record_accesses:
                phase = len(self._report.phases)
                for other, o, theirs in overlaps:
                    part = o * share / (len(mine) * len(theirs))
                    found += [Conflict(phase, key[0], key[1], key[2], me, f, la, other, of, ol,
                                       part) for f, la in mine for of, ol in theirs]
        for key, mine in touched.items():
            self._groups.setdefault(key, {})[me] = (begin, end + extra, tuple(mine))
        if self.record_accesses:
            phase = len(self._report.phases)
            self.accesses += [Access(phase, sc, mem, me, f, la, begin, end + extra)
                              for sc, mem, f, la in dict.fromkeys(spans)]
            self.conflicts += found
        if extra > 0:
            name = MEMORY_NAMES[worst]
            conf = self._report.conflict_cycles
            conf[name] = conf.get(name, 0.0) + extra
            self._phase_conflicts[name] = self._phase_conflicts.get(name, 0.0) + extra
        return extra

    # ---- instruction semantics ------------------------------------------------------------
    def _execute(self, core: int, ins: Instr, where: str, start: float) -> Any:
        op = ins.op
        a = ins.args
        if op in ("dma.load", "dma.store"):
            return self._dma(core, ins, where, start)
        if op in ("mma", "mma.set"):
            return self._mma(core, ins, where)
        if op.startswith("v"):
            return self._vector(core, ins, where)
        raise SimulationError(f"{where}: not an instruction of this unit ({a})")

    def _dma(self, core: int, ins: Instr, where: str, start: float) -> Any:
        a = ins.args
        shape, src_b, dst_b = tuple(a["shape"]), a["src"], a["dst"]
        if src_b.dtype != dst_b.dtype:
            raise SimulationError(f"{where}: DMA copies elements unchanged: source {src_b.dtype} "
                                  f"and destination {dst_b.dtype} differ")
        pad_lo = tuple(a.get("pad_lo", (0, 0, 0)))
        pad_hi = tuple(a.get("pad_hi", (0, 0, 0)))
        box = tuple(e + lo + hi for e, lo, hi in zip(shape, pad_lo, pad_hi))
        if self.timing_only:  # no data work (nor bounds checks: the real run makes them)
            pass
        elif box != shape:
            src = self._view(core, src_b, shape, where + " src")
            dst = self._dst(core, dst_b, box, where + " dst")
            fill = a.get("fill", 0)
            dst[...] = _imm_as(fill, dst_b.dtype)
            inner = dst[pad_lo[0]:pad_lo[0] + shape[0], pad_lo[1]:pad_lo[1] + shape[1],
                        pad_lo[2]:pad_lo[2] + shape[2]]
            inner[...] = src
        else:
            self._dst(core, dst_b, box, where + " dst")[...] = \
                self._view(core, src_b, shape, where + " src")
        # timing
        cfg = self.config
        isz = _ITEMSIZE[src_b.dtype]
        nbytes = math.prod(shape) * isz
        box_bytes = math.prod(box) * isz
        src_spec, dst_spec = self._mem_specs[src_b.mem], self._mem_specs[dst_b.mem]
        onchip = 0.0
        for blk, spec, n, shp in ((src_b, src_spec, nbytes, shape),
                                  (dst_b, dst_spec, box_bytes, box)):
            if blk.mem != _DRAM_ID:
                onchip = max(onchip, stream_cycles(
                    n // isz, isz, _inner_stride(shp, blk.strides), cfg.dma_onchip_bandwidth,
                    spec))
        data_start = start + cfg.dma_latency
        dram_cycles = 0.0
        for blk, shp in ((src_b, shape), (dst_b, shape)):
            if blk.mem == _DRAM_ID:
                runs, run_bytes = _dram_runs(shp, blk.strides, isz)
                burst = self._mem_specs[_DRAM_ID].burst
                moved = runs * math.ceil(run_bytes / burst) * burst
                self._report.dram_burst_bytes += moved
                if blk is src_b:
                    self._report.dram_read += nbytes
                else:
                    self._report.dram_written += nbytes
                dram_cycles += moved / self._mem_specs[_DRAM_ID].bandwidth
        if dram_cycles:
            data_start = max(data_start, self._dram_free)
            self._dram_free = data_start + dram_cycles
        data_end = data_start + max(dram_cycles, onchip, 1.0)
        latency = max(src_spec.latency, dst_spec.latency)
        reads = [(src_b, shape)]
        writes = [(dst_b, box)]
        return (data_start, data_end), latency, reads, writes

    def _mma(self, core: int, ins: Instr, where: str) -> Any:
        a = ins.args
        m1, m0, n, k = a["shape"]
        ab, bb, cb = a["a"], a["b"], a["c"]
        td = self.config.tensor_dtype(ab.dtype, bb.dtype)
        if td is None:
            raise SimulationError(f"{where}: the tensor unit does not multiply {ab.dtype} x "
                                  f"{bb.dtype}")
        if cb.dtype != str(td.acc):
            raise SimulationError(f"{where}: {ab.dtype} x {bb.dtype} accumulates in {td.acc}, "
                                  f"not {cb.dtype}")
        for blk, mem in ((ab, "input"), (bb, "weight"), (cb, "acc")):
            if mem_name(blk.mem) != mem:
                raise SimulationError(f"{where}: the tensor unit reads its {mem} operand from "
                                      f"L0 {mem}, not {mem_name(blk.mem)}")
        if not self.timing_only:
            A = self._view(core, ab, (m1, m0, k), where + " a")
            B = self._view(core, Block(bb.mem, bb.addr, bb.dtype,
                                       (0, bb.strides[0], bb.strides[1])), (1, k, n),
                           where + " b")[0]
            C = self._dst(core, cb, (m1, m0, n), where + " c")
        if self.timing_only:
            pass
        elif td.acc.is_float:
            prod32 = (A.reshape(m1 * m0, k).astype(np.float64) @ B.astype(np.float64)
                      ).astype(np.float32).reshape(m1, m0, n)
            C[...] = prod32 if ins.op == "mma.set" else (C + prod32)
        else:
            p = (A.reshape(m1 * m0, k).astype(np.float64) @ B.astype(np.float64)
                 ).astype(np.int64).reshape(m1, m0, n)
            if ins.op == "mma":
                p = p + C.astype(np.int64)
            C[...] = ((p + (1 << 31)) % (1 << 32) - (1 << 31)).astype(np.int32)
        tm, tk, tn = self.config.tensor_shape
        m = m1 * m0
        tiles = math.ceil(m / tm) * math.ceil(n / tn) * math.ceil(k / tk)
        cycles = float(tiles * td.cycles_per_tile)
        specs = self._mem_specs
        per_cycle_a = tm * tk * _ITEMSIZE[ab.dtype] / td.cycles_per_tile
        per_cycle_b = tk * tn * _ITEMSIZE[bb.dtype] / td.cycles_per_tile
        sa = stream_cycles(m * k, _ITEMSIZE[ab.dtype], ab.strides[2], int(per_cycle_a),
                           specs[ab.mem]) * math.ceil(n / tn)
        sb = stream_cycles(k * n, _ITEMSIZE[bb.dtype], bb.strides[1], int(per_cycle_b),
                           specs[bb.mem]) * math.ceil(m / tm)
        occupancy = max(cycles, sa, sb)
        reads = [(ab, (m1, m0, k)), (Block(bb.mem, bb.addr, bb.dtype, (0, bb.strides[0],
                                                                     bb.strides[1])), (1, k, n))]
        if ins.op == "mma":
            reads.append((cb, (m1, m0, n)))
        return occupancy, self.config.tensor_latency, reads, [(cb, (m1, m0, n))]

    def _vector(self, core: int, ins: Instr, where: str) -> Any:
        a = ins.args
        op = ins.op
        shape = tuple(a["shape"])
        dst_b = a["dst"]
        if self.timing_only:
            blocks = onchip_operands(ins)
            return self._vector_timing(ins, [b for _, b, _ in blocks], shape,
                                       [(b, s) for k, b, s in blocks if k != "dst"],
                                       [(dst_b, blocks[0][2])])
        reads: list[tuple[Block, tuple[int, ...]]] = []
        operands: list[Block] = [dst_b]

        def src(name: str) -> Any:
            v = a[name]
            if isinstance(v, Block):
                reads.append((v, shape))
                operands.append(v)
                return self._view(core, v, shape, f"{where} {name}")
            return v

        dt = dst_b.dtype
        out_shape = shape
        if op.startswith("vred."):
            out_shape = shape[:-1] + (1,)
            dst_view = self._dst(core, dst_b, out_shape, where + " dst")
        else:
            dst_view = self._dst(core, dst_b, shape, where + " dst")
        if dt not in {str(d) for d in self.config.vector_dtypes} and op not in ("vmov",):
            raise SimulationError(f"{where}: the vector unit does not compute in {dt}")
        if op in _BINARY:
            x, y = src("a"), src("b")
            _check_same(where, dt, a["a"], a["b"])
            dst_view[...] = _binary(op, x, y, dt)
        elif op == "vmac":
            x, y = src("a"), src("b")
            _check_same(where, dt, a["a"], a["b"])
            reads.append((dst_b, shape))
            prod = _binary("vmul", x, y, dt)
            dst_view[...] = _binary("vadd", dst_view.copy(), prod, dt)
        elif op in ("vshl", "vshr"):
            x, y = src("a"), src("b")
            if nm.is_float(dt) or a["a"].dtype != dt:
                raise SimulationError(f"{where}: shifts take integers of the destination's type")
            s = np.asarray(_imm_as(y, "int64") if not isinstance(y, np.ndarray) else y, np.int64)
            if (s < 0).any() or (s > 63).any():
                raise SimulationError(f"{where}: shift amounts must be in 0..63")
            xi = np.asarray(x, np.int64)
            r = np.left_shift(xi, s) if op == "vshl" else nm.shift_right(xi, s, bool(a["round"]))
            dst_view[...] = nm.saturate(r, dt)
        elif op == "vqmul":
            x, y = src("a"), src("b")
            for nmx in ("a", "b"):
                if isinstance(a[nmx], Block) and a[nmx].dtype != "int32":
                    raise SimulationError(f"{where}: vqmul multiplies int32 operands")
            if dt != "int32":
                raise SimulationError(f"{where}: vqmul writes int32")
            yv = y if isinstance(y, np.ndarray) else np.int64(_imm_as(y, "int32"))
            dst_view[...] = nm.qmul(x, yv, int(a["shift"]))
        elif op in _UNARY:
            x = src("a")
            if a["a"].dtype != dt:
                raise SimulationError(f"{where}: {op} source {a['a'].dtype} and destination {dt} "
                                      "differ (use vcast)")
            dst_view[...] = _unary(op, x, dt, where)
        elif op == "vcast":
            x = src("a")
            dst_view[...] = nm.cast(x, a["a"].dtype, dt, a["mode"])
        elif op == "vcmp":
            x, y = src("a"), src("b")
            if dt not in ("int8", "uint8"):
                raise SimulationError(f"{where}: vcmp writes an int8/uint8 mask")
            st = a["a"].dtype
            if isinstance(a["b"], Block) and a["b"].dtype != st:
                raise SimulationError(f"{where}: vcmp compares operands of one dtype")
            xv = nm.to_f32(x) if nm.is_float(st) else np.asarray(x, np.int64)
            yv = _imm_as(y, st) if not isinstance(y, np.ndarray) else y
            yv = nm.to_f32(yv) if nm.is_float(st) else np.asarray(yv, np.int64)
            dst_view[...] = _CMP[a["cond"]](xv, yv).astype(nm.np_dtype(dt))
        elif op == "vsel":
            m = self._view(core, a["mask"], shape, where + " mask")
            reads.append((a["mask"], shape))
            operands.append(a["mask"])
            x, y = src("a"), src("b")
            for nmx in ("a", "b"):
                if isinstance(a[nmx], Block) and a[nmx].dtype != dt:
                    raise SimulationError(f"{where}: vsel operands must be {dt}")
            xv = x if isinstance(x, np.ndarray) else _imm_as(x, dt)
            yv = y if isinstance(y, np.ndarray) else _imm_as(y, dt)
            dst_view[...] = np.where(m != 0, xv, yv)
        elif op == "vfill":
            dst_view[...] = _imm_as(a["value"], dt)
        elif op.startswith("vred."):
            x = src("a")
            if a["a"].dtype != dt:
                raise SimulationError(f"{where}: {op} source and destination dtypes differ")
            acc = bool(a["acc"])
            if acc:
                reads.append((dst_b, out_shape))
            dst_view[...] = _reduce(op[5:], x, dst_view if acc else None, dt)
        else:
            raise SimulationError(f"{where}: unknown vector instruction")
        return self._vector_timing(ins, operands, shape, reads, [(dst_b, out_shape)])

    def _vector_timing(self, ins: Instr, operands: list[Block], shape: tuple[int, ...],
                       reads: list[tuple[Block, tuple[int, ...]]],
                       writes: list[tuple[Block, tuple[int, ...]]]) -> Any:
        """A vector instruction's occupancy (its widest operand's blocks of ``width`` bytes,
        or its slowest operand's bank-conflicted stream, times its op class's cost)."""
        cfg = self.config
        dst_b, out_shape = writes[0]
        n = int(np.prod(shape))
        wide = max(_ITEMSIZE[b.dtype] for b in operands)
        base = math.ceil(n * wide / cfg.vector_width)
        conflicts = max(stream_cycles(n if b is not dst_b or not ins.op.startswith("vred.")
                                      else int(np.prod(out_shape)),
                                      _ITEMSIZE[b.dtype], _inner_stride(shape, b.strides),
                                      cfg.vector_width, self._mem_specs[b.mem])
                        for b in operands)
        cost = cfg.vector_cost.get(ins.spec.cost, cfg.vector_cost.get("default", 1))
        occupancy = float(max(base, conflicts) * cost)
        return occupancy, cfg.vector_latency, reads, writes

    # ---- the scalar unit -------------------------------------------------------------------
    def _scalar_copy(self, core: int, a: dict[str, Any], dst: int, src: int, t: float,
                     where: str) -> float:
        """``s.copy``: ``nbytes`` from DRAM ``src`` to DRAM ``dst``, a DMA the scalar unit
        issues and waits for -- the DMA's issue latency, both sides' whole bursts at the
        chip's bandwidth (sharing the channel), the DRAM latency. Returns its cycles."""
        n = int(a["nbytes"])
        if n <= 0:
            raise SimulationError(f"{where}: s.copy of {n} bytes")
        views = [self._view(core, Block(_DRAM_ID, addr, "int8", (0, 0, 1)), (n,), where)
                 for addr in (src, dst)]
        if abs(dst - src) < n:
            raise SimulationError(f"{where}: s.copy source and destination overlap")
        views[1][...] = views[0]
        spec = self._mem_specs[_DRAM_ID]
        moved = sum((-(-(addr + n) // spec.burst) - addr // spec.burst) * spec.burst
                    for addr in (src, dst))
        self._report.dram_burst_bytes += moved
        self._report.dram_read += n
        self._report.dram_written += n
        begin = max(t + self.config.dma_latency, self._dram_free)
        self._dram_free = begin + moved / spec.bandwidth
        return self._dram_free + spec.latency - t

    def _run_scalar(self, u: _Unit, start: float) -> None:
        """Run scalar instructions from ``u.pc`` up to the next token/barrier instruction or the
        end of the queue (they involve no other unit)."""
        cfg = self.config
        t = start
        u.stats.stall += max(0.0, start - u.busy)
        q = u.queue
        regs = u.regs
        steps = 0
        while u.pc < len(q):
            ins = q[u.pc]
            if ins.op in ("tok.push", "tok.pop", "barrier"):
                break
            where = self._where(u, ins)
            a = ins.args
            op = ins.op
            cycles = cfg.scalar_latency
            nxt = u.pc + 1
            try:
                if op == "s.li":
                    regs[a["rd"]] = _scalar_value(a["value"], a["dtype"])
                elif op in ("s.alu", "s.alui"):
                    y = regs[a["rs2"]] if op == "s.alu" else a["value"]
                    regs[a["rd"]] = _alu(a["fn"], regs[a["rs1"]], y, a["dtype"])
                elif op in ("s.ld", "s.st"):
                    addr = int(regs[a["base"]]) + a["offset"]
                    blk = Block(a["mem"], addr, a["dtype"], (0, 0, 1))
                    view = self._view(u.core, blk, (1,), where)
                    if op == "s.ld":
                        v = view[0]
                        regs[a["rd"]] = float(v) if nm.is_float(a["dtype"]) else int(v)
                        self._access(u.core, [(blk, (1,))], [], t, t + cycles, where)
                    else:
                        view[0] = _scalar_store(regs[a["rs"]], a["dtype"])
                        self._access(u.core, [], [(blk, (1,))], t, t + cycles, where)
                    latency = self._mem_specs[a["mem"]].latency
                    cycles += cfg.scalar_memory_latency + (latency if a["mem"] < 2 else 0)
                elif op == "s.fn":
                    if a["fn"] not in cfg.scalar_functions:
                        raise SimulationError(f"{where}: the scalar unit of {cfg.name!r} has "
                                              f"no {a['fn']} (scalar.functions: "
                                              f"{', '.join(cfg.scalar_functions) or 'none'})")
                    if not nm.is_float(a["dtype"]):
                        raise SimulationError(f"{where}: s.fn computes on floats, not "
                                              f"{a['dtype']}")
                    regs[a["rd"]] = float(nm.scalar_function(
                        a["fn"], _scalar_store(regs[a["rs"]], a["dtype"]), a["dtype"]))
                    cycles = cfg.scalar_function_latency
                elif op == "s.copy":  # a DRAM -> DRAM DMA at register-held addresses
                    cycles = self._scalar_copy(u.core, a, int(regs[a["rd"]]) + a["dst"],
                                               int(regs[a["rs"]]) + a["src"], t, where)
                elif op == "s.trap":  # the program's own check failed: stop the run
                    raise RuntimeCheckError(f"{where}: {_TRAPS[a['code']]} "
                                            f"{regs[a['rs']]}")
                elif op == "s.cvt":
                    regs[a["rd"]] = _scalar_cvt(regs[a["rs"]], a["from"], a["to"], a["mode"])
                elif op == "s.br":
                    if _BRANCH[a["cond"]](regs[a["rs1"]], regs[a["rs2"]]):
                        nxt = u.pc + a["target"]
                elif op == "s.jmp":
                    nxt = u.pc + a["target"]
                elif op == "nop":
                    pass
                else:
                    raise SimulationError(f"{where}: not a scalar instruction")
            except (SimulationError, RuntimeCheckError):
                raise
            except (ValueError, TypeError, KeyError, IndexError, OverflowError,
                    ZeroDivisionError) as err:
                raise SimulationError(f"{where}: {err}") from None
            if not 0 <= nxt <= len(q):
                raise SimulationError(f"{where}: branch target {nxt} outside the scalar program")
            t += cycles
            u.stats.busy += cycles
            u.stats.instructions += 1
            u.pc = nxt
            steps += 1
            if steps > 50_000_000:
                raise SimulationError(f"{where}: scalar program runs too long (endless loop?)")
        if self.trace:
            self._report.events.append((u.core, "scalar", "scalar code", start, t, ""))
        u.busy = t
        u.done = max(u.done, t)


# ---------------------------------------------------------------------------------------------
# arithmetic helpers
# ---------------------------------------------------------------------------------------------
_TRAPS = {"index": "index out of range:"}
_BINARY = ("vadd", "vsub", "vmul", "vdiv", "vmin", "vmax", "vmaxnm")
_UNARY = ("vmov", "vrelu", "vneg", "vabs", "vexp", "vrsqrt", "verf")
_CMP = {"lt": np.less, "le": np.less_equal, "eq": np.equal, "ne": np.not_equal,
        "gt": np.greater, "ge": np.greater_equal}
_BRANCH = {"lt": lambda x, y: x < y, "ge": lambda x, y: x >= y, "eq": lambda x, y: x == y,
           "ne": lambda x, y: x != y}


def _check_same(where: str, dt: str, *ops: Any) -> None:
    for o in ops:
        if isinstance(o, Block) and o.dtype != dt:
            raise SimulationError(f"{where}: operand {o} is {o.dtype}, the destination {dt} "
                                  "(use vcast)")


def _imm_as(v: Any, dtype: str) -> Any:
    """An immediate as a value of ``dtype`` (floats rounded to nearest even, ints saturated)."""
    if nm.is_float(dtype):
        return nm.from_f32(np.asarray(v, np.float32), dtype)[()]
    if isinstance(v, float):
        v = int(np.rint(v)) if np.isfinite(v) else 0
    lo, hi = nm.INT_RANGES.get(dtype, (-(2 ** 63), 2 ** 63 - 1))
    return nm.np_dtype(dtype).type(min(max(int(v), lo), hi))


#: The arithmetic of the binary vector ops but vdiv, on floats (float32) and integers (int64).
_BINARY_FN = {"vadd": np.add, "vsub": np.subtract, "vmul": np.multiply, "vmin": np.minimum,
              "vmax": np.maximum, "vmaxnm": np.fmax}


def _binary(op: str, x: Any, y: Any, dt: str) -> np.ndarray:
    if not isinstance(y, np.ndarray):
        y = _imm_as(y, dt)
    if nm.is_float(dt):
        xf, yf = nm.to_f32(x), nm.to_f32(y)
        with np.errstate(all="ignore"):
            if op == "vdiv":
                r = nm.div_approx(xf, yf)
            else:
                r = _BINARY_FN[op](xf, yf)
            if op in ("vmin", "vmax"):  # a NaN operand gives the canonical NaN
                r = np.where(np.isnan(xf) | np.isnan(yf), np.float32(np.nan), r)
        return nm.from_f32(r, dt)
    if op == "vdiv":
        raise SimulationError("vdiv divides floats only")
    return nm.saturate(_BINARY_FN[op](np.asarray(x, np.int64), np.asarray(y, np.int64)), dt)


def _unary(op: str, x: np.ndarray, dt: str, where: str) -> np.ndarray:
    if op == "vmov":
        return x
    if nm.is_float(dt):
        f = nm.to_f32(x)
        if op == "vrelu":
            r = np.where(f > 0, f, np.where(np.isnan(f), f, np.float32(0)))
        elif op == "vneg":
            r = -f
        elif op == "vabs":
            r = np.abs(f)
        elif op == "vexp":
            r = nm.exp_approx(f)
        elif op == "vrsqrt":
            r = nm.rsqrt_approx(f)
        else:
            r = nm.erf_approx(f)
        return nm.from_f32(r, dt)
    if op in ("vexp", "vrsqrt", "verf"):
        raise SimulationError(f"{where}: {op} computes floats only")
    xi = np.asarray(x, np.int64)
    r = np.maximum(xi, 0) if op == "vrelu" else (-xi if op == "vneg" else np.abs(xi))
    return nm.saturate(r, dt)


def _reduce(kind: str, x: np.ndarray, acc: np.ndarray | None, dt: str) -> np.ndarray:
    """Left-to-right reduction along the last axis (see :mod:`.numerics`)."""
    if nm.is_float(dt):
        f = nm.to_f32(x)
        if acc is not None:
            f = np.concatenate([nm.to_f32(acc), f], axis=-1)
        with np.errstate(all="ignore"):
            if kind == "sum":
                if dt == "float32":
                    r = np.add.accumulate(f, axis=-1, dtype=np.float32)[..., -1:]
                else:
                    # round to the element type after every addition
                    r = f[..., :1]
                    for i in range(1, f.shape[-1]):
                        r = nm.to_f32(nm.from_f32(r + f[..., i:i + 1], dt))
            elif kind == "max":
                r = np.max(f, axis=-1, keepdims=True)
                r = np.where(np.isnan(f).any(axis=-1, keepdims=True), np.float32(np.nan), r)
            else:
                r = np.min(f, axis=-1, keepdims=True)
                r = np.where(np.isnan(f).any(axis=-1, keepdims=True), np.float32(np.nan), r)
        return nm.from_f32(r, dt)
    xi = np.asarray(x, np.int64)
    if acc is not None:
        xi = np.concatenate([np.asarray(acc, np.int64), xi], axis=-1)
    if kind == "sum":
        lo, hi = nm.INT_RANGES[dt]
        r = xi[..., :1]
        if xi.shape[-1] > 1:  # saturating left-to-right: exact unless a partial sum saturates
            part = np.cumsum(xi, axis=-1)
            if part.min() >= lo and part.max() <= hi:
                r = part[..., -1:]
            else:
                for i in range(1, xi.shape[-1]):
                    r = np.clip(r + xi[..., i:i + 1], lo, hi)
    elif kind == "max":
        r = xi.max(axis=-1, keepdims=True)
    else:
        r = xi.min(axis=-1, keepdims=True)
    return nm.saturate(r, dt)


def _scalar_value(v: Any, dtype: str) -> Any:
    if nm.is_float(dtype):
        return float(nm.from_f32(np.float32(v), dtype))
    bits = nm.np_dtype(dtype).itemsize * 8
    iv = int(v)
    return ((iv + (1 << (bits - 1))) % (1 << bits)) - (1 << (bits - 1)) if dtype != "uint8" \
        else iv % 256


def _alu(fn: str, x: Any, y: Any, dtype: str) -> Any:
    if nm.is_float(dtype):
        xf, yf = float(x), float(y)
        if fn == "add":
            r = xf + yf
        elif fn == "sub":
            r = xf - yf
        elif fn == "mul":
            r = xf * yf
        elif fn == "div":
            r = float(nm.div_approx(np.float32(xf), np.float32(yf)))
        elif fn == "min":
            r = min(xf, yf)
        elif fn == "max":
            r = max(xf, yf)
        elif fn in ("lt", "le", "eq", "ne"):
            return int({"lt": xf < yf, "le": xf <= yf, "eq": xf == yf, "ne": xf != yf}[fn])
        else:
            raise SimulationError(f"s.alu {fn} does not apply to {dtype}")
        return _scalar_value(r, dtype)
    xi, yi = int(x), int(y)
    if fn == "add":
        r = xi + yi
    elif fn == "sub":
        r = xi - yi
    elif fn == "mul":
        r = xi * yi
    elif fn == "div":
        if yi == 0:
            raise SimulationError("s.alu div: division by zero")
        r = xi // yi
    elif fn == "rem":
        if yi == 0:
            raise SimulationError("s.alu rem: division by zero")
        r = xi % yi
    elif fn == "min":
        r = min(xi, yi)
    elif fn == "max":
        r = max(xi, yi)
    elif fn == "and":
        r = xi & yi
    elif fn == "or":
        r = xi | yi
    elif fn == "xor":
        r = xi ^ yi
    elif fn == "shl":
        r = xi << yi
    elif fn == "shr":
        r = xi >> yi
    else:
        return int({"lt": xi < yi, "le": xi <= yi, "eq": xi == yi, "ne": xi != yi}[fn])
    return _scalar_value(r, dtype)


def _scalar_store(v: Any, dtype: str) -> Any:
    if nm.is_float(dtype):
        return nm.from_f32(np.float32(v), dtype)
    return _scalar_value(v, dtype)


def _scalar_cvt(v: Any, src: str, dst: str, mode: str) -> Any:
    arr = np.asarray([v], dtype=np.float32 if nm.is_float(src) else np.int64)
    if nm.is_float(src) and src != "float32":
        arr = nm.from_f32(arr, src)
    out = nm.cast(arr, src if nm.is_float(src) else "int64", dst, mode)[0]
    return float(out) if nm.is_float(dst) else int(out)
