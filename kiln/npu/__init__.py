"""The NPU: its instruction set (:mod:`.isa`), binary encoding (:mod:`.encoding`), text
assembler and disassembler (:mod:`.asm`), exact arithmetic (:mod:`.numerics`), programs
(:mod:`.program`), the cycle-level simulator (:mod:`.simulator`) and its timeline
(:mod:`.timeline`). The hardware descriptions live in :mod:`kiln.target.npu`."""

from .isa import Block, Instr, IsaError
from .program import Program
from .simulator import Machine, Report, SimulationError, Simulator

__all__ = ["Block", "Instr", "IsaError", "Machine", "Program", "Report", "SimulationError",
           "Simulator"]
