"""Values the executor holds only on the host: sequences, optionals and string tensors.

A plan slot of form ``"sequence"`` holds a Python list of numpy arrays (an ONNX sequence),
one of form ``"optional"`` holds None (no value) or its value (an array, or a list for an
optional sequence); a tensor slot of dtype ``string`` holds a numpy object array of ``str``
(see ``kiln.runtime.plan.SlotSpec``). Host functions (``kiln.runtime.host_funcs``) make and
read them; no kernel ever sees one. This module checks them where they cross the executor's
boundary: a model input (what the caller passes), a host function's result (what the
function returned) and a model output (a fresh copy the caller owns).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..ir.dtype import DataType
from ..ir.errors import ArgumentError
from . import shape_expr
from .plan import Plan, SlotSpec


def string_array(value: Any, what: str) -> np.ndarray:
    """``value`` (a numpy str/bytes/object array, a list or a str) as an object array of
    ``str``; ArgumentError naming ``what`` when an element is not text."""
    arr = np.asarray(value, dtype=object) if not isinstance(value, np.ndarray) else value
    if arr.dtype.kind in "US":
        arr = arr.astype(object)
    if arr.dtype != object:
        raise ArgumentError(f"{what}: expected a string tensor (numpy str or object array), "
                            f"got {arr.dtype}")
    out = np.empty(arr.shape, object)
    flat = out.reshape(-1)
    for i, v in enumerate(arr.reshape(-1)):
        if isinstance(v, bytes):
            v = v.decode("utf-8")
        if not isinstance(v, str):
            raise ArgumentError(f"{what}: expected strings, got {type(v).__name__} {v!r}")
        flat[i] = v
    return out


def tensor_value(value: Any, dtype: DataType, what: str) -> np.ndarray:
    """One tensor inside a sequence or optional: an array of ``dtype`` (strings as
    :func:`string_array`); ArgumentError otherwise."""
    if dtype.is_string:
        return string_array(value, what)
    if not isinstance(value, np.ndarray):
        if isinstance(value, (int, float, bool, np.generic, list, tuple)):
            value = np.asarray(value, dtype=dtype.to_numpy())
        elif hasattr(value, "__dlpack__"):
            value = np.from_dlpack(value)
        else:
            raise ArgumentError(f"{what}: expected an array, got {type(value).__name__}")
    if value.dtype != dtype.to_numpy():
        raise ArgumentError(f"{what}: expected dtype {dtype}, got {value.dtype}")
    return value if value.flags.c_contiguous else np.array(value, order="C")


def check_value(value: Any, spec: SlotSpec, what: str) -> Any:
    """A sequence or optional value checked against its slot: lists of arrays of the slot's
    dtype, None for an empty optional. ArgumentError naming ``what`` otherwise."""
    form = spec.form
    if form == "optional":
        if value is None:
            return None
        form = spec.elem
    if form == "sequence":
        if isinstance(value, np.ndarray) or not isinstance(value, (list, tuple)):
            raise ArgumentError(f"{what}: expected a sequence (a list of arrays), got "
                                f"{type(value).__name__}")
        return [tensor_value(v, spec.dtype, f"{what}[{i}]") for i, v in enumerate(value)]
    return tensor_value(value, spec.dtype, what)


def keep(plan: Plan, slots: Sequence[int], inputs: list[Any]) -> list[Any]:
    """The inputs of a host function that makes a sequence or optional, with a copy of each
    tensor whose memory the executor reuses (a static temp: its workspace bytes, or its
    array in the call state, hold another value later in the run), since the result holds
    its inputs' arrays for as long as it lives. Other arrays -- constants, inputs, tensors
    allocated for this run, host values -- are never written again and are held as they are.
    """
    out = list(inputs)
    for k, slot in enumerate(slots):
        spec = plan.slots[slot]
        if (spec.kind == "temp" and not spec.is_host_value
                and all(shape_expr.is_static(d) for d in spec.shape)):
            out[k] = np.array(inputs[k], copy=True)
    return out


def aliases(result: np.ndarray, inputs: Sequence[Any]) -> bool:
    """Whether a host function's tensor ``result`` is (a view of) one of its inputs or of an
    array they hold (a sequence's element, an optional's value)."""
    base = result if result.base is None else result.base
    for value in inputs:
        for arr in (value if isinstance(value, list) else [value]):
            if isinstance(arr, np.ndarray) and (arr is result or arr is base
                                                or arr.base is base and base is not None):
                return True
    return False


def copy_value(value: Any) -> Any:
    """A copy the caller owns of a host value (lists and arrays copied, None kept)."""
    if value is None:
        return None
    if isinstance(value, list):
        return [np.array(v, copy=True) for v in value]
    return np.array(value, copy=True)


def describe(value: Any) -> str:
    """A short description of a value, for errors about a host function's result."""
    if value is None:
        return "None"
    if isinstance(value, list):
        return f"a list of {len(value)}"
    if isinstance(value, np.ndarray):
        return f"{value.dtype} of shape {value.shape}"
    return type(value).__name__
