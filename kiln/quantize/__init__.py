"""int8 post-training quantization: calibration, the graph rewrite, and the scheme's numbers.

``quantize_model(mod, params, samples)`` is the whole flow: :func:`~.calibrate.calibrate` runs
the float model on sample inputs and records each tensor's range, and
:class:`~.rewrite.QuantizeGraph` rewrites convolutions, dense layers and matmuls to int8 x int8 ->
int32 products with per-channel weight scales, an int32 bias and a fixed-point requantization
(:mod:`.scheme`; the operators' exact arithmetic is in :mod:`kiln.op.quantize`). The result is
an ordinary graph module: ``kiln.build(qmod, target="c")`` and ``target="npu"`` both run it, and
compute the same bits.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..ir.module import IRModule
from .calibrate import CALIBRATION_METHODS, Calibration, TensorRange, calibrate, prepare
from .rewrite import QUANTIZED_OPS, QuantizeGraph
from .scheme import QuantizationError, fixed_point, quantize_weight

__all__ = ["CALIBRATION_METHODS", "Calibration", "QUANTIZED_OPS", "QuantizationError",
           "QuantizeGraph", "TensorRange", "calibrate", "fixed_point", "prepare",
           "quantize_model", "quantize_weight"]


def quantize_model(mod: IRModule, params: Mapping[str, Any] | None, sample_inputs: Iterable[Any],
                   method: str = "minmax", percentile: float = 99.99,
                   skip_ops: Iterable[str] = ()) -> IRModule:
    """``mod`` (float32, ``params`` bound) calibrated on ``sample_inputs`` and rewritten to int8
    compute; its inputs and outputs stay float32."""
    calib = calibrate(mod, params, sample_inputs, method=method, percentile=percentile)
    return QuantizeGraph(calib, skip_ops)(calib.mod)
