"""What ``kiln.build(mod, target="npu")`` returns: a callable that runs the model on the
simulator (and its CPU ops on the CPU), reporting simulated cycles; saved to and loaded from
one file.

The executable owns a :class:`~kiln.npu.simulator.Machine` whose DRAM holds the constants
(uploaded once) and every tensor of the model; a call writes the inputs to DRAM, runs the steps
in order -- an NPU region is one simulator run of its program, a CPU op reads its operands from
DRAM and writes its result back -- and reads the outputs. ``last_reports`` keeps the
simulator's report of every NPU region of the last call; :attr:`NPUExecutable.last_cycles`
sums them.

``exe.save(path)`` writes the container of CPU executables (:mod:`kiln.runtime.file_format`:
named, checksummed sections) with these sections; ``kiln.load`` reads it back (this module
registers the loader) without recompiling::

    meta               JSON: kiln's version, the format version, the target ("npu -hw=edge")
    npu.header         JSON: the hardware description (its TOML tables), the DRAM layout
                       (inputs, outputs, constants: address, shape, dtype), the steps in order
                       (NPU regions with their kernels' labels and tilings; CPU ops with their
                       operands' and result's DRAM tensors)
    npu.program.<k>    region k's program in the binary instruction encoding
                       (:meth:`kiln.npu.program.Program.to_bytes`)
    npu.cpu.<k>        CPU step k: a whole kiln CPU executable file (its own checksums, the
                       machine check of ``kiln.load``)
    npu.constants      the constants' bytes, in the order of the header's table
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ...ir.errors import ArgumentError, KilnError, ModelFormatError, TargetError
from ...npu import Machine, Program, Report, Simulator
from ...runtime import file_format
from ...runtime.executable import Executable, register_loader
from ...runtime.executable import load as load_executable
from ...schedule.npu import DramTensor, KernelInfo
from ...target.npu import NPUConfig
from ...target.npu.config import ConfigError, config_from_dict
from ...version import __version__

__all__ = ["CpuStep", "NPUExecutable", "NpuStep", "is_npu_file", "load_npu"]

HEADER = "npu.header"
CONSTANTS = "npu.constants"
PROGRAM_PREFIX = "npu.program."
CPU_PREFIX = "npu.cpu."


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
        self.constants = constants
        self.dram_bytes = dram_bytes
        #: The DRAM the model would take with a range per tensor (no reuse; see dram_plan).
        self.unshared_dram_bytes = dram_bytes
        #: The intermediates kept in L1 (:class:`~kiln.codegen.npu.residency.ResidencyPlan`;
        #: None when the build kept every tensor in DRAM, or for a loaded executable).
        self.residency: Any = None
        #: per NPU program, the front of its region run per sub-batch
        #: (:class:`kiln.schedule.npu.sub_batch.SubBatchPlan`; None: not sliced; empty for
        #: a loaded executable)
        self.sub_batches: list[Any] = []
        #: ``(op, Schedule)`` of the kernels the TIR route lowered (empty on the emit route
        #: and for a loaded executable).
        self.tir: list[tuple[str, Any]] = []
        #: per NPU program, what the bank-group placement did (``build_npu(bank_plan=True)``;
        #: :class:`kiln.codegen.npu.bank_plan.BankPlan`; empty when off and when loaded)
        self.bank_plans: list[Any] = []
        #: per NPU program, the loads moved above a barrier (``build_npu(prefetch=True)``;
        #: :class:`kiln.codegen.npu.prefetch.PrefetchPlan`; empty when off and when loaded)
        self.prefetch_plans: list[Any] = []
        #: whether the products' output slot counts chosen by their own replays were kept
        #: for the whole model, and the model's replays with and without them
        #: (``build_npu``; "" where no product chose fewer slots)
        self.slot_choices = ""
        self.machine = Machine(config, dram_bytes)
        for t, arr in constants:
            self.machine.write(t.addr, arr)
        self.last_reports: list[Report] = []
        self.target = f"npu -hw={config.name}"

    @property
    def bank_conflicts(self) -> tuple[float, float]:
        """Cycles lost to bank-group conflicts over the model's programs (timing replays),
        before and after the placement (equal when it did not run)."""
        return (sum(p.conflicts_before for p in self.bank_plans),
                sum(p.conflicts_after for p in self.bank_plans))

    @property
    def kernel_bank_conflicts(self) -> dict[str, tuple[float, float]]:
        """Per kernel label (a program's phase), its bank-group conflict cycles before and
        after the placement (the timing replays; kernels without any are left out)."""
        out: dict[str, tuple[float, float]] = {}
        for p in self.bank_plans:
            for label in {**p.phases_before, **p.phases_after}:
                before, after = p.phases_before.get(label, 0.0), p.phases_after.get(label, 0.0)
                if before or after:
                    out[label] = (before, after)
        return out

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
                 f"CPU ops: {', '.join(self.cpu_ops) or 'none'}; DRAM "
                 f"{self.dram_bytes:,} bytes ({self.unshared_dram_bytes:,} without reuse)"]
        if self.residency is not None and self.residency.tensors:
            lines.append(f"  {self.residency.tensors} intermediate tensor(s) kept in L1 "
                         f"({sum(self.residency.nbytes.values()):,} bytes), "
                         f"{self.residency.saved_bytes:,} bytes of DRAM traffic avoided")
        lines += [f"  sub-batches: {p.describe()}" for p in self.sub_batches if p is not None]
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

    # ---- files ---------------------------------------------------------------------------
    def save(self, path: str) -> None:
        """Write the executable to ``path`` (one file; see the module docstring)."""
        sections: list[tuple[str, bytes]] = []
        steps: list[dict[str, Any]] = []
        with tempfile.TemporaryDirectory(prefix="kiln-npu-") as tmp:
            for k, step in enumerate(self.steps):
                if isinstance(step, NpuStep):
                    sections.append((f"{PROGRAM_PREFIX}{k}", step.program.to_bytes()))
                    steps.append({"kind": "npu", "region": step.region,
                                  "kernels": [asdict(i) for i in step.kernels]})
                    continue
                file = os.path.join(tmp, f"cpu{k}.kiln")
                step.exe.save(file)
                with open(file, "rb") as f:
                    sections.append((f"{CPU_PREFIX}{k}", f.read()))
                steps.append({"kind": "cpu", "op": step.op, "out": _tensor_json(step.out),
                              "inputs": [[_tensor_json(t), dt] for t, dt in step.inputs]})
        blob = b"".join(np.ascontiguousarray(a).tobytes() for _, a in self.constants)
        header = {
            "config": self.config.raw, "config_path": self.config.path,
            "inputs": [[n, _tensor_json(t)] for n, t in self.inputs],
            "outputs": [_tensor_json(t) for t in self.outputs],
            "tuple_output": self.tuple_output, "dram_bytes": self.dram_bytes,
            "unshared_dram_bytes": self.unshared_dram_bytes,
            "double_buffer": self.double_buffer, "steps": steps,
            "constants": [_tensor_json(t) for t, _ in self.constants],
        }
        meta = {"kiln_version": __version__, "format": file_format.VERSION,
                "target": self.target}
        try:
            file_format.write(path, [("meta", json.dumps(meta).encode()),
                                     (HEADER, json.dumps(header).encode()), *sections,
                                     (CONSTANTS, blob)])
        except OSError as err:
            raise KilnError(f"cannot write executable {path}: {err.strerror or err}") from err


def _tensor_json(t: DramTensor) -> dict[str, Any]:
    return {"addr": t.addr, "shape": list(t.shape), "dtype": t.dtype}


def _tensor(d: dict[str, Any]) -> DramTensor:
    return DramTensor(int(d["addr"]), tuple(int(x) for x in d["shape"]), str(d["dtype"]))


def is_npu_file(sections: Any) -> bool:
    """Whether a file's sections are an NPU executable's."""
    return HEADER in sections


def _cpu_executable(data: bytes) -> Executable:
    with tempfile.TemporaryDirectory(prefix="kiln-npu-") as tmp:
        file = os.path.join(tmp, "cpu.kiln")
        with open(file, "wb") as f:
            f.write(data)
        return load_executable(file)


def load_npu(sections: Any, path: str) -> NPUExecutable:
    """The NPU executable saved in ``sections`` (of the file ``path``); ModelFormatError for
    a malformed one."""
    try:
        header = json.loads(bytes(sections[HEADER]).decode())
        config = config_from_dict(header["config"], header["config_path"])
        steps: list[Any] = []
        for k, s in enumerate(header["steps"]):
            if s["kind"] == "npu":
                program = Program.from_bytes(bytes(sections[f"{PROGRAM_PREFIX}{k}"]), config)
                steps.append(NpuStep(program, [KernelInfo(**i) for i in s["kernels"]],
                                     s["region"]))
            else:
                exe = _cpu_executable(bytes(sections[f"{CPU_PREFIX}{k}"]))
                steps.append(CpuStep(s["op"], exe, [(_tensor(t), str(dt)) for t, dt in
                                                    s["inputs"]], _tensor(s["out"])))
        blob = bytes(sections[CONSTANTS])
        constants, offset = [], 0
        for c in header["constants"]:
            t = _tensor(c)
            n = int(np.prod(t.shape, dtype=np.int64))
            arr = np.frombuffer(blob, np.dtype(t.dtype), n, offset).reshape(t.shape)
            offset += arr.nbytes
            constants.append((t, arr))
        if offset != len(blob):
            raise ValueError(f"the constants take {offset} bytes, the section has {len(blob)}")
        exe = NPUExecutable(config, [(str(n), _tensor(t)) for n, t in header["inputs"]],
                            [_tensor(t) for t in header["outputs"]],
                            bool(header["tuple_output"]), steps, constants,
                            int(header["dram_bytes"]), bool(header["double_buffer"]))
        exe.unshared_dram_bytes = int(header["unshared_dram_bytes"])
        return exe
    except (ModelFormatError, TargetError):  # a damaged CPU step, code for another CPU
        raise
    except (KeyError, IndexError, TypeError, ValueError, UnicodeDecodeError, ConfigError,
            KilnError) as err:
        raise ModelFormatError(f"{path}: malformed NPU executable ({err})") from err


register_loader(is_npu_file, load_npu)
