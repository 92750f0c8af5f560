"""The int8 scheme's numbers: scales, quantized weights and biases, fixed-point multipliers.

The scheme (what :class:`~kiln.quantize.QuantizeGraph` emits):

- **activations**: one scale per tensor, symmetric (zero point 0): ``scale = absmax / 127``,
  ``absmax`` from calibration (:mod:`.calibrate`); values map to [-128, 127];
- **weights**: one scale per output channel, symmetric: ``scale_w[c] = max|W[c]| / 127``,
  ``q_w = clip(rint(W / scale_w), -127, 127)`` (computed in float64 at compile time);
- **bias**: int32, ``q_b[c] = rint(b[c] / (scale_x * scale_w[c]))`` (clamped to int32);
- **requantization**: the real multiplier ``m[c] = scale_x * scale_w[c] / scale_y`` becomes
  ``multiplier[c] / 2**shift`` with one ``shift`` per layer (the largest <= 62 that keeps
  every ``multiplier[c] = rint(m[c] * 2**shift)`` below 2**31), applied by
  ``qnn.requantize`` (:mod:`kiln.op.quantize` specifies its rounding exactly).
"""

from __future__ import annotations

import numpy as np

from ..ir.errors import KilnError

__all__ = ["INT8_MAX", "QuantizationError", "activation_scale", "fixed_point", "quantize_bias",
           "quantize_weight"]

INT8_MAX = 127
_INT32_MAX = 2 ** 31 - 1


class QuantizationError(KilnError):
    """The graph cannot be quantized as asked (a missing calibration range, a bad option)."""


def activation_scale(absmax: float) -> float:
    """The per-tensor scale of a tensor whose calibrated magnitude is ``absmax`` (a tensor
    that was always zero gets scale 1: any scale represents it exactly)."""
    absmax = float(absmax)
    if not np.isfinite(absmax):
        raise QuantizationError(f"calibration saw a non-finite value ({absmax})")
    return absmax / INT8_MAX if absmax > 0 else 1.0


def quantize_weight(w: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel symmetric int8 weights along ``axis``: ``(q_w, scales)`` with ``scales``
    one per channel (all-zero channels get scale 1)."""
    w = np.asarray(w, dtype=np.float64)
    axis = axis % w.ndim
    red = tuple(i for i in range(w.ndim) if i != axis)
    absmax = np.max(np.abs(w), axis=red) if red else np.abs(w)
    scales = np.where(absmax > 0, absmax / INT8_MAX, 1.0)
    shape = [1] * w.ndim
    shape[axis] = -1
    q = np.clip(np.rint(w / scales.reshape(shape)), -INT8_MAX, INT8_MAX).astype(np.int8)
    return q, scales


def quantize_bias(b: np.ndarray, acc_scales: np.ndarray) -> np.ndarray:
    """int32 bias in units of the accumulator's per-channel scales."""
    q = np.rint(np.asarray(b, np.float64) / acc_scales)
    return np.clip(q, -_INT32_MAX - 1, _INT32_MAX).astype(np.int32)


def fixed_point(m: np.ndarray) -> tuple[np.ndarray, int]:
    """``(multiplier, shift)``: int32 ``multiplier`` and one ``shift`` in 1..62 with
    ``multiplier / 2**shift`` the nearest to each positive real ``m`` that the largest keeps
    below 2**31 (relative error <= 2**-31 for the largest, more for channels far below it)."""
    m = np.asarray(m, dtype=np.float64).reshape(-1)
    if not (np.all(np.isfinite(m)) and np.all(m > 0)):
        raise QuantizationError(f"requantization multipliers must be positive and finite: "
                                f"{m[~(np.isfinite(m) & (m > 0))][:4]}")
    top = float(m.max())
    shift = 62
    while shift > 1 and np.rint(top * 2.0 ** shift) > _INT32_MAX:
        shift -= 1
    if np.rint(top * 2.0 ** shift) > _INT32_MAX:
        raise QuantizationError(f"requantization multiplier {top} is too large (> 2**30)")
    return np.rint(m * 2.0 ** shift).astype(np.int32), shift
