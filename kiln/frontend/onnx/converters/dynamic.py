"""ONNX operators with data-dependent output shapes: NonZero, Compress, Unique."""

from __future__ import annotations
