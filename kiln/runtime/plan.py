"""The execution plan of a graph function: what the executor runs.

A plan is a flat list of kernel calls over numbered *slots* (one slot per tensor value: inputs,
constants, intermediates, outputs), in destination-passing style: each call names its input and
output slots. Plans are plain data (JSON-compatible except for DataType and the constant arrays)
so an executable can be saved and loaded without the compiler.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..ir.dtype import DataType


@dataclass
class SlotSpec:
    """Shape (encoded dims, see ``shape_expr``) and dtype of one slot."""

    shape: list[Any]
    dtype: DataType
    kind: str  # "input" | "const" | "temp" | "output"


@dataclass
class KernelCall:
    func: str
    args: list[int]  # input slots then output slots
    num_outputs: int


@dataclass
class Plan:
    name: str
    input_names: list[str]
    input_slots: list[int]
    slots: list[SlotSpec]
    calls: list[KernelCall]
    outputs: Any  # int slot, or nested list of slots (tuple outputs)
    constants: dict[int, np.ndarray] = field(default_factory=dict)
    #: Byte offset of each static temp slot in the workspace (see ``memory_plan``).
    workspace_offsets: dict[int, int] = field(default_factory=dict)
    #: Workspace size: the peak of the memory plan.
    workspace_bytes: int = 0
    #: C symbol of the whole-model native entry (``graph_entry``), None when there is none.
    entry: str | None = None

    @property
    def num_kernels(self) -> int:
        return len(self.calls)

    def to_json(self, dtype_index: dict[DataType, int]) -> dict[str, Any]:
        return {
            "name": self.name,
            "input_names": self.input_names,
            "input_slots": self.input_slots,
            "slots": [
                {"shape": s.shape, "dtype": dtype_index[s.dtype], "kind": s.kind}
                for s in self.slots
            ],
            "calls": [
                {"func": c.func, "args": c.args, "num_outputs": c.num_outputs} for c in self.calls
            ],
            "outputs": self.outputs,
            "workspace_offsets": sorted([s, o] for s, o in self.workspace_offsets.items()),
            "workspace_bytes": self.workspace_bytes,
            "entry": self.entry,
        }

    @staticmethod
    def from_json(data: dict[str, Any], dtypes: list[DataType],
                  constants: dict[int, np.ndarray]) -> Plan:
        return Plan(
            name=data["name"],
            input_names=list(data["input_names"]),
            input_slots=list(data["input_slots"]),
            slots=[SlotSpec(s["shape"], dtypes[s["dtype"]], s["kind"]) for s in data["slots"]],
            calls=[KernelCall(c["func"], list(c["args"]), c["num_outputs"]) for c in data["calls"]],
            outputs=data["outputs"],
            constants=constants,
            workspace_offsets={int(s): int(o) for s, o in data["workspace_offsets"]},
            workspace_bytes=int(data["workspace_bytes"]),
            entry=data["entry"],
        )
