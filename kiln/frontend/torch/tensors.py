"""torch tensors in and out of kiln executables without copies (DLPack).

An executable takes anything with ``__dlpack__`` and returns numpy arrays; these helpers make
the torch side of that exchange: ``to_kiln`` views a CPU tensor as a numpy array (bfloat16,
which numpy's DLPack import does not know, goes through an int16 view and ml_dtypes'
bfloat16), ``to_torch`` views kiln's result as a tensor. Neither copies.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from ...ir.errors import ArgumentError, KilnError


def require_torch() -> Any:
    """The ``torch`` module (imported on first use: kiln does not depend on PyTorch)."""
    try:
        import torch
    except ImportError as err:  # pragma: no cover - torch is an optional dependency
        raise KilnError("kiln.frontend.torch needs PyTorch (pip install 'kiln[torch]')") from err
    return torch


def kiln_dtype(dtype: Any) -> str:
    """The kiln dtype name of a ``torch.dtype`` (KilnError for complex and other types kiln
    has no type for)."""
    name = str(dtype).removeprefix("torch.")
    if name in ("float32", "float64", "float16", "bfloat16", "int8", "int16", "int32", "int64",
                "uint8", "uint16", "uint32", "uint64", "bool"):
        return name
    raise KilnError(f"torch dtype {dtype} is not supported by kiln")


def to_numpy(tensor: Any) -> np.ndarray:
    """A numpy copy of a torch tensor (bfloat16 through ml_dtypes' type)."""
    torch = require_torch()
    t = tensor.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16).copy()
    return t.numpy().copy()


def to_kiln(t: Any, what: str = "input") -> Any:
    """A numpy view of CPU tensor ``t`` (detached: DLPack refuses tensors that need grad)."""
    import torch

    if not isinstance(t, torch.Tensor):
        return t
    if t.device.type != "cpu":
        raise ArgumentError(f"{what}: kiln runs on CPU tensors, got one on {t.device}")
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return np.from_dlpack(t.view(torch.int16)).view(ml_dtypes.bfloat16)
    return np.from_dlpack(t)


def to_torch(a: Any) -> Any:
    """A tensor viewing kiln's numpy result ``a`` (nested tuples/lists/dicts mapped)."""
    import torch

    if isinstance(a, np.ndarray):
        if a.dtype.name == "bfloat16":
            return torch.from_dlpack(a.view(np.int16)).view(torch.bfloat16)
        if not a.flags.writeable:
            a = a.copy()
        return torch.from_dlpack(a)
    if isinstance(a, tuple):
        return tuple(to_torch(x) for x in a)
    if isinstance(a, list):
        return [to_torch(x) for x in a]
    if isinstance(a, dict):
        return {k: to_torch(v) for k, v in a.items()}
    return a
