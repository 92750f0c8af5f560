"""Image operators: resize, grid_sample, roi_align."""

from __future__ import annotations
