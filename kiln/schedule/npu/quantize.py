"""The NPU lowerings of the int8 scheme's operators (``qnn.*``, :mod:`kiln.op.quantize`) and
of ``sum`` (the integer global average pool's accumulation).

All run on the vector unit as element-wise kernels (:func:`~.vector.emit_elementwise`), with the
instruction sequence that computes the operator's specified arithmetic exactly:

- ``qnn.requantize``: ``vadd`` of the bias (int32, saturating), ``vqmul`` by the fixed-point
  multiplier with the ``shift`` (the exact product plus half an LSB, arithmetic shift right),
  ``vmax``/``vmin`` for a clamp narrower than int8, then ``vcast`` to int8 (saturating); the
  per-channel bias and multiplier are stride-0 broadcast blocks;
- ``qnn.quantize``: ``vmul`` by ``float32(1/scale)``, ``vcast`` to int8 rounding to nearest
  even with saturation;
- ``qnn.dequantize``: ``vcast`` to float32 (exact for int8), ``vmul`` by ``float32(scale)``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .emit import DramTensor
from .lowering import LoweringContext, NotSupported, register_lowering
from .pooling import trailing_reduction_rows
from .vector import VecStep, emit_elementwise, emit_row_mean

__all__ = ["lower_dequantize", "lower_quantize", "lower_requantize", "lower_sum"]


def _input(op: str, x: Any, dtypes: tuple[str, ...]) -> DramTensor:
    if not isinstance(x, DramTensor):
        raise NotSupported(f"{op} of a constant (folded at compile time)")
    if x.dtype not in dtypes:
        raise NotSupported(f"{op}: input {x.dtype} (the NPU takes {', '.join(dtypes)})")
    return x


def _channel_src(ctx: LoweringContext, v: np.ndarray, rank: int, axis: int,
                 inputs: list[DramTensor]) -> tuple[Any, ...]:
    """A per-channel int32 operand as an immediate (one value) or a broadcast tensor."""
    v = np.asarray(v, dtype=np.int32).reshape(-1)
    if v.size == 1:
        return ("imm", int(v[0]))
    shape = [1] * rank
    shape[axis] = v.size
    inputs.append(ctx.constant(v.reshape(shape)))
    return ("in", len(inputs) - 1)


@register_lowering("qnn.requantize")
def lower_requantize(ctx: LoweringContext, call: Any, args: list[Any], out: DramTensor
                     ) -> None:
    at = call.attrs
    acc = _input("qnn.requantize", args[0], ("int32",))
    bias, mult = args[1], args[2]
    if not (isinstance(bias, np.ndarray) and isinstance(mult, np.ndarray)):
        raise NotSupported("qnn.requantize: bias and multiplier computed at run time")
    rank = len(acc.shape)
    inputs = [acc]
    axis = at.axis % rank
    steps = [VecStep("vadd", (("in", 0), _channel_src(ctx, bias, rank, axis, inputs))),
             VecStep("vqmul", (("out",), _channel_src(ctx, mult, rank, axis, inputs)),
                     (("shift", at.shift),))]
    if at.out_min > -128:
        steps.append(VecStep("vmax", (("out",), ("imm", at.out_min))))
    if at.out_max < 127:
        steps.append(VecStep("vmin", (("out",), ("imm", at.out_max))))
    emit_elementwise(ctx, "qnn.requantize", out, inputs, steps, compute_dtype="int32")


@register_lowering("qnn.quantize")
def lower_quantize(ctx: LoweringContext, call: Any, args: list[Any], out: DramTensor) -> None:
    x = _input("qnn.quantize", args[0], ("float32",))
    emit_elementwise(ctx, "qnn.quantize", out, [x],
                     [VecStep("vmul", (("in", 0), ("imm", call.attrs.inv_scale)))],
                     compute_dtype="float32")


@register_lowering("qnn.dequantize")
def lower_dequantize(ctx: LoweringContext, call: Any, args: list[Any], out: DramTensor
                     ) -> None:
    x = _input("qnn.dequantize", args[0], ("int8", "int32"))
    if out.dtype != "float32":
        raise NotSupported(f"qnn.dequantize to {out.dtype}")
    scale = float(np.float32(call.attrs.scale))
    emit_elementwise(ctx, "qnn.dequantize", out, [x],
                     [VecStep("vcast", (("in", 0),), (("mode", "rne"),)),
                      VecStep("vmul", (("out",), ("imm", scale)))])


@register_lowering("sum")
def lower_sum(ctx: LoweringContext, call: Any, args: list[Any], out: DramTensor) -> None:
    """A sum over trailing axes (``vred.sum``, left to right; int32 saturates)."""
    x = args[0]
    if not isinstance(x, DramTensor) or not ctx.config.supports_vector_dtype(x.dtype) or \
            out.dtype != x.dtype:
        raise NotSupported(f"sum of {getattr(x, 'dtype', 'a constant')} -> {out.dtype}")
    emit_row_mean(ctx, "sum", x, out, trailing_reduction_rows("sum", x.shape, call.attrs.axis),
                  mean=False)
