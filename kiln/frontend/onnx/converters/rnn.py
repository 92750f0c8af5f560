"""Recurrent ONNX operators: RNN, GRU, LSTM."""

from __future__ import annotations
