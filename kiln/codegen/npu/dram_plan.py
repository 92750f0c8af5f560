"""Liveness-based reuse of the NPU's DRAM: tensors that are never live at the same time share
bytes.

The lowerings place every tensor in its own DRAM range as they emit (a bump allocator: the
addresses are in the instructions). Once the whole model is emitted, each range's live
interval is read off the steps: time advances by one per kernel of an NPU program (kernels are
separated by chip-wide barriers, which order their DRAM traffic) and per CPU step; a range is
live from the first to the last kernel or CPU step that reads or writes it (both inclusive:
a kernel reads its operands while it writes its result). Inputs are live from the start (the
call writes them first), outputs to the end, constants always (they are uploaded once, when
the executable is made, and read by every call). The ranges are then placed by the runtime's
greedy best-fit (:func:`kiln.runtime.memory_plan.place`) and every DRAM address -- in the
instructions' blocks, the CPU steps' operands, the inputs, outputs and constants -- is
relocated. The bytes ``[0, DRAM_ALIGN)`` stay the zeros that all-padding DMAs read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ...ir.errors import InternalError
from ...npu.isa import Block
from ...runtime.memory_plan import Interval, place
from ...schedule.npu import DramTensor
from ...schedule.npu.dram_ranges import DramRanges
from ...schedule.npu.emit import DRAM_ALIGN
from .executable import NpuStep

__all__ = ["DramPlan", "plan_dram"]

_DRAM = 0  # the memory id of DRAM in instruction blocks (kiln.target.npu.MEMORY_NAMES)


@dataclass
class DramPlan:
    """The DRAM footprint without and with reuse (bytes, including the zero block)."""

    unshared_bytes: int
    dram_bytes: int


def _dram_blocks(ins: Any) -> list[tuple[str, Block]]:
    return [(k, v) for k, v in ins.args.items() if isinstance(v, Block) and v.mem == _DRAM
            and v.addr >= DRAM_ALIGN]


#: Scalar-unit memory instructions: their DRAM addresses are the ``offset`` field (``s.ld``,
#: ``s.st``) or the ``src``/``dst`` fields (``s.copy``): a tensor's start; the loop steps
#: through it with a base register.
_SCALAR_MEMORY_OPS = ("s.ld", "s.st")


def _scalar_dram_fields(ins: Any) -> list[str]:
    if ins.op == "s.copy":
        fields = ["src", "dst"]
    elif ins.op in _SCALAR_MEMORY_OPS and ins.args.get("mem") == _DRAM:
        fields = ["offset"]
    else:
        return []
    return [f for f in fields if ins.args.get(f, 0) >= DRAM_ALIGN]


def plan_dram(steps: list[Any], inputs: list[tuple[str, DramTensor]],
              outputs: list[DramTensor], constants: list[tuple[DramTensor, np.ndarray]],
              allocations: list[DramTensor], top: int) -> tuple[Any, DramPlan]:
    """Relocate the steps' DRAM tensors so that tensors never live together share bytes (the
    instructions and CPU steps are rewritten in place). Returns the function mapping an old
    DRAM tensor to its new one, and the footprint before and after."""
    ranges = DramRanges(allocations)
    time = 0
    for step in steps:
        if isinstance(step, NpuStep):
            for stream in step.program.streams:
                kernel = time
                for ins in stream:
                    if ins.op == "barrier":
                        kernel += 1
                        continue
                    for _, blk in _dram_blocks(ins):
                        ranges.use(blk.addr, kernel)
                    for f in _scalar_dram_fields(ins):
                        ranges.use(int(ins.args[f]), kernel)
            time += 1 + max(sum(i.op == "barrier" for i in s) for s in step.program.streams)
        else:
            for t, _ in step.inputs:
                ranges.use(t.addr, time)
            ranges.use(step.out.addr, time)
            time += 1
    for _, t in inputs:
        ranges.use(t.addr, -1)
    for t in outputs:
        ranges.use(t.addr, time)
    for t, _ in constants:
        ranges.use(t.addr, -1)
        ranges.use(t.addr, time)
    intervals = [Interval(i, ranges.ends[i] - ranges.starts[i], ranges.first[i],
                          ranges.last[i]) for i in sorted(ranges.first)]
    offsets, peak = place(intervals, DRAM_ALIGN)

    def new_addr(addr: int) -> int:
        i = ranges.index(addr)
        if i is None or i not in offsets:
            raise InternalError(f"NPU DRAM plan: address {addr} is in no used allocation")
        return DRAM_ALIGN + offsets[i] + addr - ranges.starts[i]

    def relocate(t: DramTensor) -> DramTensor:
        return DramTensor(new_addr(t.addr), t.shape, t.dtype)

    for step in steps:
        if isinstance(step, NpuStep):
            for stream in step.program.streams:
                for ins in stream:
                    for k, blk in _dram_blocks(ins):
                        ins.args[k] = blk._replace(addr=new_addr(blk.addr))
                    for f in _scalar_dram_fields(ins):
                        ins.args[f] = new_addr(int(ins.args[f]))
        else:
            step.inputs = [(relocate(t), dt) for t, dt in step.inputs]
            step.out = relocate(step.out)

    return relocate, DramPlan(top, DRAM_ALIGN + peak)
