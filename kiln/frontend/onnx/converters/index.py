"""Indexing ONNX operators: GatherElements, GatherND, Scatter*, ReverseSequence."""

from __future__ import annotations
