"""Helpers shared by the ATen converters: dtypes, type promotion, scalars, dims."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .... import graph as g
from .... import op, tir
from ....arith import Analyzer, simplify
from ....ir.dtype import as_dtype
from ....ir.errors import KilnError
from ....op.common import const_int as static_int  # noqa: F401 - the converters use it
from ..tensors import kiln_dtype


def sinfo(x: Any) -> Any:
    """``x``'s StructInfo, inferred when ``x`` is a nested call not yet emitted."""
    if x.struct_info is None:
        return g.BlockBuilder().normalize(x).struct_info
    return x.struct_info


def dtype_of(x: Any) -> str:
    return str(sinfo(x).dtype)


def shape_of(x: Any) -> tuple[Any, ...]:
    return tuple(sinfo(x).shape)


def ndim_of(x: Any) -> int:
    return len(sinfo(x).shape)


def is_float(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat"))


def scalar(value: Any, dtype: str) -> g.Constant:
    """A 0-d constant of ``dtype`` (bool/int/float ``value``)."""
    return g.const(np.array(value, dtype=_np_dtype(dtype)))


def _np_dtype(dtype: str) -> Any:
    return as_dtype(dtype).to_numpy()


def cast(x: Any, dtype: str) -> Any:
    """``x`` in ``dtype`` (unchanged when it already is)."""
    return x if dtype_of(x) == dtype else op.cast(x, dtype)


def as_tensor(x: Any, dtype: str, ctx: Any = None) -> Any:
    """A tensor operand of ``dtype`` from an Expr (cast if needed), a Python number or -- with
    the import context ``ctx`` -- a symbolic size (read from the inputs' shapes)."""
    if isinstance(x, g.Expr):
        return cast(x, dtype)
    if isinstance(x, tir.PrimExpr) and not isinstance(x, (tir.IntImm, tir.FloatImm)):
        x = simplify(x)
        if not isinstance(x, tir.IntImm):
            if ctx is None:
                raise KilnError(f"a symbolic size ({x}) used as a tensor value")
            return cast(ctx.size_tensor(x), dtype)
    if isinstance(x, (tir.IntImm, tir.FloatImm)):
        x = x.value
    if isinstance(x, float) and not is_float(dtype):
        raise KilnError(f"float scalar {x} in a {dtype} operation")
    return scalar(x, dtype)


def result_dtype(node: Any, *keys: int | str) -> str:
    """torch's promoted dtype of the arguments ``keys`` (tensors and Python numbers; 0-d
    tensors take part as numbers do), as ``torch.result_type`` computes it."""
    import torch

    out: Any = None
    for k in keys:
        v = node.meta(k)
        if isinstance(v, torch.Tensor):
            v = torch.empty((1,) * min(v.dim(), 1), dtype=v.dtype)
        elif isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            v = {torch.SymInt: 1, torch.SymFloat: 1.0, torch.SymBool: True}[type(v)]
        if out is None:
            out = v
            continue
        dims = any(isinstance(t, torch.Tensor) and t.dim() > 0 for t in (out, v))
        out = torch.empty((1,) if dims else (), dtype=torch.result_type(out, v))
    if not isinstance(out, torch.Tensor):
        out = torch.tensor(out)
    return dtype_name(out.dtype)


def dtype_name(dtype: Any) -> str:
    return kiln_dtype(dtype)


def norm_dim(d: int, ndim: int) -> int:
    """A dim index made non-negative (KilnError when out of range; rank 0 allows -1 and 0)."""
    n = max(ndim, 1)
    if not -n <= d < n:
        raise KilnError(f"dim {d} is out of range for a tensor of rank {ndim}")
    return d + n if d < 0 else d


def norm_dims(dims: Any, ndim: int) -> tuple[int, ...] | None:
    """A dim list (None/empty: all dims) made non-negative and sorted."""
    if dims is None:
        return None
    if isinstance(dims, int):
        dims = [dims]
    if len(dims) == 0:
        return None
    return tuple(sorted({norm_dim(int(d), ndim) for d in dims}))


def prod(dims: Sequence[Any]) -> Any:
    out: Any = 1
    for d in dims:
        out = out * d
    return out


def reshape(x: Any, shape: Sequence[Any]) -> Any:
    return op.reshape(x, tuple(shape))


def sizes(values: Sequence[Any]) -> tuple[Any, ...]:
    """A size list (ints and PrimExprs) as dims kiln shapes take."""
    return tuple(int(v) if isinstance(v, (int, np.integer)) else v for v in values)


def producer(ctx: Any, x: Any, op_name: str) -> Any:
    """The call of op ``op_name`` that variable ``x`` is bound to, or None."""
    if not isinstance(x, g.Var):
        return None
    value = ctx.bb.lookup_binding(x)
    if isinstance(value, g.Call) and isinstance(value.op, g.Op) and value.op.name == op_name:
        return value
    return None


def same_dim(a: Any, b: Any) -> bool:
    """Whether two sizes (ints or PrimExprs) are provably equal (``b*s`` and ``s*b`` are)."""
    return Analyzer().can_prove_equal(as_dim(a), as_dim(b))


def as_dim(d: Any) -> Any:
    """A size as a PrimExpr (ints as int64 immediates)."""
    return tir.IntImm("int64", int(d)) if isinstance(d, (int, np.integer)) else d


def same_shape(a: Sequence[Any], b: Sequence[Any]) -> bool:
    """Whether two shapes are provably equal (ints or PrimExprs)."""
    return len(a) == len(b) and all(same_dim(x, y) for x, y in zip(a, b))
