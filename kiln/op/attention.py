"""Attention-family and normalization operators."""

from __future__ import annotations
