"""In-place updates: the executable's state and writing updated inputs back to the caller.

A model may update some of its inputs in place: a torch module's buffers (a step counter, a
running statistic, a KV cache) or a tensor argument (``x.add_(1)``). The frontend returns each
new value as an extra output and records which input it replaces (``kiln.mutations``,
:attr:`kiln.runtime.plan.Plan.mutations`). A call then

1. feeds the plan's *state* (:attr:`Plan.state`: the updated buffers, held by the executable
   and saved with it) after the caller's inputs (:func:`with_state`);
2. runs the plan;
3. replaces each updated input with its new value (:func:`apply_updates`): the state array is
   overwritten, a caller's array or tensor is written in place (a numpy array, a torch tensor
   on any device); the update outputs are not returned.

Calls of one executable that update state must not run at the same time (as for the module).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..ir.errors import ArgumentError, KilnError
from . import memory_plan
from .plan import Plan, TensorInfo


def state_array(value: Any, info: TensorInfo, name: str) -> np.ndarray:
    """The executable's own aligned copy of a state input's initial ``value``; KilnError when
    its dtype or shape is not the input's."""
    arr = np.asarray(value)
    if arr.dtype != np.dtype(info.dtype) or len(arr.shape) != len(info.shape) or any(
            isinstance(d, int) and d != s for d, s in zip(info.shape, arr.shape)):
        raise KilnError(f"state {name!r}: expected {info.dtype}{list(info.shape)}, got "
                        f"{arr.dtype}{list(arr.shape)}")
    out = memory_plan.aligned_empty(arr.shape, arr.dtype)
    out[...] = arr
    return out


def with_state(plan: Plan, inputs: Sequence[Any]) -> list[Any]:
    """The plan's inputs: the caller's ``inputs`` with the state arrays at their positions."""
    out = list(inputs)
    for pos in sorted(plan.state):
        out.insert(pos, plan.state[pos])
    return out


def check_updatable(plan: Plan, inputs: Sequence[Any]) -> None:
    """ArgumentError, before anything runs, when an input the call updates cannot be written
    (a read-only array, a Python list): a failed call changes no state."""
    for m in plan.mutations:
        i = m["input"]
        if i in plan.state:
            continue
        target, name = inputs[i], plan.input_names[i]
        if isinstance(target, np.ndarray):
            if not target.flags.writeable:
                raise ArgumentError(f"input {name!r} is updated in place by the model but the "
                                    "array given is read-only")
        elif not _is_torch_tensor(target):
            raise ArgumentError(f"input {name!r} is updated in place by the model; pass a "
                                f"writable array or tensor, not a {type(target).__name__}")


def _is_torch_tensor(value: Any) -> bool:
    return type(value).__module__.split(".")[0] == "torch" and hasattr(value, "copy_")


def apply_updates(plan: Plan, inputs: Sequence[Any], outputs: Sequence[Any]) -> list[Any]:
    """Write each update output of a call into the input it replaces (``inputs`` as fed,
    state included) and return the other outputs."""
    updates = {m["output"]: m["input"] for m in plan.mutations}
    for k, i in updates.items():
        if i in plan.state:
            np.copyto(plan.state[i], np.asarray(outputs[k]))
        else:
            write_back(inputs[i], outputs[k], plan.input_names[i])
    return [o for k, o in enumerate(outputs) if k not in updates]


def write_back(target: Any, value: Any, name: str) -> None:
    """Overwrite the caller's input ``target`` (a writable numpy array or a torch tensor, see
    :func:`check_updatable`) with ``value``."""
    if isinstance(target, np.ndarray):
        np.copyto(target, np.asarray(value).reshape(target.shape), casting="same_kind")
    elif _is_torch_tensor(target):  # CPU or CUDA: copy_ moves the values to its device
        import torch

        target.copy_(value if isinstance(value, torch.Tensor) else
                     torch.from_numpy(np.ascontiguousarray(value)).reshape(target.shape))
    else:
        raise KilnError(f"input {name!r}: cannot write an update into a "
                        f"{type(target).__name__}")
