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
from ..ir.span import Span
from . import shape_expr

#: What a slot holds besides a tensor (``SlotSpec.form``): a ``"sequence"`` is a Python list
#: of arrays, an ``"optional"`` None or its value (an array or a list), see
#: ``kiln.graph.struct_info.SequenceStructInfo`` / ``OptionalStructInfo``.
HOST_FORMS = ("sequence", "optional")


@dataclass
class SlotSpec:
    """Shape (encoded dims, see ``shape_expr``) and dtype of one slot.

    ``form`` is ``"tensor"`` for an array; a sequence or optional slot (``HOST_FORMS``) has
    no shape (``[]``), the dtype of its innermost tensors, and ``elem``: the form of what it
    holds (``"tensor"``, or ``"sequence"`` for an optional sequence)."""

    shape: list[Any]
    dtype: DataType
    kind: str  # "input" | "const" | "temp" | "output"
    form: str = "tensor"
    elem: str = "tensor"

    @property
    def is_host_value(self) -> bool:
        """Held only by the Python executor, never in native memory: a sequence, an optional
        or a string tensor (no memory plan, no native entry)."""
        return self.form != "tensor" or self.dtype.is_string


@dataclass
class KernelCall:
    """One step of a plan: a native kernel call, or a host step (``kind != "kernel"``).

    Host steps compute run-time shapes (see ``kiln.runtime.shape_funcs``): ``"shape_func"``
    runs the shape function ``func`` on the tensors in ``args`` (read, never written; listed
    so that memory planning keeps them alive) and binds the symbolic names of
    ``extra["binds"]``; ``"match"`` binds or checks names from already bound values
    (a ``match_cast``); ``"host_func"`` runs host function ``func``
    (``kiln.runtime.host_funcs``) on its input slots with ``extra["attrs"]``, fills its one
    output slot and binds that slot's dim names ``extra["binds"]``. ``extra`` is JSON data.
    """

    func: str
    args: list[int]  # input slots then output slots
    num_outputs: int
    kind: str = "kernel"
    extra: dict[str, Any] | None = None
    #: The model nodes the call was made from (the graph call's span), None if unknown.
    span: Span | None = None

    @property
    def is_kernel(self) -> bool:
        return self.kind == "kernel"


def profile_symbol(entry: str) -> str:
    """The C symbol of the profiling twin of the native entry ``entry``."""
    return entry + "_profile"


@dataclass(frozen=True)
class TensorInfo:
    """An input or output of a graph function, as onnxruntime's ``get_inputs()`` describes
    one: its name, its shape (ints, and names for symbolic dims: ``("batch", 3, 224, 224)``;
    an expression of names reads like ``"mul(2, n)"``) and its numpy dtype name (``object``
    for strings; ``"sequence(float32)"``, ``"optional(int64)"`` for those values, whose
    shape is ``()``)."""

    name: str
    shape: tuple[int | str, ...]
    dtype: str


def default_output_names(count: int) -> list[str]:
    """Names of the outputs of a function whose model named none: ``output_0``, ..."""
    return [f"output_{i}" for i in range(count)]


def flat_slots(out: Any) -> list[int]:
    """The slots of an output structure (a slot, or nested lists of them), in order."""
    return [s for o in out for s in flat_slots(o)] if isinstance(out, list) else [out]


#: The graph function attribute listing in-place updates a frontend recorded: ``[{"param":
#: name of the updated parameter, "output": index of its new value among the flat outputs}]``
#: (``kiln.frontend.torch``: buffer and input mutations of an exported program). A plan keeps
#: them as :attr:`Plan.mutations`.
MUTATIONS_ATTR = "kiln.mutations"


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
    #: For an entry over symbolic shapes: per call, ``[arg index, axis]`` of each of its
    #: kernel's symbolic dims (in its ``sym`` order); None for an entry over static shapes,
    #: which takes a planned workspace instead (see ``kiln.codegen.graph_entry``).
    entry_sym_dims: list[list[list[int]]] | None = None
    #: For a plan with host steps: its runs of kernel calls between them, each a native
    #: *segment entry* ``{"start", "stop", "symbol", "sym_dims"}`` (calls ``start..stop-1``;
    #: ``sym_dims`` as :attr:`entry_sym_dims`, per call of the run; see
    #: ``kiln.codegen.graph_entry``). Empty: each kernel is called through its checked entry.
    segments: list[dict[str, Any]] = field(default_factory=list)
    #: Nested call structure (``kiln.runtime.pytree``) of the inputs and outputs, None when
    #: the executable is called with the flat inputs and returns the graph's result.
    input_tree: dict[str, Any] | None = None
    output_tree: dict[str, Any] | None = None
    #: ``{symbolic dim name: [min, max or None]}``: the sizes the model was exported for,
    #: checked when a run binds the dim (a frontend records them, e.g. ``torch.export.Dim``).
    dim_ranges: dict[str, list[int | None]] = field(default_factory=dict)
    #: One name per output tensor, in the order of :func:`flat_slots` of ``outputs``: the
    #: model's names (an ONNX graph's outputs) or :func:`default_output_names`.
    output_names: list[str] = field(default_factory=list)
    #: In-place updates (:data:`MUTATIONS_ATTR`): ``[{"input": input position, "output": flat
    #: output index}]``. After a call the output's value replaces the input's: the plan's
    #: :attr:`state` when it holds that input, else the caller's array is written
    #: (``kiln.runtime.executable``); the update outputs are not returned.
    mutations: list[dict[str, int]] = field(default_factory=list)
    #: The executable's state: ``{input position: array}``, inputs the executable feeds itself
    #: (a module's buffers that its calls update), saved with the executable.
    state: dict[int, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        count = len(flat_slots(self.outputs))
        if len(self.output_names) != count:
            self.output_names = default_output_names(count)

    def tensor_info(self, slot: int, name: str) -> TensorInfo:
        """The :class:`TensorInfo` of ``slot`` under ``name``."""
        spec = self.slots[slot]
        shape = tuple(d if isinstance(d, int) else shape_expr.to_str(d) for d in spec.shape)
        dtype = spec.dtype.to_numpy().name if spec.dtype.lanes == 1 else str(spec.dtype)
        if spec.form != "tensor":  # "sequence(float32)", "optional(sequence(int64))"
            inner = dtype if spec.elem == "tensor" else f"{spec.elem}({dtype})"
            dtype = f"{spec.form}({inner})"
        return TensorInfo(name, shape, dtype)

    @property
    def inputs(self) -> list[TensorInfo]:
        return [self.tensor_info(s, n) for n, s in zip(self.input_names, self.input_slots)]

    @property
    def output_infos(self) -> list[TensorInfo]:
        return [self.tensor_info(s, n)
                for n, s in zip(self.output_names, flat_slots(self.outputs))]

    @property
    def profile_entry(self) -> str | None:
        """C symbol of the native entry's profiling twin, which also takes ``double* seconds``
        and adds each call's wall time to ``seconds[call index]``."""
        return None if self.entry is None else profile_symbol(self.entry)

    @property
    def num_kernels(self) -> int:
        return sum(1 for c in self.calls if c.is_kernel)

    @property
    def has_host_steps(self) -> bool:
        """Whether shapes are computed while running or values live only on the host
        (sequences, optionals, strings): no static memory plan / native entry."""
        return (any(not c.is_kernel for c in self.calls)
                or any(s.is_host_value for s in self.slots))

    def to_json(self, dtype_index: dict[DataType, int]) -> dict[str, Any]:
        return {
            "name": self.name,
            "input_names": self.input_names,
            "input_slots": self.input_slots,
            "slots": [_slot_json(s, dtype_index) for s in self.slots],
            "calls": [_call_json(c) for c in self.calls],
            "outputs": self.outputs,
            "workspace_offsets": sorted([s, o] for s, o in self.workspace_offsets.items()),
            "workspace_bytes": self.workspace_bytes,
            "entry": self.entry,
            "entry_sym_dims": self.entry_sym_dims,
            "segments": self.segments,
            "input_tree": self.input_tree,
            "output_tree": self.output_tree,
            "dim_ranges": self.dim_ranges,
            "output_names": self.output_names,
            "mutations": self.mutations,
        }

    @staticmethod
    def from_json(data: dict[str, Any], dtypes: list[DataType],
                  constants: dict[int, np.ndarray], state: dict[int, np.ndarray] | None = None
                  ) -> Plan:
        return Plan(
            name=data["name"],
            input_names=list(data["input_names"]),
            input_slots=list(data["input_slots"]),
            slots=[SlotSpec(s["shape"], dtypes[s["dtype"]], s["kind"], s.get("form", "tensor"),
                            s.get("elem", "tensor")) for s in data["slots"]],
            calls=[KernelCall(c["func"], list(c["args"]), c["num_outputs"],
                              c.get("kind", "kernel"), c.get("extra"),
                              Span.from_json(c.get("span"))) for c in data["calls"]],
            outputs=data["outputs"],
            constants=constants,
            workspace_offsets={int(s): int(o) for s, o in data["workspace_offsets"]},
            workspace_bytes=int(data["workspace_bytes"]),
            entry=data["entry"],
            entry_sym_dims=data.get("entry_sym_dims"),
            segments=list(data.get("segments") or ()),
            input_tree=data.get("input_tree"),
            output_tree=data.get("output_tree"),
            dim_ranges=dict(data.get("dim_ranges") or {}),
            output_names=list(data.get("output_names") or ()),
            mutations=[{"input": int(m["input"]), "output": int(m["output"])}
                       for m in data.get("mutations") or ()],
            state=dict(state or {}),
        )


def _slot_json(s: SlotSpec, dtype_index: dict[DataType, int]) -> dict[str, Any]:
    out: dict[str, Any] = {"shape": s.shape, "dtype": dtype_index[s.dtype], "kind": s.kind}
    if s.form != "tensor":
        out["form"], out["elem"] = s.form, s.elem
    return out


def _call_json(c: KernelCall) -> dict[str, Any]:
    out: dict[str, Any] = {"func": c.func, "args": c.args, "num_outputs": c.num_outputs}
    if not c.is_kernel:
        out["kind"] = c.kind
        out["extra"] = c.extra
    if c.span is not None:
        out["span"] = c.span.to_json()
    return out
