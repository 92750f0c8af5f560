"""Compilation targets."""

from .target import Target

__all__ = ["Target"]
