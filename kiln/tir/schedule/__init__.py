"""Schedule primitives on block TIR with a replayable trace (see docs/internals.md)."""

from .schedule import Schedule
from .trace import BlockRV, Instruction, LoopRV, Trace

__all__ = ["BlockRV", "Instruction", "LoopRV", "Schedule", "Trace"]
