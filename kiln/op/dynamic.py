"""Operators with data-dependent output shapes."""

from __future__ import annotations
