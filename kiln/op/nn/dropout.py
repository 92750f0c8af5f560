"""``nn.dropout`` in inference form: the identity (training-time dropping is not modelled)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ... import te
from ...graph.struct_info import TensorStructInfo
from ...ir.errors import KilnError
from ..linalg import tensor_arg
from ..registry import MixedPrecision, OpPattern, register_op
from .window import set_frozen


@dataclass(frozen=True)
class DropoutAttrs:
    """``rate``: the training-time drop probability (unused in inference)."""

    rate: float = 0.5

    def __post_init__(self):
        rate = float(self.rate)
        if not 0.0 <= rate < 1.0:
            raise KilnError(f"nn.dropout: rate must be in [0, 1), got {self.rate!r}")
        set_frozen(self, "rate", rate)


def _infer_dropout(call: Any) -> Any:
    x = tensor_arg(call, 0, "nn.dropout", "data")
    return TensorStructInfo(x.shape, x.dtype, x.ndim)


def _dropout_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    """Inference dropout is the identity."""
    return [output_grad]


dropout = register_op(
    "nn.dropout",
    inputs=("data",),
    attrs=DropoutAttrs,
    infer=_infer_dropout,
    pattern=OpPattern.ELEMWISE,
    compute=lambda x, *, attrs: te.compute(x.shape, lambda *i: x[i], name="dropout"),
    mixed_precision=MixedPrecision.FOLLOW,
    gradient=_dropout_grad,
    doc="Dropout in inference form: the identity (training-time dropping is not modelled).",
)
