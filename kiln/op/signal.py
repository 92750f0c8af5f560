"""Signal-processing operators: DFT, windows."""

from __future__ import annotations
