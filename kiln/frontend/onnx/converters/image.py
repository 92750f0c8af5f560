"""Image ONNX operators: Resize/Upsample, GridSample, AffineGrid, RoiAlign, CenterCropPad."""

from __future__ import annotations
