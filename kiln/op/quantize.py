"""Quantization operators: none are needed as kernels of their own.

The ONNX quantization operators (QuantizeLinear, DequantizeLinear, QLinearMatMul, MatMulInteger,
ConvInteger, QLinearConv, DynamicQuantizeLinear) are exact compositions of existing kiln ops --
divide, round (half to even), clip, cast, and ``matmul``/``nn.conv2d`` on int32 -- so the frontend
decomposes them (``kiln/frontend/onnx/converters/quantize.py``) and fusion merges the
element-wise parts into the integer kernels. A fused int8 kernel (int8 loads, int32
accumulation, requantizing epilogue) would be the place for a dedicated op here.
"""

from __future__ import annotations

__all__: list[str] = []
