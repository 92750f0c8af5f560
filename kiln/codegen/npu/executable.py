"""What ``kiln.build(mod, target="npu")`` returns: a callable that runs the model on the
simulator (and its CPU ops on the CPU), reporting simulated cycles.

The executable owns a :class:`~kiln.npu.simulator.Machine` whose DRAM holds the constants
(uploaded once) and every tensor of the model; a call writes the inputs to DRAM, runs the steps
in order -- an NPU region is one simulator run of its program, a CPU op reads its operands from
DRAM and writes its result back -- and reads the outputs. ``last_reports`` keeps the
simulator's report of every NPU region of the last call; :attr:`NPUExecutable.last_cycles`
sums them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ...ir.errors import ArgumentError
from ...npu import Machine, Program, Report, Simulator
from ...runtime.executable import Executable
from ...schedule.npu import DramTensor, KernelInfo
from ...target.npu import NPUConfig

__all__ = ["CpuStep", "NPUExecutable", "NpuStep"]


@dataclass
class NpuStep:
    """An NPU region: its program and the kernels in it (labels, tilings, estimates), and the
    region function it was compiled from."""

    program: Program
    kernels: list[KernelInfo]
    region: str = ""


@dataclass
class CpuStep:
    """One op on the CPU: its executable, operands in DRAM (each with the dtype the CPU op
    takes: DRAM may hold it narrower) and result in DRAM."""

    op: str
    exe: Executable
    inputs: list[tuple[DramTensor, str]]
    out: DramTensor


class NPUExecutable:
    """Call it like graph function ``main``: ``exe(x)`` -> numpy array(s)."""

    def __init__(self, config: NPUConfig, inputs: list[tuple[str, DramTensor]],
                 outputs: list[DramTensor], tuple_output: bool, steps: list[Any],
                 constants: list[tuple[DramTensor, np.ndarray]], dram_bytes: int,
                 double_buffer: bool = True):
        self.config = config
        self.inputs = inputs
        self.outputs = outputs
        self.tuple_output = tuple_output
        self.steps = steps
        self.double_buffer = double_buffer
        self.machine = Machine(config, dram_bytes)
        for t, arr in constants:
            self.machine.write(t.addr, arr)
        self.last_reports: list[Report] = []
        self.target = f"npu -hw={config.name}"

    @property
    def kernels(self) -> list[KernelInfo]:
        return [k for s in self.steps if isinstance(s, NpuStep) for k in s.kernels]

    @property
    def cpu_ops(self) -> list[str]:
        """The ops that run on the CPU (no NPU lowering accepted them)."""
        return [s.op for s in self.steps if isinstance(s, CpuStep)]

    @property
    def last_cycles(self) -> float:
        """Simulated NPU cycles of the last call (every region; CPU ops not counted)."""
        return sum(r.cycles for r in self.last_reports)

    def describe(self) -> str:
        """Each kernel with the tiling chosen for it (what ``kiln show`` prints)."""
        lines = [f"NPU executable for {self.config.name!r}: {len(self.kernels)} kernel(s), "
                 f"CPU ops: {', '.join(self.cpu_ops) or 'none'}"]
        lines += [f"  {k.label:28s} {k.tiling}" for k in self.kernels]
        return "\n".join(lines)

    def __call__(self, *args: Any, trace: bool = False) -> Any:
        if len(args) != len(self.inputs):
            raise ArgumentError(f"expected {len(self.inputs)} input(s) "
                                f"({', '.join(n for n, _ in self.inputs)}), got {len(args)}")
        for (name, t), a in zip(self.inputs, args):
            arr = np.asarray(a)
            if arr.shape != t.shape or str(arr.dtype) != t.dtype:
                raise ArgumentError(f"input {name!r}: expected {t.dtype}{t.shape}, got "
                                    f"{arr.dtype}{arr.shape}")
            self.machine.write(t.addr, arr)
        self.last_reports = []
        for step in self.steps:
            if isinstance(step, NpuStep):
                sim = Simulator(self.config, self.machine, trace=trace)
                self.last_reports.append(sim.run(step.program))
            else:
                ins = [self.machine.read(t.addr, t.shape, t.dtype).astype(dt)
                       for t, dt in step.inputs]
                res = np.asarray(step.exe(*ins))
                self.machine.write(step.out.addr, res.astype(step.out.dtype))
        outs = [self.machine.read(t.addr, t.shape, t.dtype) for t in self.outputs]
        return tuple(outs) if self.tuple_output else outs[0]
