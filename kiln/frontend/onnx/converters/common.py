"""Small helpers shared by the converters."""

from __future__ import annotations

from typing import Any

import numpy as np

from .... import graph as g
from .... import op
from ....ir.errors import StructInfoError
from ....op.common import const_int as static_int


def scalar(value: float, dtype: str) -> Any:
    """A 0-d constant of ``dtype``."""
    return g.const(np.array(value, dtype=dtype))


def dtype_of(x: Any) -> str:
    return str(x.struct_info.dtype)


def shape_of(x: Any) -> tuple[Any, ...]:
    """The shape of ``x``; StructInfoError when only its rank is known at import (a symbolic
    dim met a different one: ``(1, seq, 64) + (1, 16, 64)``), which the converter's node then
    names."""
    shape = x.struct_info.shape
    if shape is None:
        raise StructInfoError(
            f"the shape of {getattr(x, 'name_hint', 'an input')!r} is not known when the model "
            "is imported (a symbolic dimension met a different one earlier, for example a "
            "dynamic sequence length added to a fixed-length position table); this operator "
            "needs it: give that input a static shape")
    return tuple(shape)


def ndim_of(x: Any) -> int:
    """The rank of ``x``, also when only the rank is known (a shape computed at run time)."""
    sinfo = x.struct_info
    if sinfo.shape is not None:
        return len(sinfo.shape)
    ndim = getattr(sinfo, "ndim", -1)
    if ndim < 0:
        raise StructInfoError(f"the rank of {getattr(x, 'name_hint', 'a value')!r} is not known "
                              "when the model is imported; this operator needs it")
    return ndim


def ints(arr: Any) -> list[int]:
    return [int(v) for v in np.asarray(arr).reshape(-1)]


def prod(dims: Any) -> Any:
    out: Any = 1
    for d in dims:
        out = out * d
    return out


def norm_axis(axis: int, ndim: int) -> int:
    return axis + ndim if axis < 0 else axis


def node_axis(node: Any, ndim: int, default: int = -1, what: str = "rank",
              attr: str = "axis") -> int:
    """The node's axis attribute ``attr`` checked against ``ndim`` and made non-negative (an
    error naming the node when out of range; ``what`` names the rank in the message)."""
    axis = int(node.attr(attr, default))
    if not -ndim <= axis < ndim:
        raise node.error(f"{attr} {axis} is out of range for {what} {ndim}")
    return norm_axis(axis, ndim)


def reshape(x: Any, shape: Any) -> Any:
    return op.reshape(x, tuple(shape))


def static_kernel(node: Any, w: Any) -> tuple[int, ...]:
    """The spatial dims of a convolution weight ``w`` (after its two channel dims), which the
    window arithmetic needs at import: an error naming the node when one is symbolic, or
    disagrees with the node's ``kernel_shape``."""
    dims = tuple(static_int(d) for d in shape_of(w)[2:])
    if None in dims:
        raise node.error(f"the weight's spatial dims {shape_of(w)[2:]} must be known when the "
                         "model is imported")
    given = node.attr("kernel_shape", None)
    if given is not None and tuple(int(k) for k in given) != dims:
        raise node.error(f"kernel_shape {list(given)} disagrees with the weight's spatial dims "
                         f"{list(dims)}")
    return dims  # type: ignore[return-value]


#: Elements of the largest :func:`iota` built as a constant at import (64 MiB of int32).
IOTA_CONST_LIMIT = 1 << 24


def iota(n: Any, dtype: str) -> Any:
    """``[0, 1, ..., n-1]`` of ``dtype``: a constant when ``n`` is static and at most
    :data:`IOTA_CONST_LIMIT`, else an exclusive cumsum of ones computed at run time (a
    declared length of 2**31 made a 16 GiB constant at import: fuzz 3035674)."""
    size = static_int(n)
    if size is not None and size <= IOTA_CONST_LIMIT:
        return g.const(np.arange(size, dtype=dtype))
    return op.cumsum(op.broadcast_to(scalar(1, dtype), (n,)), axis=0, exclusive=True)


def along(vec: Any, axis: int, ndim: int) -> Any:
    """The 1-D ``vec`` shaped to broadcast along ``axis`` of a rank-``ndim`` tensor."""
    if ndim == 1:
        return vec
    return op.reshape(vec, tuple(-1 if d == axis else 1 for d in range(ndim)))
