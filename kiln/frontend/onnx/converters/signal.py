"""Signal-processing ONNX operators: DFT, STFT, window functions, MelWeightMatrix."""

from __future__ import annotations
