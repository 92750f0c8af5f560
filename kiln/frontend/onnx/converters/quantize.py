"""Quantization ONNX operators: QuantizeLinear, DequantizeLinear, QLinear*, *Integer."""

from __future__ import annotations
