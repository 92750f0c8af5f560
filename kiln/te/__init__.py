"""Tensor expressions: describe an operator as computes over tensors, then make a PrimFunc.

```python
A = te.placeholder((n, m), "float32", name="A")
k = te.reduce_axis((0, m), name="k")
C = te.compute((n, p), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
f = te.create_prim_func([A, B, C])
```
"""

from .create_prim_func import create_prim_func
from .operation import comm_reducer, compute, if_then_else, max, min, reduce_axis, sum
from .tensor import (
    ComputeOp,
    Operation,
    PlaceholderOp,
    Tensor,
    placeholder,
    size_var,
    tensor_of_buffer,
    var,
)

try:  # te nodes print through the TIR printer
    from . import printer as _printer  # noqa: F401
except ImportError:  # pragma: no cover - during bring-up
    pass

__all__ = [
    "ComputeOp", "Operation", "PlaceholderOp", "Tensor", "comm_reducer", "compute",
    "create_prim_func", "if_then_else", "max", "min", "placeholder", "reduce_axis", "size_var",
    "sum", "tensor_of_buffer", "var",
]
