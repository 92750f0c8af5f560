"""Indexing operators: gather_elements, gather_nd, scatter_elements, scatter_nd."""

from __future__ import annotations
