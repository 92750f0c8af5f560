"""Subgraph ONNX operators: If, Loop, Scan."""

from __future__ import annotations
