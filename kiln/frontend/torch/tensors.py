"""torch tensors in and out of kiln executables without copies (DLPack).

An executable takes anything with ``__dlpack__`` and returns numpy arrays; these helpers make
the torch side of that exchange: ``to_kiln`` views a CPU tensor as a numpy array (bfloat16,
which numpy's DLPack import does not know, goes through an int16 view and ml_dtypes'
bfloat16), ``to_torch`` views kiln's result as a tensor. Neither copies.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...ir.errors import ArgumentError


def to_kiln(t: Any, what: str = "input") -> Any:
    """A numpy view of CPU tensor ``t`` (detached: DLPack refuses tensors that need grad)."""
    import torch

    if not isinstance(t, torch.Tensor):
        return t
    if t.device.type != "cpu":
        raise ArgumentError(f"{what}: kiln runs on CPU tensors, got one on {t.device}")
    t = t.detach()
    if t.dtype == torch.bfloat16:
        import ml_dtypes

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
