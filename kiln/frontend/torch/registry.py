"""The converter registry: ATen operator overload name -> converter.

Keys are overload names as torch prints them (``"aten.add.Tensor"``,
``"aten.convolution.default"``), so that registering converters does not import torch. A
converter serves every overload it is registered for; :func:`converter` takes several names for
ops whose overloads differ only in argument kinds (``add.Tensor`` / ``add.Scalar``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Converter = Callable[..., Any]

_CONVERTERS: dict[str, Converter] = {}


def converter(*names: str) -> Callable[[Converter], Converter]:
    """Register ``fn(ctx, node) -> Expr | list[Expr] | PrimExpr`` for the overloads ``names``."""

    def register(fn: Converter) -> Converter:
        for name in names:
            if name in _CONVERTERS:
                raise ValueError(f"converter for {name} registered twice")
            _CONVERTERS[name] = fn
        return fn

    return register


def lookup_converter(name: str) -> Converter | None:
    """The converter of overload ``name`` (``"aten.relu.default"``), or None."""
    return _CONVERTERS.get(name)


def supported_ops() -> set[str]:
    """Every overload name that has a converter."""
    return set(_CONVERTERS)
