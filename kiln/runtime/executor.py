"""Executor: runs a graph function's Plan by calling its native kernels in order.

Inputs are checked against the function's signature before any kernel touches memory (a wrong
shape or dtype raises ArgumentError naming the input and both values). Constants are bound once;
intermediates of static shape are allocated once, when the executor is made, and reused by every
run; outputs are fresh arrays each run, owned by the caller. An executor is therefore not
re-entrant: use one per thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..ir.dtype import DataType
from ..ir.errors import ArgumentError
from . import shape_expr
from .plan import Plan


def _fmt_shape(shape: Sequence[Any]) -> str:
    dims = [d if isinstance(d, int) else _fmt_dim(d) for d in shape]
    return "(" + ", ".join(str(d) for d in dims) + ("," if len(dims) == 1 else "") + ")"


def _fmt_dim(code: Any) -> str:
    if isinstance(code, int):
        return str(code)
    if code[0] == "var":
        return code[1]
    return f"{code[0]}({_fmt_dim(code[1])}, {_fmt_dim(code[2])})"


def as_input_array(value: Any, name: str, dtype: DataType) -> np.ndarray:
    """Zero-copy view of an input (numpy or any ``__dlpack__`` producer) as a numpy array.

    Python scalars and lists are converted to the expected dtype; arrays must already have it
    (kiln never casts silently). Non-contiguous arrays are copied to contiguous ones.
    """
    if isinstance(value, np.ndarray):
        arr = value
    elif hasattr(value, "__dlpack__"):
        try:
            arr = np.from_dlpack(value)
        except (TypeError, BufferError, RuntimeError) as err:
            raise ArgumentError(
                f"input {name!r}: cannot view {type(value).__name__} through DLPack ({err}); "
                "kiln runs on CPU memory"
            ) from err
    elif isinstance(value, (int, float, bool, list, tuple, np.generic)):
        arr = np.asarray(value, dtype=dtype.to_numpy())
    else:
        raise ArgumentError(
            f"input {name!r}: expected an array (numpy or __dlpack__), got {type(value).__name__}"
        )
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    return arr


class Executor:
    """Runs one Plan against a loaded native Module."""

    def __init__(self, plan: Plan, module: Any):
        self.plan = plan
        self.module = module
        self._funcs = {c.func: module[c.func] for c in plan.calls}
        self._static: dict[int, np.ndarray] = {}
        for slot, spec in enumerate(plan.slots):
            if spec.kind == "const":
                self._static[slot] = plan.constants[slot]
            elif spec.kind == "temp" and all(shape_expr.is_static(d) for d in spec.shape):
                self._static[slot] = np.empty(spec.shape, dtype=spec.dtype.to_numpy())

    # ---- argument checking --------------------------------------------------------------
    def _bind_inputs(self, args: Sequence[Any]) -> tuple[list[np.ndarray], dict[str, int]]:
        plan = self.plan
        fname = plan.name
        if len(args) != len(plan.input_slots):
            raise ArgumentError(
                f"{fname}: expected {len(plan.input_slots)} input(s) "
                f"({', '.join(plan.input_names)}) but got {len(args)}"
            )
        env: dict[str, int] = {}
        arrays = []
        for name, slot, value in zip(plan.input_names, plan.input_slots, args):
            spec = plan.slots[slot]
            arr = as_input_array(value, name, spec.dtype)
            want_np = spec.dtype.to_numpy()
            if arr.dtype != want_np:
                raise ArgumentError(
                    f"{fname}: input {name!r} expected dtype {spec.dtype} but got "
                    f"{DataType.from_numpy(arr.dtype) if arr.dtype.kind in 'biuf' else arr.dtype}"
                )
            if arr.ndim != len(spec.shape):
                raise ArgumentError(
                    f"{fname}: input {name!r} expected shape {_fmt_shape(spec.shape)} "
                    f"(rank {len(spec.shape)}) but got {tuple(arr.shape)} (rank {arr.ndim})"
                )
            for axis, (want, got) in enumerate(zip(spec.shape, arr.shape)):
                if isinstance(want, list) and want[0] == "var" and want[1] not in env:
                    env[want[1]] = int(got)
                    continue
                expected = shape_expr.evaluate(want, env) if isinstance(want, list) else want
                if isinstance(want, list) and want[0] != "var":
                    continue  # compound dims are checked once all vars are bound (below)
                if expected != got:
                    raise ArgumentError(
                        f"{fname}: input {name!r} expected shape {_fmt_shape(spec.shape)} but "
                        f"got {tuple(arr.shape)} (axis {axis}: {expected} != {got})"
                    )
            arrays.append(arr)
        for name, slot, arr in zip(plan.input_names, plan.input_slots, arrays):
            for axis, want in enumerate(plan.slots[slot].shape):
                if isinstance(want, list) and want[0] != "var":
                    expected = shape_expr.evaluate(want, env)
                    if expected != arr.shape[axis]:
                        raise ArgumentError(
                            f"{fname}: input {name!r} expected shape "
                            f"{_fmt_shape(plan.slots[slot].shape)} but got {tuple(arr.shape)}"
                        )
        return arrays, env

    # ---- running ------------------------------------------------------------------------
    def run(self, *args: Any) -> Any:
        plan = self.plan
        arrays, env = self._bind_inputs(args)
        values: list[np.ndarray | None] = [None] * len(plan.slots)
        for slot, arr in zip(plan.input_slots, arrays):
            values[slot] = arr
        for slot, arr in self._static.items():
            values[slot] = arr
        for slot, spec in enumerate(plan.slots):
            if values[slot] is None:
                shape = tuple(shape_expr.evaluate(d, env) for d in spec.shape)
                values[slot] = np.empty(shape, dtype=spec.dtype.to_numpy())
        for call in plan.calls:
            self._funcs[call.func](*[values[s] for s in call.args])
        return self._collect(plan.outputs, values)

    def _collect(self, out: Any, values: list[Any]) -> Any:
        if isinstance(out, list):
            return tuple(self._collect(o, values) for o in out)
        arr = values[out]
        kind = self.plan.slots[out].kind
        # Never hand out storage the executor keeps (inputs, constants, reused temps).
        return arr if kind == "output" else np.array(arr, copy=True)
