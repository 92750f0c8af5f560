"""Quantization operators: quantize/dequantize linear, integer matmul/conv."""

from __future__ import annotations
