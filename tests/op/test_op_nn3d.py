"""Pooling windows padded along H only, with W read contiguously: the shape the separable 3-D
pooling of the ONNX frontend produces for its depth pass (kernel (kd, 1) over (D, H*W)).

The schedule used to vectorize W under the H guard, a scalar-condition select of vector loads
that the C code generator cannot emit (a gcc error); such windows now stay scalar.
"""

from __future__ import annotations

import numpy as np
import pytest

from kiln.testing.op_testing import check, run_cases


def _pool_ref(x, kind, k, s, pad_lo, pad_hi, count_include_pad):
    """numpy pooling along axis 2 only (window k, stride s, padding lo/hi)."""
    fill = -np.inf if kind == "max" else 0.0
    xp = np.pad(x, ((0, 0), (0, 0), (pad_lo, pad_hi), (0, 0)), constant_values=fill)
    mask = np.pad(np.ones_like(x), ((0, 0), (0, 0), (pad_lo, pad_hi), (0, 0)))
    out = (xp.shape[2] - k) // s + 1
    win = np.stack([xp[:, :, i * s:i * s + k] for i in range(out)], axis=2)
    if kind == "max":
        return win.max(axis=3)
    cnt = k if count_include_pad else np.stack(
        [mask[:, :, i * s:i * s + k] for i in range(out)], axis=2).sum(axis=3)
    return win.sum(axis=3) / cnt


@pytest.mark.parametrize("kind,count_include_pad", [("max", False), ("avg", False),
                                                    ("avg", True)])
def test_height_only_padding_with_contiguous_width(kind, count_include_pad):
    x = np.random.default_rng(0).standard_normal((2, 3, 7, 16)).astype(np.float32)
    attrs = dict(pool_size=(3, 1), strides=(2, 1), padding=(1, 0, 2, 0))
    if kind == "avg":
        attrs["count_include_pad"] = count_include_pad
    (out,) = run_cases([(f"nn.{kind}_pool2d", [x], attrs)])
    check(out, _pool_ref(x, kind, 3, 2, 1, 2, count_include_pad))
