"""What a GPU executable holds, as plain data: the program and how to launch its kernels.

A :class:`DeviceProgram` is made by the GPU code generator (:mod:`kiln.codegen.gpu`) and read
by the GPU runtime; it survives an executable file as JSON plus the source and the compiled
binary (PTX/cubin), so a saved executable runs without a compiler. Per lowered PrimFunc, a
:class:`DeviceFunction` lists

- its signature (``FunctionInfo``, as for the C backend) and where each symbolic dimension is
  read from (``sym_sources``: parameter index and axis of its first plain occurrence);
- its *workspaces*: global intermediates the function allocates itself (their sizes in
  elements, encoded shape expressions of the symbolic dims);
- its kernels in launch order (:class:`KernelSpec`): the kernel's symbol, its arguments
  (:class:`KernelArg`: a parameter's buffer or scalar, a workspace, a symbolic dim, the fresh
  seed, the check record and the call's tag), grid extents (encoded expressions, evaluated when
  a call binds the dims), block extents and dynamic shared memory bytes;
- the messages of its run-time index checks (``checks``: ``kiln.tir.check_index``), by the
  number a kernel writes into the *check record* when an index is out of range.

The check record is one small device buffer per executor (:data:`CHECK_RECORD`): the first
failing thread claims it (an atomic compare-and-swap of ``failed``) and writes which check of
which call failed and the values; the host reads it after a run's kernels and raises
``RuntimeCheckError``, as the CPU target does after its kernel returns. The kernel goes on
with index 0 (inside the tensor), so nothing is read or written out of bounds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...ir.dtype import DataType
from ...ir.errors import RuntimeCheckError
from .. import shape_expr
from ..module import FunctionInfo, ParamInfo


@dataclass(frozen=True)
class KernelArg:
    """One kernel argument: ``kind`` is ``"buffer"`` (parameter ``index`` of the function),
    ``"workspace"`` (workspace ``index``), ``"sym"`` (symbolic dim ``index``, int64 by value),
    ``"scalar"`` (scalar parameter ``index``, by value, ``dtype``), ``"seed"`` (a pointer to
    a fresh uint64 per launch), ``"checks"`` (a pointer to the check record) or ``"call"``
    (the tag of the plan call the launch belongs to, int64 by value, written into the check
    record)."""

    kind: str
    index: int = 0
    dtype: str = "int64"


#: The check record's layout, in int64 words: ``failed`` (its low 32 bits are claimed with a
#: 32-bit compare-and-swap, which every OpenCL device has), the number of the failed check in
#: its function's ``checks``, the index, the allowed range ``[lo, hi)`` and the call's tag.
CHECK_RECORD = ("failed", "check", "value", "lo", "hi", "call")


def empty_check_record() -> np.ndarray:
    """A cleared check record (host side), to upload before kernels that check indices run."""
    return np.zeros(len(CHECK_RECORD), np.int64)


def check_failure(record: np.ndarray, function: DeviceFunction) -> RuntimeCheckError | None:
    """The error a check record read back from the device reports (``None`` when no check
    failed), with ``function``'s message for the failed check."""
    fields = dict(zip(CHECK_RECORD, (int(x) for x in record)))
    if not fields["failed"]:
        return None
    checks = function.checks
    what = checks[fields["check"]] if 0 <= fields["check"] < len(checks) else (
        f"{function.info.name}: check #{fields['check']}")
    return RuntimeCheckError(f"{what}: index {fields['value']} is out of range "
                             f"[{fields['lo']}, {fields['hi']})")


@dataclass(frozen=True)
class KernelSpec:
    """One kernel launch of a function (see the module docstring)."""

    name: str
    args: tuple[KernelArg, ...]
    grid: tuple[Any, Any, Any]
    block: tuple[int, int, int]
    dynamic_shared_bytes: int = 0

    @property
    def threads(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]


@dataclass(frozen=True)
class WorkspaceSpec:
    """A global intermediate of a function: ``size`` elements of ``dtype`` (encoded)."""

    name: str
    dtype: DataType
    size: Any

    def nbytes(self, env: dict[str, int]) -> int:
        return shape_expr.evaluate(self.size, env) * self.dtype.itemsize


@dataclass(frozen=True)
class DeviceFunction:
    """One lowered PrimFunc: signature, workspaces and kernels (see the module docstring)."""

    info: FunctionInfo
    sym_sources: tuple[tuple[int, int], ...]
    workspaces: tuple[WorkspaceSpec, ...]
    kernels: tuple[KernelSpec, ...]
    #: The function's conditions on its symbolic dims (``kiln.assume``: encoded
    #: :mod:`~kiln.runtime.shape_expr` conditions and their messages), checked on the host
    #: before its kernels launch, as the C entry checks them before computing.
    assumptions: tuple[tuple[Any, str], ...] = ()
    #: The messages of the function's run-time index checks, by number (see the module
    #: docstring).
    checks: tuple[str, ...] = ()

    @property
    def has_checks(self) -> bool:
        """Whether a kernel of the function writes the check record."""
        return any(a.kind == "checks" for k in self.kernels for a in k.args)

    def bind_dims(self, shapes: list[tuple[int, ...]]) -> dict[str, int]:
        """The symbolic dims' values read from the argument shapes (parameter order)."""
        return {name: int(shapes[p][a])
                for name, (p, a) in zip(self.info.sym_vars, self.sym_sources)}


@dataclass
class DeviceProgram:
    """All kernels of an executable: one source (and, for CUDA, its compiled binary)."""

    kind: str  # "cuda" | "opencl"
    arch: str  # CUDA: "sm_90"...; OpenCL: ""
    source: str
    functions: dict[str, DeviceFunction]
    #: CUDA: the cubin for ``arch`` and the PTX (portable to later architectures).
    binaries: dict[str, bytes] = field(default_factory=dict)

    # ---- JSON ----------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind, "arch": self.arch,
            "functions": {name: _function_json(f) for name, f in self.functions.items()},
        }

    @staticmethod
    def from_json(data: dict[str, Any], source: str, binaries: dict[str, bytes]
                  ) -> DeviceProgram:
        return DeviceProgram(
            kind=data["kind"], arch=data["arch"], source=source, binaries=dict(binaries),
            functions={name: _function_from_json(f) for name, f in data["functions"].items()})


def _function_json(f: DeviceFunction) -> dict[str, Any]:
    info = f.info
    return {
        "name": info.name, "symbol": info.symbol, "sym_vars": list(info.sym_vars),
        "num_outputs": info.num_outputs,
        "params": [{"name": p.name, "shape": list(p.shape), "dtype": str(p.dtype),
                    "is_scalar": p.is_scalar} for p in info.params],
        "sym_sources": [list(s) for s in f.sym_sources],
        "workspaces": [{"name": w.name, "dtype": str(w.dtype), "size": w.size}
                       for w in f.workspaces],
        "kernels": [{"name": k.name, "grid": list(k.grid), "block": list(k.block),
                     "dynamic_shared_bytes": k.dynamic_shared_bytes,
                     "args": [[a.kind, a.index, a.dtype] for a in k.args]}
                    for k in f.kernels],
        "assumptions": [[code, message] for code, message in f.assumptions],
        "checks": list(f.checks),
    }


def _function_from_json(d: dict[str, Any]) -> DeviceFunction:
    info = FunctionInfo(
        name=d["name"], symbol=d["symbol"], unchecked_symbol="", sym_vars=tuple(d["sym_vars"]),
        num_outputs=d["num_outputs"],
        params=tuple(ParamInfo(p["name"], tuple(p["shape"]), DataType(p["dtype"]),
                               p["is_scalar"]) for p in d["params"]))
    return DeviceFunction(
        info=info,
        sym_sources=tuple(tuple(s) for s in d["sym_sources"]),  # type: ignore[misc]
        workspaces=tuple(WorkspaceSpec(w["name"], DataType(w["dtype"]), w["size"])
                         for w in d["workspaces"]),
        kernels=tuple(KernelSpec(k["name"], tuple(KernelArg(*a) for a in k["args"]),
                                 tuple(k["grid"]), tuple(k["block"]),  # type: ignore[arg-type]
                                 k["dynamic_shared_bytes"]) for k in d["kernels"]),
        assumptions=tuple((code, message) for code, message in d.get("assumptions", ())),
        checks=tuple(str(m) for m in d.get("checks", ())))
