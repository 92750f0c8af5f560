"""Attention-family ONNX operators: Attention, RMSNormalization, RotaryEmbedding, norms."""

from __future__ import annotations
