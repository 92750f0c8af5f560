"""Loss operators."""

from __future__ import annotations
